//! A small keyed token bucket for the webhook route, and the webhook counters.
//!
//! Keyed by `adapter/connector_account`, so one noisy (or hostile) sender
//! cannot starve the webhooks of every other account. Each key's bucket has
//! the limit of its connector account: the gateway-wide default
//! (`[webhooks]` in `sluice.toml`) with the account's config keys
//! `webhook_burst` / `webhook_per_second` on top ([`RateLimit::for_account`]).
//! The limit lives in the bucket with the time it was read, so the route reads
//! an account's config at most once per refresh interval, not per webhook.
//! The number of keys is bounded: when the table is full, idle buckets are
//! dropped, and if none is idle new keys share one overflow bucket at the
//! default limit.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use prometheus::{IntCounterVec, Opts, Registry};

/// How fast a key may send: a burst, refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub burst: u32,
    pub per_second: u32,
}

/// Sized from the measured ingest rate (BENCHMARKS.md, issue 17): the 2-core
/// reference machine keeps 4,800 to 7,200 verified webhooks a second in the
/// inbox on PostgreSQL (16 and 32 senders), so one account may by default
/// take a fifth to a seventh of that for as long as it likes and twice that
/// at once (a PSP's catch-up after its own outage), and a few flooding
/// accounts still leave room for the others. An account with more traffic
/// gets its own keys.
impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            burst: 2_000,
            per_second: 1_000,
        }
    }
}

/// How long the webhook route uses a limit read from a connector account
/// before reading it again (`ApiConfig::webhook_limit_refresh`): a change
/// made through another gateway instance reaches this one within it, and an
/// account's config is read at most this often, never per webhook.
pub const WEBHOOK_LIMIT_REFRESH: Duration = Duration::from_secs(10);

/// Largest webhook burst or rate a gateway or a connector account may set
/// (the bucket counts in u64 thousandths, so this stays far from overflow).
pub const MAX_WEBHOOK_RATE: u32 = 1_000_000;
/// The connector account's config key overriding the default burst.
pub const WEBHOOK_BURST_KEY: &str = "webhook_burst";
/// The connector account's config key overriding the default refill per second.
pub const WEBHOOK_PER_SECOND_KEY: &str = "webhook_per_second";
/// [`parse_rate`] as a regular expression, for the OpenAPI document.
pub const RATE_PATTERN: &str = "^([1-9][0-9]{0,5}|1000000)$";

/// A config value of [`WEBHOOK_BURST_KEY`] or [`WEBHOOK_PER_SECOND_KEY`]: a
/// whole number from 1 to [`MAX_WEBHOOK_RATE`] in plain decimal digits (no
/// sign, space or leading zero, exactly [`RATE_PATTERN`]).
pub fn parse_rate(value: &str) -> Option<u32> {
    let digits_only = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    // Seven digits at most, so the parse cannot overflow before the range check.
    if !digits_only || value.starts_with('0') || value.len() > 7 {
        return None;
    }
    value
        .parse::<u32>()
        .ok()
        .filter(|v| (1..=MAX_WEBHOOK_RATE).contains(v))
}

/// The first webhook limit key of a connector account's config whose value
/// [`parse_rate`] refuses, for the admin API's 400.
pub fn invalid_rate_key(config: &BTreeMap<String, String>) -> Option<&'static str> {
    [WEBHOOK_BURST_KEY, WEBHOOK_PER_SECOND_KEY]
        .into_iter()
        .find(|key| config.get(*key).is_some_and(|v| parse_rate(v).is_none()))
}

impl RateLimit {
    /// `default` with the connector account's own `webhook_burst` and
    /// `webhook_per_second` on top, each on its own. A stored value the admin
    /// API would refuse (written before it checked) keeps the default.
    pub fn for_account(default: RateLimit, config: &serde_json::Value) -> RateLimit {
        let key = |name: &str| config.get(name)?.as_str().and_then(parse_rate);
        RateLimit {
            burst: key(WEBHOOK_BURST_KEY).unwrap_or(default.burst),
            per_second: key(WEBHOOK_PER_SECOND_KEY).unwrap_or(default.per_second),
        }
    }

    /// The bucket's size in thousandths of a token.
    fn capacity(&self) -> u64 {
        u64::from(self.burst.max(1)) * MILLI
    }

    /// Thousandths of a token added per millisecond.
    fn rate(&self) -> u64 {
        u64::from(self.per_second.max(1))
    }
}

