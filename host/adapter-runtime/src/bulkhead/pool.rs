//! The pure state machine of the bulkhead: instance slots shared fairly across
//! (adapter, connector account) keys, bounded per-key queues, and the CPU token
//! buckets. No clock, no IO, no async: every method takes `now`, so its tests are
//! deterministic.

use super::{BulkheadConfig, Shed, ShedReason};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Who a call is for: the adapter's name and the connector account id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallKey {
    pub adapter: String,
    pub account: String,
}

impl CallKey {
    pub fn new(adapter: impl Into<String>, account: impl Into<String>) -> Self {
        CallKey {
            adapter: adapter.into(),
            account: account.into(),
        }
    }
}

/// A queued call, woken by [`SlotPool::release`] or cancelled by its waiter.
pub type Ticket = u64;

/// What one finished call cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// The guest's CPU time on its thread (instantiation included).
    pub cpu: Duration,
    /// The call was interrupted at its CPU deadline.
    pub deadline_hit: bool,
}

/// The answer to a call asking for a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The call holds a slot now; it must [`SlotPool::release`] it.
    Granted,
    /// The call waits; a later release wakes it, or its waiter cancels it.
    Queued(Ticket),
    /// The call is refused at once.
    Shed(Shed),
}

/// A queued call's fate, decided by a release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake {
    pub ticket: Ticket,
    pub key: CallKey,
    /// The reserve the call was queued with (what its release must free).
    pub reserve: Duration,
    /// `Ok`: the call now holds a slot. `Err`: it is shed (its key was throttled).
    pub outcome: Result<(), Shed>,
}

/// A token bucket of microseconds of CPU time. It may go into debt: a call is
/// charged what it used after it ran, and a key in debt is throttled until the
/// refill pays it back.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    micros: i64,
    capacity: i64,
    /// Microseconds added per second.
    refill: i64,
    last: Instant,
}

impl Bucket {
    fn new(capacity_ms: u64, refill_ms_per_sec: u64, now: Instant) -> Self {
        let capacity = millis_to_micros(capacity_ms);
        Bucket {
            micros: capacity,
            capacity,
            refill: millis_to_micros(refill_ms_per_sec),
            last: now,
        }
    }

    fn refill_to(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_micros();
        // `refill` is at most 10^12 and elapsed fits in u64 for 500 000 years: no overflow in u128.
        let added = elapsed.saturating_mul(self.refill.unsigned_abs() as u128) / 1_000_000;
        let added = i64::try_from(added).unwrap_or(i64::MAX);
        self.micros = self.micros.saturating_add(added).min(self.capacity);
        self.last = self.last.max(now);
    }

    fn charge(&mut self, used: Duration) {
        let used = i64::try_from(used.as_micros()).unwrap_or(i64::MAX);
        self.micros = self.micros.saturating_sub(used);
    }

    fn exhausted(&self) -> bool {
        self.micros <= 0
    }

    fn full(&self) -> bool {
        self.micros >= self.capacity
    }

    /// How long until the bucket is positive again.
    fn retry_after(&self) -> Duration {
        let missing = self.micros.saturating_neg().saturating_add(1).max(1);
        let micros = (missing as u128).saturating_mul(1_000_000) / self.refill.max(1) as u128;
        Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
    }
}

fn duration_micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn micros_duration(micros: i64) -> Duration {
    Duration::from_micros(micros.max(0).unsigned_abs())
}

fn millis_to_micros(ms: u64) -> i64 {
    i64::try_from(ms.saturating_mul(1000)).unwrap_or(i64::MAX)
}

#[derive(Debug)]
struct KeyState {
    in_use: usize,
    /// Queued calls with the CPU each must find reserved before it may start.
    waiting: VecDeque<(Ticket, i64)>,
    cpu: Bucket,
    /// Microseconds of CPU the key's running calls may still spend: the sum of their
    /// reserves (each its call's CPU deadline), released when the call reports.
    reserved: i64,
}

#[derive(Debug)]
struct AdapterState {
    in_use: usize,
    /// Charged only with calls that hit their CPU deadline, over every account of
    /// the adapter: one tenant cannot dodge its budget with many accounts, and an
    /// adapter that merely serves a lot never drains it.
    deadline: Bucket,
}

/// Keys idle this long past a full bucket are forgotten (bounded memory).
const PRUNE_ABOVE_KEYS: usize = 4096;

