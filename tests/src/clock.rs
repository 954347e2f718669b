//! Test clocks. Each starts where a test needs it; none sleeps.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

pub use sluice_store::{Clock, ManualClock, SystemClock};

/// A clock a [`crate::TestDb`] can create for its store.
pub trait TestClock: Clock + Clone + Send + Sync + 'static {
    fn start() -> Self;
}

/// Starts at the wall clock and moves only when told.
impl TestClock for ManualClock {
    fn start() -> Self {
        ManualClock::new(SystemClock.now_ms())
    }
}

impl TestClock for SystemClock {
    fn start() -> Self {
        SystemClock
    }
}

/// Wall-clock time that a test can also jump forward (leases, key expiry, days
/// of backoff), so time-driven code keeps running normally in between.
#[derive(Debug, Clone, Default)]
pub struct SkewClock(Arc<AtomicI64>);

impl SkewClock {
    /// Jump `by_ms` into the future.
    pub fn advance(&self, by_ms: i64) {
        self.0.fetch_add(by_ms, Ordering::SeqCst);
    }
}

impl Clock for SkewClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.0.load(Ordering::SeqCst)
    }
}

impl TestClock for SkewClock {
    fn start() -> Self {
        SkewClock::default()
    }
}
