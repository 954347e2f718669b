//! Kills at the store's await points (issue 12: "the gateway process is
//! killed at a random await point").
//!
//! The store tells its [`AwaitPoints`] when a write transaction is about to
//! begin, when it has begun (on SQLite the connection then holds the
//! database's write lock) and when it has committed (the write is durable;
//! whoever asked for it may never hear of it). [`StoreKills`], one per gateway incarnation, draws
//! from the world's one generator whether the process dies there. A death
//! throws the incarnation's kill switch and unwinds the task that reached the
//! point with a [`Killed`] payload: a dead process runs nothing more, and
//! what the task held is dropped as the process's memory would be. A dropped
//! transaction is rolled back and its connection released, as SQLite rolls
//! back a transaction whose connection a dead process closed, so the next
//! incarnation does not wait on a write lock nobody will ever release (the
//! first try, which left the dead task pending forever with its transaction,
//! hung seed 104 on the restarted gateway's first write).
//!
//! A task the orchestrator spawned ends there (tokio catches the unwind; the
//! world sees the kill switch first and never reads the join error); the
//! world's own future is wrapped in [`CatchKilled`] by `World::guarded`.
//! Kills are drawn only while a guarded operation runs ([`Armed`]): the
//! world's own reads and the operators' writes are not the gateway process.

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use sluice_store::{AwaitPoint, AwaitPoints};

use crate::net::{Crash, NetMode};
use crate::rng::SimRng;
use crate::trace::Trace;

/// Kills per thousand store await points reached while a guarded operation
/// runs with crashes on (each write transaction has three).
pub const KILL_PER_MILLE: u64 = 8;

/// The unwind payload of a killed incarnation's task.
#[derive(Debug)]
pub struct Killed;

/// What the world shares with every incarnation's [`StoreKills`]: whether a
/// guarded operation is running (the gateway process is at work), and how
/// many kills the store's await points caused.
#[derive(Debug, Clone, Default)]
pub struct Armed {
    armed: Arc<AtomicBool>,
    kills: Arc<AtomicU32>,
    after_commit: Arc<AtomicU32>,
    race: Arc<Mutex<Option<Race>>>,
}

/// Two operations running at once, one per gateway instance, taking turns:
/// only the instance whose turn it is runs, and it hands the turn over only
/// before a write transaction (holding nothing of the database), when the
/// seed's generator says so, or when its operation ends. So the order of
/// every statement is the seed's, and the other instance's writes land
/// between this one's reads and its conditional `UPDATE`s.
#[derive(Debug)]
struct Race {
    /// The incarnations racing, by serial.
    members: [u64; 2],
    done: [bool; 2],
    turn: tokio::sync::watch::Sender<u64>,
}

impl Race {
    fn index(&self, serial: u64) -> Option<usize> {
        self.members.iter().position(|m| *m == serial)
    }
}

/// Hand-overs per thousand before-write points of a racing instance.
pub const RACE_SWITCH_PER_MILLE: u64 = 500;

impl Armed {
    /// Armed until the returned guard is dropped.
    pub fn arm(&self) -> ArmedGuard {
        self.armed.store(true, Ordering::SeqCst);
        ArmedGuard(self.armed.clone())
    }

    fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }

    /// Kills at the store's await points so far.
    pub fn kills(&self) -> u32 {
        self.kills.load(Ordering::SeqCst)
    }

    /// Of those, the kills after a `COMMIT`.
    pub fn after_commit_kills(&self) -> u32 {
        self.after_commit.load(Ordering::SeqCst)
    }

    fn race(&self) -> std::sync::MutexGuard<'_, Option<Race>> {
        self.race.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a race of the incarnations `first` and `second`; `first` has
    /// the first turn.
    pub fn start_race(&self, first: u64, second: u64) {
        *self.race() = Some(Race {
            members: [first, second],
            done: [false, false],
            turn: tokio::sync::watch::channel(first).0,
        });
    }

    pub fn end_race(&self) {
        *self.race() = None;
    }

    /// Waits for the turn of incarnation `serial` (at once outside a race).
    pub async fn turn_of(&self, serial: u64) {
        let rx = self.race().as_ref().map(|race| race.turn.subscribe());
        if let Some(mut rx) = rx {
            // The sender lives as long as the race; an ended race ends the wait.
            let _ = rx.wait_for(|turn| *turn == serial).await;
        }
    }

    /// Incarnation `serial`'s operation ended (or died): the other one runs
    /// to its end.
    pub fn finish(&self, serial: u64) {
        let mut race = self.race();
        let Some(race) = race.as_mut() else { return };
        let Some(me) = race.index(serial) else { return };
        race.done[me] = true;
        if !race.done[1 - me] {
            race.turn.send_replace(race.members[1 - me]);
        }
    }

    /// At a before-write point of incarnation `serial`: maybe hand the turn
    /// to the other racer, and wait for it to come back.
    fn hand_over(
        &self,
        serial: u64,
        rng: &SimRng,
        trace: &Trace,
    ) -> Option<Pin<Box<dyn Future<Output = ()> + Send + 'static>>> {
        let race = self.race();
        let race = race.as_ref()?;
        let me = race.index(serial)?;
        if race.done[1 - me] || !rng.chance(RACE_SWITCH_PER_MILLE) {
            return None;
        }
        trace.line(format!(
            "race: instance {} waits before a write; instance {} runs",
            race.members[me],
            race.members[1 - me]
        ));
        let mut rx = race.turn.subscribe();
        race.turn.send_replace(race.members[1 - me]);
        Some(Box::pin(async move {
            let _ = rx.wait_for(|turn| *turn == serial).await;
        }))
    }
}

/// Disarms on drop.
#[derive(Debug)]
pub struct ArmedGuard(Arc<AtomicBool>);

impl Drop for ArmedGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// The await points of one incarnation's store.
#[derive(Debug)]
pub struct StoreKills {
    /// Which incarnation of the world this is (its serial number).
    pub serial: u64,
    pub rng: SimRng,
    pub crash: Crash,
    pub mode: Arc<Mutex<NetMode>>,
    pub trace: Trace,
    pub armed: Armed,
}

impl StoreKills {
    fn crashes_on(&self) -> bool {
        self.mode.lock().unwrap_or_else(|p| p.into_inner()).crashes
    }
}

impl AwaitPoints for StoreKills {
    fn reached(&self, point: AwaitPoint) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        // A dead process writes nothing more (a task of it that was not at
        // this point when it died ends at its next write).
        if self.crash.is_dead() {
            resume_unwind(Box::new(Killed));
        }
        if self.armed.is_armed() && self.crashes_on() && self.rng.below(1000) < KILL_PER_MILLE {
            self.trace
                .line(format!("kill at store await point {}", point.label()));
            self.armed.kills.fetch_add(1, Ordering::SeqCst);
            if point == AwaitPoint::AfterCommit {
                self.armed.after_commit.fetch_add(1, Ordering::SeqCst);
            }
            self.crash.kill();
            resume_unwind(Box::new(Killed));
        }
        if point == AwaitPoint::BeforeWrite {
            if let Some(wait) = self.armed.hand_over(self.serial, &self.rng, &self.trace) {
                return wait;
            }
        }
        Box::pin(std::future::ready(()))
    }
}

/// `op`, but a [`Killed`] unwind out of it ends it with `None` (any other
/// panic goes on unwinding).
pub struct CatchKilled<F> {
    op: Pin<Box<F>>,
}

impl<F: Future> CatchKilled<F> {
    pub fn new(op: F) -> Self {
        CatchKilled { op: Box::pin(op) }
    }
}