/// The slots of one runtime and who holds them.
#[derive(Debug)]
pub struct SlotPool {
    config: BulkheadConfig,
    key_cap: usize,
    adapter_cap: usize,
    free: usize,
    keys: HashMap<CallKey, KeyState>,
    adapters: HashMap<String, AdapterState>,
    /// Keys with queued calls, in the order they are served (round robin).
    ready: VecDeque<CallKey>,
    next_ticket: Ticket,
}

impl SlotPool {
    /// A pool of `slots` slots (at least 1); `config` must be valid.
    pub fn new(slots: usize, config: BulkheadConfig) -> Self {
        let slots = slots.max(1);
        let (key_cap, adapter_cap) = config.caps(slots);
        SlotPool {
            config,
            key_cap,
            adapter_cap,
            free: slots,
            keys: HashMap::new(),
            adapters: HashMap::new(),
            ready: VecDeque::new(),
            next_ticket: 0,
        }
    }

    /// The most slots one key, and one adapter over all its accounts, may hold.
    pub fn caps(&self) -> (usize, usize) {
        (self.key_cap, self.adapter_cap)
    }

    /// Slots held by `key` now.
    pub fn in_use(&self, key: &CallKey) -> usize {
        self.keys.get(key).map_or(0, |k| k.in_use)
    }

