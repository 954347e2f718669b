//! Bulkheads for adapter calls (issue 13): one tenant's slow or hostile adapter must
//! not starve the calls of every other tenant.
//!
//! * **Fair instance slots.** The runtime's `max_concurrent_instances` slots are
//!   shared across (adapter, connector account) keys: one key holds at most
//!   `key_share_percent` of them, one adapter over all its accounts at most
//!   `adapter_share_percent` (so many accounts of one hostile adapter cannot take
//!   more either), and both caps are at least 1. A call that cannot start waits in
//!   its key's queue (at most `queue_per_key` calls, at most `max_wait`); freed slots
//!   go to the keys with queued calls in turn. Beyond that the call is shed at once.
//! * **CPU fairness.** Each key has a token bucket of guest CPU time (milliseconds,
//!   `cpu_burst_ms`, refilled at `cpu_refill_ms_per_sec`), charged after every call
//!   with the CPU time its blocking thread used. A key in debt (its calls keep
//!   running until their deadline) is throttled: its calls are shed until the
//!   refill pays the debt back. Each adapter also has a bucket charged only with
//!   calls that hit their deadline, over all its accounts.
//!
//! A shed call is [`crate::AdapterError::Shed`]: it never ran, nothing happened.
//! The state machine is [`pool::SlotPool`] (pure, `now` passed in); [`Bulkhead`] is its
//! async wrapper with the wait deadline, and [`metrics`] counts sheds and waits.

pub(crate) mod cpu;
pub mod metrics;
pub mod pool;

use crate::error::RuntimeError;
use pool::{Admission, CallKey, SlotPool, Ticket, Usage, Wake};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How adapter calls share the runtime's slots and CPU. Validated by
/// `AdapterRuntime::new` ([`BulkheadConfig::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BulkheadConfig {
    /// Percent of the slots one (adapter, account) key may hold (1-100; at least 1 slot).
    pub key_share_percent: u32,
    /// Percent of the slots one adapter may hold over all its accounts (1-100; at
    /// least the key share).
    pub adapter_share_percent: u32,
    /// Calls of one key that may wait for a slot; more are shed at once.
    pub queue_per_key: usize,
    /// Longest wait for a slot; then the call is shed.
    pub max_wait: Duration,
    /// CPU time (ms) a key may use in a burst.
    pub cpu_burst_ms: u64,
    /// CPU time (ms) a key gets back per second.
    pub cpu_refill_ms_per_sec: u64,
    /// CPU time (ms) of deadline-hitting calls one adapter may use in a burst, over
    /// all its accounts.
    pub adapter_deadline_burst_ms: u64,
    /// ... and gets back per second.
    pub adapter_deadline_refill_ms_per_sec: u64,
}

impl Default for BulkheadConfig {
    fn default() -> Self {
        BulkheadConfig {
            key_share_percent: 25,
            adapter_share_percent: 50,
            queue_per_key: 32,
            max_wait: Duration::from_secs(1),
            cpu_burst_ms: 3_000,
            cpu_refill_ms_per_sec: 400,
            adapter_deadline_burst_ms: 4_000,
            adapter_deadline_refill_ms_per_sec: 400,
        }
    }
}

/// Bounds of [`BulkheadConfig`].
pub const MAX_QUEUE_PER_KEY: usize = 100_000;
pub const MAX_WAIT: Duration = Duration::from_secs(60);
pub const MAX_CPU_BUDGET_MS: u64 = 1_000_000_000;

