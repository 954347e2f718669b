//! Cost of the sandbox on the webhook path, and of loading an adapter.
//!
//! Run: `cargo xtask build-adapters && cargo bench -p sluice-adapter-runtime --bench adapter_call`
//!
//! * `webhook_2kb/native`: the test-well-behaved adapter's verification and
//!   normalisation (HMAC-SHA256 over a 2 KB JSON body) called as a plain Rust function.
//! * `webhook_2kb/sandboxed_blocking`: the same logic compiled to a component, called
//!   through the runtime: fresh store from the pre-instance, limits, host imports,
//!   lifting the result, output size check; on the calling thread.
//! * `webhook_2kb/sandboxed_async`: the real `AdapterHandle::handle_webhook` path, which
//!   adds the bulkhead slot and runs the guest on a fiber in the calling task.
//! * `load/cold` and `load/warm`: `AdapterRuntime::load` compiling from scratch versus
//!   reading the compile cache (a restart).
//!
//! After criterion, it prints medians of individually timed calls and their ratio.

use criterion::{black_box, Criterion};
use sluice_adapter_runtime::bulkhead::MAX_CPU_BUDGET_MS;
use sluice_adapter_runtime::{
    AdapterHandle, AdapterRuntime, BulkheadConfig, ConnectorAccountScope, Header, RuntimeConfig,
    WebhookRequest,
};
use sluice_adapter_test_well_behaved::{types as native, webhook, WebhookSecrets};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NOW_SECS: i64 = 1_800_000_000;
const SECRET: &str = "whsec_bench_secret";

fn adapter_bytes() -> Vec<u8> {
    let dir = std::env::var_os("SLUICE_TEST_ADAPTERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/adapters"));
    let path = dir.join("test-well-behaved.wasm");
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}); run `cargo xtask build-adapters` first",
            path.display()
        )
    })
}

/// A realistic ~2 KB `payment.succeeded` webhook body.
fn webhook_body() -> Vec<u8> {
    let mut metadata = String::new();
    let mut i = 0;
    while metadata.len() < 1700 {
        metadata.push_str(&format!(
            r#""key_{i:02}":"value for metadata entry number {i:02}","#
        ));
        i += 1;
    }
    metadata.pop();
    let body = format!(
        r#"{{"id":"evt_1Nq2bench","type":"payment.succeeded","created":{NOW_SECS},"data":{{"id":"pay_3MtwBwLkdIwHu7ix","reference":"att_01HZX3K9Q7V2R6","amount":129900,"currency":"EUR","status":"succeeded","metadata":{{{metadata}}}}}}}"#
    );
    assert!(
        (1900..2200).contains(&body.len()),
        "body is {} bytes",
        body.len()
    );
    body.into_bytes()
}

fn config(cache_dir: Option<PathBuf>) -> RuntimeConfig {
    RuntimeConfig {
        cache_dir,
        clock: Arc::new(|| NOW_SECS * 1000),
        // One account calling flat out for seconds uses far more than its default CPU
        // budget: measure the call path, not the bulkhead's throttle.
        bulkhead: BulkheadConfig {
            cpu_burst_ms: MAX_CPU_BUDGET_MS,
            cpu_refill_ms_per_sec: MAX_CPU_BUDGET_MS,
            ..BulkheadConfig::default()
        },
        ..RuntimeConfig::default()
    }
}

struct Fixture {
    handle: AdapterHandle,
    account: ConnectorAccountScope,
    request: WebhookRequest,
    native_request: native::WebhookRequest,
    _rt: AdapterRuntime,
}

fn fixture() -> Fixture {
    let rt = AdapterRuntime::new(config(None)).expect("runtime");
    rt.load("test-well-behaved", &adapter_bytes(), None, true)
        .expect("load");
    let handle = rt.active("test-well-behaved").expect("active");
    let body = webhook_body();
    let signature = webhook::sign(SECRET, NOW_SECS, &body);
    let request = WebhookRequest {
        method: "POST".into(),
        path: "/webhooks/test-well-behaved/acct_bench".into(),
        headers: vec![
            Header {
                name: "Content-Type".into(),
                value: "application/json".into(),
            },
            Header {
                name: "X-Test-Signature".into(),
                value: signature.clone(),
            },
        ],
        body: body.clone(),
    };
    let native_request = native::WebhookRequest {
        method: request.method.clone(),
        path: request.path.clone(),
        headers: request
            .headers
            .iter()
            .map(|h| native::Header {
                name: h.name.clone(),
                value: h.value.clone(),
            })
            .collect(),
        body,
    };
    let account = ConnectorAccountScope::new("acct_bench")
        .with_config("base_url", "http://127.0.0.1:9")
        .with_secret("webhook_secret", SECRET);
    Fixture {
        handle,
        account,
        request,
        native_request,
        _rt: rt,
    }
}

