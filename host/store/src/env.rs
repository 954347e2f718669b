//! The environment every component draws nondeterminism from: time and
//! random numbers. Production uses the system's; a test or the deterministic
//! simulator (issue 12) passes a manual clock and a seeded generator, so one
//! seed gives one run. The simulator also passes [`AwaitPoints`]: the store
//! tells it when it reaches a point where a real process could die (a write
//! transaction about to begin, begun, or just committed), and the simulator
//! may kill the gateway there. Production passes none.
//!
//! The store holds the `Env` it was opened with and hands it on
//! ([`crate::Store::env`]): the scanner's and the publisher's jitter, the CAS
//! backoff and every id the gateway mints (UUIDv7 from [`Env::uuid_v7`], claim
//! tokens and lease holders from [`Env::uuid_v4`]) come from it, never from a
//! global generator or the wall clock behind the environment's back.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use uuid::Uuid;

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

    /// A new UUIDv7 at `now_ms`, ordered after every earlier one this source
    /// minted (listings page by id, so creation order must survive two ids
    /// in the same millisecond). The default is the uuid crate's: the wall
    /// clock, the OS generator and its process-wide counter, which is what
    /// production runs on ([`OsEntropy`] with the [`SystemClock`] gives the
    /// same instant).
    fn uuid_v7(&self, now_ms: i64) -> Uuid {
        let _ = now_ms;
        Uuid::now_v7()
    }

    /// 122 random bits as a UUIDv4 (claim tokens, lease holders).
    fn uuid_v4(&self) -> Uuid {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.next_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&self.next_u64().to_le_bytes());
        uuid::Builder::from_random_bytes(bytes).into_uuid()
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

/// One seeded source: the same seed gives the same numbers and the same ids.
///
/// Ids come from a second generator derived from the seed, so minting one
/// does not move the sequence every jitter and choice is drawn from (a run's
/// decisions do not depend on how many ids it minted).
#[derive(Debug)]
pub struct SeededEntropy {
    draws: Mutex<StdRng>,
    ids: Mutex<SeededIds>,
}

/// The id generator's state: its generator and the last UUIDv7 timestamp and
/// counter it used.
#[derive(Debug)]
struct SeededIds {
    rng: StdRng,
    last_ms: u64,
    counter: u16,
}

/// The 12 bits of a UUIDv7's `rand_a`, used as a counter within one
/// millisecond (RFC 9562 §6.2, method 1).
const V7_COUNTER_MAX: u16 = 0x0fff;

impl SeededEntropy {
    pub fn new(seed: u64) -> Self {
        SeededEntropy {
            draws: Mutex::new(StdRng::seed_from_u64(seed)),
            ids: Mutex::new(SeededIds {
                rng: StdRng::seed_from_u64(seed ^ 0x1d5e_ed1d_5eed_1d5e),
                last_ms: 0,
                counter: 0,
            }),
        }
    }
}

impl Entropy for SeededEntropy {
    fn next_u64(&self) -> u64 {
        // A panic while holding the lock cannot leave a generator half-updated
        // in a way that matters: any state is a valid state.
        let mut rng = self.draws.lock().unwrap_or_else(|p| p.into_inner());
        rng.random()
    }

    fn uuid_v7(&self, now_ms: i64) -> Uuid {
        // Same as above: every state of the id generator is a valid one.
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.next_v7(u64::try_from(now_ms).unwrap_or(0))
    }

    fn uuid_v4(&self) -> Uuid {
        // Same as above.
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        let mut bytes = [0u8; 16];
        ids.rng.fill_bytes(&mut bytes);
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }
}

impl SeededIds {
    /// Timestamp `now_ms` (or the last one, if the clock stands behind it),
    /// the counter within that millisecond, then 62 seeded random bits. A
    /// full counter moves the timestamp one millisecond ahead, as RFC 9562
    /// allows, so ids stay strictly increasing.
    fn next_v7(&mut self, now_ms: u64) -> Uuid {
        if now_ms > self.last_ms {
            self.last_ms = now_ms;
            self.counter = 0;
        } else if self.counter < V7_COUNTER_MAX {
            self.counter += 1;
        } else {
            self.last_ms += 1;
            self.counter = 0;
        }
        let mut bytes = [0u8; 10];
        bytes[..2].copy_from_slice(&self.counter.to_be_bytes());
        self.rng.fill_bytes(&mut bytes[2..]);
        uuid::Builder::from_unix_timestamp_millis(self.last_ms, &bytes).into_uuid()
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
    /// A write transaction has committed and its caller has not gone on:
    /// what it wrote is durable, and whoever asked may never hear of it.
    AfterCommit,
}

impl AwaitPoint {
    pub fn label(self) -> &'static str {
        match self {
            AwaitPoint::BeforeWrite => "before_write",
            AwaitPoint::InWrite => "in_write",
            AwaitPoint::AfterCommit => "after_commit",
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

    /// A new time-ordered id at the environment's `now` ([`Entropy::uuid_v7`]).
    pub fn uuid_v7(&self) -> Uuid {
        self.entropy.uuid_v7(self.now_ms())
    }

    /// A new random id ([`Entropy::uuid_v4`]).
    pub fn uuid_v4(&self) -> Uuid {
        self.entropy.uuid_v4()
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

    #[test]
    fn the_same_seed_mints_the_same_ids_from_the_virtual_clock() {
        let (a, clock) = Env::seeded(7, 1_700_000_000_000);
        let (b, _) = Env::seeded(7, 1_700_000_000_000);
        let mint = |env: &Env| (0..3).map(|_| env.uuid_v7()).collect::<Vec<_>>();
        let ids = mint(&a);
        assert_eq!(ids, mint(&b));
        let (secs, nanos) = ids[0]
            .get_timestamp()
            .expect("a v7 id has a timestamp")
            .to_unix();
        assert_eq!(
            (secs, nanos),
            (1_700_000_000, 0),
            "the id's time is the virtual clock's"
        );
        clock.advance(5);
        assert_ne!(mint(&a), mint(&b), "the clock moved for a only");
        let (c, _) = Env::seeded(8, 1_700_000_000_000);
        assert_ne!(ids, mint(&c));
    }

    #[test]
    fn seeded_ids_keep_minting_order_within_a_millisecond_past_the_counter_and_if_the_clock_goes_back(
    ) {
        let (env, clock) = Env::seeded(3, 1_000_000);
        let mut ids: Vec<Uuid> = (0..10_000).map(|_| env.uuid_v7()).collect();
        clock.set(999_000);
        ids.extend((0..10).map(|_| env.uuid_v7()));
        clock.set(2_000_000);
        ids.extend((0..10).map(|_| env.uuid_v7()));
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
            // The simple form (what the store writes) sorts the same way.
            assert!(pair[0].simple().to_string() < pair[1].simple().to_string());
        }
        assert!(ids.iter().all(|id| id.get_version_num() == 7));
    }

    #[test]
    fn minting_ids_does_not_move_the_numbers_a_run_decides_with() {
        let (a, _) = Env::seeded(11, 1_000);
        let (b, _) = Env::seeded(11, 1_000);
        for _ in 0..5 {
            let _ = (a.uuid_v7(), a.uuid_v4());
        }
        let draw = |env: &Env| (0..5).map(|_| env.entropy.next_u64()).collect::<Vec<_>>();
        assert_eq!(draw(&a), draw(&b));
    }
}
