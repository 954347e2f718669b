//! The bulkhead's fairness, driven through the pure state machine with an injected
//! clock (`t0 + offset`): no sleeps, no timing.

use super::pool::{Admission, CallKey, SlotPool, Usage, Wake};
use super::*;

fn key(adapter: &str, account: &str) -> CallKey {
    CallKey::new(adapter, account)
}

fn config() -> BulkheadConfig {
    BulkheadConfig {
        key_share_percent: 25,
        adapter_share_percent: 50,
        queue_per_key: 2,
        max_wait: Duration::from_millis(500),
        cpu_burst_ms: 1_000,
        cpu_refill_ms_per_sec: 100,
        adapter_deadline_burst_ms: 2_000,
        adapter_deadline_refill_ms_per_sec: 200,
    }
}

/// A call admitted without a CPU reserve: only the bucket being exhausted holds it back.
const NO_RESERVE: Duration = Duration::ZERO;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn cheap() -> Usage {
    Usage {
        cpu: ms(1),
        deadline_hit: false,
    }
}

fn deadline(cpu_ms: u64) -> Usage {
    Usage {
        cpu: ms(cpu_ms),
        deadline_hit: true,
    }
}

fn granted(pool: &mut SlotPool, k: &CallKey, now: Instant, n: usize) {
    for i in 0..n {
        assert_eq!(
            pool.admit(k, NO_RESERVE, now, true),
            Admission::Granted,
            "call {i} of {k:?}"
        );
    }
}

fn shed_reason(admission: Admission) -> ShedReason {
    match admission {
        Admission::Shed(shed) => shed.reason,
        other => panic!("expected a shed, got {other:?}"),
    }
}

#[test]
fn one_key_holds_at_most_its_share_and_the_rest_stays_for_other_keys() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(16, config());
    assert_eq!(pool.caps(), (4, 8));
    let hostile = key("loop", "acct_h");
    granted(&mut pool, &hostile, t0, 4);
    assert!(matches!(
        pool.admit(&hostile, NO_RESERVE, t0, true),
        Admission::Queued(_)
    ));
    // Another merchant's account gets its slots at once.
    let well = key("stripe", "acct_w");
    granted(&mut pool, &well, t0, 4);
    assert_eq!(pool.in_use(&hostile), 4);
}

#[test]
fn the_caps_are_at_least_one_slot_however_small_the_pool() {
    assert_eq!(config().caps(1), (1, 1));
    assert_eq!(config().caps(3), (1, 1));
    assert_eq!(config().caps(8), (2, 4));
    let all = BulkheadConfig {
        key_share_percent: 100,
        adapter_share_percent: 100,
        ..config()
    };
    assert_eq!(all.caps(64), (64, 64));
}

#[test]
fn many_accounts_of_one_adapter_cannot_take_more_than_the_adapter_share() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(16, config());
    for account in ["h1", "h2"] {
        granted(&mut pool, &key("loop", account), t0, 4);
    }
    // The adapter holds its 8 of 16: a third account of it waits...
    assert!(matches!(
        pool.admit(&key("loop", "h3"), NO_RESERVE, t0, true),
        Admission::Queued(_)
    ));
    // ...while another adapter's accounts still get the other 8.
    granted(&mut pool, &key("stripe", "w1"), t0, 4);
    granted(&mut pool, &key("stripe", "w2"), t0, 4);
}

#[test]
fn a_full_queue_sheds_the_call_at_once() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(4, config());
    let k = key("loop", "acct_h");
    granted(&mut pool, &k, t0, 1);
    assert!(matches!(
        pool.admit(&k, NO_RESERVE, t0, true),
        Admission::Queued(_)
    ));
    assert!(matches!(
        pool.admit(&k, NO_RESERVE, t0, true),
        Admission::Queued(_)
    ));
    assert_eq!(
        shed_reason(pool.admit(&k, NO_RESERVE, t0, true)),
        ShedReason::QueueFull
    );
    // A caller that cannot wait is shed instead of queued.
    let other = key("loop", "acct_2");
    granted(&mut pool, &other, t0, 1);
    assert_eq!(
        shed_reason(pool.admit(&other, NO_RESERVE, t0, false)),
        ShedReason::QueueFull
    );
}

