//! Compiles `proto/` with protox (pure Rust, so the build needs no system `protoc`) and
//! generates prost messages and tonic clients and servers from the descriptors.

use std::path::PathBuf;

const FILES: &[&str] = &[
    "istio/workload/workload.proto",
    "istio/security/authorization.proto",
    "istio/v1/auth/ca.proto",
    "google/rpc/status.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/service/discovery/v3/discovery.proto",
    "ambit/waypoint/v1/policy.proto",
    "ambit/waypoint/v1/route.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let files: Vec<PathBuf> = FILES.iter().map(|f| root.join(f)).collect();
    let descriptors = protox::compile(&files, [&root])?;
    tonic_build::configure()
        .build_client(true)
        .build_server(true)
        // Addresses stay shared buffers when a batch is decoded.
        .bytes([
            ".istio.workload.Workload",
            ".istio.workload.Service",
            ".istio.workload.GatewayAddress",
            ".istio.workload.NetworkAddress",
            ".istio.security.Address",
        ])
        .compile_fds(descriptors)?;
    Ok(())
}
