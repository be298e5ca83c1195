//! Code generated from `proto/` at build time (the upstream wire contract).
//!
//! The module tree mirrors the protobuf packages (`controller.proto.v1` and so
//! on) because the generated code refers across packages by relative path.
//! Use the short aliases below elsewhere in the crate.

pub mod codec;
pub mod details;

// Generated code: lints are for the code written here.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod dataplane {
    pub mod proto {
        pub mod v1 {
            tonic::include_proto!("dataplane.proto.v1");
        }
    }
}

// Generated code: lints are for the code written here.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod controller {
    pub mod proto {
        pub mod v1 {
            tonic::include_proto!("controller.proto.v1");
            pub use crate::proto::details::{ConnectionDetails, connection_details};
        }
    }
}

// Generated code: lints are for the code written here.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod controlplane {
    pub mod proto {
        pub mod v1 {
            tonic::include_proto!("controlplane.proto.v1");
        }
    }
}

// Generated code: lints are for the code written here.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod slimcp {
    pub mod proto {
        pub mod v1 {
            tonic::include_proto!("slimcp.proto.v1");
        }
    }
}

/// The SPIFFE Workload API (no protobuf package, hence the `_` file), for
/// the SPIRE registration auth's trust bundles.
// Generated code: lints are for the code written here.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod spiffe {
    include!(concat!(env!("OUT_DIR"), "/_.rs"));
}

/// `controller.proto.v1`: the southbound stream.
pub use controller::proto::v1 as sb;
/// `controlplane.proto.v1`: the northbound operator API.
pub use controlplane::proto::v1 as nb;
/// `dataplane.proto.v1`: names.
pub use dataplane::proto::v1 as dp;
/// `slimcp.proto.v1`: slim-cp's relay and admin services.
pub use slimcp::proto::v1 as cluster;
