//! A circuit breaker of one connector account, as a pure state machine over
//! the host's clock (issue 13, seed 001 §9): the host feeds it the outcome of
//! every PSP call of the account (queries too: a PSP that answers them is
//! up) and asks it only before routing a new attempt, never before a query
//! of an attempt already at the PSP: convergence must not wait for it.
//!
//! Closed: outcomes go into a rolling window; once it holds at least
//! `min_calls` and the unanswered share reaches `open_percent`, the breaker
//! opens. A refusal of the account's credentials opens it at once. Open: no
//! new attempt until `open_ms` has passed, then half-open: `probes` attempts
//! go through; the first answered one closes it, an unanswered one opens it
//! again.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Most outcomes a window holds, whatever the traffic (TIGER_STYLE: a limit on everything).
pub const MAX_WINDOW_OUTCOMES: usize = 512;

/// What one PSP call said about the PSP's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallHealth {
    /// A definitive answer (success, decline, action required): the PSP works.
    Answered,
    /// A timeout, a 5xx, a refused connection or an answer nobody can read.
    Unanswered,
    /// HTTP 401/403 to a first send: the account's credentials are refused.
    CredentialsRefused,
}

/// When a breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerPolicy {
    pub window_ms: i64,
    pub min_calls: u32,
    /// Unanswered calls, in percent of the window's calls, that open it.
    pub open_percent: u32,
    pub open_ms: i64,
    /// Attempts let through while half-open.
    pub probes: u32,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            window_ms: 60_000,
            min_calls: 20,
            open_percent: 50,
            open_ms: 30_000,
            probes: 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("breaker policy: {0}")]
pub struct BreakerPolicyError(&'static str);

impl BreakerPolicy {
    pub fn validate(&self) -> Result<(), BreakerPolicyError> {
        let day = 24 * 3_600_000;
        if !(1_000..=day).contains(&self.window_ms) || !(1_000..=day).contains(&self.open_ms) {
            return Err(BreakerPolicyError(
                "window_ms and open_ms between 1 s and 24 h",
            ));
        }
        if self.min_calls == 0 || self.min_calls as usize > MAX_WINDOW_OUTCOMES {
            return Err(BreakerPolicyError("min_calls between 1 and 512"));
        }
        if !(1..=100).contains(&self.open_percent) || !(1..=100).contains(&self.probes) {
            return Err(BreakerPolicyError(
                "open_percent and probes between 1 and 100",
            ));
        }
        Ok(())
    }
}

/// Where a breaker stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open {
        since_ms: i64,
        until_ms: i64,
        reason: String,
    },
    HalfOpen {
        since_ms: i64,
        probes_left: u32,
        reason: String,
    },
}

impl BreakerState {
    pub fn name(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half_open",
        }
    }
}

/// A change of state, for history, logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerTransition {
    pub from: &'static str,
    pub to: &'static str,
    pub reason: String,
}

/// One breaker: its state and its rolling window of `(at_ms, unanswered)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breaker {
    policy: BreakerPolicy,
    state: BreakerState,
    window: VecDeque<(i64, bool)>,
}

impl Breaker {
    pub fn new(policy: BreakerPolicy) -> Breaker {
        Breaker {
            policy,
            state: BreakerState::Closed,
            window: VecDeque::new(),
        }
    }

    /// The state at `now_ms` (an open breaker past its time reads half-open).
    pub fn state(&self, now_ms: i64) -> BreakerState {
        match &self.state {
            BreakerState::Open {
                until_ms, reason, ..
            } if now_ms >= *until_ms => BreakerState::HalfOpen {
                since_ms: *until_ms,
                probes_left: self.policy.probes,
                reason: reason.clone(),
            },
            // A probe that never reported (its attempt crashed before the
            // send) must not hold the breaker half-open for ever.
            BreakerState::HalfOpen {
                since_ms,
                probes_left: 0,
                reason,
            } if now_ms >= since_ms.saturating_add(self.policy.open_ms) => BreakerState::HalfOpen {
                since_ms: now_ms,
                probes_left: self.policy.probes,
                reason: reason.clone(),
            },
            state => state.clone(),
        }
    }

