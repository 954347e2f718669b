//! Sandbox configuration and the settings the control API can change at run time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Which wire format a payment, a key or a webhook target speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Stripe,
    Adyen,
}

/// How far an `Idempotency-Key` reaches.
///
/// Stripe and Adyen both scope keys to the account: the same key sent to a
/// different endpoint is an error, not a fresh request. `PerEndpoint` exists for
/// callers that knowingly reuse one key across endpoints (for example the attempt
/// reference for both create and cancel); real PSPs would refuse that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyScope {
    PerApiKey,
    PerEndpoint,
}

/// Where the webhooks of one connector account go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookTarget {
    /// Absolute URL the sandbox POSTs to, e.g. `http://127.0.0.1:8080/webhooks/stripe/acct_1`.
    pub url: String,
    /// Stripe: the `whsec_...` string (used verbatim as the HMAC key).
    /// Adyen: the HMAC key in hex.
    pub secret: String,
    pub format: Format,
    /// When set, only events of payments created with this API key go here;
    /// otherwise every event of `format` does.
    #[serde(default)]
    pub api_key: Option<String>,
}

/// Faults applied to webhook delivery. Changeable at run time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeliveryFaults {
    /// How many times each webhook request is sent (1 = once, 3 = two duplicates).
    pub duplicates: u32,
    /// Each webhook is sent no earlier than this long after the event happened.
    #[serde(with = "millis", rename = "delay_ms")]
    pub delay: Duration,
    /// Webhooks are collected into windows of this many and each window is
    /// shuffled before sending. 0 or 1 keeps the order.
    pub reorder_window: usize,
    /// A partly filled reorder window is sent after this long.
    #[serde(with = "millis", rename = "reorder_flush_ms")]
    pub reorder_flush: Duration,
    /// Adyen: put the items of one operation (e.g. AUTHORISATION + CAPTURE) into
    /// one `notificationItems` batch. False sends one item per request.
    pub adyen_batch: bool,
}

impl Default for DeliveryFaults {
    fn default() -> Self {
        Self {
            duplicates: 1,
            delay: Duration::ZERO,
            reorder_window: 0,
            reorder_flush: Duration::from_millis(200),
            adyen_batch: true,
        }
    }
}

/// How stubbornly the sandbox re-sends a webhook the gateway did not acknowledge with 2xx.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetryPolicy {
    /// Attempts per webhook copy, including the first. At least 1.
    pub max_attempts: u32,
    /// Wait before retry n is `backoff * n`.
    #[serde(with = "millis", rename = "backoff_ms")]
    pub backoff: Duration,
    /// Per-request timeout when calling the gateway.
    #[serde(with = "millis", rename = "request_timeout_ms")]
    pub request_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            backoff: Duration::from_millis(500),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// What a refund does. Changeable at run time through the control API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundBehaviour {
    /// Stripe: `succeeded` at once. Adyen: REFUND success notification at once.
    #[default]
    Succeed,
    /// `pending`; succeeds when pending work settles.
    PendingThenSucceed,
    /// `pending`; fails when pending work settles (Stripe `refund.failed`,
    /// Adyen REFUND with `success=false`).
    PendingThenFail,
}

/// The sandbox's clock (unix milliseconds). The wall clock by default; the
/// deterministic simulator passes its virtual one, so payment times, webhook
/// signatures and event dates move with simulated time.
#[derive(Clone)]
pub struct SandboxClock(Arc<dyn Fn() -> i64 + Send + Sync>);

impl SandboxClock {
    pub fn new(now_ms: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        SandboxClock(Arc::new(now_ms))
    }

    /// The wall clock (0 if it is before 1970).
    pub fn system() -> Self {
        SandboxClock::new(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .unwrap_or(0)
        })
    }

    pub fn now_ms(&self) -> i64 {
        (self.0)()
    }

    pub fn now_secs(&self) -> i64 {
        self.now_ms().div_euclid(1000)
    }
}

impl std::fmt::Debug for SandboxClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SandboxClock({})", self.now_ms())
    }
}

/// Everything `start` needs. `Default` gives a sandbox suitable for demos.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Accepted `Authorization: Bearer` keys for the Stripe subset.
    pub stripe_api_keys: Vec<String>,
    /// Accepted `X-API-Key` values for the Adyen subset.
    pub adyen_api_keys: Vec<String>,
    /// `pm_sluice_commit_then_timeout`: how long the committed answer is withheld.
    pub timeout_hold: Duration,
    /// `pm_sluice_slow`: how long before the request is processed and answered.
    pub slow_delay: Duration,
    /// `pm_sluice_late_webhook_only` and pending refunds settle after this long.
    /// None: only when `settle_pending` is called.
    pub late_webhook_delay: Option<Duration>,
    /// Seed for ids and reordering; None draws one from the OS.
    pub seed: Option<u64>,
    pub idempotency_scope: IdempotencyScope,
    pub delivery: DeliveryFaults,
    pub retry: RetryPolicy,
    pub refund_behaviour: RefundBehaviour,
    /// Connector name → target, installed at start.
    pub webhook_targets: BTreeMap<String, WebhookTarget>,
    /// How long every Stripe-format lookup (retrieve or search of a
    /// PaymentIntent) takes before it answers; zero answers at once. Makes
    /// overlapping queries observable in [`crate::QueryRecord`]s.
    pub query_delay: Duration,
    pub clock: SandboxClock,
    /// Keep webhooks instead of sending them: each signed request waits in
    /// [`crate::SandboxHandle::take_webhooks`] for the caller (the simulator)
    /// to deliver, duplicate, reorder or drop. Delivery faults and retries
    /// then are the caller's.
    pub capture_webhooks: bool,
    /// How many webhook requests may be in flight at once (1..=64, clamped).
    /// 1 sends them one after another, in order; more lets them keep pace with
    /// a gateway under load, as a PSP that delivers concurrently does, and
    /// arrive in any order.
    pub webhook_senders: usize,
}

/// The Stripe key a default sandbox accepts.
pub const DEFAULT_STRIPE_API_KEY: &str = "sk_test_sluice_sandbox";
/// The Adyen key a default sandbox accepts.
pub const DEFAULT_ADYEN_API_KEY: &str = "sluice_sandbox_adyen_key";

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            port: 0,
            stripe_api_keys: vec![DEFAULT_STRIPE_API_KEY.to_owned()],
            adyen_api_keys: vec![DEFAULT_ADYEN_API_KEY.to_owned()],
            timeout_hold: Duration::from_secs(30),
            slow_delay: Duration::from_secs(3),
            late_webhook_delay: Some(Duration::from_secs(5)),
            seed: None,
            idempotency_scope: IdempotencyScope::PerApiKey,
            delivery: DeliveryFaults::default(),
            retry: RetryPolicy::default(),
            refund_behaviour: RefundBehaviour::Succeed,
            webhook_targets: BTreeMap::new(),
            query_delay: Duration::ZERO,
            clock: SandboxClock::system(),
            capture_webhooks: false,
            webhook_senders: 1,
        }
    }
}

/// Durations travel as integer milliseconds in the control API's JSON.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}