impl<F: Future> Future for CatchKilled<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let op = self.op.as_mut();
        // After an unwind the future is never polled again (the caller drops
        // it), so what it left half-done cannot be observed.
        match catch_unwind(AssertUnwindSafe(|| op.poll(cx))) {
            Ok(Poll::Ready(out)) => Poll::Ready(Some(out)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) if payload.is::<Killed>() => Poll::Ready(None),
            Err(payload) => resume_unwind(payload),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_killed_unwind_ends_the_operation_with_none_and_its_output_otherwise() {
        let done = CatchKilled::new(async { 7 }).await;
        assert_eq!(done, Some(7));
        let killed = CatchKilled::new(async {
            if std::hint::black_box(true) {
                resume_unwind(Box::new(Killed));
            }
            7
        })
        .await;
        assert_eq!(killed, None);
    }

    fn kills(armed: &Armed) -> StoreKills {
        StoreKills {
            serial: 0,
            rng: SimRng::new(1),
            crash: Crash::new(),
            mode: Arc::new(Mutex::new(NetMode {
                fault_per_mille: 0,
                crashes: true,
            })),
            trace: Trace::new(sluice_store::ManualClock::new(0), false),
            armed: armed.clone(),
        }
    }

    /// Whether reaching `point` unwound with [`Killed`].
    fn dies_at(kills: &StoreKills, point: AwaitPoint) -> bool {
        match catch_unwind(AssertUnwindSafe(|| drop(kills.reached(point)))) {
            Ok(()) => false,
            Err(payload) => payload.is::<Killed>(),
        }
    }

    #[test]
    fn only_an_armed_incarnation_is_killed_and_a_dead_one_never_writes_again() {
        let armed = Armed::default();
        let kills = kills(&armed);
        assert!(
            (0..10_000).all(|_| !dies_at(&kills, AwaitPoint::BeforeWrite)),
            "the world's own writes are not the gateway's"
        );
        let guard = armed.arm();
        assert!((0..10_000).any(|_| dies_at(&kills, AwaitPoint::InWrite)));
        assert!(kills.crash.is_dead());
        assert_eq!(armed.kills(), 1);
        drop(guard);
        assert!(
            dies_at(&kills, AwaitPoint::BeforeWrite),
            "dead, armed or not"
        );
        assert_eq!(
            armed.kills(),
            1,
            "a dead process's later writes are not new kills"
        );
        let _armed_again = armed.arm();
        let next = self::kills(&armed);
        assert!(
            (0..10_000).any(|_| dies_at(&next, AwaitPoint::AfterCommit)),
            "a process dies after a commit too"
        );
        assert_eq!(armed.kills(), 2);
        assert_eq!(armed.after_commit_kills(), 1);
    }

    #[tokio::test]
    async fn racers_take_turns_and_the_second_runs_only_once_the_first_hands_over_or_ends() {
        let armed = Armed::default();
        let (rng, trace) = (
            SimRng::new(3),
            Trace::new(sluice_store::ManualClock::new(0), false),
        );
        let log = Mutex::new(Vec::new());
        let say = |what: &'static str| log.lock().unwrap().push(what);
        armed.start_race(1, 2);
        let first = async {
            armed.turn_of(1).await;
            say("first starts");
            let wait = loop {
                if let Some(wait) = armed.hand_over(1, &rng, &trace) {
                    break wait;
                }
            };
            say("first waits before a write");
            wait.await;
            say("first goes on");
            armed.finish(1);
        };
        let second = async {
            armed.turn_of(2).await;
            say("second runs");
            armed.finish(2);
        };
        tokio::join!(first, second);
        armed.end_race();
        assert_eq!(
            log.into_inner().unwrap(),
            [
                "first starts",
                "first waits before a write",
                "second runs",
                "first goes on"
            ]
        );
    }

    #[test]
    fn the_guard_disarms_when_dropped() {
        let armed = Armed::default();
        let guard = armed.arm();
        assert!(armed.is_armed());
        drop(guard);
        assert!(!armed.is_armed());
    }
}
