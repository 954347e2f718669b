//! The recovery scanner's retry budget per PSP (issue 13; seed 000 §15): a
//! token bucket over the caller's clock, so that after an outage the backlog
//! of rows due for a query reaches the PSP at a bounded rate instead of as a
//! second flood. Pure: the caller passes `now` and the jitter; tokens are
//! integer milli-tokens, no floats in the bucket itself.
//!
//! A row the bucket refuses is never dropped: [`defer_delay_ms`] says how
//! far to push its next look, spread by its place in the queue of refused
//! rows and by the caller's jitter, so the backlog comes back at about the
//! bucket's own rate.

/// How fast recovery may contact one PSP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudgetPolicy {
    /// Contacts allowed at once after a quiet time.
    pub burst: u32,
    /// Contacts per second sustained. At least 1.
    pub per_second: u32,
    /// The longest a refused row is pushed out (before jitter).
    pub max_defer_ms: i64,
}

impl Default for RetryBudgetPolicy {
    fn default() -> Self {
        RetryBudgetPolicy {
            burst: 200,
            per_second: 50,
            max_defer_ms: 10 * 60 * 1000,
        }
    }
}

const MILLI: u64 = 1000;

/// One PSP's bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    policy: RetryBudgetPolicy,
    milli_tokens: u64,
    last_ms: i64,
}

impl TokenBucket {
    /// A full bucket at `now_ms`.
    pub fn new(policy: RetryBudgetPolicy, now_ms: i64) -> TokenBucket {
        TokenBucket {
            policy,
            milli_tokens: capacity(&policy),
            last_ms: now_ms,
        }
    }

    /// Take one token if there is one at `now_ms`.
    pub fn try_take(&mut self, now_ms: i64) -> bool {
        self.refill(now_ms);
        if self.milli_tokens < MILLI {
            return false;
        }
        self.milli_tokens -= MILLI;
        true
    }

    /// Whole tokens available at `now_ms` (without taking any).
    pub fn available(&mut self, now_ms: i64) -> u32 {
        self.refill(now_ms);
        u32::try_from(self.milli_tokens / MILLI).unwrap_or(u32::MAX)
    }

    pub fn policy(&self) -> RetryBudgetPolicy {
        self.policy
    }

    /// A clock that goes backwards adds nothing and is not remembered.
    fn refill(&mut self, now_ms: i64) {
        let elapsed = now_ms.saturating_sub(self.last_ms);
        if elapsed <= 0 {
            return;
        }
        let rate = u64::from(self.policy.per_second.max(1));
        let earned = u64::try_from(elapsed)
            .unwrap_or(u64::MAX)
            .saturating_mul(rate);
        self.milli_tokens = self
            .milli_tokens
            .saturating_add(earned)
            .min(capacity(&self.policy));
        self.last_ms = now_ms;
    }
}

fn capacity(policy: &RetryBudgetPolicy) -> u64 {
    u64::from(policy.burst.max(1)) * MILLI
}

/// How far to push the `queued`-th row (1-based) the bucket refused in one
/// round: the time the bucket needs to earn that many tokens, capped, plus
/// up to as much again by `jitter` (in `[0, 1)`), so refused rows neither
/// come back together nor before the budget could serve them. At least 1 ms.
pub fn defer_delay_ms(queued: u32, policy: &RetryBudgetPolicy, jitter: f64) -> i64 {
    let rate = i64::from(policy.per_second.max(1));
    // Rounded up: the k-th row never comes back before its token can exist.
    let base =
        ((i64::from(queued.max(1)) * 1000 + rate - 1) / rate).min(policy.max_defer_ms.max(1));
    let spread = (base as f64 * jitter.clamp(0.0, 1.0)) as i64;
    base.saturating_add(spread).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(burst: u32, per_second: u32) -> RetryBudgetPolicy {
        RetryBudgetPolicy {
            burst,
            per_second,
            ..RetryBudgetPolicy::default()
        }
    }

    #[test]
    fn a_full_bucket_serves_its_burst_then_refuses() {
        let mut bucket = TokenBucket::new(policy(3, 1), 0);
        assert!((0..3).all(|_| bucket.try_take(0)));
        assert!(!bucket.try_take(0));
        assert!(!bucket.try_take(999), "not a whole token yet");
        assert!(bucket.try_take(1000));
    }

    #[test]
    fn the_bucket_refills_at_its_rate_up_to_its_burst_and_ignores_a_clock_going_back() {
        let mut bucket = TokenBucket::new(policy(10, 4), 1_000);
        while bucket.try_take(1_000) {}
        assert_eq!(bucket.available(1_500), 2);
        assert_eq!(
            bucket.available(1_000),
            2,
            "backwards: nothing earned, nothing lost"
        );
        assert_eq!(bucket.available(1_000_000), 10, "never more than the burst");
    }

    #[test]
    fn over_an_outage_backlog_the_bucket_allows_no_more_than_burst_plus_rate_times_time() {
        let p = policy(20, 5);
        let mut bucket = TokenBucket::new(p, 0);
        // 10 000 rows due at once, offered every 100 ms for 60 s.
        let mut served = 0u32;
        for tick in 0..600 {
            for _ in 0..10_000 {
                if !bucket.try_take(tick * 100) {
                    break;
                }
                served += 1;
            }
        }
        assert!(served <= 20 + 5 * 60, "{served}");
        assert!(served >= 5 * 59, "{served}");
    }

    #[test]
    fn refused_rows_are_spread_over_the_time_the_bucket_needs_with_jitter_and_a_cap() {
        let p = policy(10, 10);
        assert_eq!(defer_delay_ms(1, &p, 0.0), 100);
        assert_eq!(defer_delay_ms(50, &p, 0.0), 5_000);
        assert_eq!(defer_delay_ms(50, &p, 0.5), 7_500);
        assert!(defer_delay_ms(50, &p, 0.999) < 10_000);
        let capped = defer_delay_ms(u32::MAX, &p, 0.0);
        assert_eq!(capped, p.max_defer_ms);
        assert_eq!(
            defer_delay_ms(0, &policy(1, 0), 0.0),
            1000,
            "a zero rate counts as 1/s"
        );
    }
}