    /// Ask for a slot for a call that may spend up to `reserve` of CPU (its deadline).
    /// With `may_queue` false a call that would wait is shed instead.
    ///
    /// A key with CPU left may always run one call; each further call at once must
    /// find its whole `reserve` in the key's bucket beyond what the running calls may
    /// still spend. A key whose calls use what they are allowed therefore runs one at
    /// a time as its bucket runs low, instead of a whole share of slots spinning in
    /// parallel before the first one is charged.
    pub fn admit(
        &mut self,
        key: &CallKey,
        reserve: Duration,
        now: Instant,
        may_queue: bool,
    ) -> Admission {
        let reserve = duration_micros(reserve);
        if self.keys.len() > PRUNE_ABOVE_KEYS {
            self.prune(now);
        }
        self.touch(key, now);
        if let Some(shed) = self.throttled(key) {
            return Admission::Shed(shed);
        }
        let has_waiters = self.keys.get(key).is_some_and(|k| !k.waiting.is_empty());
        if !has_waiters && self.eligible(key, reserve) {
            self.take(key, reserve);
            return Admission::Granted;
        }
        let limit = self.config.queue_per_key;
        let Some(state) = self.keys.get_mut(key) else {
            return Admission::Shed(Shed::new(ShedReason::QueueFull, self.config.max_wait));
        };
        if !may_queue || state.waiting.len() >= limit {
            return Admission::Shed(Shed::new(ShedReason::QueueFull, self.config.max_wait));
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        state.waiting.push_back((ticket, reserve));
        if !self.ready.contains(key) {
            self.ready.push_back(key.clone());
        }
        Admission::Queued(ticket)
    }

    /// Withdraw a queued call (its wait deadline passed, or its caller left). False
    /// when it is no longer queued: a release already woke it.
    pub fn cancel(&mut self, key: &CallKey, ticket: Ticket) -> bool {
        let Some(state) = self.keys.get_mut(key) else {
            return false;
        };
        let Some(at) = state.waiting.iter().position(|(t, _)| *t == ticket) else {
            return false;
        };
        state.waiting.remove(at);
        if state.waiting.is_empty() {
            self.ready.retain(|k| k != key);
        }
        true
    }

    /// A call of `key` that was admitted with `reserve` is done with its slot: charge
    /// what it used, free its reserve and hand freed slots to queued calls, one key at
    /// a time in turn.
    pub fn release(
        &mut self,
        key: &CallKey,
        reserve: Duration,
        usage: Usage,
        now: Instant,
    ) -> Vec<Wake> {
        self.touch(key, now);
        if let Some(state) = self.keys.get_mut(key) {
            state.in_use = state.in_use.saturating_sub(1);
            state.reserved = state
                .reserved
                .saturating_sub(duration_micros(reserve))
                .max(0);
            state.cpu.charge(usage.cpu);
        }
        if let Some(adapter) = self.adapters.get_mut(&key.adapter) {
            adapter.in_use = adapter.in_use.saturating_sub(1);
            if usage.deadline_hit {
                adapter.deadline.charge(usage.cpu);
            }
        }
        self.free += 1;
        self.wake(now)
    }

    /// Hand free slots to the queued calls of eligible keys, in round-robin order;
    /// queued calls of a throttled key are shed.
    fn wake(&mut self, now: Instant) -> Vec<Wake> {
        let mut wakes = Vec::new();
        let mut turn = 0;
        while turn < self.ready.len() && self.free > 0 {
            let key = self.ready[turn].clone();
            self.touch(&key, now);
            if let Some(shed) = self.throttled(&key) {
                self.ready.remove(turn);
                let drained = self
                    .keys
                    .get_mut(&key)
                    .map(|k| std::mem::take(&mut k.waiting));
                wakes.extend(drained.into_iter().flatten().map(|(ticket, reserve)| Wake {
                    ticket,
                    key: key.clone(),
                    reserve: micros_duration(reserve),
                    outcome: Err(shed.clone()),
                }));
                continue;
            }
            let head = self.keys.get(&key).and_then(|k| k.waiting.front().copied());
            let Some((ticket, reserve)) = head else {
                self.ready.remove(turn);
                continue;
            };
            if !self.eligible(&key, reserve) {
                turn += 1;
                continue;
            }
            if let Some(state) = self.keys.get_mut(&key) {
                state.waiting.pop_front();
            }
            self.ready.remove(turn);
            self.take(&key, reserve);
            wakes.push(Wake {
                ticket,
                key: key.clone(),
                reserve: micros_duration(reserve),
                outcome: Ok(()),
            });
            if self.keys.get(&key).is_some_and(|k| !k.waiting.is_empty()) {
                self.ready.push_back(key);
            }
            turn = 0;
        }
        wakes
    }

    /// Refills `key`'s and its adapter's buckets, creating them on first sight. Looks up
    /// before inserting: `entry` takes an owned key, and cloning the key's strings on every
    /// admission and release was a measurable part of a warm call's fixed cost.
    fn touch(&mut self, key: &CallKey, now: Instant) {
        let config = &self.config;
        match self.keys.get_mut(key) {
            Some(state) => state.cpu.refill_to(now),
            None => {
                let mut cpu = Bucket::new(config.cpu_burst_ms, config.cpu_refill_ms_per_sec, now);
                cpu.refill_to(now);
                let state = KeyState {
                    in_use: 0,
                    waiting: VecDeque::new(),
                    cpu,
                    reserved: 0,
                };
                self.keys.insert(key.clone(), state);
            }
        }
        match self.adapters.get_mut(&key.adapter) {
            Some(adapter) => adapter.deadline.refill_to(now),
            None => {
                let mut deadline = Bucket::new(
                    config.adapter_deadline_burst_ms,
                    config.adapter_deadline_refill_ms_per_sec,
                    now,
                );
                deadline.refill_to(now);
                let state = AdapterState {
                    in_use: 0,
                    deadline,
                };
                self.adapters.insert(key.adapter.clone(), state);
            }
        }
    }

    fn throttled(&self, key: &CallKey) -> Option<Shed> {
        if let Some(state) = self.keys.get(key).filter(|k| k.cpu.exhausted()) {
            return Some(Shed::new(ShedReason::CpuBudget, state.cpu.retry_after()));
        }
        self.adapters
            .get(&key.adapter)
            .filter(|a| a.deadline.exhausted())
            .map(|a| Shed::new(ShedReason::AdapterCpuBudget, a.deadline.retry_after()))
    }

    /// A free slot, the key and its adapter under their caps, and CPU for the call:
    /// the first running call of a key needs only a bucket that is not exhausted
    /// (checked by `throttled`), every further one its whole reserve on top of the
    /// running calls' reserves.
    fn eligible(&self, key: &CallKey, reserve: i64) -> bool {
        let covered = self
            .keys
            .get(key)
            .is_none_or(|k| k.in_use == 0 || k.cpu.micros.saturating_sub(k.reserved) >= reserve);
        self.free > 0
            && covered
            && self.in_use(key) < self.key_cap
            && self.adapters.get(&key.adapter).map_or(0, |a| a.in_use) < self.adapter_cap
    }

    fn take(&mut self, key: &CallKey, reserve: i64) {
        self.free -= 1;
        if let Some(state) = self.keys.get_mut(key) {
            state.in_use += 1;
            state.reserved = state.reserved.saturating_add(reserve);
        }
        if let Some(adapter) = self.adapters.get_mut(&key.adapter) {
            adapter.in_use += 1;
        }
    }

    /// Forget idle keys whose buckets are full again: they behave exactly like new ones.
    fn prune(&mut self, now: Instant) {
        self.keys.retain(|_, k| {
            k.cpu.refill_to(now);
            k.in_use > 0 || !k.waiting.is_empty() || !k.cpu.full()
        });
        self.adapters.retain(|_, a| {
            a.deadline.refill_to(now);
            a.in_use > 0 || !a.deadline.full()
        });
    }
}
