//! Deterministic simulation of the whole gateway (issue 12).
//!
//! A seed builds a world from the seed alone and drives the real code —
//! store (SQLite, or PostgreSQL with `--store postgres`), orchestrator, inbox processor, recovery scanner, the real
//! Stripe-format and Adyen-format adapter components — against the sandbox
//! PSP's ledger in process, through a network that loses, duplicates,
//! mangles and delays, with the gateway process killed between the PSP's
//! commit and ours. Virtual time only moves when the world moves it; every
//! choice comes from one seeded generator. After every step the money
//! invariants are checked; at the end faults stop, the world converges, and
//! our records must agree with the PSP's ledger.
//!
//! `cargo xtask sim` runs many seeds, `cargo xtask sim --seed S` replays one
//! with its trace.

pub mod business;
pub mod check;
pub mod fulfillment;
pub mod fulfillment_check;
pub mod kills;
pub mod manual_refund;
pub mod merchants;
pub mod net;
pub mod ops;
pub mod process;
pub mod race;
pub mod review;
pub mod review_fulfillment;
pub mod rng;
pub mod seed_db;
pub mod trace;
pub mod webhooks;
pub mod world;

use std::path::Path;
use std::sync::Arc;

use sluice_adapter_runtime::{
    AdapterRuntime, BulkheadConfig, RuntimeConfig, SandboxLimits, MAX_CPU_DEADLINE,
};
use sluice_store::{Clock, ManualClock};

use crate::net::NetMode;
use crate::seed_db::Template;
pub use crate::seed_db::{KeepDb, StoreKind};
use crate::world::World;

/// Why a seed could not run at all (not a finding: a broken set-up).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("set-up: {0}")]
    Setup(String),
    #[error("store: {0}")]
    Store(String),
    #[error("sandbox: {0}")]
    Sandbox(#[from] sluice_sandbox_psp::SandboxError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// How big one seed's world is.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Workload steps with faults, before convergence. 40 by default: about
    /// six payments from two honest tenants with a crash or two, and what
    /// lets 10,000 seeds run in CI's five minutes; a soak can ask for more.
    pub steps: u32,
    /// Convergence rounds at most (each jumps to the next due timer).
    pub converge_rounds: u32,
    /// How much virtual time convergence may take: longer than every
    /// timer the gateway sets (authorization validity 7 days, review after
    /// 24 h of UNKNOWN).
    pub converge_ms: i64,
    /// Print every trace line as it happens.
    pub echo: bool,
    /// The store every seed's gateway runs on.
    pub store: StoreKind,
    /// Whether a seed's database outlives it.
    pub keep_db: KeepDb,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            steps: 40,
            converge_rounds: 5_000,
            converge_ms: 10 * 86_400_000,
            echo: false,
            store: StoreKind::Sqlite,
            keep_db: KeepDb::No,
        }
    }
}

/// What one seed did.
#[derive(Debug, Clone)]
pub struct SeedReport {
    pub seed: u64,
    pub trace_hash: String,
    pub trace_lines: u64,
    pub payments: usize,
    pub crashes: u32,
    /// Of the crashes, the kills at the store's await points.
    pub store_kills: u32,
    /// Of those, the kills after a write transaction's `COMMIT`.
    pub after_commit_kills: u32,
    pub violations: Vec<String>,
    /// How many payments with a business goal ended in each fulfillment
    /// state (empty when the seed failed before convergence).
    pub fulfillment: std::collections::BTreeMap<String, usize>,
    /// The last lines of the trace (for a failing seed).
    pub tail: Vec<String>,
    /// Where the seed's database was kept (`SimOptions::keep_db`): a path,
    /// or a database's name on the PostgreSQL server.
    pub kept_db: Option<String>,
}

impl SeedReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// What a worker keeps across seeds: the compiled adapters (their host clock
/// is the world's virtual clock) and a migrated template database.
pub struct Simulator {
    runtime: AdapterRuntime,
    clock: ManualClock,
    template: Template,
    options: SimOptions,
}

