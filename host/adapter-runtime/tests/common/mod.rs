//! Shared helpers for the runtime's tests: the compiled test adapters, runtimes with a
//! fixed clock, and signed webhooks for `test-well-behaved`.
#![allow(dead_code)]

use sluice_adapter_runtime::{
    AdapterRuntime, CaptureMode, ConnectorAccountScope, Header, Money, Operation, OperationContext,
    RuntimeConfig, SandboxLimits, WebhookRequest,
};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The host clock every test runtime uses (Unix millis).
pub const NOW_MILLIS: i64 = 1_800_000_000_000;
pub const NOW_SECS: i64 = NOW_MILLIS / 1000;

// Each test binary includes this module and uses a different part of it.
#[allow(unused_imports)]
pub use sluice_test_support::adapters::{adapter_bytes, adapter_path, adapters_dir};

/// A compile cache shared by the tests of one binary, so each component compiles once.
pub fn shared_cache_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir for the compile cache"))
        .path()
        .to_path_buf()
}

pub fn config() -> RuntimeConfig {
    RuntimeConfig {
        cache_dir: Some(shared_cache_dir()),
        clock: Arc::new(|| NOW_MILLIS),
        ..RuntimeConfig::default()
    }
}

pub fn runtime() -> AdapterRuntime {
    AdapterRuntime::new(config()).expect("runtime")
}

/// A runtime with the named adapters loaded and active under their own names.
pub fn runtime_with(names: &[&str]) -> AdapterRuntime {
    let rt = runtime();
    for name in names {
        load(&rt, name, None);
    }
    rt
}

pub fn load(rt: &AdapterRuntime, name: &str, limits: Option<SandboxLimits>) {
    rt.load(name, &adapter_bytes(name), limits, true)
        .unwrap_or_else(|e| panic!("loading {name}: {e:?}"));
}

pub fn account(id: &str, api_key: &str, webhook_secret: &str) -> ConnectorAccountScope {
    ConnectorAccountScope::new(id)
        .with_config("base_url", "http://127.0.0.1:9/psp")
        .with_secret("api_key", api_key)
        .with_secret("webhook_secret", webhook_secret)
}

/// A webhook for `test-well-behaved`, signed with `secret` at `timestamp`.
pub fn signed_webhook(secret: &str, timestamp: i64, body: &[u8]) -> WebhookRequest {
    WebhookRequest {
        method: "POST".into(),
        path: "/webhooks/test-well-behaved/acct".into(),
        headers: vec![
            Header {
                name: "Content-Type".into(),
                value: "application/json".into(),
            },
            Header {
                name: "X-Test-Signature".into(),
                value: sluice_adapter_test_well_behaved::webhook::sign(secret, timestamp, body),
            },
        ],
        body: body.to_vec(),
    }
}

pub fn payment_succeeded_body(event_id: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{event_id}","type":"payment.succeeded","data":{{"id":"pay_1","reference":"att_1","amount":1999,"currency":"EUR","status":"succeeded"}}}}"#
    )
    .into_bytes()
}

pub fn sale_context() -> OperationContext {
    OperationContext {
        operation: Operation::Sale,
        capture_mode: CaptureMode::Automatic,
        attempt_reference: "att_1".into(),
        action_reference: None,
        psp_payment_reference: None,
        psp_refund_reference: None,
        amount: Money {
            amount_minor: 1999,
            currency: "EUR".into(),
        },
        payment_method_token: Some("tok_visa".into()),
        return_url: None,
        merchant_order_no: "order-1".into(),
        metadata: vec![],
    }
}

/// Appends a custom section: same behaviour, different bytes, so a different version.
pub fn with_custom_section(wasm: &[u8], name: &str, payload: &[u8]) -> Vec<u8> {
    let mut content = leb128(name.len());
    content.extend_from_slice(name.as_bytes());
    content.extend_from_slice(payload);
    let mut out = wasm.to_vec();
    out.push(0);
    out.extend(leb128(content.len()));
    out.extend(content);
    out
}

fn leb128(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}
