//! The sandboxed adapter runtime of Sluice.
//!
//! PSP adapters are WebAssembly components implementing the `psp-adapter` world of
//! `wit/psp-adapter.wit`. This crate compiles them once at load time (with an on-disk
//! cache keyed by content digest and engine compatibility), validates them before they
//! can serve, keeps every loaded version with one atomically swappable active version
//! per adapter, and runs each call in a fresh, throw-away sandbox:
//!
//! * a `Store` per call from a pre-instantiated component (pooling allocator); after a
//!   call that returned normally it is kept warm for the next call of the same version
//!   for the same connector account only ([`WarmConfig`], `warm.rs`), and after a trap,
//!   a deadline or a memory-limit hit it is discarded, so a failure never poisons a
//!   later call and no account's call ever runs in memory another account's call used;
//! * a memory cap (resource limiter), a CPU deadline (epoch interruption driven by a
//!   dedicated ticker thread) and a cap on the size of what the call returns;
//! * deny-all WASI: no files, no network, no environment, no arguments, stdin closed,
//!   stdout/stderr captured with a cap and sent to tracing;
//! * `host` imports that see only the [`ConnectorAccountScope`] of the call, and a
//!   `keyring` import that computes MACs with the account's secrets ([`Keyring`]): no
//!   secret ever enters the sandbox (contract `sluice:psp@0.2.0`). Secret values are
//!   redacted from the PSP responses, webhooks and contexts handed to a guest.
//!
//! Calls are `async`: the guest runs on a wasmtime fiber inside the calling task (no
//! hop to another thread), and yields to the scheduler at every epoch tick
//! ([`RuntimeConfig::yield_on_tick`]), so a guest spinning until its deadline holds a
//! worker thread for one tick at a time, never for the whole deadline. The number of
//! concurrently running guests is bounded by [`RuntimeConfig::max_concurrent_instances`],
//! shared fairly across (adapter, connector account) keys with a CPU budget per key
//! ([`bulkhead`]), charged with the thread CPU time of every poll of the call: a call
//! that cannot get its share in time is shed ([`AdapterError::Shed`]) instead of
//! waiting behind another tenant.

mod bindings;
pub mod bulkhead;
mod cache;
mod calls;
mod engine;
mod error;
mod handle;
mod keyring;
mod limits;
mod metered;
mod output;
pub mod release;
mod runtime;
mod sandbox;
pub mod testing;
mod warm;

pub use bindings::sluice::psp::host::LogLevel;
pub use bindings::sluice::psp::types::{
    AdapterInfo, Capability, CaptureMode, EventKind, EvidenceSource, Failure, FailureCategory,
    Header, HttpRequest, HttpResponse, Money, Operation, OperationContext, PaymentEvent,
    SettlementLine, SettlementLineType, WebhookAcceptance, WebhookRejection, WebhookRequest,
};
pub use bulkhead::metrics::register_metrics;
pub use bulkhead::{BulkheadConfig, Shed, ShedReason};
pub use error::{AdapterError, LoadError, RuntimeError};
pub use handle::AdapterHandle;
pub use keyring::{
    HmacHash, KeyText, Keyring, KeyringFailure, PlaceholderError, MAX_HMAC_DATA_BYTES, REDACTED,
};
pub use limits::{system_clock_millis, Clock, RuntimeConfig, SandboxLimits, MAX_CPU_DEADLINE};
pub use release::{CanaryPolicy, CanaryStatus, Rollout};
pub use runtime::{AdapterIdentity, AdapterRuntime, AdapterStatus, AdapterVersionInfo};
pub use warm::{WarmConfig, MAX_WARM_CALLS, MAX_WARM_IDLE};

use std::collections::BTreeMap;
use std::fmt;

/// The adapter contract versions this host accepts: `sluice:psp/adapter@0.2.x`. A
/// `0.1.x` component (which read secrets through `get-secret`) is refused at load time.
pub const CONTRACT_INTERFACE: &str = "sluice:psp/adapter";
pub const SUPPORTED_CONTRACT: &str = "0.2.x";

/// The connector account a call serves: its id, non-secret settings and secrets. The
/// adapter's `get-config` import sees `config` (minus any name that is also a secret's);
/// its `keyring` import computes MACs with `secrets` without revealing them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnectorAccountScope {
    pub account_id: String,
    pub config: BTreeMap<String, String>,
    pub secrets: Keyring,
}

impl ConnectorAccountScope {
    pub fn new(account_id: impl Into<String>) -> Self {
        ConnectorAccountScope {
            account_id: account_id.into(),
            ..Self::default()
        }
    }

    pub fn with_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }

    pub fn with_secret(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.secrets.insert(key, value);
        self
    }

    /// A secret with several valid versions, newest first (a rotation window).
    pub fn with_secret_versions(mut self, key: impl Into<String>, versions: Vec<String>) -> Self {
        self.secrets.insert_versions(key, versions);
        self
    }

    /// What `get-config` answers: the setting, unless the name is also a secret's (a
    /// secret copied into the settings by mistake must not reach the guest).
    pub fn visible_config(&self, key: &str) -> Option<&str> {
        if self.secrets.contains(key) {
            return None;
        }
        self.config.get(key).map(String::as_str)
    }
}

/// Secrets are never printed: only their names are shown.
impl fmt::Debug for ConnectorAccountScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectorAccountScope")
            .field("account_id", &self.account_id)
            .field("config", &self.config)
            .field("secrets", &self.secrets)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_of_a_scope_never_contains_secret_values() {
        let scope = ConnectorAccountScope::new("acct_1")
            .with_config("base_url", "http://127.0.0.1:1")
            .with_secret("api_key", "sk_live_very_secret");
        let printed = format!("{scope:?}");
        assert!(!printed.contains("sk_live_very_secret"), "{printed}");
        assert!(printed.contains("api_key"));
        assert!(printed.contains("http://127.0.0.1:1"));
    }

    #[test]
    fn config_lookup_refuses_the_name_of_a_secret() {
        let scope = ConnectorAccountScope::new("acct_1")
            .with_config("api_key", "sk_live_copied_by_mistake")
            .with_config("base_url", "http://127.0.0.1:1")
            .with_secret("api_key", "sk_live_copied_by_mistake");
        assert_eq!(scope.visible_config("api_key"), None);
        assert_eq!(scope.visible_config("base_url"), Some("http://127.0.0.1:1"));
    }
}