impl Simulator {
    /// Loads the adapters from `adapters_dir` (`stripe.wasm`, `adyen.wasm`).
    pub fn new(adapters_dir: &Path, options: SimOptions) -> Result<Simulator, SimError> {
        let clock = ManualClock::new(world::START_MS);
        let tick = clock.clone();
        let runtime = AdapterRuntime::new(RuntimeConfig {
            cache_dir: Some(adapters_dir.join(".sim-cache")),
            max_concurrent_instances: 4,
            clock: Arc::new(move || tick.now_ms()),
            // The CPU deadline is wall-clock time (epoch ticks): under load a
            // well-behaved call could trap in one run and not in its replay,
            // so a seed's outcome would depend on the machine (CI seed 35 and
            // the seed 1 replay diverged that way). The longest deadline keeps
            // the sandbox armed against a runaway guest without ever firing on
            // the real adapters; the deadline itself is tested in the runtime.
            default_limits: SandboxLimits {
                cpu_deadline: MAX_CPU_DEADLINE,
                ..SandboxLimits::default()
            },
            bulkhead: wide_open_bulkhead(),
            // A guest yielding at a wall-clock tick would let another of the seed's
            // futures run at a point that differs between a run and its replay.
            yield_on_tick: false,
            ..RuntimeConfig::default()
        })
        .map_err(|e| SimError::Setup(e.to_string()))?;
        for name in ["stripe", "adyen"] {
            let path = adapters_dir.join(format!("{name}.wasm"));
            let bytes = std::fs::read(&path)
                .map_err(|e| SimError::Setup(format!("{}: {e}", path.display())))?;
            runtime
                .load(name, &bytes, None, true)
                .map_err(|e| SimError::Setup(format!("loading {name}: {e}")))?;
        }
        let template = tokio_runtime(true)?.block_on(Template::make(&options.store))?;
        Ok(Simulator {
            runtime,
            clock,
            template,
            options,
        })
    }

    /// The stack of the thread a seed runs on (reserved, not committed).
    const SEED_STACK_BYTES: usize = 256 << 20;

    /// Runs one seed to its end.
    pub fn run(&self, seed: u64) -> Result<SeedReport, SimError> {
        let runtime = tokio_runtime(self.template.needs_io())?;
        let db = runtime.block_on(self.template.seed_db(seed))?;
        let url = db.url();
        let started = std::time::Instant::now();
        // On a thread of its own with a large stack: a world's future holds
        // the whole gateway's call chains, megabytes in a debug build, where
        // a test harness thread has 2 MiB. It inherits the job's core.
        let report = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name(format!("seed-{seed}"))
                .stack_size(Self::SEED_STACK_BYTES)
                .spawn_scoped(scope, || runtime.block_on(self.run_world(seed, &url)))
                .map_err(SimError::Io)?
                .join()
                .map_err(|_| SimError::Setup(format!("seed {seed}: its thread panicked")))?
        });
        tracing::debug!(
            target: "sluice_sim::seed_db",
            "seed {seed}: ran in {} ms",
            started.elapsed().as_millis()
        );
        let passed = report.as_ref().is_ok_and(SeedReport::passed);
        // Before the runtime goes: a PostgreSQL database is dropped through
        // it (disconnecting the killed incarnations' pools).
        let kept = runtime.block_on(
            self.template
                .finish(db, seed, passed, &self.options.keep_db),
        );
        // The killed incarnations' calls hang forever by design; nothing of
        // the world is left to wait for.
        runtime.shutdown_background();
        let mut report = report?;
        report.kept_db = kept?;
        Ok(report)
    }

    async fn run_world(&self, seed: u64, db_url: &str) -> Result<SeedReport, SimError> {
        let mut world = World::build(
            seed,
            self.runtime.clone(),
            self.clock.clone(),
            db_url,
            self.options.echo,
        )
        .await?;
        let mode = world.mode();
        world.trace.line(format!(
            "seed {seed}: faults {} per mille, crashes {}",
            mode.fault_per_mille, mode.crashes
        ));
        for _ in 0..self.options.steps {
            world.step().await?;
            world.check_step().await?;
            if !world.violations.is_empty() {
                break;
            }
        }
        if world.violations.is_empty() {
            world
                .converge(self.options.converge_rounds, self.options.converge_ms)
                .await?;
            // The operators' turn: what automation left in review, resolved
            // by two people from the PSP's record; then automation again.
            if world.operators_turn().await? {
                world
                    .converge(self.options.converge_rounds, self.options.converge_ms)
                    .await?;
            }
            world.check_step().await?;
            world.check_converged().await?;
        }
        Ok(SeedReport {
            seed,
            trace_hash: world.trace.hash(),
            trace_lines: world.trace.len(),
            payments: world.payments.len(),
            crashes: world.crashes,
            store_kills: world.armed.kills(),
            after_commit_kills: world.armed.after_commit_kills(),
            violations: world.violations.clone(),
            fulfillment: world.fulfillment_outcomes.clone(),
            tail: world.trace.tail(),
            kept_db: None,
        })
    }
}