impl BulkheadConfig {
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let invalid = |what: String| Err(RuntimeError::InvalidBulkhead(what));
        for (name, percent) in [
            ("key_share_percent", self.key_share_percent),
            ("adapter_share_percent", self.adapter_share_percent),
        ] {
            if !(1..=100).contains(&percent) {
                return invalid(format!("{name} must be between 1 and 100"));
            }
        }
        if self.adapter_share_percent < self.key_share_percent {
            return invalid("adapter_share_percent must be at least key_share_percent".into());
        }
        if self.queue_per_key > MAX_QUEUE_PER_KEY {
            return invalid(format!("queue_per_key must be at most {MAX_QUEUE_PER_KEY}"));
        }
        if self.max_wait > MAX_WAIT {
            return invalid(format!("max_wait must be at most {MAX_WAIT:?}"));
        }
        for (name, ms) in [
            ("cpu_burst_ms", self.cpu_burst_ms),
            ("cpu_refill_ms_per_sec", self.cpu_refill_ms_per_sec),
            ("adapter_deadline_burst_ms", self.adapter_deadline_burst_ms),
            (
                "adapter_deadline_refill_ms_per_sec",
                self.adapter_deadline_refill_ms_per_sec,
            ),
        ] {
            if !(1..=MAX_CPU_BUDGET_MS).contains(&ms) {
                return invalid(format!("{name} must be between 1 and {MAX_CPU_BUDGET_MS}"));
            }
        }
        Ok(())
    }

    /// (per key, per adapter) slot caps for a pool of `slots`.
    pub fn caps(&self, slots: usize) -> (usize, usize) {
        let share = |percent: u32| (slots.saturating_mul(percent as usize) / 100).max(1);
        let key = share(self.key_share_percent);
        (key, share(self.adapter_share_percent).max(key))
    }
}

/// Why a call was shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShedReason {
    /// The key's queue was full.
    QueueFull,
    /// No slot came within the wait deadline.
    WaitTimeout,
    /// The key used up its CPU budget.
    CpuBudget,
    /// The adapter's calls keep hitting their deadline over all its accounts.
    AdapterCpuBudget,
}

impl ShedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::WaitTimeout => "wait_timeout",
            ShedReason::CpuBudget => "cpu_budget",
            ShedReason::AdapterCpuBudget => "adapter_cpu_budget",
        }
    }
}

impl fmt::Display for ShedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShedReason::QueueFull => "too many calls of this connector account are waiting",
            ShedReason::WaitTimeout => "no instance slot within the wait deadline",
            ShedReason::CpuBudget => "the connector account used up its adapter CPU budget",
            ShedReason::AdapterCpuBudget => {
                "the adapter's calls keep running into their CPU deadline"
            }
        })
    }
}

/// A refused call: why, and when it is worth trying again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shed {
    pub reason: ShedReason,
    pub retry_after: Duration,
}

impl Shed {
    pub fn new(reason: ShedReason, retry_after: Duration) -> Self {
        Shed {
            reason,
            retry_after,
        }
    }
}

struct Inner {
    pool: SlotPool,
    wakers: HashMap<Ticket, oneshot::Sender<Result<(), Shed>>>,
}

/// The async face of [`SlotPool`]: waits with a deadline, counts, and releases the
/// slot when the call is done.
pub(crate) struct Bulkhead {
    inner: Mutex<Inner>,
    max_wait: Duration,
}

impl Bulkhead {
    pub fn new(slots: usize, config: BulkheadConfig) -> Self {
        Bulkhead {
            inner: Mutex::new(Inner {
                pool: SlotPool::new(slots, config),
                wakers: HashMap::new(),
            }),
            max_wait: config.max_wait,
        }
    }

