//! The per-call sandbox: the store's data, the memory limiter, captured stdio, the
//! deny-all WASI context and the `host` and `keyring` imports scoped to one connector
//! account.

use crate::bindings::sluice::psp::{host, keyring, types};
use crate::keyring::{HmacHash, KeyText, KeyringFailure};
use crate::limits::{Clock, SandboxLimits};
use crate::ConnectorAccountScope;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{HostWallClock, ResourceTable, WasiCtx, WasiCtxView, WasiView};

/// Everything one call's `Store` holds. Built fresh for each call, dropped after it.
pub(crate) struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    scope: Arc<ConnectorAccountScope>,
    clock: Clock,
    log_budget: usize,
    logs_dropped: usize,
    pub(crate) stdout: CapturedOutput,
    pub(crate) stderr: CapturedOutput,
}

impl CallState {
    pub(crate) fn new(
        limits: &SandboxLimits,
        scope: Arc<ConnectorAccountScope>,
        clock: Clock,
    ) -> Self {
        let stdout = CapturedOutput::new(limits.max_log_bytes);
        let stderr = CapturedOutput::new(limits.max_log_bytes);
        let wasi = deny_all_wasi(&stdout, &stderr, Arc::clone(&clock));
        CallState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(limits.memory_bytes),
            scope,
            clock,
            log_budget: limits.max_log_bytes,
            logs_dropped: 0,
            stdout,
            stderr,
        }
    }

    /// Readies a warm instance's state for its next call: this call's scope (the
    /// account's credentials may have rotated since), fresh log and output budgets.
    /// The memory limiter keeps its total: the guest's memory is what it was.
    pub(crate) fn begin_next_call(
        &mut self,
        limits: &SandboxLimits,
        scope: &ConnectorAccountScope,
    ) {
        debug_assert_eq!(
            scope.account_id, self.scope.account_id,
            "a warm instance never changes account"
        );
        // Equal settings and keys (the usual case) keep the copy the store already holds:
        // cloning the scope's maps and strings on every call cost more than comparing
        // them. Anything changed (a rotated secret, a new setting) is copied in.
        if *self.scope != *scope {
            self.scope = Arc::new(scope.clone());
        }
        self.log_budget = limits.max_log_bytes;
        self.logs_dropped = 0;
        let _ = self.stdout.take();
        let _ = self.stderr.take();
    }

    /// Whether the store may serve another call of the same account: the memory cap
    /// was never hit and the guest left no WASI resource open.
    pub(crate) fn reusable(&self) -> bool {
        !self.limiter.hit && self.table.is_empty()
    }

    /// Sends what the call wrote to stdout/stderr, and how much was dropped, to tracing:
    /// one event per stream, so a call cannot multiply log events by printing short
    /// lines. Runs inside the call's span (adapter name, version, digest).
    pub(crate) fn emit_captured_output(&self) {
        for (stream, captured) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let (bytes, dropped) = captured.take();
            if bytes.is_empty() && dropped == 0 {
                continue;
            }
            let text = String::from_utf8_lossy(&bytes);
            if dropped > 0 {
                tracing::warn!(target: "sluice::adapter::output", stream, dropped_bytes = dropped,
                    "adapter output over budget was dropped; kept:\n{}", text.trim_end());
            } else {
                tracing::info!(target: "sluice::adapter::output", stream, "{}", text.trim_end());
            }
        }
        if self.logs_dropped > 0 {
            tracing::warn!(target: "sluice::adapter::log", dropped_lines = self.logs_dropped, "adapter log lines over budget were dropped");
        }
    }
}

/// What one `log` line costs against the budget on top of its text.
const LOG_LINE_OVERHEAD: usize = 64;

