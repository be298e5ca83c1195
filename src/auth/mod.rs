//! Registration authentication: turns `topology.registration_auth` into the
//! [`Authenticator`] the southbound consults before recording anything.
//!
//! Shared secrets ([`SharedSecretAuth`]) check an HMAC token per group;
//! SPIRE ([`spire::SpireAuth`]) checks a JWT-SVID against SPIFFE trust
//! bundles and requires its trust domain to be the node's group.

pub mod domains;
pub mod sealing;
mod shared_secret;
pub mod spire;

use std::sync::Arc;

pub use domains::Domains;

pub use shared_secret::{
    CLOCK_SKEW_SECS, Rejection, SharedSecretAuth, TOKEN_VALIDITY_SECS, mint_token,
};

use crate::config::RegistrationAuthConfig;
use crate::southbound::auth::{AcceptAll, Authenticator};

/// Longest node-supplied text quoted in a refusal, so that a hostile node
/// cannot flood the log through its group name, token id or claims.
const MAX_QUOTED: usize = 96;

/// Why the configured registration auth cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthSetupError {
    /// The SPIRE bundle file is missing or unusable at start-up.
    #[error("topology.registration_auth.bundle_path {path:?}: {reason}")]
    SpireBundleFile {
        /// The configured path.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// SPIRE auth follows its bundles in background tasks, which need a
    /// Tokio runtime (a programming error, not an operator's).
    #[error("SPIRE registration auth must be started inside a Tokio runtime")]
    NoRuntime,
}

/// The authenticator for `cfg`: none configured accepts every node (the
/// reference's default), shared secrets check each node's token (against
/// the configured secrets and those of `domains`), SPIRE each node's
/// JWT-SVID (started on the current Tokio runtime).
pub fn authenticator(
    cfg: Option<&RegistrationAuthConfig>,
    domains: Option<Arc<Domains>>,
) -> Result<Arc<dyn Authenticator>, AuthSetupError> {
    match cfg {
        None => Ok(Arc::new(AcceptAll)),
        Some(RegistrationAuthConfig::SharedSecret { secrets }) => {
            let auth = SharedSecretAuth::new(secrets.clone());
            Ok(Arc::new(match domains {
                Some(d) => auth.with_domains(d),
                None => auth,
            }))
        }
        Some(RegistrationAuthConfig::Spire { bundles, audience }) => Ok(Arc::new(
            spire::SpireAuth::start(bundles, audience, spire::Timing::default())?,
        )),
    }
}

/// The API-managed domains for `cfg`: only shared-secret auth has any
/// (the reference refuses `AddDomain` under SPIRE or without auth, and so
/// does slim-cp). `seal` is the key stored secrets are sealed with.
pub fn domains(
    cfg: Option<&RegistrationAuthConfig>,
    seal: Option<sealing::SealKey>,
) -> Option<Arc<Domains>> {
    match cfg {
        Some(RegistrationAuthConfig::SharedSecret { secrets }) => Some(Arc::new(Domains::new(
            secrets.keys().cloned().collect(),
            seal,
        ))),
        _ => None,
    }
}

/// Node-supplied text, cut to a loggable length on a char boundary.
pub(crate) fn quoted(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::{SharedSecret, SpireBundleSource};
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
        let auth = authenticator(None, None).unwrap();
        assert!(auth.verify(&request("")).is_ok());
    }

    #[test]
    fn shared_secret_checks_tokens_against_the_wall_clock() {
        let secrets = BTreeMap::from([("g".to_string(), SharedSecret::new(SECRET).unwrap())]);
        let cfg = RegistrationAuthConfig::SharedSecret { secrets };
        let auth = authenticator(Some(&cfg), None).unwrap();
        let now = u64::try_from(crate::clock::unix_now()).unwrap();
        assert!(
            auth.verify(&request(&mint_token("g", "n1", SECRET, now)))
                .is_ok()
        );
        assert!(auth.verify(&request("")).is_err());
    }

    #[tokio::test]
    async fn spire_with_an_unusable_bundle_file_stops_the_start() {
        let cfg = RegistrationAuthConfig::Spire {
            bundles: SpireBundleSource::File {
                path: "/nonexistent/slim-cp/bundle.json".into(),
                trust_domain: Some("g".into()),
            },
            audience: "slim".into(),
        };
        let err = authenticator(Some(&cfg), None).err().unwrap().to_string();
        assert!(
            err.starts_with("topology.registration_auth.bundle_path"),
            "{err}"
        );
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn spire_needs_a_runtime_for_its_follower() {
        let cfg = RegistrationAuthConfig::Spire {
            bundles: SpireBundleSource::WorkloadApi {
                socket_path: "/run/spire/agent.sock".into(),
            },
            audience: "slim".into(),
        };
        let err = authenticator(Some(&cfg), None).err().unwrap();
        assert_eq!(err, AuthSetupError::NoRuntime);
    }
}
