//! Generates the gRPC code from `proto/` with a vendored protoc, so a fresh
//! machine needs nothing installed beyond the Rust toolchain.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut prost = tonic_prost_build::Config::new();
    prost.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let includes = [PathBuf::from("proto"), protoc_bin_vendored::include_path()?];
    let protos = [
        "proto/data-plane/v1/data_plane.proto",
        "proto/controller/v1/controller.proto",
        "proto/controlplane/v1/controlplane.proto",
        "proto/slimcp/v1/cluster.proto",
        "proto/spiffe/workload.proto",
    ]
    .map(PathBuf::from);
    // Read by hand in both wire revisions (see src/proto/details.rs).
    prost.extern_path(
        ".controller.proto.v1.ConnectionDetails",
        "crate::proto::details::ConnectionDetails",
    );
    // Every service's codec: prost's with smaller per-call buffers (see
    // src/proto/codec.rs).
    tonic_prost_build::configure()
        .codec_path("crate::proto::codec::LeanCodec")
        .compile_with_config(prost, &protos, &includes)?;
    println!("cargo:rerun-if-changed=proto");
    // sqlx::migrate! embeds migrations/ but only notices edits, not new files.
    println!("cargo:rerun-if-changed=migrations");
    Ok(())
}