impl World {
    /// Faults stop; the PSP settles, every webhook arrives, the inbox drains
    /// and recovery runs, jumping to each next due timer, until nothing is
    /// due or the rounds run out.
    ///
    /// Only timers of payments outside manual review are jumped to: a
    /// flagged payment's queries go on at the capped backoff for as long as
    /// an operator leaves it, and stepping through each of them (hundreds
    /// over the week an authorization lives: seed 1 took 471 rounds) would
    /// cost most of a seed's time while deciding nothing the convergence
    /// check looks at. Its due rows still run, late, in the rounds the other
    /// timers cause: a scanner that comes late is a state the gateway must
    /// handle anyway.
    pub async fn converge(&mut self, rounds: u32, within_ms: i64) -> Result<(), SimError> {
        let deadline = self.now_ms().saturating_add(within_ms);
        self.set_mode(NetMode {
            fault_per_mille: 0,
            crashes: false,
        });
        self.trace.line("converge: faults stop");
        for _ in 0..rounds {
            self.settle()?;
            self.deliver_webhooks(true).await?;
            self.drain_inbox().await?;
            self.scan().await?;
            self.publish_all().await?;
            self.collect_webhooks();
            if !self.in_flight.is_empty() {
                continue;
            }
            let now = self.now_ms();
            let open = self.open_outside_review(now).await?;
            // Only queries of flagged payments are left: an operator's turn.
            if open.count == 0 {
                break;
            }
            // What is due now was just run; what is left waits for a later
            // time, a lease or claim of a killed instance to run out, or an
            // earlier event of its payment (the publisher's per-payment order).
            let next = match (open.next_due, open.lease_expiry) {
                (Some(due), Some(lease)) => Some(due.min(lease)),
                (due, lease) => due.or(lease),
            };
            match next {
                Some(at) if at <= deadline => self.clock.advance((at - now).max(0) + 1),
                _ => break,
            }
        }
        self.trace.line("converge: done");
        Ok(())
    }

    /// Publisher passes until one finds nothing to do (bounded: each pass
    /// handles a batch, and a seed has a few hundred events at most).
    async fn publish_all(&mut self) -> Result<(), SimError> {
        for _ in 0..20 {
            if !self.publish().await? {
                break;
            }
        }
        Ok(())
    }

    /// Pending rows (anything with a next look, and fulfillment checks: a
    /// deadline is a timer too, and nothing else wakes a push payment whose
    /// merchant never confirms) of payments no operator has been asked
    /// about, inbox events not yet applied, outbox events and deliveries not
    /// yet done, the earliest of their due times after `now`, and when the
    /// first lease or claim held at `now` runs out (a scanner's lease, an
    /// outbox event's or delivery's claim, an inbox event's claim by a
    /// processor killed while applying it): one statement, as every
    /// convergence round asks.
    async fn open_outside_review(&self, now: i64) -> Result<OpenOutsideReview, SimError> {
        let (count, next_due, lease_expiry): (i64, Option<i64>, Option<i64>) =
            sqlx::query_as(OPEN_OUTSIDE_REVIEW)
                .bind(now)
                .fetch_one(self.gw.store.pool())
                .await?;
        Ok(OpenOutsideReview {
            count,
            next_due,
            lease_expiry,
        })
    }
}

