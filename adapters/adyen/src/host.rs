//! What the logic may ask of its host: connector-account settings, secrets, the clock
//! and the log. The component glue backs it with the wit imports; tests back it with
//! plain maps.

use crate::bindings::sluice::psp::host::LogLevel;
use crate::types::{Failure, FailureCategory};

/// Config key: the PSP API origin, e.g. `https://checkout-test.adyen.com`.
pub const CONFIG_BASE_URL: &str = "base_url";
/// Config key: the Adyen merchant account code sent in every request.
pub const CONFIG_MERCHANT_ACCOUNT: &str = "merchant_account";
/// Secret key: the Adyen API key (`X-API-Key`).
pub const SECRET_API_KEY: &str = "api_key";
/// Secret key: the notification HMAC key, as the hex string Adyen's Customer Area shows.
pub const SECRET_WEBHOOK: &str = "webhook_secret";

/// The connector account's view of the host during one call.
pub trait Host {
    /// A non-secret setting; None when unset.
    fn config(&self, key: &str) -> Option<String>;
    /// A secret; None when unset. Never log or echo it.
    fn secret(&self, key: &str) -> Option<String>;
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

/// A non-empty secret, or a configuration failure.
pub fn require_secret(host: &impl Host, key: &str) -> Result<String, Failure> {
    match host.secret(key) {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(missing_setting("secret", key)),
    }
}