    /// Calls and unanswered calls in the window at `now_ms`.
    pub fn window_counts(&self, now_ms: i64) -> (usize, usize) {
        let from = now_ms.saturating_sub(self.policy.window_ms);
        let recent = self.window.iter().filter(|(at, _)| *at > from);
        recent.fold((0, 0), |(calls, bad), (_, u)| {
            (calls + 1, bad + usize::from(*u))
        })
    }

    /// Whether a new attempt may go to the PSP now, without taking a probe:
    /// `Err(reason)` when it may not.
    pub fn check(&self, now_ms: i64) -> Result<(), String> {
        match self.state(now_ms) {
            BreakerState::Closed => Ok(()),
            BreakerState::HalfOpen { probes_left, .. } if probes_left > 0 => Ok(()),
            BreakerState::HalfOpen { reason, .. } => {
                Err(format!("breaker half-open, probe in flight: {reason}"))
            }
            BreakerState::Open {
                reason, until_ms, ..
            } => Err(format!("breaker open until {until_ms}: {reason}")),
        }
    }

    /// A new attempt goes to the PSP: while half-open it takes a probe.
    pub fn admit(&mut self, now_ms: i64) -> Result<Option<BreakerTransition>, String> {
        self.check(now_ms)?;
        let before = self.state.name();
        self.state = match self.state(now_ms) {
            BreakerState::HalfOpen {
                probes_left,
                reason,
                ..
            } => BreakerState::HalfOpen {
                since_ms: now_ms,
                probes_left: probes_left.saturating_sub(1),
                reason,
            },
            state => state,
        };
        Ok(self.transition(before, "probe let through"))
    }

    /// The outcome of one PSP call of this account.
    pub fn record(&mut self, now_ms: i64, health: CallHealth) -> Option<BreakerTransition> {
        let before = self.state.name();
        let reason = match (self.state(now_ms), health) {
            (_, CallHealth::CredentialsRefused) => Some("credentials refused".to_owned()),
            (BreakerState::Closed, _) => self.push(now_ms, health == CallHealth::Unanswered),
            (BreakerState::HalfOpen { .. }, CallHealth::Answered) => {
                self.state = BreakerState::Closed;
                self.window.clear();
                return self.transition(before, "a probe was answered");
            }
            (BreakerState::HalfOpen { .. }, CallHealth::Unanswered) => {
                Some("a probe went unanswered".to_owned())
            }
            // Open: calls still running from before it opened change nothing.
            (BreakerState::Open { .. }, _) => None,
        };
        let reason = reason?;
        self.state = BreakerState::Open {
            since_ms: now_ms,
            until_ms: now_ms.saturating_add(self.policy.open_ms),
            reason: reason.clone(),
        };
        self.transition(before, &reason)
    }

    /// Adds an outcome to the window; the reason to open, if the window says so.
    fn push(&mut self, now_ms: i64, unanswered: bool) -> Option<String> {
        let from = now_ms.saturating_sub(self.policy.window_ms);
        while self.window.front().is_some_and(|(at, _)| *at <= from)
            || self.window.len() >= MAX_WINDOW_OUTCOMES
        {
            self.window.pop_front();
        }
        self.window.push_back((now_ms, unanswered));
        let (calls, bad) = self.window_counts(now_ms);
        let enough = calls >= self.policy.min_calls as usize;
        let share = bad * 100 >= calls * self.policy.open_percent as usize;
        (enough && share).then(|| {
            let seconds = self.policy.window_ms / 1000;
            format!("{bad} of the last {calls} calls unanswered within {seconds} s")
        })
    }