    // A poisoned lock means a panic between two consistent updates of the pool (every
    // method leaves it consistent before anything that can panic), so it is usable.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for `key`'s call that may spend up to `reserve` of CPU, waiting at most
    /// `max_wait` for one.
    pub async fn acquire(
        self: &Arc<Self>,
        key: CallKey,
        reserve: Duration,
    ) -> Result<SlotGuard, Shed> {
        let queued = {
            // Admission and the waker's registration under one lock: no release can
            // wake the ticket before its sender is there. The channel is made only for
            // a call that queues: a granted call (the common case) allocates none.
            let mut inner = self.lock();
            match inner.pool.admit(&key, reserve, Instant::now(), true) {
                Admission::Granted => None,
                Admission::Shed(shed) => Some(Err(shed)),
                Admission::Queued(ticket) => {
                    let (sender, receiver) = oneshot::channel();
                    inner.wakers.insert(ticket, sender);
                    Some(Ok((ticket, receiver)))
                }
            }
        };
        let (ticket, receiver) = match queued {
            None => return Ok(self.guard(key, reserve)),
            Some(Err(shed)) => return Err(self.shed(&key, shed)),
            Some(Ok(queued)) => queued,
        };
        metrics::slot_wait(&key.adapter, &key.account);
        let started = Instant::now();
        let mut queued = Queued {
            bulkhead: self,
            key: &key,
            reserve,
            ticket,
            receiver,
            settled: false,
        };
        let woken = tokio::time::timeout(self.max_wait, &mut queued.receiver).await;
        let outcome = match woken {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) | Err(_) => queued.give_up(),
        };
        queued.settled = true;
        drop(queued);
        metrics::slot_waited(&key.adapter, started.elapsed());
        match outcome {
            Ok(()) => Ok(self.guard(key, reserve)),
            Err(shed) => Err(self.shed(&key, shed)),
        }
    }

    /// A slot for `key` now, or shed (for synchronous callers that cannot wait).
    pub fn try_acquire(
        self: &Arc<Self>,
        key: CallKey,
        reserve: Duration,
    ) -> Result<SlotGuard, Shed> {
        let admission = self.lock().pool.admit(&key, reserve, Instant::now(), false);
        match admission {
            Admission::Granted => Ok(self.guard(key, reserve)),
            Admission::Shed(shed) => Err(self.shed(&key, shed)),
            Admission::Queued(_) => {
                Err(self.shed(&key, Shed::new(ShedReason::QueueFull, self.max_wait)))
            }
        }
    }

    fn guard(self: &Arc<Self>, key: CallKey, reserve: Duration) -> SlotGuard {
        SlotGuard {
            bulkhead: Arc::clone(self),
            key,
            reserve,
            usage: Usage::default(),
        }
    }

    fn shed(&self, key: &CallKey, shed: Shed) -> Shed {
        metrics::shed(&key.adapter, &key.account, shed.reason);
        tracing::warn!(adapter = %key.adapter, account = %key.account,
            reason = shed.reason.as_str(), retry_after_ms = shed.retry_after.as_millis() as u64,
            "adapter call shed");
        shed
    }

    fn release(&self, key: &CallKey, reserve: Duration, usage: Usage) {
        let mut inner = self.lock();
        let wakes = inner.pool.release(key, reserve, usage, Instant::now());
        Self::deliver(&mut inner, wakes);
    }

    /// Tell woken calls their fate. A waiter that is gone cannot be (it cancels its
    /// ticket under this lock before it drops its receiver), but if one were, its
    /// slot goes back to the pool rather than leaking.
    fn deliver(inner: &mut Inner, mut wakes: Vec<Wake>) {
        while let Some(wake) = wakes.pop() {
            let granted = wake.outcome.is_ok();
            let key = wake.key.clone();
            let delivered = inner
                .wakers
                .remove(&wake.ticket)
                .is_some_and(|sender| sender.send(wake.outcome).is_ok());
            if granted && !delivered {
                let freed =
                    inner
                        .pool
                        .release(&key, wake.reserve, Usage::default(), Instant::now());
                wakes.extend(freed);
            }
        }
    }
}

/// A queued call; dropped before it settled (its caller went away), it withdraws
/// its ticket or gives back the slot it was just handed.
struct Queued<'a> {
    bulkhead: &'a Arc<Bulkhead>,
    key: &'a CallKey,
    reserve: Duration,
    ticket: Ticket,
    receiver: oneshot::Receiver<Result<(), Shed>>,
    settled: bool,
}

impl Queued<'_> {
    /// The deadline passed: withdraw, unless a release woke the call meanwhile.
    fn give_up(&mut self) -> Result<(), Shed> {
        let mut inner = self.bulkhead.lock();
        if inner.pool.cancel(self.key, self.ticket) {
            inner.wakers.remove(&self.ticket);
            return Err(Shed::new(ShedReason::WaitTimeout, self.bulkhead.max_wait));
        }
        drop(inner);
        self.receiver
            .try_recv()
            .unwrap_or_else(|_| Err(Shed::new(ShedReason::WaitTimeout, self.bulkhead.max_wait)))
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if self.give_up().is_ok() {
            self.bulkhead
                .release(self.key, self.reserve, Usage::default());
        }
    }
}

/// A held slot. Record what the call used with [`SlotGuard::finish`]; dropping it
/// releases the slot (with no usage, if the call never reported).
pub(crate) struct SlotGuard {
    bulkhead: Arc<Bulkhead>,
    key: CallKey,
    reserve: Duration,
    usage: Usage,
}

impl SlotGuard {
    pub fn finish(mut self, usage: Usage) {
        self.usage = usage;
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.bulkhead.release(&self.key, self.reserve, self.usage);
    }
}

#[cfg(test)]
mod tests;