#[test]
fn freed_slots_go_to_waiting_keys_in_turn() {
    let t0 = Instant::now();
    let cfg = BulkheadConfig {
        key_share_percent: 50,
        adapter_share_percent: 100,
        ..config()
    };
    let mut pool = SlotPool::new(2, cfg);
    let (a, b, c) = (key("x", "a"), key("x", "b"), key("x", "c"));
    granted(&mut pool, &a, t0, 1);
    granted(&mut pool, &c, t0, 1);
    let Admission::Queued(a1) = pool.admit(&a, NO_RESERVE, t0, true) else {
        panic!("a queues")
    };
    let Admission::Queued(a2) = pool.admit(&a, NO_RESERVE, t0, true) else {
        panic!("a queues again")
    };
    let Admission::Queued(b1) = pool.admit(&b, NO_RESERVE, t0, true) else {
        panic!("b queues")
    };
    // c's slot frees: a is first in turn but holds its cap of 1, so b, which holds
    // nothing, gets it.
    let wakes = pool.release(&c, NO_RESERVE, cheap(), t0);
    assert_eq!(wakes.iter().map(|w| w.ticket).collect::<Vec<_>>(), vec![b1]);
    // a's own slot frees: its first queued call gets it, then its second.
    let wakes = pool.release(&a, NO_RESERVE, cheap(), t0);
    assert_eq!(wakes.iter().map(|w| w.ticket).collect::<Vec<_>>(), vec![a1]);
    let wakes = pool.release(&a, NO_RESERVE, cheap(), t0);
    assert_eq!(wakes.iter().map(|w| w.ticket).collect::<Vec<_>>(), vec![a2]);
}

#[test]
fn a_cancelled_call_is_no_longer_woken() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(1, config());
    let k = key("x", "a");
    granted(&mut pool, &k, t0, 1);
    let Admission::Queued(ticket) = pool.admit(&k, NO_RESERVE, t0, true) else {
        panic!("queues")
    };
    assert!(pool.cancel(&k, ticket));
    assert!(!pool.cancel(&k, ticket), "a ticket is cancelled once");
    assert_eq!(
        pool.release(&k, NO_RESERVE, cheap(), t0),
        Vec::<Wake>::new()
    );
    granted(&mut pool, &k, t0, 1);
}

#[test]
fn a_key_that_keeps_hitting_its_deadline_is_throttled_and_others_are_not() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(16, config());
    let hostile = key("loop", "acct_h");
    let well = key("stripe", "acct_w");
    // Five 200 ms deadline hits use up the 1 000 ms burst.
    for _ in 0..5 {
        granted(&mut pool, &hostile, t0, 1);
        pool.release(&hostile, NO_RESERVE, deadline(200), t0);
    }
    assert_eq!(
        shed_reason(pool.admit(&hostile, NO_RESERVE, t0, true)),
        ShedReason::CpuBudget
    );
    for _ in 0..100 {
        granted(&mut pool, &well, t0, 1);
        pool.release(&well, NO_RESERVE, cheap(), t0);
    }
    // The bucket stands at exactly 0; 10 ms of refill (100 ms/s) make it positive again.
    let later = t0 + ms(10);
    assert_eq!(
        pool.admit(&hostile, NO_RESERVE, later, true),
        Admission::Granted
    );
}

#[test]
fn a_throttled_key_is_told_when_to_retry() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(16, config());
    let hostile = key("loop", "acct_h");
    granted(&mut pool, &hostile, t0, 1);
    pool.release(&hostile, NO_RESERVE, deadline(1_500), t0);
    // 500 ms of debt at 100 ms/s: about 5 s.
    let Admission::Shed(shed) = pool.admit(&hostile, NO_RESERVE, t0, true) else {
        panic!("throttled")
    };
    assert_eq!(shed.reason, ShedReason::CpuBudget);
    assert!(
        shed.retry_after >= ms(5_000) && shed.retry_after < ms(5_100),
        "{:?}",
        shed.retry_after
    );
    assert!(matches!(
        pool.admit(&hostile, NO_RESERVE, t0 + ms(4_900), true),
        Admission::Shed(_)
    ));
    assert_eq!(
        pool.admit(&hostile, NO_RESERVE, t0 + ms(5_100), true),
        Admission::Granted
    );
}