/// stdin closed, no args, no environment, no preopened directories, no sockets or name
/// lookups, stdout/stderr captured with a cap, wall clock = the host clock.
fn deny_all_wasi(stdout: &CapturedOutput, stderr: &CapturedOutput, clock: Clock) -> WasiCtx {
    let mut builder = WasiCtx::builder();
    builder
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .wall_clock(HostClock(clock));
    builder.build()
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for CallState {}

impl host::Host for CallState {
    fn get_config(&mut self, key: String) -> Option<String> {
        self.scope.visible_config(&key).map(str::to_owned)
    }

    fn log(&mut self, level: host::LogLevel, message: String) {
        // Each line costs its length plus a fixed overhead, so a flood of empty lines
        // exhausts the budget too.
        let cost = message.len().saturating_add(LOG_LINE_OVERHEAD);
        if cost > self.log_budget {
            self.logs_dropped += 1;
            return;
        }
        self.log_budget -= cost;
        let account = self.scope.account_id.as_str();
        match level {
            host::LogLevel::Trace => {
                tracing::trace!(target: "sluice::adapter::log", account, "{message}")
            }
            host::LogLevel::Debug => {
                tracing::debug!(target: "sluice::adapter::log", account, "{message}")
            }
            host::LogLevel::Info => {
                tracing::info!(target: "sluice::adapter::log", account, "{message}")
            }
            host::LogLevel::Warn => {
                tracing::warn!(target: "sluice::adapter::log", account, "{message}")
            }
            host::LogLevel::Error => {
                tracing::error!(target: "sluice::adapter::log", account, "{message}")
            }
        }
    }

    fn now_unix_millis(&mut self) -> i64 {
        (self.clock)()
    }
}

impl keyring::Host for CallState {
    fn hmac(
        &mut self,
        key_name: String,
        algorithm: keyring::HmacAlgorithm,
        encoding: keyring::KeyEncoding,
        data: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, keyring::KeyringError> {
        let hash = match algorithm {
            keyring::HmacAlgorithm::Sha256 => HmacHash::Sha256,
            keyring::HmacAlgorithm::Sha512 => HmacHash::Sha512,
        };
        let text = match encoding {
            keyring::KeyEncoding::Utf8 => KeyText::Utf8,
            keyring::KeyEncoding::Hex => KeyText::Hex,
            keyring::KeyEncoding::Base64 => KeyText::Base64,
        };
        self.scope
            .secrets
            .hmac(&key_name, hash, text, &data)
            .map_err(|failure| {
                let message = failure.to_string();
                match failure {
                    KeyringFailure::UnknownKey(_) => keyring::KeyringError::UnknownKey(message),
                    KeyringFailure::UnusableKey { .. } => {
                        keyring::KeyringError::UnusableKey(message)
                    }
                    KeyringFailure::TooLarge { .. } => keyring::KeyringError::TooLarge(message),
                }
            })
    }
}

/// The WASI wall clock reads the same host clock as `now-unix-millis`, so simulated
/// time is consistent whichever an adapter uses.
struct HostClock(Clock);

impl HostWallClock for HostClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn now(&self) -> Duration {
        Duration::from_millis(u64::try_from((self.0)()).unwrap_or(0))
    }
}

/// Caps the total linear memory of one store and remembers whether the cap was hit,
/// so the call's failure is reported as `MemoryLimit` rather than as whatever trap
/// the guest's allocator turns the failed growth into.
pub(crate) struct MemoryLimiter {
    limit: usize,
    total: usize,
    pub(crate) hit: bool,
}

/// Table elements per store; Rust components use a few dozen.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl MemoryLimiter {
    fn new(limit: usize) -> Self {
        MemoryLimiter {
            limit,
            total: 0,
            hit: false,
        }
    }
}

#[derive(Debug)]
pub(crate) struct MemoryLimitExceeded;

impl std::fmt::Display for MemoryLimitExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("adapter memory limit exceeded")
    }
}

impl std::error::Error for MemoryLimitExceeded {}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let new_total = self.total.saturating_sub(current).saturating_add(desired);
        if new_total > self.limit {
            self.hit = true;
            // Trapping (rather than failing the grow) stops the guest at once instead of
            // letting it retry or spin in its allocator until the deadline.
            return Err(wasmtime::Error::new(MemoryLimitExceeded));
        }
        self.total = new_total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// A stdout/stderr sink that keeps the first `cap` bytes and counts the rest. It never
/// fails a write: output is diagnostics, and a chatty adapter must still get its answer
/// through.
#[derive(Clone)]
pub(crate) struct CapturedOutput {
    inner: Arc<Mutex<Captured>>,
    cap: usize,
}

#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: u64,
}

impl CapturedOutput {
    fn new(cap: usize) -> Self {
        CapturedOutput {
            inner: Arc::new(Mutex::new(Captured::default())),
            cap,
        }
    }

    fn push(&self, data: &[u8]) {
        let mut captured = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let room = self.cap.saturating_sub(captured.bytes.len());
        let kept = room.min(data.len());
        captured.bytes.extend_from_slice(&data[..kept]);
        captured.dropped += (data.len() - kept) as u64;
    }

    /// The kept bytes and the number of dropped bytes.
    pub(crate) fn take(&self) -> (Vec<u8>, u64) {
        let mut captured = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let dropped = std::mem::take(&mut captured.dropped);
        (std::mem::take(&mut captured.bytes), dropped)
    }

    #[cfg(test)]
    fn kept_len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
            .len()
    }
}

/// Largest write the guest is told it may make at once.
const WRITE_PERMIT: usize = 64 << 10;

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl tokio::io::AsyncWrite for CapturedOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_output_keeps_the_first_bytes_and_counts_the_rest() {
        let out = CapturedOutput::new(10);
        out.push(b"0123456");
        out.push(b"789abcdef");
        assert_eq!(out.kept_len(), 10);
        let (kept, dropped) = out.take();
        assert_eq!(kept, b"0123456789");
        assert_eq!(dropped, 6);
    }

    #[test]
    fn memory_limiter_counts_all_memories_of_the_store() {
        let mut limiter = MemoryLimiter::new(100);
        assert!(limiter.memory_growing(0, 60, None).unwrap());
        assert!(limiter.memory_growing(0, 30, None).unwrap());
        assert!(limiter.memory_growing(30, 40, None).is_ok());
        assert!(limiter.memory_growing(60, 61, None).is_err());
        assert!(limiter.hit);
    }
}
