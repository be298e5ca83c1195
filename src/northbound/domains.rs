//! Registration-auth domains (SLIM 3.x `slimctl controller domain ...`):
//! groups whose nodes prove membership with a shared secret managed
//! through the API. Semantics follow the reference 3.4.6 control plane:
//! listing works in every mode and shows the configured domains, the
//! stored ones and the groups of registered nodes (with their node ids),
//! never a secret; adding needs API mode and `shared_secret` auth, and
//! replaces the secret of a domain that exists (that is how a secret is
//! rotated); removing needs the same and disconnects the domain's nodes.
//! Stored secrets admit nodes only in API mode; in config mode the file's
//! secrets alone do (stored domains are still listed).
//! Where slim-cp differs: removing an unknown domain is NOT_FOUND (the
//! reference answers OK), a domain of the configuration file cannot be
//! removed through the API (the file would bring it back), and the other
//! replicas close their streams of the domain's nodes when they next reload
//! the domains (within `RELOAD_PERIOD`).

use std::collections::BTreeMap;

use tonic::Status;

use super::topology::check_name;
use super::{Ctx, errors};
use crate::auth::Domains;
use crate::config::SharedSecret;
use crate::proto::nb;

impl Ctx {
    pub async fn list_domains(&self) -> Result<Vec<nb::DomainEntry>, Status> {
        let mut domains: BTreeMap<String, Vec<String>> = BTreeMap::new();
        if let Some(d) = &self.domains {
            for name in d.configured() {
                domains.entry(name.clone()).or_default();
            }
        }
        let stored = self
            .store
            .list_domains()
            .await
            .map_err(errors::from_store)?;
        for d in stored {
            domains.entry(d.name).or_default();
        }
        let nodes = self.store.list_nodes().await.map_err(errors::from_store)?;
        for n in nodes {
            if let Some(group) = n.group.filter(|g| !g.is_empty()) {
                domains.entry(group).or_default().push(n.id);
            }
        }
        Ok(domains
            .into_iter()
            .map(|(domain_name, nodes)| nb::DomainEntry { domain_name, nodes })
            .collect())
    }

    pub async fn add_domain(&self, name: &str, secret: &str) -> Result<(), Status> {
        let domains = self.domain_api()?;
        check_name("domain_name", name)?;
        let secret = check_secret(secret)?;
        let sealed = domains
            .seal(name, &secret)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        let created = self
            .store
            .put_domain(sealed)
            .await
            .map_err(errors::from_store)?;
        domains.learn(name, &secret);
        tracing::info!(domain = %name, created, "domain secret stored");
        Ok(())
    }

    pub async fn remove_domain(&self, name: &str) -> Result<(), Status> {
        let domains = self.domain_api()?;
        check_name("domain_name", name)?;
        let removed = self
            .store
            .remove_domain(name)
            .await
            .map_err(errors::from_store)?;
        domains.forget(name);
        if !removed {
            return Err(match domains.configured().contains(name) {
                true => Status::failed_precondition(format!(
                    "domain '{name}' has its secret in the configuration file \
                     (topology.registration_auth.secrets); remove it there"
                )),
                false => Status::not_found(format!("domain '{name}' not found")),
            });
        }
        // Other replicas close theirs when they next reload the domains.
        let closed = self.transport.registry().close_group(name);
        tracing::info!(domain = %name, closed, "domain removed");
        Ok(())
    }

    /// The domains, if this replica manages them through the API.
    fn domain_api(&self) -> Result<&Domains, Status> {
        self.ensure_api_mode()?;
        self.domains.as_deref().ok_or_else(|| {
            Status::unimplemented(
                "domains are managed only with shared-secret registration auth \
                 (topology.registration_auth.type: shared_secret)",
            )
        })
    }
}

/// A secret the nodes would accept too: non-empty, at least as long as
/// slim-auth requires, at most [`crate::limits::MAX_SECRET_BYTES`]. The
/// messages never quote it.
fn check_secret(secret: &str) -> Result<SharedSecret, Status> {
    if secret.is_empty() {
        return Err(Status::invalid_argument("secret must not be empty"));
    }
    crate::limits::check_len("secret", secret, crate::limits::MAX_SECRET_BYTES)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    SharedSecret::new(secret).map_err(Status::invalid_argument)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_checked_without_being_quoted() {
        for bad in [
            "",
            "short-secret",
            &"s".repeat(crate::limits::MAX_SECRET_BYTES + 1),
        ] {
            let err = check_secret(bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains("secret"), "{}", err.message());
            if !bad.is_empty() {
                assert!(!err.message().contains(bad), "{}", err.message());
            }
        }
        assert!(check_secret(&"s".repeat(32)).is_ok());
    }
}