#[test]
fn spreading_deadline_hits_over_many_accounts_throttles_the_adapter() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(16, config());
    // Ten accounts each stay within their own budget (200 ms of their 1 000 ms)...
    for i in 0..10 {
        let k = key("loop", &format!("h{i}"));
        granted(&mut pool, &k, t0, 1);
        pool.release(&k, NO_RESERVE, deadline(200), t0);
    }
    // ...but the adapter's 2 000 ms deadline budget is gone: a new account of it is shed.
    assert_eq!(
        shed_reason(pool.admit(&key("loop", "h99"), NO_RESERVE, t0, true)),
        ShedReason::AdapterCpuBudget
    );
    // Another adapter, and the same adapter's calls that never hit a deadline, are not
    // charged: a busy, honest adapter never drains its adapter budget.
    assert_eq!(
        pool.admit(&key("stripe", "w"), NO_RESERVE, t0, true),
        Admission::Granted
    );
    let mut busy = SlotPool::new(16, config());
    let honest = key("stripe", "w");
    for _ in 0..900 {
        granted(&mut busy, &honest, t0, 1);
        busy.release(&honest, NO_RESERVE, cheap(), t0);
    }
    assert_eq!(
        busy.admit(&key("stripe", "w2"), NO_RESERVE, t0, true),
        Admission::Granted
    );
}

#[test]
fn queued_calls_of_a_key_that_becomes_throttled_are_shed_when_a_slot_frees() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(4, config());
    let hostile = key("loop", "acct_h");
    granted(&mut pool, &hostile, t0, 1);
    let Admission::Queued(ticket) = pool.admit(&hostile, NO_RESERVE, t0, true) else {
        panic!("queues")
    };
    let wakes = pool.release(&hostile, NO_RESERVE, deadline(1_200), t0);
    assert_eq!(wakes.len(), 1);
    assert_eq!(wakes[0].ticket, ticket);
    assert_eq!(
        wakes[0].outcome.as_ref().map_err(|s| s.reason),
        Err(ShedReason::CpuBudget)
    );
}

#[test]
fn a_key_starts_calls_at_once_only_while_its_bucket_covers_each_one_s_whole_deadline() {
    // 64 slots: the key's share is 16. A bucket of 1000 ms covers the first call
    // (any CPU left does) and four more 200 ms reserves beside it; the sixth waits.
    let t0 = Instant::now();
    let mut pool = SlotPool::new(64, config());
    let spinner = key("loop", "acct_h");
    for i in 0..5 {
        assert_eq!(
            pool.admit(&spinner, ms(200), t0, true),
            Admission::Granted,
            "call {i}"
        );
    }
    let Admission::Queued(sixth) = pool.admit(&spinner, ms(200), t0, true) else {
        panic!("the sixth call waits: nothing would pay for its deadline")
    };
    // The five spend their whole deadline: the bucket is empty, the waiter is shed
    // when a slot frees, and the key has nothing running in parallel any more.
    let mut wakes = Vec::new();
    for _ in 0..5 {
        wakes.extend(pool.release(&spinner, ms(200), deadline(200), t0));
    }
    assert_eq!(wakes.len(), 1);
    assert_eq!(wakes[0].ticket, sixth);
    assert_eq!(
        wakes[0].outcome.as_ref().map_err(|s| s.reason),
        Err(ShedReason::CpuBudget)
    );
    assert_eq!(pool.in_use(&spinner), 0);
}

#[test]
fn a_key_low_on_cpu_runs_one_call_at_a_time_and_the_next_starts_when_it_ends() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(64, config());
    let spinner = key("loop", "acct_h");
    granted(&mut pool, &spinner, t0, 1);
    // 900 ms spent: 100 ms left, less than a second call's 200 ms deadline.
    assert!(pool
        .release(&spinner, NO_RESERVE, deadline(900), t0)
        .is_empty());
    assert_eq!(
        pool.admit(&spinner, ms(200), t0, true),
        Admission::Granted,
        "one call: the bucket is not exhausted"
    );
    let Admission::Queued(next) = pool.admit(&spinner, ms(200), t0, true) else {
        panic!("a second one at once is not covered")
    };
    let wakes = pool.release(&spinner, ms(200), deadline(50), t0);
    assert_eq!(wakes.len(), 1);
    assert_eq!(wakes[0].ticket, next);
    assert_eq!(wakes[0].reserve, ms(200));
    assert!(wakes[0].outcome.is_ok(), "50 ms left: it runs, alone");
    assert_eq!(pool.in_use(&spinner), 1);
}

#[test]
fn a_key_whose_calls_are_cheap_keeps_its_whole_share_of_slots() {
    let t0 = Instant::now();
    let mut pool = SlotPool::new(64, config());
    let honest = key("stripe", "acct_w");
    for _ in 0..100 {
        assert_eq!(pool.admit(&honest, ms(200), t0, true), Admission::Granted);
        pool.release(&honest, ms(200), cheap(), t0);
    }
    // 100 calls of 1 ms leave 900 ms: sixteen 50 ms reserves at once fit.
    for i in 0..16 {
        assert_eq!(
            pool.admit(&honest, ms(50), t0, true),
            Admission::Granted,
            "call {i}: the key's share is 16"
        );
    }
    assert!(matches!(
        pool.admit(&honest, ms(50), t0, true),
        Admission::Queued(_)
    ));
}