struct OpenOutsideReview {
    count: i64,
    next_due: Option<i64>,
    lease_expiry: Option<i64>,
}

const OPEN_OUTSIDE_REVIEW: &str = "
WITH open_rows AS (
    SELECT t.next_retry_time AS due FROM payment_attempts t
        JOIN payment_orders o ON o.id = t.payment_id
        WHERE t.next_retry_time IS NOT NULL AND o.manual_review = 0
    UNION ALL
    SELECT t.next_retry_time FROM captures t
        JOIN payment_orders o ON o.id = t.payment_id
        WHERE t.next_retry_time IS NOT NULL AND o.manual_review = 0
    UNION ALL
    SELECT t.next_retry_time FROM refunds t
        JOIN payment_orders o ON o.id = t.payment_id
        WHERE t.next_retry_time IS NOT NULL AND o.manual_review = 0
    UNION ALL
    SELECT fulfillment_next_check_at FROM payment_orders
        WHERE fulfillment_next_check_at IS NOT NULL AND manual_review = 0
    UNION ALL
    SELECT next_attempt_at FROM webhook_inbox
        WHERE status IN ('pending', 'processing', 'failed')
    UNION ALL
    SELECT next_attempt_at FROM outbox WHERE status = 'pending'
    UNION ALL
    SELECT next_attempt_at FROM event_deliveries WHERE status = 'pending'
),
leases AS (
    SELECT lease_until AS until FROM scanner_leases
    UNION ALL
    SELECT claimed_until FROM outbox WHERE status = 'pending'
    UNION ALL
    SELECT claimed_until FROM event_deliveries WHERE status = 'pending'
    UNION ALL
    SELECT claimed_until FROM webhook_inbox WHERE status = 'processing'
)
SELECT (SELECT COUNT(*) FROM open_rows),
       (SELECT MIN(due) FROM open_rows WHERE due > $1),
       (SELECT MIN(until) FROM leases WHERE until > $1)";

/// The bulkhead's waits and CPU budgets are wall-clock time too: a call shed
/// under load in one run and not in its replay would make a seed depend on
/// the machine. Wide open, it never sheds the simulator's calls (one seed
/// calls one adapter at a time); its fairness is tested in the runtime.
fn wide_open_bulkhead() -> BulkheadConfig {
    BulkheadConfig {
        key_share_percent: 100,
        adapter_share_percent: 100,
        queue_per_key: sluice_adapter_runtime::bulkhead::MAX_QUEUE_PER_KEY,
        max_wait: sluice_adapter_runtime::bulkhead::MAX_WAIT,
        cpu_burst_ms: sluice_adapter_runtime::bulkhead::MAX_CPU_BUDGET_MS,
        cpu_refill_ms_per_sec: sluice_adapter_runtime::bulkhead::MAX_CPU_BUDGET_MS,
        adapter_deadline_burst_ms: sluice_adapter_runtime::bulkhead::MAX_CPU_BUDGET_MS,
        adapter_deadline_refill_ms_per_sec: sluice_adapter_runtime::bulkhead::MAX_CPU_BUDGET_MS,
    }
}

/// A current-thread runtime: one seed runs on one thread, in one order.
/// On SQLite timers only (budgets are `tokio::time` timeouts): a seed opens
/// no socket, and without an I/O driver an idle runtime parks on a futex
/// rather than in `epoll_wait`, woken without an eventfd write, which is
/// cheaper on each of the thousands of hand-offs to SQLite's worker thread a
/// seed makes. PostgreSQL is a socket (`io`).
fn tokio_runtime(io: bool) -> Result<tokio::runtime::Runtime, SimError> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time();
    if io {
        builder.enable_io();
    }
    Ok(builder.build()?)
}
