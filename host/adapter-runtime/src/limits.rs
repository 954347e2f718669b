//! Sandbox limits and runtime configuration.

use crate::bulkhead::BulkheadConfig;
use crate::error::LoadError;
use crate::warm::WarmConfig;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Limits applied to every call of one adapter version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxLimits {
    /// Cap on the total linear memory of one call's instance.
    pub memory_bytes: usize,
    /// CPU deadline of one call, instantiation included. Enforced with epoch
    /// interruption, so the call stops within one epoch tick after it.
    pub cpu_deadline: Duration,
    /// Cap on the size of what one call returns (strings and lists, as held by the host).
    pub max_output_bytes: usize,
    /// Cap on the bytes a call may write through the `log` import and to stdout/stderr
    /// (each stream has its own budget of this size); the rest is dropped.
    pub max_log_bytes: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            memory_bytes: 64 << 20,
            cpu_deadline: Duration::from_millis(200),
            max_output_bytes: 4 << 20,
            max_log_bytes: 64 << 10,
        }
    }
}

/// Largest memory a single instance may be given; the pooling allocator reserves
/// address space per slot for this much.
pub const MAX_MEMORY_BYTES: usize = 1 << 30;
/// Longest CPU deadline a call may be given.
pub const MAX_CPU_DEADLINE: Duration = Duration::from_secs(30);

impl SandboxLimits {
    pub(crate) fn validate(&self) -> Result<(), LoadError> {
        if self.memory_bytes == 0 || self.memory_bytes > MAX_MEMORY_BYTES {
            return Err(LoadError::InvalidLimits(format!(
                "memory_bytes must be between 1 and {MAX_MEMORY_BYTES}"
            )));
        }
        if self.cpu_deadline.is_zero() || self.cpu_deadline > MAX_CPU_DEADLINE {
            return Err(LoadError::InvalidLimits(format!(
                "cpu_deadline must be between 0 and {MAX_CPU_DEADLINE:?}"
            )));
        }
        Ok(())
    }
}

/// The host clock adapters see through `now-unix-millis` (Unix epoch milliseconds).
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// How the runtime is set up.
#[derive(Clone)]
pub struct RuntimeConfig {
    /// Where compiled artifacts are cached across restarts. None: compile on every load.
    pub cache_dir: Option<PathBuf>,
    /// Limits for versions loaded without explicit limits.
    pub default_limits: SandboxLimits,
    /// How many adapter calls may run at the same time; more wait for a slot. The
    /// instance pool is sized from this.
    pub max_concurrent_instances: u32,
    /// The clock behind the `now-unix-millis` import and the WASI wall clock.
    pub clock: Clock,
    /// How often the epoch ticker interrupts guests to check deadlines.
    pub epoch_tick: Duration,
    /// How the slots and the CPU are shared across (adapter, connector account) keys.
    pub bulkhead: BulkheadConfig,
    /// Whether a running guest yields to the async scheduler at every epoch tick (so it
    /// holds a worker thread for at most one tick at a time). Off only where nothing may
    /// depend on wall-clock timing, i.e. the deterministic simulator.
    pub yield_on_tick: bool,
    /// Instances kept warm between calls of one version for one account (`warm.rs`).
    pub warm: WarmConfig,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: None,
            default_limits: SandboxLimits::default(),
            max_concurrent_instances: 64,
            clock: Arc::new(system_clock_millis),
            epoch_tick: Duration::from_millis(10),
            bulkhead: BulkheadConfig::default(),
            yield_on_tick: true,
            warm: WarmConfig::default(),
        }
    }
}

impl fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeConfig")
            .field("cache_dir", &self.cache_dir)
            .field("default_limits", &self.default_limits)
            .field("max_concurrent_instances", &self.max_concurrent_instances)
            .field("epoch_tick", &self.epoch_tick)
            .field("bulkhead", &self.bulkhead)
            .field("yield_on_tick", &self.yield_on_tick)
            .field("warm", &self.warm)
            .finish_non_exhaustive()
    }
}

/// Milliseconds since the Unix epoch from the system clock (0 if the clock is before 1970).
pub fn system_clock_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
