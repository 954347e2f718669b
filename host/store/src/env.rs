//! The environment every component draws nondeterminism from: time and
//! random numbers. Production uses the system's; a test or the deterministic
//! simulator (issue 12) passes a manual clock and a seeded generator, so one
//! seed gives one run. The simulator also passes [`AwaitPoints`]: the store
//! tells it when it reaches a point where a real process could die (a write
//! transaction about to begin, or begun), and the simulator may kill the
//! gateway there. Production passes none.
//!
//! The store holds the `Env` it was opened with and hands it on
//! ([`crate::Store::env`]): the scanner's and the publisher's jitter and the
//! CAS backoff come from it, never from a global generator. (Ids are still
//! UUIDv7: sequentially minted ones are ordered, so no decision depends on
//! their random bits.)

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::clock::{Clock, ManualClock, SystemClock};

/// A source of random numbers (jitter, choices). Not for secrets: API keys and
/// signing secrets always come from the operating system's generator.
pub trait Entropy: Send + Sync + std::fmt::Debug {
    fn next_u64(&self) -> u64;

    /// A uniform number in `[0, 1)`.
    fn unit(&self) -> f64 {
        // 53 random bits, the mantissa of an f64: exactly uniform on the grid.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform integer in `0..=max`.
    fn up_to(&self, max: u64) -> u64 {
        match max.checked_add(1) {
            Some(span) => self.next_u64() % span,
            None => self.next_u64(),
        }
    }
}

/// The operating system's generator (thread-local, seeded from the OS).
#[derive(Debug, Default, Clone, Copy)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn next_u64(&self) -> u64 {
        rand::rng().next_u64()
    }
}

/// One seeded generator: the same seed gives the same sequence.
#[derive(Debug)]
pub struct SeededEntropy(Mutex<StdRng>);

impl SeededEntropy {
    pub fn new(seed: u64) -> Self {
        SeededEntropy(Mutex::new(StdRng::seed_from_u64(seed)))
    }
}

impl Entropy for SeededEntropy {
    fn next_u64(&self) -> u64 {
        // A panic while holding the lock cannot leave a generator half-updated
        // in a way that matters: any state is a valid state.
        let mut rng = self.0.lock().unwrap_or_else(|p| p.into_inner());
        rng.random()
    }
}

/// A point where the store waits on the database, named for whoever watches
/// them ([`AwaitPoints`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwaitPoint {
    /// A write transaction is about to begin: nothing of it is held yet.
    BeforeWrite,
    /// A write transaction has begun and nothing is written yet; on SQLite its
    /// connection holds the database's write lock (`BEGIN IMMEDIATE`).
    InWrite,
}

impl AwaitPoint {
    pub fn label(self) -> &'static str {
        match self {
            AwaitPoint::BeforeWrite => "before_write",
            AwaitPoint::InWrite => "in_write",
        }
    }
}

/// Watches the store's await points. The deterministic simulator kills the
/// gateway process at some of them (its implementation then never returns:
/// it unwinds the task, as a dead process runs nothing more, and what the
/// task held, such as an open transaction, is dropped and rolled back). The
/// future it returns is awaited before the store goes on.
pub trait AwaitPoints: Send + Sync + std::fmt::Debug {
    fn reached(&self, point: AwaitPoint) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// Clock and entropy, shared by every component of one gateway, and who
/// watches the store's await points (nobody in production).
#[derive(Debug, Clone)]
pub struct Env {
    pub clock: Arc<dyn Clock>,
    pub entropy: Arc<dyn Entropy>,
    pub await_points: Option<Arc<dyn AwaitPoints>>,
}

impl Env {
    /// The production environment: wall clock, OS entropy.
    pub fn system() -> Self {
        Env::with_clock(Arc::new(SystemClock))
    }

    /// `clock` with OS entropy (tests that only move time).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Env {
            clock,
            entropy: Arc::new(OsEntropy),
            await_points: None,
        }
    }

    /// A fully deterministic environment for `seed`, starting at `start_ms`;
    /// the returned clock moves it.
    pub fn seeded(seed: u64, start_ms: i64) -> (Self, ManualClock) {
        let clock = ManualClock::new(start_ms);
        let env = Env {
            clock: Arc::new(clock.clone()),
            entropy: Arc::new(SeededEntropy::new(seed)),
            await_points: None,
        };
        (env, clock)
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Tells the watcher, if any, that the store reached `point`.
    pub async fn reached(&self, point: AwaitPoint) {
        if let Some(points) = &self.await_points {
            points.reached(point).await;
        }
    }
}

impl Default for Env {
    fn default() -> Self {
        Env::system()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_numbers() {
        let (a, _) = Env::seeded(7, 1_000);
        let (b, _) = Env::seeded(7, 1_000);
        let draw = |env: &Env| (0..5).map(|_| env.entropy.next_u64()).collect::<Vec<_>>();
        assert_eq!(draw(&a), draw(&b));
        let (c, _) = Env::seeded(8, 1_000);
        assert_ne!(draw(&a), draw(&c));
    }

    #[test]
    fn unit_draws_stay_in_the_half_open_interval_and_up_to_is_inclusive() {
        let entropy = SeededEntropy::new(1);
        for _ in 0..10_000 {
            let x = entropy.unit();
            assert!((0.0..1.0).contains(&x), "{x}");
            assert!(entropy.up_to(3) <= 3);
        }
        assert!((0..1_000).any(|_| entropy.up_to(3) == 3));
        let _ = entropy.up_to(u64::MAX);
    }
}
