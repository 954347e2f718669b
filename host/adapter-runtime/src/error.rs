//! Typed errors at the runtime's boundary.

use std::path::PathBuf;

/// Why a call into an adapter failed. Every variant is an error for that one call: the
/// store it ran in is discarded and the adapter keeps serving later calls.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// The call used more than its CPU deadline and was interrupted.
    #[error("adapter call exceeded its CPU deadline")]
    Timeout,
    /// The adapter tried to grow its memory beyond its cap.
    #[error("adapter exceeded its memory limit")]
    MemoryLimit,
    /// The adapter trapped (panic, `unreachable`, out-of-bounds access, ...).
    #[error("adapter trapped: {0}")]
    Trap(String),
    /// What the adapter returned is larger than its output cap.
    #[error("adapter output of {size} bytes exceeds the cap of {limit} bytes")]
    OutputTooLarge { size: usize, limit: usize },
    /// A fresh instance could not be created (e.g. the instance pool is exhausted).
    #[error("cannot instantiate adapter: {0}")]
    Instantiate(String),
    /// The bulkhead refused the call before it ran (its connector account's queue is
    /// full, no slot came within the wait deadline, or its CPU budget is used up):
    /// nothing happened; try again after `retry_after_ms`.
    #[error("adapter call shed: {reason}")]
    Shed {
        reason: crate::bulkhead::ShedReason,
        retry_after_ms: u64,
    },
    /// The runtime is shutting down and no longer runs calls.
    #[error("adapter runtime is shutting down")]
    ShuttingDown,
    /// A failure of the host machinery itself, not of the adapter.
    #[error("adapter runtime internal error: {0}")]
    Internal(String),
}

impl From<crate::bulkhead::Shed> for AdapterError {
    fn from(shed: crate::bulkhead::Shed) -> Self {
        AdapterError::Shed {
            reason: shed.reason,
            retry_after_ms: u64::try_from(shed.retry_after.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        }
    }
}

impl AdapterError {
    /// For a shed call: when it is worth trying again (whole seconds, at least 1),
    /// as a `Retry-After` header says it.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            AdapterError::Shed { retry_after_ms, .. } => Some(retry_after_ms.div_ceil(1000).max(1)),
            _ => None,
        }
    }
}

/// Why an adapter component could not be loaded, activated or rolled back. When a
/// load fails, nothing changes: the previously active version keeps serving.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The name is not usable as an adapter name (it is also a URL path segment).
    #[error("invalid adapter name {0:?}: use 1-64 characters of a-z, 0-9, '-' and '_'")]
    InvalidName(String),
    /// The bytes are not a valid WebAssembly component for this engine.
    #[error("not a valid adapter component: {0}")]
    InvalidComponent(String),
    /// The component does not implement the `psp-adapter` world (missing or mistyped
    /// exports, or imports the host does not provide).
    #[error("component does not implement the sluice:psp psp-adapter world: {0}")]
    WrongWorld(String),
    /// The component exports the adapter interface of a contract version the host does
    /// not support.
    #[error("unsupported adapter contract version: {0}")]
    UnsupportedContractVersion(String),
    /// `describe().name` differs from the name the component is loaded under.
    #[error("adapter describes itself as {got:?} but is loaded as {expected:?}")]
    NameMismatch { expected: String, got: String },
    /// `describe()` failed during validation.
    #[error("describe() failed during validation: {0}")]
    DescribeFailed(#[source] AdapterError),
    /// The limits asked for exceed what the engine was configured for.
    #[error("sandbox limits not supported: {0}")]
    InvalidLimits(String),
    /// No adapter of that name is loaded.
    #[error("no adapter named {0:?} is loaded")]
    UnknownAdapter(String),
    /// The adapter has no loaded version with that digest.
    #[error("adapter {name:?} has no loaded version with digest {digest}")]
    UnknownVersion { name: String, digest: String },
    /// There is no previously active version to go back to.
    #[error("adapter {0:?} has no previously active version to roll back to")]
    NothingToRollBackTo(String),
    /// A shadow or canary rollout asked for something the runtime cannot serve.
    #[error("invalid rollout: {0}")]
    InvalidRollout(String),
    /// The version asked to run beside the active one is the active one.
    #[error("adapter {name:?} version {digest} is the active version; stage another one")]
    AlreadyActive { name: String, digest: String },
    /// A file could not be read.
    #[error("cannot read {path}: {message}")]
    Io { path: PathBuf, message: String },
}

/// Why the runtime itself could not be created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot configure the wasm engine: {0}")]
    Engine(String),
    #[error("invalid bulkhead configuration: {0}")]
    InvalidBulkhead(String),
    #[error("cannot use compile cache directory {path}: {message}")]
    CacheDir { path: PathBuf, message: String },
}

/// Formats a wasmtime error with its whole cause chain (its `Display` drops the trap
/// cause), bounded so an adapter cannot flood logs through its error messages.
pub(crate) fn describe_wasm_error(err: &wasmtime::Error) -> String {
    const MAX: usize = 2048;
    let mut text = format!("{err:?}");
    if text.len() > MAX {
        let mut cut = MAX;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(" …");
    }
    text
}
