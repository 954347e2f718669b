//! The wasmtime engine: pooling allocator, epoch interruption and its ticker thread.

use crate::error::RuntimeError;
use crate::limits::MAX_MEMORY_BYTES;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Per-component maxima. A Rust `wasm32-wasip2` adapter has one memory, a handful of
/// core instances and tables; these leave room for other toolchains without letting a
/// component reserve unbounded resources.
const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 32;
const MAX_MEMORIES_PER_COMPONENT: u32 = 2;
const MAX_TABLES_PER_COMPONENT: u32 = 8;
/// Instance slots kept free for load-time validation (loads are serialised).
const VALIDATION_SLOTS: u32 = 2;
/// Memory a freed slot keeps resident (see `build_engine`): at most this times the slots
/// of RSS, 34 MiB with the default 64 + 2 slots.
const KEEP_RESIDENT_BYTES: usize = 512 * 1024;
const KEEP_RESIDENT_TABLE_BYTES: usize = 64 * 1024;

/// `SLUICE_WASM_PERFMAP=1`: write a perf map of the guests' compiled code, so
/// `perf record`/`perf report` of the gateway name the guests' functions
/// (BENCHMARKS.md, adapter runtime). Off by default: the map grows with every load.
pub const PERFMAP_ENV: &str = "SLUICE_WASM_PERFMAP";

/// The pool holds the running calls, the idle warm instances (`warm.rs`) and the
/// validation slots: a call never finds the pool exhausted by instances at rest.
pub(crate) fn build_engine(
    max_concurrent_instances: u32,
    max_warm_idle: u32,
) -> Result<Engine, RuntimeError> {
    let slots = max_concurrent_instances
        .max(1)
        .saturating_add(max_warm_idle)
        .saturating_add(VALIDATION_SLOTS);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT))
        .total_memories(slots.saturating_mul(MAX_MEMORIES_PER_COMPONENT))
        .total_tables(slots.saturating_mul(MAX_TABLES_PER_COMPONENT))
        // A store keeps its fiber stack between calls: one per instance slot.
        .total_stacks(slots)
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
        .max_memory_size(MAX_MEMORY_BYTES)
        // A freed slot keeps up to 512 KiB of its memory resident and resets only the pages
        // the call dirtied back to the component's initial image (Linux's PAGEMAP_SCAN,
        // kernel 6.7+), instead of an madvise of the whole memory and page faults on the
        // next call: a 2 KB webhook call went from 64 to 40 us (BENCHMARKS.md). Without
        // PAGEMAP_SCAN wasmtime resets the resident part with memset, which measured slower
        // than madvise. Either way the next call starts from the initial image: nothing one
        // call leaves in memory reaches another (tests/sandbox.rs).
        .pagemap_scan(wasmtime::Enabled::Auto)
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(KEEP_RESIDENT_TABLE_BYTES);

    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    if std::env::var_os(PERFMAP_ENV).is_some_and(|v| v == "1") {
        // Names the guests' compiled functions in `perf report` (/tmp/perf-<pid>.map).
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    Engine::new(&config).map_err(|e| RuntimeError::Engine(format!("{e:?}")))
}

/// Increments the engine's epoch at a fixed interval on a dedicated OS thread. A tokio
/// task could be starved by the very guest it has to interrupt; a thread cannot.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub(crate) fn start(engine: Engine, tick: Duration) -> Result<Self, RuntimeError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("sluice-epoch-ticker".into())
            .spawn(move || {
                while !stop_flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                }
            })
            .map_err(|e| RuntimeError::Engine(format!("cannot start epoch ticker: {e}")))?;
        Ok(EpochTicker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // The ticker never panics; a failed join only means it is already gone.
            let _ = thread.join();
        }
    }
}

/// Number of epoch ticks that covers `deadline`, plus one so a call is never cut short
/// by a tick that was already in flight when it started.
pub(crate) fn deadline_ticks(deadline: Duration, tick: Duration) -> u64 {
    let tick_nanos = tick.as_nanos().max(1);
    let ticks = deadline.as_nanos().div_ceil(tick_nanos);
    u64::try_from(ticks)
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_ticks_round_up_and_add_one() {
        let tick = Duration::from_millis(10);
        assert_eq!(deadline_ticks(Duration::from_millis(200), tick), 21);
        assert_eq!(deadline_ticks(Duration::from_millis(201), tick), 22);
        assert_eq!(deadline_ticks(Duration::from_millis(1), tick), 2);
    }
}
