//! How the orchestrator is tuned. Every duration is a budget, never "wait forever".

use std::time::Duration;

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
}

impl Default for OrchestratorConfig {
    fn default() -> Self {
        OrchestratorConfig {
            sync_wait: Duration::from_secs(5),
            psp_timeout: Duration::from_secs(15),
            max_response_bytes: 1 << 20,
            in_flight_grace: Duration::from_secs(2),
            inbox: InboxConfig::default(),
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