/// The key of a webhook route's bucket.
pub fn limit_key(adapter: &str, connector_account: &str) -> String {
    format!("{adapter}/{connector_account}")
}

/// At most one log line per key in this interval says how many webhooks were refused.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Tokens are counted in thousandths so refills need no floats.
const MILLI: u64 = 1000;
const MAX_KEYS: usize = 10_000;
const OVERFLOW_KEY: &str = "\u{0}overflow";

#[derive(Debug, Clone, Copy)]
struct Bucket {
    milli_tokens: u64,
    last: Instant,
    limit: RateLimit,
    /// When `limit` was read from the connector account; None: never (the
    /// default was assumed), so the next webhook reads it.
    limit_read: Option<Instant>,
    /// Refusals since the last one logged, and when that was.
    refused: u64,
    refusal_logged: Option<Instant>,
}

impl Bucket {
    /// Bring the tokens up to `now` under the bucket's current limit.
    fn refill(&mut self, now: Instant) {
        self.milli_tokens = refilled(self, now);
        self.last = now;
    }

    /// Re-size to `limit`, keeping what was spent: the tokens used from the
    /// old burst are used from the new one too. A raise adds its headroom at
    /// once (an operator raises a limit during a PSP's catch-up burst); a cut
    /// leaves at most the new burst, and nothing while more was spent.
    fn resize(&mut self, limit: RateLimit) {
        let spent = self.limit.capacity().saturating_sub(self.milli_tokens);
        self.milli_tokens = limit.capacity().saturating_sub(spent);
        self.limit = limit;
    }
}

/// How long a refused webhook waits for its 429, and how many may wait at once.
///
/// A sender that ignores `Retry-After` and sends again the moment it is refused (a
/// PSP's retry loop after its outage, or a flood) would otherwise get tens of
/// thousands of refusals a second, each costing the gateway parsing, routing and a
/// response, and take the CPU every other tenant's payments need. Held for `hold`,
/// such a sender makes at most one request per connection per `hold`; a held refusal
/// costs a timer and an open connection, no CPU. At most `max_held` refusals wait at
/// a time; beyond that they are answered at once, so memory stays bounded too. A
/// zero `hold` answers every refusal at once.
#[derive(Debug)]
pub struct RefusalHold {
    hold: Duration,
    slots: Arc<Semaphore>,
}

/// Default of [`RefusalHold`]'s `hold`.
pub const REFUSAL_HOLD: Duration = Duration::from_millis(250);
/// Longest `hold` a configuration may set: a PSP waits this long for its answer.
pub const MAX_REFUSAL_HOLD: Duration = Duration::from_secs(5);
/// Refusals held at once, at most.
pub const MAX_HELD_REFUSALS: usize = 4096;

