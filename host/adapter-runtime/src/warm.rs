//! Instances kept warm between calls of one adapter version for one connector account.
//!
//! A fresh instance per call costs more than the call itself (instantiation about
//! 11 us, returning the pooled slot about 13 us, BENCHMARKS.md). After a call that
//! returned normally, its store and instance go back here, and the next call of the
//! *same version for the same connector account* takes them instead of instantiating.
//! Whatever the guest keeps in its memory between calls therefore stays within one
//! tenant's own calls of one version; the rules that make that true are all here:
//!
//! * the key is (version digest, connector account id): never across accounts or
//!   versions;
//! * only an instance whose call returned normally comes back: never after a trap,
//!   a deadline, a memory-limit hit, a failed instantiation or an output over its cap;
//! * only with an empty WASI resource table: nothing the guest opened is left open;
//! * at most [`WarmConfig::max_calls`] calls per instance, then it is dropped, so no
//!   slow leak in a guest grows without end;
//! * at most [`WarmConfig::max_idle`] idle instances in all, least recently parked
//!   dropped first. The instance pool is sized for them on top of the running calls.

use crate::bindings::PspAdapter;
use crate::sandbox::CallState;
use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use wasmtime::Store;

/// Upper bounds of [`WarmConfig`], so a configuration cannot reserve an unbounded
/// instance pool.
pub const MAX_WARM_IDLE: u32 = 1024;
pub const MAX_WARM_CALLS: u32 = 1_000_000;

/// How many instances stay warm and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmConfig {
    /// Idle instances kept in all, across versions and accounts; 0 turns reuse off
    /// (every call instantiates afresh).
    pub max_idle: u32,
    /// Calls one instance serves before it is dropped.
    pub max_calls: u32,
}

impl Default for WarmConfig {
    fn default() -> Self {
        WarmConfig {
            max_idle: 32,
            max_calls: 10_000,
        }
    }
}

impl WarmConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_idle > MAX_WARM_IDLE {
            return Err(format!("warm.max_idle must be at most {MAX_WARM_IDLE}"));
        }
        if self.max_calls == 0 || self.max_calls > MAX_WARM_CALLS {
            return Err(format!(
                "warm.max_calls must be between 1 and {MAX_WARM_CALLS}"
            ));
        }
        Ok(())
    }
}

/// Which calls may share an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WarmKey {
    pub(crate) digest: String,
    pub(crate) account: String,
}

/// A store with its instance, between calls.
pub(crate) struct WarmInstance {
    pub(crate) store: Store<CallState>,
    pub(crate) guest: PspAdapter,
    /// Calls this instance has served.
    pub(crate) calls: u32,
}

/// The idle instances, most recently parked last.
pub(crate) struct WarmPool {
    config: WarmConfig,
    idle: Mutex<VecDeque<(WarmKey, WarmInstance)>>,
}

impl WarmPool {
    pub(crate) fn new(config: WarmConfig) -> Self {
        WarmPool {
            config,
            idle: Mutex::new(VecDeque::new()),
        }
    }

    /// The most recently parked instance of `key`, if any.
    pub(crate) fn take(&self, key: &WarmKey) -> Option<WarmInstance> {
        if self.config.max_idle == 0 {
            return None;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let index = idle.iter().rposition(|(k, _)| k == key)?;
        idle.remove(index).map(|(_, instance)| instance)
    }

    /// Parks an instance whose call returned normally. The caller has checked the
    /// call's outcome; this checks what is left in the store.
    pub(crate) fn park(&self, key: WarmKey, instance: WarmInstance) {
        let reusable = self.config.max_idle > 0
            && instance.calls < self.config.max_calls
            && instance.store.data().reusable();
        if !reusable {
            return;
        }
        let evicted = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            idle.push_back((key, instance));
            let over = idle.len().saturating_sub(self.config.max_idle as usize);
            idle.drain(..over).collect::<Vec<_>>()
        };
        // Dropping a store returns its pooled slot (microseconds): outside the lock.
        drop(evicted);
    }

    /// Idle instances now (metrics and tests).
    pub(crate) fn idle_len(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_limits_are_validated() {
        assert!(WarmConfig::default().validate().is_ok());
        assert!(WarmConfig {
            max_idle: 0,
            max_calls: 1
        }
        .validate()
        .is_ok());
        assert!(WarmConfig {
            max_idle: MAX_WARM_IDLE + 1,
            ..WarmConfig::default()
        }
        .validate()
        .is_err());
        assert!(WarmConfig {
            max_calls: 0,
            ..WarmConfig::default()
        }
        .validate()
        .is_err());
    }
}
