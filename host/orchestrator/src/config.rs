//! How the orchestrator is tuned. Every duration is a budget, never "wait forever".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::fulfillment::{FulfillmentTransport, HttpFulfillmentTransport};

/// Orchestrator settings.
#[derive(Debug, Clone)]
pub struct OrchestratorConfig {
    /// How long a merchant request waits for the PSP's outcome before it is
    /// answered with the current (processing) view; the call goes on in the
    /// background.
    pub sync_wait: Duration,
    /// Default budget for one PSP call (connect, send, answer, body). A
    /// connector account may set its own with the config key `timeout_ms`.
    pub psp_timeout: Duration,
    /// The largest PSP response body the host reads.
    pub max_response_bytes: usize,
    /// A SUBMITTED / PROCESSING aggregate whose last PSP call is younger than
    /// its call budget plus this grace is still being handled by whoever sent
    /// it; an API trigger then waits instead of querying.
    pub in_flight_grace: Duration,
    pub inbox: InboxConfig,
    /// Recovery facts of each adapter's protocol, by adapter name (a
    /// connector account may override them with its own config keys, see
    /// [`ConnectorRecovery`]). An adapter not named has neither.
    pub adapter_recovery: BTreeMap<String, ConnectorRecovery>,
    /// When a connector account's (or an adapter's) breaker opens and for
    /// how long routing then skips it for new attempts.
    pub breaker: sluice_core::BreakerPolicy,
    /// PSP calls in flight per connector account, and the share only
    /// queries may use (a connector account may set its own, see
    /// [`crate::CallLimits::for_account`]).
    pub call_limits: crate::CallLimits,
    /// How pull-mode fulfillment calls reach a merchant's business: HTTP
    /// by default; a simulation puts its simulated business here.
    pub fulfillment_transport: Arc<dyn FulfillmentTransport>,
}

/// What recovery may rely on for one connector: data about the PSP's
/// protocol, set per adapter (`[adapters.<name>]` in `sluice.toml`) and per
/// connector account (config keys `resend_window_ms`,
/// `authorization_validity_ms`, which win). Never inferred from an adapter's
/// name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectorRecovery {
    /// How long the PSP honours an idempotency key, less a safety margin
    /// (Stripe-format: 24 h). Within it, an attempt whose query proved the
    /// PSP has no such payment is re-sent with the same key
    /// (`sluice_core::decide_resend`). None: never re-sent.
    pub resend_window: Option<Duration>,
    /// How long the PSP holds an authorization. None: the scanner's default
    /// (`RecoveryPolicy::authorization_validity_ms`, 7 days).
    pub authorization_validity: Option<Duration>,
}

impl ConnectorRecovery {
    /// The adapter's defaults with the connector account's own keys on top.
    pub fn for_account(
        defaults: Option<&ConnectorRecovery>,
        account_config: &BTreeMap<String, String>,
    ) -> ConnectorRecovery {
        let defaults = defaults.copied().unwrap_or_default();
        let key = |name: &str| {
            account_config
                .get(name)
                .and_then(|ms| ms.trim().parse::<u64>().ok())
                .map(Duration::from_millis)
        };
        ConnectorRecovery {
            resend_window: key("resend_window_ms").or(defaults.resend_window),
            authorization_validity: key("authorization_validity_ms")
                .or(defaults.authorization_validity),
        }
    }

    pub fn resend_window_ms(&self) -> Option<i64> {
        self.resend_window.map(millis)
    }

    pub fn authorization_validity_ms(&self) -> Option<i64> {
        self.authorization_validity.map(millis)
    }
}

impl Default for OrchestratorConfig {
    fn default() -> Self {
        OrchestratorConfig {
            sync_wait: Duration::from_secs(5),
            psp_timeout: Duration::from_secs(15),
            max_response_bytes: 1 << 20,
            in_flight_grace: Duration::from_secs(2),
            inbox: InboxConfig::default(),
            adapter_recovery: BTreeMap::new(),
            breaker: sluice_core::BreakerPolicy::default(),
            call_limits: crate::CallLimits::default(),
            fulfillment_transport: Arc::new(HttpFulfillmentTransport::default()),
        }
    }
}

/// Settings of the asynchronous inbox processor.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    /// How many inbox rows one round claims.
    pub batch_size: i64,
    /// How long a claim holds a row before another processor may take it
    /// (a processor that crashed mid-row).
    pub lease: Duration,
    /// After this many failed tries an event is quarantined for an operator.
    pub max_tries: i64,
    /// Delay before the first retry; doubles per try up to `retry_cap`.
    pub retry_base: Duration,
    pub retry_cap: Duration,
    /// How long the processor loop sleeps when a round found nothing to do.
    pub idle_poll: Duration,
}

impl Default for InboxConfig {
    fn default() -> Self {
        InboxConfig {
            batch_size: 50,
            lease: Duration::from_secs(60),
            max_tries: 8,
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(300),
            idle_poll: Duration::from_millis(250),
        }
    }
}

impl InboxConfig {
    /// The delay before try `tries + 1`, after `tries` failed ones.
    pub fn retry_delay(&self, tries: i64) -> Duration {
        let exponent = u32::try_from(tries.saturating_sub(1).clamp(0, 20)).unwrap_or(20);
        self.retry_base
            .saturating_mul(2u32.saturating_pow(exponent))
            .min(self.retry_cap)
    }
}

pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbox_retries_back_off_exponentially_up_to_the_cap() {
        let config = InboxConfig::default();
        assert_eq!(config.retry_delay(1), Duration::from_secs(1));
        assert_eq!(config.retry_delay(2), Duration::from_secs(2));
        assert_eq!(config.retry_delay(4), Duration::from_secs(8));
        assert_eq!(config.retry_delay(40), Duration::from_secs(300));
        assert_eq!(config.retry_delay(0), Duration::from_secs(1));
    }
}
