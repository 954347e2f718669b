//! Staged releases of an adapter version beside the active one: a shadow that repeats
//! the active version's work without ever affecting state, and a canary that takes a
//! share of the new attempts.
//!
//! Which version serves an attempt is a pure function of the rollout and the attempt's
//! reference ([`Rollout::takes`]), so the same attempt always gets the same version, on
//! every instance and after a restart.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::LoadError;

/// At most this many connector accounts are named in one rollout.
pub const MAX_ROLLOUT_ACCOUNTS: usize = 256;
/// The smallest sample a canary policy may ask for: fewer outcomes say nothing.
pub const MIN_CANARY_SAMPLE: u32 = 5;
/// The largest sample a canary policy may ask for.
pub const MAX_CANARY_SAMPLE: u32 = 100_000;

/// The share of new attempts a canary version takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Rollout {
    /// Every new attempt of these connector accounts.
    #[serde(default)]
    pub accounts: Vec<String>,
    /// And this percentage (0-100) of the other new attempts, chosen by a hash of the
    /// attempt reference.
    #[serde(default)]
    pub percent: u8,
}

impl Rollout {
    pub fn validate(&self) -> Result<(), LoadError> {
        if self.percent > 100 {
            return Err(LoadError::InvalidRollout(format!(
                "percent is {}; it must be 0 to 100",
                self.percent
            )));
        }
        if self.accounts.len() > MAX_ROLLOUT_ACCOUNTS {
            return Err(LoadError::InvalidRollout(format!(
                "{} accounts named; at most {MAX_ROLLOUT_ACCOUNTS}",
                self.accounts.len()
            )));
        }
        // A rollout taking nothing (0%, no account) is allowed: a parked canary, loaded
        // and watched, that a later rollout opens.
        Ok(())
    }

    /// Whether the canary serves the new attempt `reference` of `account`.
    pub fn takes(&self, account: &str, reference: &str) -> bool {
        self.accounts.iter().any(|a| a == account) || bucket(reference) < self.percent
    }
}

/// When a canary is stopped automatically: one of its UNKNOWN, error or decline rates
/// exceeds the active version's by more than `max_excess_pct` percentage points, once
/// it has at least `min_sample` outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryPolicy {
    pub min_sample: u32,
    pub max_excess_pct: u8,
}

impl Default for CanaryPolicy {
    fn default() -> Self {
        CanaryPolicy {
            min_sample: 20,
            max_excess_pct: 10,
        }
    }
}

impl CanaryPolicy {
    pub fn validate(&self) -> Result<(), LoadError> {
        if !(MIN_CANARY_SAMPLE..=MAX_CANARY_SAMPLE).contains(&self.min_sample) {
            return Err(LoadError::InvalidRollout(format!(
                "min_sample is {}; it must be {MIN_CANARY_SAMPLE} to {MAX_CANARY_SAMPLE}",
                self.min_sample
            )));
        }
        if self.max_excess_pct > 100 {
            return Err(LoadError::InvalidRollout(format!(
                "max_excess_pct is {}; it must be 0 to 100",
                self.max_excess_pct
            )));
        }
        Ok(())
    }
}

/// A canary as the runtime serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CanaryStatus {
    pub digest: String,
    pub version: String,
    pub rollout: Rollout,
    pub policy: CanaryPolicy,
}

/// The attempt reference's bucket, 0-99: the first eight bytes of its SHA-256, so the
/// split does not depend on how references are numbered.
pub fn bucket(reference: &str) -> u8 {
    let digest = Sha256::digest(reference.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    // The remainder of a division by 100 is below 100, so it fits in a u8.
    (u64::from_be_bytes(first) % 100) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_reference_always_falls_in_the_same_bucket() {
        assert_eq!(bucket("pay_1_a1"), bucket("pay_1_a1"));
        assert!(bucket("pay_1_a1") < 100);
    }

    #[test]
    fn a_percentage_rollout_takes_about_that_share_of_references() {
        let rollout = Rollout {
            accounts: vec![],
            percent: 25,
        };
        let taken = (0..4000)
            .filter(|i| rollout.takes("acct", &format!("pay_{i}_a1")))
            .count();
        assert!((800..1200).contains(&taken), "took {taken} of 4000");
    }

    #[test]
    fn a_named_account_is_always_taken_and_others_never_at_zero_percent() {
        let rollout = Rollout {
            accounts: vec!["ca_canary".into()],
            percent: 0,
        };
        assert!((0..100).all(|i| rollout.takes("ca_canary", &format!("p{i}"))));
        assert!((0..100).all(|i| !rollout.takes("ca_other", &format!("p{i}"))));
    }

    #[test]
    fn a_rollout_that_takes_too_much_is_refused_and_one_that_takes_nothing_is_parked() {
        let none = Rollout::default();
        assert!(none.validate().is_ok());
        assert!(!none.takes("acct", "pay_1_a1"));
        let over = Rollout {
            accounts: vec![],
            percent: 101,
        };
        assert!(over.validate().is_err());
        let policy = CanaryPolicy {
            min_sample: 1,
            max_excess_pct: 10,
        };
        assert!(policy.validate().is_err());
    }
}
