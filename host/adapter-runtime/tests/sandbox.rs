//! The sandbox properties, on the real compiled test adapters.

mod common;

use common::*;
use sluice_adapter_runtime::bulkhead::MAX_CPU_BUDGET_MS;
use sluice_adapter_runtime::{
    AdapterError, AdapterRuntime, BulkheadConfig, ConnectorAccountScope, EventKind, EvidenceSource,
    HttpResponse, RuntimeConfig, SandboxLimits, WarmConfig, WebhookRejection,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ok_response(body: &str) -> HttpResponse {
    HttpResponse {
        status: 200,
        headers: vec![],
        body: body.as_bytes().to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn well_behaved_adapter_builds_requests_parses_responses_and_verifies_webhooks() {
    let rt = runtime_with(&["test-well-behaved"]);
    let adapter = rt.active("test-well-behaved").expect("active");
    assert_eq!(adapter.identity().name, "test-well-behaved");
    let info = adapter.describe().await.unwrap();
    assert_eq!(info.name, "test-well-behaved");

    let acct = account("acct_a", "sk_a", "whsec_a");
    let request = adapter
        .build_request(&acct, sale_context())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(request.url, "http://127.0.0.1:9/psp/v1/payments");
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.clone())
    };
    assert_eq!(header("Idempotency-Key").as_deref(), Some("att_1"));
    // The adapter writes a placeholder; only the host's wire copy carries the key.
    assert_eq!(
        header("Authorization").as_deref(),
        Some("Bearer {{secret:api_key}}")
    );
    assert_eq!(
        acct.secrets
            .substitute_header("Authorization", &header("Authorization").unwrap())
            .unwrap(),
        "Bearer sk_a"
    );

    let events = adapter
        .parse_response(
            &acct,
            sale_context(),
            ok_response(r#"{"id":"pay_1","status":"succeeded","amount":1999,"currency":"EUR"}"#),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(events[0].kind, EventKind::PaymentSucceeded);
    let unknown = adapter
        .parse_response(
            &acct,
            sale_context(),
            HttpResponse {
                status: 502,
                headers: vec![],
                body: b"bad gateway".to_vec(),
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(unknown[0].kind, EventKind::ResultUnknown);
    let garbage = adapter
        .parse_response(&acct, sale_context(), ok_response("<html>"))
        .await
        .unwrap();
    assert!(garbage.is_err());

    let body = payment_succeeded_body("evt_1");
    let webhook = signed_webhook("whsec_a", NOW_SECS - 5, &body);
    let accepted = adapter
        .handle_webhook(&acct, webhook)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(accepted.ack.status, 200);
    assert_eq!(accepted.ack.body, br#"{"received":true}"#);
    assert_eq!(accepted.events.len(), 1);
    assert_eq!(accepted.events[0].evidence, EvidenceSource::Webhook);
    assert_eq!(
        accepted.events[0].provider_event_id.as_deref(),
        Some("evt_1")
    );

    // The adapter's replay guard reads the host clock import (fixed at NOW_MILLIS).
    let stale = signed_webhook("whsec_a", NOW_SECS - 301, &body);
    let rejected = adapter.handle_webhook(&acct, stale).await.unwrap();
    assert!(
        matches!(rejected, Err(WebhookRejection::StaleTimestamp(_))),
        "{rejected:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_is_stopped_within_its_deadline() {
    let deadline = Duration::from_millis(150);
    let rt = runtime();
    let limits = SandboxLimits {
        cpu_deadline: deadline,
        ..SandboxLimits::default()
    };
    load(&rt, "test-infinite-loop", Some(limits));
    let adapter = rt.active("test-infinite-loop").unwrap();
    let acct = account("acct", "k", "s");

    let started = Instant::now();
    let result = adapter
        .handle_webhook(&acct, signed_webhook("s", NOW_SECS, b"{}"))
        .await;
    let elapsed = started.elapsed();
    assert_eq!(result.unwrap_err(), AdapterError::Timeout);
    assert!(
        elapsed >= deadline,
        "stopped before its deadline: {elapsed:?}"
    );
    assert!(
        elapsed < deadline * 4,
        "took {elapsed:?} for a {deadline:?} deadline"
    );

    let started = Instant::now();
    let result = adapter.build_request(&acct, sale_context()).await;
    assert_eq!(result.unwrap_err(), AdapterError::Timeout);
    assert!(
        started.elapsed() < deadline * 4,
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_adapter_traps_and_the_next_call_on_it_still_works() {
    let rt = runtime_with(&["test-panic"]);
    let adapter = rt.active("test-panic").unwrap();
    let acct = ConnectorAccountScope::new("acct");

    let err = adapter
        .handle_webhook(&acct, signed_webhook("s", NOW_SECS, b"{}"))
        .await
        .unwrap_err();
    assert!(matches!(err, AdapterError::Trap(_)), "{err:?}");
    let err = adapter
        .build_request(&acct, sale_context())
        .await
        .unwrap_err();
    assert!(matches!(err, AdapterError::Trap(_)), "{err:?}");

    let server_error = HttpResponse {
        status: 500,
        headers: vec![],
        body: vec![],
    };
    for _ in 0..3 {
        let err = adapter
            .parse_response(&acct, sale_context(), server_error.clone())
            .await
            .unwrap_err();
        assert!(matches!(err, AdapterError::Trap(_)), "{err:?}");
        let fine = adapter
            .parse_response(&acct, sale_context(), ok_response("{}"))
            .await
            .unwrap();
        assert_eq!(fine, Ok(vec![]));
    }
    assert_eq!(adapter.describe().await.unwrap().name, "test-panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_timeout_or_memory_failure_does_not_poison_later_calls() {
    let rt = runtime();
    load(&rt, "test-well-behaved", None);
    load(&rt, "test-panic", None);
    load(
        &rt,
        "test-memory-bomb",
        Some(SandboxLimits {
            memory_bytes: 16 << 20,
            ..SandboxLimits::default()
        }),
    );
    load(
        &rt,
        "test-infinite-loop",
        Some(SandboxLimits {
            cpu_deadline: Duration::from_millis(50),
            ..SandboxLimits::default()
        }),
    );
    let acct = account("acct", "sk", "whsec");
    let well = rt.active("test-well-behaved").unwrap();
    let body = payment_succeeded_body("evt_p");
    for round in 0..3 {
        for bad in ["test-panic", "test-memory-bomb", "test-infinite-loop"] {
            let adapter = rt.active(bad).unwrap();
            let err = adapter
                .handle_webhook(&acct, signed_webhook("whsec", NOW_SECS, &body))
                .await
                .unwrap_err();
            let expected = match bad {
                "test-panic" => matches!(err, AdapterError::Trap(_)),
                "test-memory-bomb" => err == AdapterError::MemoryLimit,
                _ => err == AdapterError::Timeout,
            };
            assert!(expected, "round {round}, {bad}: {err:?}");
            // The same version answers its next call normally.
            assert_eq!(adapter.describe().await.unwrap().name, bad);
            let accepted = well
                .handle_webhook(&acct, signed_webhook("whsec", NOW_SECS, &body))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(accepted.events.len(), 1);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_well_behaved_adapter_keeps_working_and_fast_while_another_adapter_loops() {
    // The sandbox alone, without the bulkhead's CPU throttle (which would shed the
    // looping calls after a few seconds of CPU): isolation must not depend on it.
    let unthrottled = BulkheadConfig {
        cpu_burst_ms: MAX_CPU_BUDGET_MS,
        cpu_refill_ms_per_sec: MAX_CPU_BUDGET_MS,
        adapter_deadline_burst_ms: MAX_CPU_BUDGET_MS,
        adapter_deadline_refill_ms_per_sec: MAX_CPU_BUDGET_MS,
        ..BulkheadConfig::default()
    };
    let rt = AdapterRuntime::new(RuntimeConfig {
        bulkhead: unthrottled,
        ..config()
    })
    .expect("runtime");
    load(&rt, "test-well-behaved", None);
    let loop_deadline = Duration::from_secs(2);
    load(
        &rt,
        "test-infinite-loop",
        Some(SandboxLimits {
            cpu_deadline: loop_deadline,
            ..SandboxLimits::default()
        }),
    );
    let well = rt.active("test-well-behaved").unwrap();
    let acct = account("acct", "sk", "whsec");
    let body = payment_succeeded_body("evt_l");

    let baseline = median_latency(&well, &acct, &body, 30).await;

    // Two guests spinning until their deadline, over and over, on a 2-core machine.
    let stop = Arc::new(AtomicBool::new(false));
    let mut loopers = Vec::new();
    for _ in 0..2 {
        let looping = rt.active("test-infinite-loop").unwrap();
        let acct = acct.clone();
        let stop = Arc::clone(&stop);
        loopers.push(tokio::spawn(async move {
            let mut timeouts = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = looping
                    .handle_webhook(&acct, signed_webhook("x", NOW_SECS, b"{}"))
                    .await;
                assert_eq!(r.unwrap_err(), AdapterError::Timeout);
                timeouts += 1;
            }
            timeouts
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Measured on a worker thread, where the gateway's tasks run: the looping guests run
    // on the same two workers (on fibers, yielding at every epoch tick).
    let mut latencies = tokio::spawn(async move {
        let mut latencies = Vec::new();
        for _ in 0..60 {
            let started = Instant::now();
            let accepted = well
                .handle_webhook(&acct, signed_webhook("whsec", NOW_SECS, &body))
                .await
                .unwrap()
                .unwrap();
            latencies.push(started.elapsed());
            assert_eq!(accepted.events.len(), 1);
        }
        latencies
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    for looper in loopers {
        assert!(looper.await.unwrap() >= 1);
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    let worst = latencies[latencies.len() - 1];
    eprintln!("baseline median {baseline:?}; while looping: median {median:?}, worst {worst:?}");
    // Sane means: never queued behind a looping guest (which holds its thread for 2 s),
    // and the typical call within a small factor of the idle figure (2 busy loops
    // compete for the same 2 cores, so some slowdown is physics, not queuing).
    assert!(worst < loop_deadline / 4, "worst call took {worst:?}");
    assert!(
        median < (baseline * 10).max(Duration::from_millis(20)),
        "median {median:?} against an idle median of {baseline:?}"
    );
}

async fn median_latency(
    adapter: &sluice_adapter_runtime::AdapterHandle,
    acct: &ConnectorAccountScope,
    body: &[u8],
    n: usize,
) -> Duration {
    let mut latencies = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        adapter
            .handle_webhook(acct, signed_webhook("whsec", NOW_SECS, body))
            .await
            .unwrap()
            .unwrap();
        latencies.push(started.elapsed());
    }
    latencies.sort();
    latencies[n / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_output_is_refused_with_output_too_large() {
    let rt = runtime();
    // A generous deadline: copying megabytes out of the guest takes a while in debug
    // builds, and this test is about the output cap, not the deadline.
    let limits = SandboxLimits {
        cpu_deadline: Duration::from_secs(5),
        ..SandboxLimits::default()
    };
    load(&rt, "test-huge-output", Some(limits));
    let adapter = rt.active("test-huge-output").unwrap();
    let limit = adapter.limits().max_output_bytes;
    let acct = ConnectorAccountScope::new("acct");

    let err = adapter
        .handle_webhook(&acct, signed_webhook("s", NOW_SECS, b"{}"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AdapterError::OutputTooLarge { size, limit: l } if size > limit && l == limit),
        "{err:?}"
    );
    let err = adapter
        .build_request(&acct, sale_context())
        .await
        .unwrap_err();
    assert!(
        matches!(err, AdapterError::OutputTooLarge { .. }),
        "{err:?}"
    );
    let err = adapter
        .parse_response(&acct, sale_context(), ok_response("{}"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AdapterError::OutputTooLarge { .. }),
        "{err:?}"
    );

    // The same adapter asked for a small output passes: the cap is about size.
    let small = ConnectorAccountScope::new("acct").with_config("output_bytes", "4096");
    let accepted = adapter
        .handle_webhook(&small, signed_webhook("s", NOW_SECS, b"{}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(accepted.ack.body.len(), 4096);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_of_one_account_are_invisible_to_a_call_for_another() {
    let rt = runtime_with(&["test-well-behaved"]);
    let adapter = rt.active("test-well-behaved").unwrap();
    let a = account("acct_a", "sk_a", "whsec_a");
    let b = account("acct_b", "sk_b", "whsec_b");
    let body = payment_succeeded_body("evt_a");

    // A webhook signed with A's secret verifies only in a call for A.
    let for_a = signed_webhook("whsec_a", NOW_SECS, &body);
    assert!(adapter
        .handle_webhook(&a, for_a.clone())
        .await
        .unwrap()
        .is_ok());
    let in_b = adapter.handle_webhook(&b, for_a).await.unwrap();
    assert!(
        matches!(in_b, Err(WebhookRejection::BadSignature(_))),
        "{in_b:?}"
    );

    // Interleaved concurrent calls: each request's placeholder becomes only its own
    // account's api key.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let adapter = adapter.clone();
        let (acct, key) = if i % 2 == 0 {
            (a.clone(), "sk_a")
        } else {
            (b.clone(), "sk_b")
        };
        tasks.push(tokio::spawn(async move {
            let request = adapter
                .build_request(&acct, sale_context())
                .await
                .unwrap()
                .unwrap();
            let auth = request
                .headers
                .iter()
                .find(|h| h.name == "Authorization")
                .map(|h| h.value.clone())
                .expect("an Authorization header");
            let wire = acct
                .secrets
                .substitute_header("Authorization", &auth)
                .unwrap();
            assert_eq!(wire, format!("Bearer {key}"));
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // An account without secrets: its request's placeholder cannot be substituted (a
    // configuration error of the call), and its webhooks verify with nothing.
    let bare = ConnectorAccountScope::new("acct_c").with_config("base_url", "http://127.0.0.1:9");
    let request = adapter
        .build_request(&bare, sale_context())
        .await
        .unwrap()
        .unwrap();
    let auth = &request.headers[0];
    assert!(bare
        .secrets
        .substitute_header(&auth.name, &auth.value)
        .is_err());
    let unsigned = adapter
        .handle_webhook(&bare, signed_webhook("whsec_a", NOW_SECS, &body))
        .await
        .unwrap();
    assert!(
        matches!(unsigned, Err(WebhookRejection::BadSignature(_))),
        "{unsigned:?}"
    );
}

/// Collects what tracing writes, to look at captured adapter output.
#[derive(Clone, Default)]
struct LogBuffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn stdout_flood_is_capped_and_the_call_still_succeeds() {
    let rt = runtime();
    // Every write is a WASI host call; a generous deadline keeps debug builds on a busy
    // machine from turning this into a deadline test.
    let limits = SandboxLimits {
        cpu_deadline: Duration::from_secs(5),
        ..SandboxLimits::default()
    };
    load(&rt, "test-stdout-flood", Some(limits));
    let adapter = rt.active("test-stdout-flood").unwrap();
    let cap = adapter.limits().max_log_bytes;
    // 2 MiB per stream: 32 times the per-stream cap.
    let flood_bytes = 2 << 20;
    let acct =
        ConnectorAccountScope::new("acct").with_config("flood_bytes", flood_bytes.to_string());
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();

    let result = tracing::subscriber::with_default(subscriber, || {
        adapter.handle_webhook_blocking(&acct, &signed_webhook("s", NOW_SECS, b"{}"))
    });
    let accepted = result.unwrap().unwrap();
    assert_eq!(accepted.ack.body, b"flooded");

    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    // The adapter writes lines of 1023 'f's; count only long runs, not the f's of
    // field values like the digest.
    let flood_chars: usize = logs
        .split(|c| c != 'f')
        .filter(|run| run.len() >= 32)
        .map(str::len)
        .sum();
    assert!(flood_chars > 0, "captured output never reached the log");
    // Each stream keeps at most `cap` bytes; the rest is counted, not stored or logged.
    assert!(
        flood_chars <= 2 * cap + 4096,
        "{flood_chars} bytes of output logged with a cap of {cap} per stream"
    );
    assert!(
        logs.contains("dropped_bytes"),
        "no report of dropped output"
    );
    // The `log` import has its own byte budget: 10 000 lines become a bounded few.
    let log_lines = logs.matches("flood log line").count();
    assert!(log_lines > 0, "no adapter log line reached tracing");
    assert!(
        log_lines * 64 <= cap,
        "{log_lines} log lines passed a budget of {cap} bytes"
    );
    assert!(
        logs.contains("dropped_lines"),
        "no report of dropped log lines"
    );
    assert!(
        logs.contains("adapter=test-stdout-flood"),
        "output not tagged with the adapter"
    );
}

/// Pooled instance slots keep some memory resident between calls (engine.rs); with warm
/// instances off, what a call leaves there must never reach the next one, whoever's it is.
/// `test-exfiltrate` keeps what each call was handed in a static and writes what it finds
/// there into every output. (With warm instances on, `tests/warm.rs` proves the weaker
/// rule that holds then: never across accounts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_warm_instances_off_no_call_sees_what_any_earlier_call_left_in_the_adapter_s_memory() {
    let rt = AdapterRuntime::new(RuntimeConfig {
        warm: WarmConfig {
            max_idle: 0,
            ..WarmConfig::default()
        },
        ..config()
    })
    .expect("runtime");
    load(&rt, "test-exfiltrate", None);
    let adapter = rt.active("test-exfiltrate").expect("active");
    let first = account("acct_first", "sk_first", "whsec_first");
    let second = account("acct_second", "sk_second", "whsec_second");
    for round in 0..20 {
        let marker = format!("marker-of-acct-first-round-{round}");
        let (a, b) = if round % 2 == 0 {
            (&first, &second)
        } else {
            (&second, &first)
        };
        let mut handed = signed_webhook("whsec_first", 1_800_000_000, marker.as_bytes());
        let seen = adapter
            .handle_webhook(a, handed.clone())
            .await
            .expect("ran")
            .expect("accepted");
        let text = String::from_utf8_lossy(&seen.ack.body).into_owned();
        assert!(
            text.contains(&marker),
            "the adapter echoes its own input: {text}"
        );
        handed.body = b"nothing of interest".to_vec();
        let next = adapter
            .handle_webhook(b, handed)
            .await
            .expect("ran")
            .expect("accepted");
        let text = String::from_utf8_lossy(&next.ack.body).into_owned();
        assert!(
            !text.contains("marker-of-acct-first"),
            "round {round}: the next call found the earlier call's input in memory: {text}"
        );
        assert!(
            text.ends_with("remembered from earlier calls:\n"),
            "round {round}: nothing survives a call: {text}"
        );
    }
}
