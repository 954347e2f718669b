//! A small keyed token bucket for the webhook route, and the webhook counters.
//!
//! Keyed by `adapter/connector_account`, so one noisy (or hostile) sender
//! cannot starve the webhooks of every other account. The number of keys is
//! bounded: when the table is full, idle buckets are dropped, and if none is
//! idle new keys share one overflow bucket.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, Opts, Registry};

/// How fast a key may send: a burst, refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub burst: u32,
    pub per_second: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            burst: 200,
            per_second: 100,
        }
    }
}

/// Tokens are counted in thousandths so refills need no floats.
const MILLI: u64 = 1000;
const MAX_KEYS: usize = 10_000;
const OVERFLOW_KEY: &str = "\u{0}overflow";

#[derive(Debug, Clone, Copy)]
struct Bucket {
    milli_tokens: u64,
    last: Instant,
}

#[derive(Debug)]
pub struct KeyedRateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl KeyedRateLimiter {
    pub fn new(limit: RateLimit) -> Self {
        KeyedRateLimiter {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Take one token for `key`; on refusal, how long until one is available.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let capacity = u64::from(self.limit.burst.max(1)) * MILLI;
        let rate = u64::from(self.limit.per_second.max(1));
        // A poisoned lock only means another request panicked mid-update; the
        // map of counters is still usable.
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(key) && buckets.len() >= MAX_KEYS {
            buckets.retain(|_, b| refilled(b, now, rate, capacity) < capacity);
        }
        let key = if buckets.contains_key(key) || buckets.len() < MAX_KEYS {
            key
        } else {
            OVERFLOW_KEY
        };
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            milli_tokens: capacity,
            last: now,
        });
        bucket.milli_tokens = refilled(bucket, now, rate, capacity);
        bucket.last = now;
        if bucket.milli_tokens >= MILLI {
            bucket.milli_tokens -= MILLI;
            Ok(())
        } else {
            let missing = MILLI - bucket.milli_tokens;
            Err(Duration::from_millis(missing.div_ceil(rate)))
        }
    }
}

fn refilled(bucket: &Bucket, now: Instant, rate: u64, capacity: u64) -> u64 {
    let elapsed_ms = now.saturating_duration_since(bucket.last).as_millis();
    let added = u64::try_from(elapsed_ms)
        .unwrap_or(u64::MAX)
        .saturating_mul(rate);
    bucket.milli_tokens.saturating_add(added).min(capacity)
}

/// Why a webhook delivery ended as it did: the `outcome` label of
/// `sluice_webhooks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookOutcomeLabel {
    Accepted,
    Duplicate,
    RejectedBadSignature,
    RejectedStaleTimestamp,
    RejectedMalformed,
    RejectedUnsupported,
    NotFound,
    RateLimited,
    /// The adapter runtime's bulkhead refused the verification call (503, retried).
    Shed,
    Error,
}

impl WebhookOutcomeLabel {
    pub const ALL: [WebhookOutcomeLabel; 10] = [
        WebhookOutcomeLabel::Accepted,
        WebhookOutcomeLabel::Duplicate,
        WebhookOutcomeLabel::RejectedBadSignature,
        WebhookOutcomeLabel::RejectedStaleTimestamp,
        WebhookOutcomeLabel::RejectedMalformed,
        WebhookOutcomeLabel::RejectedUnsupported,
        WebhookOutcomeLabel::NotFound,
        WebhookOutcomeLabel::RateLimited,
        WebhookOutcomeLabel::Shed,
        WebhookOutcomeLabel::Error,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            WebhookOutcomeLabel::Accepted => "accepted",
            WebhookOutcomeLabel::Duplicate => "duplicate",
            WebhookOutcomeLabel::RejectedBadSignature => "rejected_bad_signature",
            WebhookOutcomeLabel::RejectedStaleTimestamp => "rejected_stale_timestamp",
            WebhookOutcomeLabel::RejectedMalformed => "rejected_malformed",
            WebhookOutcomeLabel::RejectedUnsupported => "rejected_unsupported",
            WebhookOutcomeLabel::NotFound => "not_found",
            WebhookOutcomeLabel::RateLimited => "rate_limited",
            WebhookOutcomeLabel::Shed => "shed",
            WebhookOutcomeLabel::Error => "error",
        }
    }
}

