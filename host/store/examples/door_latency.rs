//! Measures the one door on both backends: sequential latency of each store
//! call in a payment's life, and concurrent `apply_event` throughput.
//!
//! `cargo run --release -p sluice-store --example door_latency [payments]`
//! PostgreSQL comes from SLUICE_TEST_DATABASE_URL (default
//! postgres://postgres@127.0.0.1:5432/postgres); a scratch database is created
//! and dropped.

use sluice_core::{CaptureMode, Currency, EventKind, EvidenceSource, Money, PaymentEvent};
use sluice_store::{
    ApplyEvent, EventTarget, NewAttempt, NewConnectorAccount, NewPayment, Provenance,
    RefundRequest, Store,
};
use sqlx::Connection;
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let payments: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir()?;
    let sqlite = format!("sqlite://{}/bench.db", dir.path().display());
    run("sqlite", &sqlite, payments).await?;

    sqlx::any::install_default_drivers();
    let admin_url = std::env::var("SLUICE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = format!("sluice_bench_{}", std::process::id());
    let mut admin = sqlx::AnyConnection::connect(&admin_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await?;
    let base = admin_url
        .rsplit_once('/')
        .map_or(admin_url.as_str(), |(b, _)| b);
    let result = run("postgres", &format!("{base}/{name}"), payments).await;
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    result
}

fn event(kind: EventKind, evidence: EvidenceSource) -> PaymentEvent {
    PaymentEvent::new(kind, evidence)
}

fn apply(reference: &str, event: PaymentEvent) -> ApplyEvent {
    ApplyEvent {
        target: EventTarget::Attempt(reference.to_owned()),
        event,
        provenance: Provenance::adapter("bench", "0", "-"),
        inbox_id: None,
        next_retry_time: None,
    }
}

#[derive(Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn report(&mut self, what: &str) {
        self.0.sort();
        let pick = |q: f64| self.0[((self.0.len() - 1) as f64 * q) as usize];
        println!(
            "  {what:<28} p50 {:>7.2} ms   p99 {:>7.2} ms",
            pick(0.5).as_secs_f64() * 1e3,
            pick(0.99).as_secs_f64() * 1e3
        );
    }
}

async fn timed<T, F: std::future::Future<Output = T>>(samples: &mut Samples, f: F) -> T {
    let start = Instant::now();
    let out = f.await;
    samples.0.push(start.elapsed());
    out
}

async fn run(label: &str, url: &str, payments: usize) -> Result<(), Error> {
    let store = Store::connect(url).await?;
    store.migrate().await?;
    let merchant = store.create_merchant("bench").await?;
    let account = store
        .create_connector_account(&NewConnectorAccount {
            merchant_id: merchant.id.clone(),
            adapter: "bench".into(),
            label: "main".into(),
            config: serde_json::json!({}),
            secrets: serde_json::json!({}),
        })
        .await?;
    let eur = Currency::parse("EUR")?;
    let sys = Provenance::actor("bench");
    let (mut create, mut attempt_s, mut apply_s, mut dup_s, mut refund_s) = Default::default();
    let mut references = Vec::new();
    let start = Instant::now();
    for n in 0..payments {
        let payment = timed(
            &mut create,
            store.create_payment(
                &NewPayment {
                    merchant_id: merchant.id.clone(),
                    merchant_order_no: format!("B-{n}"),
                    amount: Money::positive(1000, eur)?,
                    capture_mode: CaptureMode::Automatic,
                    payment_method_token: None,
                    return_url: None,
                    description: None,
                    metadata: serde_json::json!({}),
                    fulfillment: Default::default(),
                },
                &sys,
            ),
        )
        .await?;
        let attempt = timed(
            &mut attempt_s,
            store.create_attempt(
                &NewAttempt {
                    payment_id: payment.id.clone(),
                    connector_account_id: account.id.clone(),
                    ..NewAttempt::default()
                },
                &sys,
            ),
        )
        .await?;
        let r = &attempt.reference;
        let submitted = apply(
            r,
            event(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse),
        );
        timed(&mut apply_s, store.apply_event(&submitted)).await?;
        let success = apply(
            r,
            event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse),
        );
        timed(&mut apply_s, store.apply_event(&success)).await?;
        timed(&mut dup_s, store.apply_event(&success)).await?;
        let refund = RefundRequest {
            payment_id: payment.id.clone(),
            merchant_id: None,
            amount: Money::positive(100, eur)?,
            reason: None,
            idempotency_key: None,
        };
        timed(&mut refund_s, store.reserve_refund(&refund, &sys)).await?;
        references.push(payment.id);
    }
    let sequential = start.elapsed();
    println!(
        "{label}: {payments} payments, sequential {:.2} s",
        sequential.as_secs_f64()
    );
    create.report("create_payment");
    attempt_s.report("create_attempt");
    apply_s.report("apply_event (applied)");
    dup_s.report("apply_event (duplicate)");
    refund_s.report("reserve_refund");

    // Concurrent door traffic: 16 tasks reserving small refunds on distinct payments.
    let start = Instant::now();
    let mut tasks = Vec::new();
    for chunk in references.chunks(references.len().div_ceil(16)) {
        let store = store.clone();
        let chunk = chunk.to_vec();
        let sys = sys.clone();
        tasks.push(tokio::spawn(async move {
            for id in chunk {
                let refund = RefundRequest {
                    payment_id: id,
                    merchant_id: None,
                    amount: Money {
                        amount_minor: 10,
                        currency: eur,
                    },
                    reason: None,
                    idempotency_key: None,
                };
                store.reserve_refund(&refund, &sys).await?;
            }
            Ok::<_, sluice_store::StoreError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = start.elapsed();
    println!(
        "  concurrent reserve_refund      {:.0} /s with 16 tasks",
        references.len() as f64 / elapsed.as_secs_f64()
    );
    store.close().await;
    Ok(())
}
