//! Build information for `ambit version`, `/config_dump` and `istio_build`, with the keys
//! ztunnel's `version` section has.

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const GIT_REVISION: &str = env!("AMBIT_GIT_REVISION");
pub const BUILD_STATUS: &str = env!("AMBIT_BUILD_STATUS");
pub const RUST_VERSION: &str = env!("AMBIT_RUST_VERSION");
/// ztunnel names its crypto provider by the build feature; ours is the same library.
pub const CRYPTO_PROVIDER: &str = "tls-aws-lc";

pub fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

pub fn istio_version() -> String {
    std::env::var("ISTIO_META_ISTIO_VERSION").unwrap_or_else(|_| "unknown".into())
}

pub fn info() -> serde_json::Value {
    serde_json::json!({
        "version": VERSION,
        "gitRevision": GIT_REVISION,
        "rustVersion": RUST_VERSION,
        "buildProfile": build_profile(),
        "buildStatus": BUILD_STATUS,
        "istioVersion": istio_version(),
        "cryptoProvider": CRYPTO_PROVIDER,
    })
}

/// One line, in the layout of ztunnel's `version` command.
pub fn line() -> String {
    format!(
        "version.BuildInfo{{Version:{VERSION:?}, GitRevision:{GIT_REVISION:?}, RustVersion:{RUST_VERSION:?}, BuildProfile:{:?}, BuildStatus:{BUILD_STATUS:?}, IstioVersion:{:?}, CryptoProvider:{CRYPTO_PROVIDER:?}}}",
        build_profile(),
        istio_version()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn info_has_ztunnels_keys() {
        let v = super::info();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "buildProfile",
                "buildStatus",
                "cryptoProvider",
                "gitRevision",
                "istioVersion",
                "rustVersion",
                "version"
            ]
        );
        assert!(
            super::RUST_VERSION.starts_with("1."),
            "{}",
            super::RUST_VERSION
        );
        assert!(super::line().starts_with("version.BuildInfo{Version:\""));
    }
}