/// Counters of the webhook route: `sluice_webhooks_total{outcome}`, to be
/// registered in the server's Prometheus registry.
#[derive(Debug, Clone)]
pub struct WebhookMetrics {
    deliveries: IntCounterVec,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A copy of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WebhookCounts {
    pub accepted: u64,
    pub duplicates: u64,
    pub rejected_bad_signature: u64,
    pub rejected_stale_timestamp: u64,
    pub rejected_malformed: u64,
    pub rejected_unsupported: u64,
    pub not_found: u64,
    pub rate_limited: u64,
    pub errors: u64,
}

impl WebhookCounts {
    /// Every verification failure, whatever its kind.
    pub fn rejected(&self) -> u64 {
        self.rejected_bad_signature
            + self.rejected_stale_timestamp
            + self.rejected_malformed
            + self.rejected_unsupported
    }
}

impl WebhookMetrics {
    pub fn new() -> Self {
        let deliveries = IntCounterVec::new(
            Opts::new(
                "sluice_webhooks_total",
                "PSP webhook deliveries by outcome.",
            ),
            &["outcome"],
        )
        // The name, help and label are constants that prometheus accepts.
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}"));
        for outcome in WebhookOutcomeLabel::ALL {
            deliveries.with_label_values(&[outcome.as_str()]);
        }
        WebhookMetrics { deliveries }
    }

    /// Add the counters to `registry` (once per registry).
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.deliveries.clone()))
    }

    pub fn count(&self, outcome: WebhookOutcomeLabel) {
        self.deliveries.with_label_values(&[outcome.as_str()]).inc();
    }

    fn get(&self, outcome: WebhookOutcomeLabel) -> u64 {
        self.deliveries.with_label_values(&[outcome.as_str()]).get()
    }

    pub fn snapshot(&self) -> WebhookCounts {
        use WebhookOutcomeLabel as O;
        WebhookCounts {
            accepted: self.get(O::Accepted),
            duplicates: self.get(O::Duplicate),
            rejected_bad_signature: self.get(O::RejectedBadSignature),
            rejected_stale_timestamp: self.get(O::RejectedStaleTimestamp),
            rejected_malformed: self.get(O::RejectedMalformed),
            rejected_unsupported: self.get(O::RejectedUnsupported),
            not_found: self.get(O::NotFound),
            rate_limited: self.get(O::RateLimited),
            errors: self.get(O::Error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_allowed_then_refused_until_refilled() {
        let limiter = KeyedRateLimiter::new(RateLimit {
            burst: 3,
            per_second: 10,
        });
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limiter.check("stripe/ca_1", t0).is_ok());
        }
        let wait = limiter.check("stripe/ca_1", t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        assert!(
            limiter.check("stripe/ca_2", t0).is_ok(),
            "keys are independent"
        );
        assert!(limiter
            .check("stripe/ca_1", t0 + Duration::from_millis(100))
            .is_ok());
        assert!(limiter
            .check("stripe/ca_1", t0 + Duration::from_millis(100))
            .is_err());
    }

    #[test]
    fn webhook_counters_are_exported_under_one_name_with_an_outcome_label() {
        let metrics = WebhookMetrics::new();
        metrics.count(WebhookOutcomeLabel::RejectedBadSignature);
        metrics.count(WebhookOutcomeLabel::RejectedBadSignature);
        let registry = Registry::new();
        metrics.register(&registry).unwrap();
        let families = registry.gather();
        assert_eq!(families.len(), 1);
        assert_eq!(families[0].name(), "sluice_webhooks_total");
        assert_eq!(
            families[0].get_metric().len(),
            WebhookOutcomeLabel::ALL.len()
        );
        assert_eq!(metrics.snapshot().rejected_bad_signature, 2);
        assert_eq!(metrics.snapshot().rejected(), 2);
    }

    #[test]
    fn the_key_table_is_bounded() {
        let limiter = KeyedRateLimiter::new(RateLimit {
            burst: 1,
            per_second: 1,
        });
        let t0 = Instant::now();
        for i in 0..(MAX_KEYS + 50) {
            let _ = limiter.check(&format!("k{i}"), t0);
        }
        let size = limiter.buckets.lock().unwrap().len();
        assert!(size <= MAX_KEYS + 1, "{size}");
    }
}
