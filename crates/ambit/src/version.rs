//! Build information for `ambit version`, `/config_dump` and `istio_build`.

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub fn info() -> serde_json::Value {
    serde_json::json!({
        "version": VERSION,
        "buildProfile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "cryptoProvider": "aws-lc-rs",
        "istioVersion": std::env::var("ISTIO_META_ISTIO_VERSION").unwrap_or_else(|_| "unknown".into()),
    })
}