impl RefusalHold {
    pub fn new(hold: Duration, max_held: usize) -> Self {
        RefusalHold {
            hold: hold.min(MAX_REFUSAL_HOLD),
            slots: Arc::new(Semaphore::new(max_held.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// Wait out the hold before a refusal is answered, if a hold slot is free.
    pub async fn wait(&self) {
        let Some(_slot) = self.try_slot() else {
            return;
        };
        tokio::time::sleep(self.hold).await;
    }

    /// How long a held refusal waits.
    pub fn hold(&self) -> Duration {
        self.hold
    }

    /// A slot to hold one refusal in; None: answer at once.
    fn try_slot(&self) -> Option<OwnedSemaphorePermit> {
        if self.hold.is_zero() {
            return None;
        }
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }
}

#[derive(Debug)]
pub struct KeyedRateLimiter {
    default: RateLimit,
    refresh: Duration,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl KeyedRateLimiter {
    /// Buckets of `default` until an account's own limit is read; a limit
    /// read is used for `refresh`, then read again.
    pub fn new(default: RateLimit, refresh: Duration) -> Self {
        KeyedRateLimiter {
            default,
            refresh,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// The gateway-wide limit, for keys whose account sets none.
    pub fn default_limit(&self) -> RateLimit {
        self.default
    }

    /// Whether `key` has a limit read less than the refresh interval ago, so
    /// [`Self::check`] needs no read of the account.
    pub fn has_fresh_limit(&self, key: &str, now: Instant) -> bool {
        self.lock().get(key).is_some_and(|b| {
            b.limit_read
                .is_some_and(|read| now.saturating_duration_since(read) < self.refresh)
        })
    }

    /// Take one token for `key` under the limit its bucket has (the default
    /// for a new key); on refusal, how long until one is available.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), Duration> {
        self.take(key, None, now)
    }

    /// [`Self::check`] with `limit` just read from the key's account: the
    /// bucket is re-sized to it and it is fresh for the refresh interval.
    pub fn check_read(&self, key: &str, limit: RateLimit, now: Instant) -> Result<(), Duration> {
        self.take(key, Some(limit), now)
    }

    /// An account's limit changed here (the admin API): a bucket of `key` is
    /// re-sized now, so new requests get it without waiting for a refresh.
    /// Without a bucket nothing is kept: its first webhook reads the account.
    pub fn set_limit(&self, key: &str, limit: RateLimit, now: Instant) {
        if let Some(bucket) = self.lock().get_mut(key) {
            bucket.refill(now);
            bucket.resize(limit);
            bucket.limit_read = Some(now);
        }
    }

    fn take(&self, key: &str, read: Option<RateLimit>, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.lock();
        if !buckets.contains_key(key) && buckets.len() >= MAX_KEYS {
            buckets.retain(|_, b| refilled(b, now) < b.limit.capacity());
        }
        let (key, read) = if buckets.contains_key(key) || buckets.len() < MAX_KEYS {
            (key, read)
        } else {
            // The shared overflow bucket never takes one account's limit.
            (OVERFLOW_KEY, None)
        };
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            milli_tokens: read.unwrap_or(self.default).capacity(),
            last: now,
            limit: read.unwrap_or(self.default),
            limit_read: None,
            refused: 0,
            refusal_logged: None,
        });
        bucket.refill(now);
        if let Some(limit) = read {
            bucket.resize(limit);
            bucket.limit_read = Some(now);
        }
        if bucket.milli_tokens >= MILLI {
            bucket.milli_tokens -= MILLI;
            Ok(())
        } else {
            let missing = MILLI - bucket.milli_tokens;
            Err(Duration::from_millis(missing.div_ceil(bucket.limit.rate())))
        }
    }

    /// Count a refusal of `key`; Some(refusals since the last log line) when one is
    /// due: the first refusal, then at most one line per [`REFUSAL_LOG_EVERY`]. A
    /// flood of refused webhooks must not cost a log line each.
    pub fn note_refusal(&self, key: &str, now: Instant) -> Option<u64> {
        let mut buckets = self.lock();
        // A key refused in the shared overflow bucket is counted there.
        let key = if buckets.contains_key(key) {
            key
        } else {
            OVERFLOW_KEY
        };
        let bucket = buckets.get_mut(key)?;
        bucket.refused = bucket.refused.saturating_add(1);
        let due = bucket
            .refusal_logged
            .is_none_or(|at| now.saturating_duration_since(at) >= REFUSAL_LOG_EVERY);
        if !due {
            return None;
        }
        bucket.refusal_logged = Some(now);
        Some(std::mem::take(&mut bucket.refused))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bucket>> {
        // A poisoned lock only means another request panicked mid-update; the
        // map of counters is still usable.
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn refilled(bucket: &Bucket, now: Instant) -> u64 {
    let elapsed_ms = now.saturating_duration_since(bucket.last).as_millis();
    let added = u64::try_from(elapsed_ms)
        .unwrap_or(u64::MAX)
        .saturating_mul(bucket.limit.rate());
    bucket
        .milli_tokens
        .saturating_add(added)
        .min(bucket.limit.capacity())
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

    const REFRESH: Duration = Duration::from_secs(10);

    fn limit(burst: u32, per_second: u32) -> RateLimit {
        RateLimit { burst, per_second }
    }

    /// Take tokens for `key` until refused; how many were granted.
    fn drain(limiter: &KeyedRateLimiter, key: &str, now: Instant) -> u32 {
        let mut granted = 0;
        while limiter.check(key, now).is_ok() {
            granted += 1;
            assert!(granted <= MAX_WEBHOOK_RATE, "never refused");
        }
        granted
    }

    #[test]
    fn a_burst_is_allowed_then_refused_until_refilled() {
        let limiter = KeyedRateLimiter::new(
            RateLimit {
                burst: 3,
                per_second: 10,
            },
            REFRESH,
        );
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
        let limiter = KeyedRateLimiter::new(
            RateLimit {
                burst: 1,
                per_second: 1,
            },
            REFRESH,
        );
        let t0 = Instant::now();
        for i in 0..(MAX_KEYS + 50) {
            let _ = limiter.check(&format!("k{i}"), t0);
        }
        let size = limiter.buckets.lock().unwrap().len();
        assert!(size <= MAX_KEYS + 1, "{size}");
    }

    #[test]
    fn each_key_is_held_to_the_limit_read_for_its_own_account() {
        let limiter = KeyedRateLimiter::new(limit(2, 1), REFRESH);
        let t0 = Instant::now();
        assert!(limiter.check_read("a/ca_big", limit(50, 1), t0).is_ok());
        assert_eq!(drain(&limiter, "a/ca_big", t0), 49);
        assert!(limiter.check_read("a/ca_small", limit(1, 1), t0).is_ok());
        assert_eq!(drain(&limiter, "a/ca_small", t0), 0);
        assert_eq!(drain(&limiter, "a/ca_default", t0), 2);
        // The refill is the account's too: 20/s refills one token in 50 ms.
        assert!(limiter.check_read("a/ca_fast", limit(1, 20), t0).is_ok());
        let wait = limiter.check("a/ca_fast", t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(50));
        assert!(limiter.check("a/ca_fast", t0 + wait).is_ok());
    }

    #[test]
    fn a_raised_limit_adds_its_headroom_at_once_and_a_cut_never_grants_more_than_the_new_burst() {
        let limiter = KeyedRateLimiter::new(limit(10, 1), REFRESH);
        let t0 = Instant::now();
        assert_eq!(drain(&limiter, "k", t0), 10);
        // Raised from 10 to 25 with all 10 spent: 15 more at once.
        limiter.set_limit("k", limit(25, 1), t0);
        assert_eq!(drain(&limiter, "k", t0), 15);
        // A fresh bucket of 100 with 5 spent, cut to 20: 15 left, never 20 more.
        assert!(limiter.check_read("j", limit(100, 1), t0).is_ok());
        for _ in 0..4 {
            assert!(limiter.check("j", t0).is_ok());
        }
        limiter.set_limit("j", limit(20, 1), t0);
        assert_eq!(drain(&limiter, "j", t0), 15);
        // Cut below what was spent: nothing until it refills.
        assert!(limiter.check_read("i", limit(100, 1), t0).is_ok());
        limiter.set_limit("i", limit(1, 1), t0);
        assert_eq!(drain(&limiter, "i", t0), 0);
        assert_eq!(drain(&limiter, "i", t0 + Duration::from_secs(5)), 1);
    }

    #[test]
    fn an_unchanged_limit_read_again_changes_nothing() {
        let limiter = KeyedRateLimiter::new(limit(10, 1), REFRESH);
        let t0 = Instant::now();
        assert!(limiter.check_read("k", limit(5, 1), t0).is_ok());
        assert!(limiter.check_read("k", limit(5, 1), t0).is_ok());
        assert_eq!(drain(&limiter, "k", t0), 3);
    }

    #[test]
    fn a_limit_read_is_fresh_for_the_refresh_interval_and_then_read_again() {
        let limiter = KeyedRateLimiter::new(limit(10, 1), REFRESH);
        let t0 = Instant::now();
        assert!(!limiter.has_fresh_limit("k", t0), "never read");
        assert!(limiter.check("k", t0).is_ok());
        assert!(
            !limiter.has_fresh_limit("k", t0),
            "the default was assumed, not read"
        );
        assert!(limiter.check_read("k", limit(5, 1), t0).is_ok());
        assert!(limiter.has_fresh_limit("k", t0 + REFRESH - Duration::from_millis(1)));
        assert!(!limiter.has_fresh_limit("k", t0 + REFRESH));
        // A change made here through the admin API is fresh from then on.
        limiter.set_limit("k", limit(6, 1), t0 + REFRESH);
        assert!(limiter.has_fresh_limit("k", t0 + REFRESH));
        // ... but is kept only by a bucket that exists.
        limiter.set_limit("new", limit(6, 1), t0);
        assert!(!limiter.has_fresh_limit("new", t0));
    }

    #[test]
    fn a_table_full_of_busy_keys_puts_new_keys_in_the_overflow_bucket_at_the_default() {
        let limiter = KeyedRateLimiter::new(limit(1, 1), REFRESH);
        let t0 = Instant::now();
        for i in 0..MAX_KEYS {
            assert!(limiter.check(&format!("k{i}"), t0).is_ok());
        }
        // Every bucket is spent, so none is idle: the newcomer's own limit is not applied.
        assert!(limiter.check_read("big", limit(100, 1), t0).is_ok());
        assert!(limiter.check("big", t0).is_err());
        assert!(!limiter.has_fresh_limit("big", t0));
        assert_eq!(limiter.buckets.lock().unwrap().len(), MAX_KEYS + 1);
    }

    #[test]
    fn a_connector_account_overrides_the_default_limit_key_by_key() {
        let default = limit(200, 100);
        let own = serde_json::json!({"webhook_burst": "5000", "base_url": "https://psp"});
        assert_eq!(RateLimit::for_account(default, &own), limit(5000, 100));
        let both = serde_json::json!({"webhook_burst": "1", "webhook_per_second": "1000000"});
        assert_eq!(RateLimit::for_account(default, &both), limit(1, 1_000_000));
        let stale = serde_json::json!({"webhook_burst": "0", "webhook_per_second": 7});
        assert_eq!(RateLimit::for_account(default, &stale), default);
        assert_eq!(
            RateLimit::for_account(default, &serde_json::json!({})),
            default
        );
    }

    #[test]
    fn a_webhook_rate_is_a_plain_whole_number_from_one_to_a_million_exactly_as_its_pattern_says() {
        let pattern = regex::Regex::new(RATE_PATTERN).unwrap();
        let cases = [
            "1",
            "9",
            "10",
            "200",
            "999999",
            "1000000",
            "0",
            "00",
            "01",
            "1000001",
            "9999999",
            "10000000",
            "99999999999999999999",
            "",
            " 1",
            "1 ",
            "+1",
            "-1",
            "1.0",
            "1e3",
            "abc",
            "\u{0661}",
        ];
        for case in cases {
            let parsed = parse_rate(case);
            assert_eq!(parsed.is_some(), pattern.is_match(case), "{case:?}");
            if let Some(v) = parsed {
                assert_eq!(v.to_string(), case);
            }
        }
        assert_eq!(parse_rate("1000000"), Some(MAX_WEBHOOK_RATE));
        let mut config = BTreeMap::new();
        config.insert("webhook_per_second".to_owned(), "0".to_owned());
        assert_eq!(invalid_rate_key(&config), Some(WEBHOOK_PER_SECOND_KEY));
        config.insert("webhook_per_second".to_owned(), "10".to_owned());
        config.insert("unrelated".to_owned(), "0".to_owned());
        assert_eq!(invalid_rate_key(&config), None);
    }

    #[test]
    fn a_flood_of_refusals_is_logged_once_then_once_per_interval_with_its_count() {
        let limiter = KeyedRateLimiter::new(limit(1, 1), REFRESH);
        let t0 = Instant::now();
        assert!(limiter.check("a/ca_flood", t0).is_ok());
        assert!(limiter.check("a/ca_flood", t0).is_err());
        assert_eq!(limiter.note_refusal("a/ca_flood", t0), Some(1), "the first");
        for _ in 0..999 {
            assert_eq!(limiter.note_refusal("a/ca_flood", t0), None);
        }
        let later = t0 + REFUSAL_LOG_EVERY;
        assert_eq!(
            limiter.note_refusal("a/ca_flood", later),
            Some(1_000),
            "one line for the 999 held back and this one"
        );
        assert_eq!(
            limiter.note_refusal("a/ca_other", t0),
            None,
            "no bucket: nothing refused"
        );
    }

    #[test]
    fn at_most_max_held_refusals_wait_at_once_and_each_slot_comes_back() {
        let hold = RefusalHold::new(Duration::from_millis(250), 2);
        let first = hold.try_slot().expect("a slot");
        let second = hold.try_slot().expect("a second slot");
        assert!(hold.try_slot().is_none(), "the third is answered at once");
        drop(first);
        assert!(
            hold.try_slot().is_some(),
            "a slot comes back when its wait ends"
        );
        drop(second);
    }

    #[test]
    fn a_zero_hold_holds_nothing_and_a_longer_one_than_allowed_is_capped() {
        assert!(RefusalHold::new(Duration::ZERO, 10).try_slot().is_none());
        assert_eq!(
            RefusalHold::new(Duration::from_secs(3600), 10).hold(),
            MAX_REFUSAL_HOLD
        );
    }
}
