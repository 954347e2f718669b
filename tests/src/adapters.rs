//! The compiled adapters the tests load (built by `cargo xtask build-adapters`).

use std::path::PathBuf;
use std::sync::OnceLock;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use sluice_adapter_runtime::{AdapterRuntime, RuntimeConfig};

/// The small adapter most host tests drive (`adapters/test-well-behaved`).
pub const WELL_BEHAVED: &str = "test-well-behaved";

/// Directory holding `<adapter>.wasm`: `SLUICE_TEST_ADAPTERS_DIR`, else
/// `$CARGO_TARGET_DIR/adapters`, else the workspace's `target/adapters`
/// (where `cargo xtask build-adapters` puts them).
pub fn adapters_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_TEST_ADAPTERS_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        let dir = PathBuf::from(target).join("adapters");
        if dir.is_dir() {
            return dir;
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/adapters")
}

/// Where the compiled adapter `name` (its directory's name under `adapters/`) is.
pub fn adapter_path(name: &str) -> PathBuf {
    adapters_dir().join(format!("{name}.wasm"))
}

/// The bytes of the compiled adapter `name`; a clear failure when it is not built.
pub fn adapter_bytes(name: &str) -> Vec<u8> {
    let path = adapter_path(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the compiled adapter {} ({e}). Build the adapters first: \
             `cargo xtask build-adapters` (or set SLUICE_TEST_ADAPTERS_DIR)",
            path.display()
        )
    })
}

/// The second, misbehaving version of `test-well-behaved` (its `variant` feature:
/// `adapters/test-well-behaved/src/variant.rs`), built by `cargo xtask build-adapters`
/// into `variants/`. It describes itself as `test-well-behaved` too.
pub fn well_behaved_variant_bytes() -> Vec<u8> {
    let path = adapters_dir().join("variants/test-well-behaved-variant.wasm");
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the adapter variant {} ({e}). Build the adapters first: \
             `cargo xtask build-adapters`",
            path.display()
        )
    })
}

/// One compile cache per test binary, so each component compiles once.
pub fn cache_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("compile cache dir"))
        .path()
        .to_path_buf()
}

/// A runtime with the named adapters loaded and active. It compiles: call it
/// from `spawn_blocking` inside async tests.
pub fn runtime_with(names: &[&str]) -> AdapterRuntime {
    let runtime = AdapterRuntime::new(RuntimeConfig {
        cache_dir: Some(cache_dir()),
        max_concurrent_instances: 16,
        ..RuntimeConfig::default()
    })
    .expect("adapter runtime");
    for name in names {
        runtime
            .load(name, &adapter_bytes(name), None, true)
            .unwrap_or_else(|e| panic!("loading {name}: {e:?}"));
    }
    runtime
}

/// `t=<unix>,v1=<hex hmac>` over `"{t}.{body}"`: the `test-well-behaved`
/// adapter's webhook signature (its `X-Test-Signature` header).
pub fn well_behaved_signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}