#[test]
fn invalid_configurations_are_refused_with_a_reason() {
    assert!(BulkheadConfig::default().validate().is_ok());
    let bad = [
        BulkheadConfig {
            key_share_percent: 0,
            ..config()
        },
        BulkheadConfig {
            key_share_percent: 101,
            ..config()
        },
        BulkheadConfig {
            key_share_percent: 60,
            adapter_share_percent: 50,
            ..config()
        },
        BulkheadConfig {
            max_wait: Duration::from_secs(61),
            ..config()
        },
        BulkheadConfig {
            cpu_refill_ms_per_sec: 0,
            ..config()
        },
        BulkheadConfig {
            queue_per_key: MAX_QUEUE_PER_KEY + 1,
            ..config()
        },
    ];
    for config in bad {
        let error = config.validate().expect_err("refused");
        assert!(
            matches!(error, RuntimeError::InvalidBulkhead(_)),
            "{error:?}"
        );
    }
}

fn waiting(max_wait: Duration) -> BulkheadConfig {
    BulkheadConfig {
        max_wait,
        ..config()
    }
}

#[tokio::test]
async fn a_queued_call_is_shed_at_its_wait_deadline_and_its_slot_is_never_leaked() {
    // A zero wait deadline has passed by the first look: the outcome needs no timing.
    let bulkhead = Arc::new(Bulkhead::new(1, waiting(Duration::ZERO)));
    let k = key("x", "a");
    let held = bulkhead
        .acquire(k.clone(), NO_RESERVE)
        .await
        .expect("the one slot");
    let shed = bulkhead
        .acquire(k.clone(), NO_RESERVE)
        .await
        .err()
        .expect("shed");
    assert_eq!(shed.reason, ShedReason::WaitTimeout);
    drop(held);
    let again = bulkhead
        .acquire(k.clone(), NO_RESERVE)
        .await
        .expect("the slot is free again");
    drop(again);
    assert!(bulkhead.try_acquire(k, NO_RESERVE).is_ok());
}

#[tokio::test]
async fn a_waiter_gets_the_slot_its_predecessor_releases() {
    // The deadline is far beyond the test: only the release can decide.
    let bulkhead = Arc::new(Bulkhead::new(1, waiting(MAX_WAIT)));
    let k = key("x", "a");
    let held = bulkhead
        .acquire(k.clone(), NO_RESERVE)
        .await
        .expect("the one slot");
    let waiter = tokio::spawn({
        let bulkhead = Arc::clone(&bulkhead);
        let k = k.clone();
        async move { bulkhead.acquire(k, NO_RESERVE).await.map(drop) }
    });
    tokio::task::yield_now().await;
    held.finish(Usage::default());
    assert_eq!(waiter.await.expect("joined"), Ok(()));
    assert!(
        bulkhead.try_acquire(k, NO_RESERVE).is_ok(),
        "released after the waiter"
    );
}

#[tokio::test]
async fn a_waiter_that_goes_away_gives_its_place_back() {
    // The deadline is far beyond the test: only the release can decide.
    let bulkhead = Arc::new(Bulkhead::new(1, waiting(MAX_WAIT)));
    let k = key("x", "a");
    let held = bulkhead
        .acquire(k.clone(), NO_RESERVE)
        .await
        .expect("the one slot");
    let waiter = tokio::spawn({
        let bulkhead = Arc::clone(&bulkhead);
        let k = k.clone();
        async move { bulkhead.acquire(k, NO_RESERVE).await.map(drop) }
    });
    tokio::task::yield_now().await;
    waiter.abort();
    assert!(waiter.await.is_err(), "aborted");
    drop(held);
    assert!(
        bulkhead.try_acquire(k, NO_RESERVE).is_ok(),
        "nothing leaked"
    );
}

#[test]
fn a_shed_call_becomes_a_typed_adapter_error_with_its_retry_after() {
    let error = crate::AdapterError::from(Shed::new(ShedReason::CpuBudget, ms(2_300)));
    assert_eq!(
        error,
        crate::AdapterError::Shed {
            reason: ShedReason::CpuBudget,
            retry_after_ms: 2_300
        }
    );
    assert_eq!(error.retry_after_secs(), Some(3));
    assert_eq!(crate::AdapterError::Timeout.retry_after_secs(), None);
}