fn native_call(f: &Fixture) -> usize {
    let secrets = WebhookSecrets {
        webhook_secret: Some(SECRET),
        tolerance_seconds: 300,
    };
    let accepted = webhook::verify_and_normalise(&secrets, NOW_SECS, &f.native_request)
        .expect("native verification");
    accepted.events.len()
}

fn sandboxed_call(f: &Fixture) -> usize {
    let accepted = f
        .handle
        .handle_webhook_blocking(&f.account, &f.request)
        .expect("sandboxed call")
        .expect("verification");
    accepted.events.len()
}

fn bench_webhook(c: &mut Criterion, f: &Fixture, tokio_rt: &tokio::runtime::Runtime) {
    assert_eq!(native_call(f), 1);
    assert_eq!(sandboxed_call(f), 1);
    let mut group = c.benchmark_group("webhook_2kb");
    group
        .sample_size(50)
        .measurement_time(Duration::from_secs(4));
    group.bench_function("native", |b| b.iter(|| black_box(native_call(f))));
    group.bench_function("sandboxed_blocking", |b| {
        b.iter(|| black_box(sandboxed_call(f)))
    });
    group.bench_function("sandboxed_async", |b| {
        b.iter(|| {
            tokio_rt.block_on(async {
                let r = f.handle.handle_webhook(&f.account, f.request.clone()).await;
                black_box(r.expect("call").expect("verified").events.len())
            })
        })
    });
    group.finish();
}

fn bench_load(c: &mut Criterion) {
    let bytes = adapter_bytes();
    let cache = tempfile::tempdir().expect("cache dir");
    AdapterRuntime::new(config(Some(cache.path().to_path_buf())))
        .expect("runtime")
        .load("test-well-behaved", &bytes, None, true)
        .expect("populate cache");
    let mut group = c.benchmark_group("load");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    group.bench_function("cold", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let rt = AdapterRuntime::new(config(None)).expect("runtime");
                let started = Instant::now();
                black_box(
                    rt.load("test-well-behaved", &bytes, None, true)
                        .expect("load"),
                );
                total += started.elapsed();
            }
            total
        })
    });
    group.bench_function("warm", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let rt =
                    AdapterRuntime::new(config(Some(cache.path().to_path_buf()))).expect("runtime");
                let started = Instant::now();
                let info = rt
                    .load("test-well-behaved", &bytes, None, true)
                    .expect("load");
                total += started.elapsed();
                assert!(info.from_cache);
            }
            total
        })
    });
    group.finish();
}

fn median_of(n: usize, mut call: impl FnMut()) -> Duration {
    let mut samples: Vec<Duration> = (0..n)
        .map(|_| {
            let started = Instant::now();
            call();
            started.elapsed()
        })
        .collect();
    samples.sort();
    samples[n / 2]
}

fn print_medians(f: &Fixture, tokio_rt: &tokio::runtime::Runtime) {
    let n = 2000;
    let native = median_of(n, || {
        black_box(native_call(f));
    });
    let blocking = median_of(n, || {
        black_box(sandboxed_call(f));
    });
    let via_async = median_of(n, || {
        tokio_rt.block_on(async {
            black_box(
                f.handle
                    .handle_webhook(&f.account, f.request.clone())
                    .await
                    .ok(),
            );
        })
    });
    let describe = median_of(n, || {
        tokio_rt.block_on(async {
            black_box(f.handle.describe().await.ok());
        })
    });
    let ratio = |d: Duration| d.as_secs_f64() / native.as_secs_f64();
    println!("\nmedians of {n} individually timed calls, 2 KB signed webhook:");
    println!("  native                    {native:>10.2?}");
    println!(
        "  sandboxed (blocking)      {blocking:>10.2?}  = {:.1} x native",
        ratio(blocking)
    );
    println!(
        "  sandboxed (async handle)  {via_async:>10.2?}  = {:.1} x native",
        ratio(via_async)
    );
    println!(
        "  describe (async handle)   {describe:>10.2?}  (fixed cost of a call: slot, warm store, fiber, lifting)"
    );
    // One line for `cargo xtask bench` to read.
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "RESULT native_us={:.2} blocking_us={:.2} async_us={:.2} describe_us={:.2}",
        us(native),
        us(blocking),
        us(via_async),
        us(describe)
    );
}

fn main() {
    let tokio_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let f = fixture();
    let mut c = Criterion::default().configure_from_args();
    bench_webhook(&mut c, &f, &tokio_rt);
    bench_load(&mut c);
    c.final_summary();
    print_medians(&f, &tokio_rt);
}
