//! The registration authentication seam: every registration passes one
//! authenticator before anything is recorded.

use crate::proto::sb;

/// Decides whether a node may join the group it claims.
pub trait Authenticator: Send + Sync + 'static {
    /// `Err` carries why, for the operator's log; the node only learns it
    /// was refused.
    fn verify(&self, request: &sb::RegisterNodeRequest) -> Result<(), String>;
}

/// No registration auth (the default): every node is accepted.
pub struct AcceptAll;

impl Authenticator for AcceptAll {
    fn verify(&self, _request: &sb::RegisterNodeRequest) -> Result<(), String> {
        Ok(())
    }
}
