//! The bulkhead on the real runtime (issue 13): an account whose adapter burns its CPU
//! deadline on every call, flooded from many tasks and spread over many accounts,
//! cannot take the slots or the CPU of another account's well-behaved adapter.
//!
//! The assertions do not depend on timing: the pool's caps guarantee the well-behaved
//! calls a slot at once whatever the looping calls do, and the CPU throttle is
//! awaited by outcome (a bounded number of calls), never by a clock.

mod common;

use common::*;
use sluice_adapter_runtime::bulkhead::metrics::shed_count;
use sluice_adapter_runtime::{
    AdapterError, AdapterRuntime, BulkheadConfig, RuntimeConfig, SandboxLimits, ShedReason,
};
use std::time::Duration;

const LOOP: &str = "test-infinite-loop";
const WELL: &str = "test-well-behaved";

fn runtime_with_bulkhead(slots: u32, bulkhead: BulkheadConfig) -> AdapterRuntime {
    let rt = AdapterRuntime::new(RuntimeConfig {
        max_concurrent_instances: slots,
        bulkhead,
        ..config()
    })
    .expect("runtime");
    load(&rt, WELL, None);
    let limits = SandboxLimits {
        cpu_deadline: Duration::from_millis(100),
        ..SandboxLimits::default()
    };
    load(&rt, LOOP, Some(limits));
    rt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_looping_account_never_takes_the_slots_of_a_well_behaved_one() {
    // 8 slots: at most 2 per account and 4 for the looping adapter over all its
    // accounts, so the well-behaved account always finds a free slot of its share.
    let rt = runtime_with_bulkhead(
        8,
        BulkheadConfig {
            key_share_percent: 25,
            adapter_share_percent: 50,
            queue_per_key: 2,
            max_wait: Duration::from_millis(50),
            ..BulkheadConfig::default()
        },
    );
    let mut flood = Vec::new();
    for task in 0..16 {
        let looping = rt.active(LOOP).expect("active");
        // The hostile tenant spreads its calls over four accounts of the same adapter.
        let acct = account(&format!("acct_hostile_{}", task % 4), "k", "s");
        flood.push(tokio::spawn(async move {
            let (mut timeouts, mut shed) = (0, 0);
            for _ in 0..4 {
                match looping
                    .handle_webhook(&acct, signed_webhook("s", NOW_SECS, b"{}"))
                    .await
                {
                    Err(AdapterError::Timeout) => timeouts += 1,
                    Err(AdapterError::Shed { .. }) => shed += 1,
                    other => panic!("a looping call ended {other:?}"),
                }
            }
            (timeouts, shed)
        }));
    }

    let well = rt.active(WELL).expect("active");
    let acct = account("acct_well", "sk", "whsec");
    for i in 0..40 {
        let body = payment_succeeded_body(&format!("evt_{i}"));
        let accepted = well
            .handle_webhook(&acct, signed_webhook("whsec", NOW_SECS, &body))
            .await
            .expect("never shed, never failed")
            .expect("verified");
        assert_eq!(accepted.events.len(), 1);
    }

    let (mut timeouts, mut shed) = (0, 0);
    for task in flood {
        let (t, s) = task.await.expect("flood task");
        timeouts += t;
        shed += s;
    }
    eprintln!("looping calls: {timeouts} ran to their deadline, {shed} shed");
    // 64 looping calls against 4 slots and queues of 2 per account: some must be shed.
    assert!(shed > 0, "no looping call was shed");
    assert_eq!(timeouts + shed, 64);
    for reason in [ShedReason::CpuBudget, ShedReason::AdapterCpuBudget] {
        assert_eq!(shed_count(WELL, "acct_well", reason), 0);
    }
    assert_eq!(shed_count(WELL, "acct_well", ShedReason::QueueFull), 0);
    assert_eq!(shed_count(WELL, "acct_well", ShedReason::WaitTimeout), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_that_keeps_hitting_its_deadline_is_throttled_and_another_is_not() {
    // A CPU budget of 300 ms that barely refills: a few 100 ms deadline hits use it up.
    let rt = runtime_with_bulkhead(
        8,
        BulkheadConfig {
            cpu_burst_ms: 300,
            cpu_refill_ms_per_sec: 1,
            ..BulkheadConfig::default()
        },
    );
    let looping = rt.active(LOOP).expect("active");
    let hostile = account("acct_burner", "k", "s");
    let mut throttled = None;
    // Each call is charged the CPU time it really got (at most its 100 ms deadline),
    // so on a busy machine it takes a few more calls: bounded by outcome, not time.
    for call in 0..60 {
        match looping
            .build_request(&hostile, sale_context())
            .await
            .expect_err("it never answers")
        {
            AdapterError::Timeout => continue,
            AdapterError::Shed {
                reason,
                retry_after_ms,
            } => {
                throttled = Some((call, reason, retry_after_ms));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let (call, reason, retry_after_ms) = throttled.expect("throttled within 60 calls");
    assert!(call >= 3, "throttled after only {call} calls");
    assert_eq!(reason, ShedReason::CpuBudget);
    assert!(retry_after_ms >= 1, "{retry_after_ms}");
    assert!(shed_count(LOOP, "acct_burner", ShedReason::CpuBudget) >= 1);

    // Another account of the same adapter has its own budget, and another adapter's
    // calls are not touched at all.
    let other = account("acct_other", "k", "s");
    assert_eq!(
        looping.build_request(&other, sale_context()).await,
        Err(AdapterError::Timeout)
    );
    let well = rt.active(WELL).expect("active");
    let acct = account("acct_well", "sk", "whsec");
    for _ in 0..20 {
        assert!(well
            .build_request(&acct, sale_context())
            .await
            .expect("not shed")
            .is_ok());
    }
}

#[test]
fn a_runtime_refuses_an_invalid_bulkhead() {
    let error = AdapterRuntime::new(RuntimeConfig {
        bulkhead: BulkheadConfig {
            key_share_percent: 0,
            ..BulkheadConfig::default()
        },
        ..config()
    })
    .err()
    .expect("refused");
    assert!(error.to_string().contains("key_share_percent"), "{error}");
}

#[test]
fn the_blocking_webhook_call_takes_a_slot_of_its_share_and_gives_it_back() {
    // One slot in all: the second call only runs if the first gave it back.
    let rt = runtime_with_bulkhead(1, BulkheadConfig::default());
    let well = rt.active(WELL).expect("active");
    let acct = account("acct_sync", "sk", "whsec");
    for event in ["evt_sync_1", "evt_sync_2"] {
        let body = payment_succeeded_body(event);
        let accepted = well
            .handle_webhook_blocking(&acct, &signed_webhook("whsec", NOW_SECS, &body))
            .expect("the slot is free")
            .expect("verified");
        assert_eq!(accepted.events.len(), 1);
    }
}