    fn transition(&self, from: &'static str, reason: &str) -> Option<BreakerTransition> {
        let to = self.state.name();
        (from != to).then(|| BreakerTransition {
            from,
            to,
            reason: reason.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerPolicy::default())
    }

    #[test]
    fn the_default_policy_is_valid_and_nonsense_is_refused() {
        assert_eq!(BreakerPolicy::default().validate(), Ok(()));
        let zero = BreakerPolicy {
            min_calls: 0,
            ..BreakerPolicy::default()
        };
        assert!(zero.validate().is_err());
        let never = BreakerPolicy {
            open_percent: 101,
            ..BreakerPolicy::default()
        };
        assert!(never.validate().is_err());
    }

    #[test]
    fn a_mostly_unanswered_window_opens_the_breaker_and_new_attempts_are_refused() {
        let mut b = breaker();
        for t in 0..19 {
            assert_eq!(b.record(t, CallHealth::Unanswered), None, "below min_calls");
        }
        let opened = b.record(19, CallHealth::Unanswered).expect("opens");
        assert_eq!((opened.from, opened.to), ("closed", "open"));
        assert!(
            opened.reason.contains("20 of the last 20"),
            "{}",
            opened.reason
        );
        assert!(b.check(5).is_err());
        assert!(b.admit(29_999).is_err());
    }

    #[test]
    fn answered_calls_keep_it_closed_and_old_outcomes_leave_the_window() {
        let mut b = breaker();
        for t in 0..40 {
            let health = if t % 4 == 0 {
                CallHealth::Unanswered
            } else {
                CallHealth::Answered
            };
            assert_eq!(
                b.record(t, health),
                None,
                "a quarter unanswered is not half"
            );
        }
        assert_eq!(b.check(40), Ok(()));
        let mut calm = breaker();
        for t in 0..19 {
            calm.record(t, CallHealth::Unanswered);
        }
        // A minute later those 19 are gone: one more does not make 20.
        assert_eq!(calm.record(70_000, CallHealth::Unanswered), None);
        assert_eq!(calm.window_counts(70_000), (1, 1));
    }

    #[test]
    fn credentials_refused_opens_at_once_with_that_reason() {
        let mut b = breaker();
        let t = b.record(0, CallHealth::CredentialsRefused).expect("opens");
        assert_eq!(t.reason, "credentials refused");
        assert!(b.check(1).unwrap_err().contains("credentials refused"));
    }

    #[test]
    fn after_open_ms_one_probe_goes_through_and_an_answer_closes_the_breaker() {
        let mut b = breaker();
        b.record(0, CallHealth::CredentialsRefused);
        assert_eq!(b.state(30_000).name(), "half_open");
        b.admit(30_000).expect("the probe");
        assert!(b.admit(30_001).is_err(), "one probe at a time");
        let closed = b.record(30_100, CallHealth::Answered).expect("closes");
        assert_eq!((closed.from, closed.to), ("half_open", "closed"));
        assert_eq!(b.check(30_101), Ok(()));
    }

    #[test]
    fn a_probe_that_never_reports_does_not_hold_the_breaker_half_open_for_ever() {
        let mut b = breaker();
        b.record(0, CallHealth::CredentialsRefused);
        b.admit(30_000).expect("the probe");
        assert!(b.check(59_999).is_err());
        b.admit(60_000)
            .expect("another probe once the first is overdue");
    }

    #[test]
    fn an_unanswered_probe_opens_it_again_for_another_open_ms() {
        let mut b = breaker();
        b.record(0, CallHealth::CredentialsRefused);
        b.admit(30_000).expect("the probe");
        let again = b.record(30_500, CallHealth::Unanswered).expect("reopens");
        assert_eq!((again.from, again.to), ("half_open", "open"));
        assert!(b.check(60_499).is_err());
        assert_eq!(b.check(60_500), Ok(()));
    }

    proptest! {
        #[test]
        fn the_window_never_outgrows_its_limit_and_an_open_breaker_refuses_until_its_time(
            outcomes in proptest::collection::vec((0i64..2_000, 0u8..3), 0..1500)
        ) {
            let mut b = breaker();
            let mut now = 0;
            for (step, kind) in outcomes {
                now += step;
                let health = [CallHealth::Answered, CallHealth::Unanswered, CallHealth::CredentialsRefused][kind as usize];
                let _ = b.admit(now);
                b.record(now, health);
                prop_assert!(b.window.len() <= MAX_WINDOW_OUTCOMES);
                if let BreakerState::Open { until_ms, .. } = b.state(now) {
                    prop_assert!(until_ms > now);
                    prop_assert!(b.check(now).is_err());
                }
            }
        }
    }
}
