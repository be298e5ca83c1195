//! Registration authentication: turns `topology.registration_auth` into the
//! [`Authenticator`] the southbound consults before recording anything.
//!
//! Only shared secrets are verified. A SPIRE configuration is refused at
//! startup: accepting it without checking JWT-SVIDs would let any node join
//! any group while the operator believes membership is enforced.

mod shared_secret;

use std::sync::Arc;

pub use shared_secret::{
    CLOCK_SKEW_SECS, Rejection, SharedSecretAuth, TOKEN_VALIDITY_SECS, mint_token,
};

use crate::config::RegistrationAuthConfig;
use crate::southbound::auth::{AcceptAll, Authenticator};

/// Why the configured registration auth cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthSetupError {
    /// `type: spire` is configured; slim-cp cannot verify it yet.
    #[error(
        "topology.registration_auth: `type: spire` is not supported: slim-cp does not verify \
         SPIRE JWT-SVIDs yet, and starting without the check would let any node join any \
         group; use `type: shared_secret` with one secret per group instead"
    )]
    SpireUnsupported,
}

/// The authenticator for `cfg`: none configured accepts every node (the
/// reference's default), shared secrets check each node's token.
pub fn authenticator(
    cfg: Option<&RegistrationAuthConfig>,
) -> Result<Arc<dyn Authenticator>, AuthSetupError> {
    match cfg {
        None => Ok(Arc::new(AcceptAll)),
        Some(RegistrationAuthConfig::SharedSecret { secrets }) => {
            Ok(Arc::new(SharedSecretAuth::new(secrets.clone())))
        }
        Some(RegistrationAuthConfig::Spire { .. }) => Err(AuthSetupError::SpireUnsupported),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::SharedSecret;
    use crate::proto::sb;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn request(credentials: &str) -> sb::RegisterNodeRequest {
        sb::RegisterNodeRequest {
            node_id: "n1".into(),
            group_name: Some("g".into()),
            credentials: credentials.into(),
            ..Default::default()
        }
    }

    #[test]
    fn none_accepts_everyone() {
        let auth = authenticator(None).unwrap();
        assert!(auth.verify(&request("")).is_ok());
    }

    #[test]
    fn shared_secret_checks_tokens_against_the_wall_clock() {
        let secrets = BTreeMap::from([("g".to_string(), SharedSecret::new(SECRET).unwrap())]);
        let cfg = RegistrationAuthConfig::SharedSecret { secrets };
        let auth = authenticator(Some(&cfg)).unwrap();
        let now = u64::try_from(crate::clock::unix_now()).unwrap();
        assert!(
            auth.verify(&request(&mint_token("g", "n1", SECRET, now)))
                .is_ok()
        );
        assert!(auth.verify(&request("")).is_err());
    }

    #[test]
    fn spire_is_refused_at_startup_with_a_way_out() {
        let cfg = RegistrationAuthConfig::Spire {
            socket_path: "/run/spire/agent.sock".into(),
            audience: "slim".into(),
        };
        let err = authenticator(Some(&cfg)).err().unwrap().to_string();
        assert!(err.contains("does not verify SPIRE JWT-SVIDs"), "{err}");
        assert!(err.contains("shared_secret"), "{err}");
    }
}
