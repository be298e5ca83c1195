//! The two southbound revisions slim-cp serves. SLIM 2.0.0-alpha.2 and the
//! 3.x line share every control message but one: `ConnectionDetails`
//! reuses field numbers 3 and 4 with other wire types (see
//! [`crate::proto::details`]). Beyond the wire, a 3.x node reads the
//! connections of its `RegisterNodeResponse` as the server's requirements
//! rather than as a client configuration (see
//! [`crate::routing::linkconfig`]).

/// Which revision a node spoke. A 3.x node whose listeners have no TLS,
/// no auth method, no SPIRE trust domain and no metadata sends exactly the
/// bytes a 2.0.0-alpha.2 node sends, so `V2` means "no 3.x field seen".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Revision {
    /// 2.0.0-alpha.2, the revision the architecture describes.
    #[default]
    V2,
    /// The 3.x line.
    V3,
}

impl Revision {
    /// The number stored for it (the major version).
    pub fn as_i16(self) -> i16 {
        match self {
            Revision::V2 => 2,
            Revision::V3 => 3,
        }
    }

    /// The revision stored as `n`, if it is one.
    pub fn from_i16(n: i16) -> Option<Revision> {
        match n {
            2 => Some(Revision::V2),
            3 => Some(Revision::V3),
            _ => None,
        }
    }
}
