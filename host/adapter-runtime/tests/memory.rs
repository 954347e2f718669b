//! The memory cap, alone in its binary so the process's RSS means something.

mod common;

use common::*;
use sluice_adapter_runtime::{AdapterError, ConnectorAccountScope, SandboxLimits};

/// Resident set size of this process, from /proc (Linux).
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS value");
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb_fails_with_memory_limit_and_host_memory_stays_bounded() {
    let cap = 48 << 20;
    let rt = runtime();
    load(
        &rt,
        "test-memory-bomb",
        Some(SandboxLimits {
            memory_bytes: cap,
            ..SandboxLimits::default()
        }),
    );
    let adapter = rt.active("test-memory-bomb").unwrap();
    let acct = ConnectorAccountScope::new("acct");
    // Warm up once so allocator pools and lazily built host state are in the baseline.
    let first = adapter
        .handle_webhook(&acct, signed_webhook("s", NOW_SECS, b"{}"))
        .await;
    assert_eq!(first.unwrap_err(), AdapterError::MemoryLimit);
    let baseline = rss_bytes();

    let rounds = 10;
    let mut peak = baseline;
    for _ in 0..rounds {
        let started = std::time::Instant::now();
        let result = adapter
            .handle_webhook(&acct, signed_webhook("s", NOW_SECS, b"{}"))
            .await;
        assert_eq!(result.unwrap_err(), AdapterError::MemoryLimit);
        // The cap stops the bomb long before the CPU deadline would.
        assert!(started.elapsed() < adapter.limits().cpu_deadline);
        peak = peak.max(rss_bytes());
    }
    let grown = rss_bytes().saturating_sub(baseline);
    eprintln!("baseline {baseline} B, peak {peak} B, grown after {rounds} bombs {grown} B");
    // Without the cap a bomb would take everything; with it, a leak per call would
    // still show as `rounds * cap`. Neither may happen.
    assert!(
        grown < cap,
        "host RSS grew by {grown} bytes over {rounds} bombs of {cap}"
    );
    assert!(
        peak.saturating_sub(baseline) < 2 * cap,
        "host RSS peaked {} bytes over the baseline",
        peak - baseline
    );
    // And the adapter still works for calls that do not explode.
    assert_eq!(adapter.describe().await.unwrap().name, "test-memory-bomb");
}
