//! What the logic may ask of its host: connector-account settings, MACs with its secrets
//! (the keyring), the clock and the log. The adapter never holds a secret: requests carry
//! the placeholder [`API_KEY_PLACEHOLDER`], which the host substitutes after its
//! destination check. The component glue backs this with the wit imports; tests back it
//! with the host's own keyring and a fixed clock.

use crate::bindings::sluice::psp::host::LogLevel;
pub use crate::bindings::sluice::psp::keyring::{HmacAlgorithm, KeyEncoding, KeyringError};
use crate::types::{Failure, FailureCategory};

/// Config key: the PSP API origin, e.g. `https://api.stripe.com`.
pub const CONFIG_BASE_URL: &str = "base_url";
/// Config key: the webhook signature tolerance in seconds.
pub const CONFIG_WEBHOOK_TOLERANCE: &str = "webhook_tolerance_seconds";
/// Secret key: the Stripe secret API key (`sk_...`).
pub const SECRET_API_KEY: &str = "api_key";
/// Secret key: the webhook endpoint secret (`whsec_...`).
pub const SECRET_WEBHOOK: &str = "webhook_secret";
/// What the host replaces with the API key in the request it sends.
pub const API_KEY_PLACEHOLDER: &str = "{{secret:api_key}}";

/// The connector account's view of the host during one call.
pub trait Host {
    /// A non-secret setting; None when unset.
    fn config(&self, key: &str) -> Option<String>;
    /// `HMAC(secret, data)` for every valid version of the account's secret `key`,
    /// newest first; the secret itself never reaches the adapter.
    fn hmac(
        &self,
        key: &str,
        algorithm: HmacAlgorithm,
        encoding: KeyEncoding,
        data: &[u8],
    ) -> Result<Vec<Vec<u8>>, KeyringError>;
    /// Milliseconds since the Unix epoch, from the host's clock.
    fn now_unix_millis(&self) -> i64;
    /// A line in the host's log (no secrets, signatures or card data).
    fn log(&self, level: LogLevel, message: &str);
}

/// A configuration failure naming the missing setting (never its value).
pub fn missing_setting(kind: &str, key: &str) -> Failure {
    Failure {
        category: FailureCategory::Configuration,
        code: "missing_setting".to_string(),
        message: format!("the connector account has no {kind} `{key}`"),
    }
}

/// A non-empty config value, or a configuration failure.
pub fn require_config(host: &impl Host, key: &str) -> Result<String, Failure> {
    match host.config(key) {
        Some(value) if !value.trim().is_empty() => Ok(value.trim().to_string()),
        _ => Err(missing_setting("setting", key)),
    }
}
