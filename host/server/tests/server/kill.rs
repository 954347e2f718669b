//! The kill -9 test (issue 6): `sluice serve` on PostgreSQL with the sandbox
//! PSP, a few hundred payments, refunds and webhook storms with faults on,
//! SIGKILLed and restarted several times while the load runs; then, after a
//! bounded convergence time, the invariants hold.
//!
//! Size: `SLUICE_KILL_TEST_PAYMENTS` payments (default 160), `SLUICE_KILL_TEST_KILLS`
//! kills (default 5).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use reqwest::{Method, StatusCode};
use serde_json::json;
use sluice_sandbox_psp::{DeliveryFaults, RetryPolicy, SandboxConfig};
use sqlx::{Connection, Row};
use tokio::time::Instant;

use crate::pg::TestDatabase;
use crate::system::*;

/// Timings that make recovery after a crash take seconds, not minutes.
const FAST_WORKERS: &str = "\
scanner_interval_ms = 250
scanner_lease_ms = 8000
submitted_timeout_ms = 1500
processing_timeout_ms = 1500
query_backoff_ms = 500
max_query_backoff_ms = 2000
max_unknown_age_ms = 20000
first_query_delay_ms = 500
in_flight_grace_ms = 500
inbox_lease_ms = 3000
outbox_lease_ms = 3000
delivery_lease_ms = 7000
delivery_timeout_ms = 3000
nats_ack_timeout_ms = 3000
publisher_poll_ms = 100
idempotency_lease_ms = 10000
";

/// What recovery may rely on for the Stripe-format protocol (issue 11 §4):
/// its Idempotency-Keys are kept 24 h, so within 23 h an attempt or refund
/// whose query proves the PSP has none is re-sent with the same key. Data
/// about the adapter in the configuration, never a host special case.
const ADAPTER_RECOVERY: &str = "\
[adapters.stripe]
resend_window_ms = 82800000
";

/// Only these scenarios may end in manual review: their PSP answers 500 to
/// every request and every query and committed nothing, so no query can
/// prove an outcome (Stripe's search finds nothing and the re-send with the
/// same key gets the same 500; the Adyen replay answers 500 again). A payment
/// in review for any other reason was sent there by a kill.
const UNRESOLVABLE_BY_CONSTRUCTION: &[&str] = &["pm_sluice_server_error"];

/// The PSP call budget of the connector accounts (the sandbox holds a
/// commit-then-timeout answer longer).
const PSP_TIMEOUT_MS: u64 = 1500;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Sale,
    AuthorizeCapture,
    SaleRefund,
    /// A sale, then two refunds of 60 % each sent at the same moment.
    SaleRacingRefunds,
}

const SCENARIOS: &[(&str, &str, Flow)] = &[
    ("stripe", "pm_card_visa", Flow::SaleRefund),
    ("adyen", "pm_card_visa", Flow::Sale),
    ("stripe", "pm_card_visa", Flow::AuthorizeCapture),
    ("adyen", "pm_card_visa", Flow::AuthorizeCapture),
    ("stripe", "pm_card_chargeDeclined", Flow::Sale),
    ("adyen", "pm_card_insufficient_funds", Flow::Sale),
    ("stripe", "pm_sluice_commit_then_timeout", Flow::Sale),
    ("adyen", "pm_sluice_commit_then_timeout", Flow::SaleRefund),
    // A 500 that committed nothing: no query can prove it (Stripe's search
    // finds nothing, the Adyen replay answers 500 again), so it goes to an
    // operator once UNKNOWN is older than `max_unknown_age_ms`.
    ("adyen", "pm_sluice_server_error", Flow::Sale),
    ("stripe", "pm_sluice_server_error", Flow::Sale),
    ("stripe", "pm_card_visa", Flow::SaleRacingRefunds),
    ("adyen", "pm_card_visa", Flow::SaleRacingRefunds),
    ("stripe", "pm_sluice_garbage", Flow::Sale),
    ("stripe", "pm_sluice_late_webhook_only", Flow::SaleRefund),
    ("adyen", "pm_sluice_webhook_before_response", Flow::Sale),
    ("stripe", "pm_sluice_slow", Flow::AuthorizeCapture),
    ("adyen", "pm_sluice_garbage", Flow::SaleRacingRefunds),
];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn is_terminal_order(state: &str) -> bool {
    matches!(state, "SUCCEEDED" | "FAILED" | "CANCELED" | "EXPIRED")
}

#[derive(Default)]
struct DriverStats {
    created: AtomicUsize,
    captures: AtomicUsize,
    refunds_sent: AtomicUsize,
    refunds_refused: AtomicUsize,
    gave_up: AtomicUsize,
    /// (payment index, what the driver was waiting for) of flows cut short by the load deadline.
    gave_up_at: std::sync::Mutex<Vec<(usize, &'static str)>>,
}

impl DriverStats {
    fn give_up(&self, index: usize, stage: &'static str) {
        self.gave_up.fetch_add(1, Ordering::Relaxed);
        self.gave_up_at
            .lock()
            .expect("stats lock")
            .push((index, stage));
    }
}

/// How long past the load deadline a flow that authorized a payment may take to capture it.
const FINISH_GRACE: Duration = Duration::from_secs(30);

/// Drives one payment through its flow, retrying through restarts.
async fn drive(
    api: MerchantClient,
    merchant: Merchant,
    run: String,
    index: usize,
    deadline: Instant,
    stats: Arc<DriverStats>,
) {
    let (adapter, token, flow) = SCENARIOS[index % SCENARIOS.len()];
    let account = if adapter == "stripe" {
        &merchant.stripe_account
    } else {
        &merchant.adyen_account
    };
    let amount = 1_000 + (index as i64) * 7;
    let manual = flow == Flow::AuthorizeCapture;
    let body = json!({
        "amount": amount,
        "currency": "EUR",
        "merchant_order_no": format!("{run}-{index}"),
        "capture_mode": if manual { "manual" } else { "automatic" },
        "connector_account": account,
        "payment_method": token,
        "confirm": true,
    });
    let Some((status, created)) = api
        .call(
            Method::POST,
            "/v1/payments",
            Some(&format!("create-{run}-{index}")),
            Some(&body),
            deadline,
        )
        .await
    else {
        stats.give_up(index, "create");
        return;
    };
    assert!(status.is_success(), "create {index}: {status} {created}");
    stats.created.fetch_add(1, Ordering::Relaxed);
    let id = created["id"].as_str().expect("payment id").to_owned();
    let wanted = if manual { "AUTHORIZED" } else { "SUCCEEDED" };
    if flow == Flow::Sale {
        return;
    }
    // An authorization rests until its merchant captures it: a flow that created one goes
    // on to its capture past the load deadline, as its merchant would, or its payment
    // would never settle (a create answered just after the deadline did that once).
    let deadline = if manual {
        deadline + FINISH_GRACE
    } else {
        deadline
    };
    let Some(payment) = api
        .wait_payment(&id, deadline, |p| {
            let state = p["state"].as_str().unwrap_or_default();
            state == wanted || is_terminal_order(state)
        })
        .await
    else {
        stats.give_up(index, wanted);
        return;
    };
    if payment["state"] != wanted {
        return;
    }
    match flow {
        Flow::Sale => {}
        Flow::AuthorizeCapture => {
            let reply = api
                .call(
                    Method::POST,
                    &format!("/v1/payments/{id}/capture"),
                    Some(&format!("capture-{run}-{index}")),
                    Some(&json!({})),
                    deadline,
                )
                .await;
            match reply {
                Some((status, _)) if status.is_success() => {
                    stats.captures.fetch_add(1, Ordering::Relaxed);
                }
                Some((status, body)) => panic!("capture {index}: {status} {body}"),
                None => stats.give_up(index, "capture"),
            }
        }
        Flow::SaleRefund => {
            refund(
                &api,
                &id,
                &format!("refund-{run}-{index}"),
                amount / 2,
                deadline,
                &stats,
            )
            .await;
        }
        Flow::SaleRacingRefunds => {
            let part = amount * 6 / 10;
            let (key_a, key_b) = (
                format!("race-a-{run}-{index}"),
                format!("race-b-{run}-{index}"),
            );
            tokio::join!(
                refund(&api, &id, &key_a, part, deadline, &stats),
                refund(&api, &id, &key_b, part, deadline, &stats),
            );
        }
    }
}

async fn refund(
    api: &MerchantClient,
    payment_id: &str,
    key: &str,
    amount: i64,
    deadline: Instant,
    stats: &DriverStats,
) {
    let reply = api
        .call(
            Method::POST,
            &format!("/v1/payments/{payment_id}/refunds"),
            Some(key),
            Some(&json!({ "amount": amount })),
            deadline,
        )
        .await;
    match reply {
        Some((status, _)) if status.is_success() => {
            stats.refunds_sent.fetch_add(1, Ordering::Relaxed);
        }
        // More than is left to refund: refused, nothing changed.
        Some((StatusCode::BAD_REQUEST, _)) => {
            stats.refunds_refused.fetch_add(1, Ordering::Relaxed);
        }
        Some((status, body)) => panic!("refund {key}: {status} {body}"),
        None => stats.give_up(usize::MAX, "refund"),
    }
}

/// What the database says at one moment, for the convergence loop.
#[derive(Debug, Default)]
struct DbState {
    payments: usize,
    /// Open orders whose every attempt was definitively declined (client
    /// status `failed`; the merchant may retry with other details).
    declined_open: usize,
    /// Orders flagged for manual review.
    in_review: usize,
    /// Orders neither terminal nor in manual_review, with their state.
    unsettled_orders: Vec<(String, String)>,
    /// Attempts, captures and refunds not terminal (of payments not in review).
    unsettled_rows: Vec<(String, String, String)>,
    inbox_open: i64,
    outbox_ids: BTreeSet<String>,
    deliveries_open: i64,
}

async fn db_state(conn: &mut sqlx::AnyConnection) -> DbState {
    let mut state = DbState::default();
    // `open_attempts`: attempts not definitively FAILED or CANCELED. An open
    // order without one rests: its client status is `failed` and only the
    // merchant can go on (a new attempt with other payment details).
    let orders = sqlx::query(
        "SELECT o.id, o.state, o.manual_review, \
                (SELECT COUNT(*) FROM payment_attempts a WHERE a.payment_id = o.id \
                   AND a.state NOT IN ('FAILED', 'CANCELED')) AS open_attempts, \
                (SELECT COUNT(*) FROM payment_attempts a WHERE a.payment_id = o.id) AS attempts \
         FROM payment_orders o",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("orders");
    state.payments = orders.len();
    let mut in_review = BTreeSet::new();
    for row in &orders {
        let id: String = row.get("id");
        let s: String = row.get("state");
        let review: i64 = row.get("manual_review");
        let open_attempts: i64 = row.get("open_attempts");
        let attempts: i64 = row.get("attempts");
        let declined_and_open = attempts > 0 && open_attempts == 0;
        if review == 1 {
            state.in_review += 1;
            in_review.insert(id.clone());
        } else if declined_and_open {
            state.declined_open += 1;
        } else if !is_terminal_order(&s) {
            state.unsettled_orders.push((id, s));
        }
    }
    for (table, terminal) in [
        ("payment_attempts", "'SUCCEEDED', 'FAILED', 'CANCELED'"),
        ("captures", "'SUCCEEDED', 'FAILED'"),
        ("refunds", "'SUCCEEDED', 'FAILED', 'CANCELED'"),
    ] {
        let rows = sqlx::query(&format!(
            "SELECT id, payment_id, state FROM {table} WHERE state NOT IN ({terminal})"
        ))
        .fetch_all(&mut *conn)
        .await
        .expect("pending rows");
        for row in rows {
            let payment: String = row.get("payment_id");
            if !in_review.contains(&payment) {
                state
                    .unsettled_rows
                    .push((table.into(), row.get("id"), row.get("state")));
            }
        }
    }
    state.inbox_open = sqlx::query(
        "SELECT COUNT(*) AS n FROM webhook_inbox WHERE status IN ('pending', 'processing', 'failed')",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("inbox")
    .get("n");
    state.outbox_ids = sqlx::query("SELECT event_id FROM outbox")
        .fetch_all(&mut *conn)
        .await
        .expect("outbox")
        .iter()
        .map(|r| r.get("event_id"))
        .collect();
    state.deliveries_open =
        sqlx::query("SELECT COUNT(*) AS n FROM event_deliveries WHERE status <> 'sent'")
            .fetch_one(&mut *conn)
            .await
            .expect("deliveries")
            .get("n");
    state
}

/// Why events have not been delivered, for a failure message: the outbox rows not
/// fanned out and the deliveries not sent, counted by sink, status, tries and last error,
/// with the soonest and latest next try relative to now.
async fn undelivered_summary(conn: &mut sqlx::AnyConnection) -> String {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut out = String::new();
    for (label, sql) in [
        (
            "outbox not fanned out",
            "SELECT 'outbox' AS sink, status, attempts, COALESCE(last_error, '') AS err, \
                    COUNT(*) AS n, MIN(next_attempt_at) AS soonest, MAX(next_attempt_at) AS latest \
             FROM outbox WHERE status <> 'sent' GROUP BY status, attempts, last_error",
        ),
        (
            "deliveries not sent",
            "SELECT sink, status, attempts, COALESCE(last_error, '') AS err, \
                    COUNT(*) AS n, MIN(next_attempt_at) AS soonest, MAX(next_attempt_at) AS latest \
             FROM event_deliveries WHERE status <> 'sent' GROUP BY sink, status, attempts, last_error",
        ),
    ] {
        let rows = sqlx::query(sql).fetch_all(&mut *conn).await.unwrap_or_default();
        out.push_str(&format!("\n{label}: {} groups", rows.len()));
        for row in rows.iter().take(20) {
            let (sink, status, err): (String, String, String) =
                (row.get("sink"), row.get("status"), row.get("err"));
            let (attempts, n, soonest, latest): (i64, i64, i64, i64) = (
                row.get("attempts"),
                row.get("n"),
                row.get("soonest"),
                row.get("latest"),
            );
            out.push_str(&format!(
                "\n  {n} × {sink} {status} after {attempts} tries, next in {:.1}..{:.1} s: {err}",
                (soonest - now_ms) as f64 / 1000.0,
                (latest - now_ms) as f64 / 1000.0,
            ));
        }
    }
    out
}

/// A payment's rows and history, for a failure message.
async fn describe_payment(conn: &mut sqlx::AnyConnection, id: &str) -> String {
    let mut out = String::new();
    for (label, sql) in [
        ("order", "SELECT state || ' ' || capture_mode || ' ' || COALESCE(payment_method_token, '') AS d FROM payment_orders WHERE id = $1"),
        ("attempt", "SELECT id || ' ' || state || ' ' || adapter || ' ' || reference || ' ' || COALESCE(failure_code, '') || ' ' || COALESCE(failure_message, '') || ' retries ' || retry_count AS d FROM payment_attempts WHERE payment_id = $1"),
        ("capture", "SELECT id || ' ' || state || ' ' || reference || ' ' || COALESCE(failure_code, '') || ' ' || COALESCE(failure_message, '') AS d FROM captures WHERE payment_id = $1"),
        ("refund", "SELECT id || ' ' || state || ' ' || reference || ' ' || COALESCE(failure_code, '') || ' ' || COALESCE(failure_message, '') AS d FROM refunds WHERE payment_id = $1"),
        ("history", "SELECT aggregate_type || ':' || COALESCE(from_state, '-') || '->' || to_state || ' ' || event_kind || ' ' || decision || ' ' || reason || ' ' || evidence_source || ' ' || COALESCE(actor, '') || ' at ' || recorded_at AS d FROM state_history WHERE payment_id = $1 AND decision <> 'ignored_duplicate' ORDER BY id"),
    ] {
        let rows = sqlx::query(sql)
            .bind(id)
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_default();
        for row in rows {
            let d: String = row.get("d");
            out.push_str(&format!("\n    {label}: {d}"));
        }
    }
    out
}

/// A payment in manual review: its scenario and why it is there.
struct Review {
    payment_id: String,
    adapter: &'static str,
    token: &'static str,
    flow: Flow,
    reason: String,
}

/// Every payment in manual review, with the scenario its order number names
/// (`{run}-{index}`) and the flag's reason (the history row that raised it).
async fn review_reasons(conn: &mut sqlx::AnyConnection, run: &str) -> Vec<Review> {
    let rows = sqlx::query(
        "SELECT id, merchant_order_no, COALESCE(manual_review_reason, '') AS reason \
         FROM payment_orders WHERE manual_review = 1 ORDER BY merchant_order_no",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("reviews");
    rows.iter()
        .map(|row| {
            let order_no: String = row.get("merchant_order_no");
            let index: usize = order_no
                .strip_prefix(&format!("{run}-"))
                .and_then(|i| i.parse().ok())
                .unwrap_or_else(|| panic!("order number {order_no} names no scenario"));
            let (adapter, token, flow) = SCENARIOS[index % SCENARIOS.len()];
            Review {
                payment_id: row.get("id"),
                adapter,
                token,
                flow,
                reason: row.get("reason"),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_during_load_converges_with_one_charge_per_success_and_every_event_delivered() {
    let payments = env_usize("SLUICE_KILL_TEST_PAYMENTS", 160);
    let kills = env_usize("SLUICE_KILL_TEST_KILLS", 5);
    let test_started = Instant::now();

    let db = TestDatabase::create().await;
    let sandbox = sluice_sandbox_psp::start(SandboxConfig {
        timeout_hold: Duration::from_secs(4),
        slow_delay: Duration::from_millis(700),
        late_webhook_delay: Some(Duration::from_secs(1)),
        delivery: DeliveryFaults {
            duplicates: 2,
            reorder_window: 4,
            reorder_flush: Duration::from_millis(100),
            adyen_batch: false,
            ..DeliveryFaults::default()
        },
        // Keep re-sending through the gateway's restarts (up to about a minute).
        retry: RetryPolicy {
            max_attempts: 35,
            backoff: Duration::from_millis(100),
            request_timeout: Duration::from_secs(3),
        },
        ..SandboxConfig::default()
    })
    .await
    .expect("sandbox PSP");
    let receiver = Receiver::start().await;
    let consumer = JetStreamConsumer::start().await;
    let adapters = real_adapters();
    let mut root = tempfile::tempdir().expect("temp dir");
    // To read a passing run's gateway log too.
    if std::env::var_os("SLUICE_KILL_TEST_KEEP_LOG").is_some() {
        root.disable_cleanup(true);
        println!("gateway log kept in {}", root.path().display());
    }
    let nats_url =
        std::env::var("SLUICE_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let mut gateway = Gateway::new(
        "gateway",
        root.path(),
        &db.url,
        adapters.path(),
        &format!("{FAST_WORKERS}\n{ADAPTER_RECOVERY}"),
        &[
            ("SLUICE_NATS_URL", nats_url.as_str()),
            ("SLUICE_NATS_STREAM", consumer.stream.as_str()),
            (
                "SLUICE_NATS_SUBJECT_PREFIX",
                consumer.subject_prefix.as_str(),
            ),
        ],
    );
    gateway.start().await;
    let merchant = set_up_merchant(
        &gateway.url,
        &sandbox,
        PSP_TIMEOUT_MS,
        Some(&receiver.url),
        true,
    )
    .await;
    let api = MerchantClient::new(&gateway.url, &merchant.api_key);
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();

    // The load: `payments` flows, 12 at a time, each retrying through restarts.
    let load_started = Instant::now();
    let load_deadline = load_started + Duration::from_secs(60);
    let stats = Arc::new(DriverStats::default());
    let permits = Arc::new(tokio::sync::Semaphore::new(12));
    let (load_api, load_merchant, load_run, load_stats) =
        (api.clone(), merchant.clone(), run.clone(), stats.clone());
    let load = tokio::spawn(async move {
        let mut drivers = tokio::task::JoinSet::new();
        for index in 0..payments {
            let permit = permits.clone().acquire_owned().await.expect("permit");
            let (api, merchant, run, stats) = (
                load_api.clone(),
                load_merchant.clone(),
                load_run.clone(),
                load_stats.clone(),
            );
            drivers.spawn(async move {
                drive(api, merchant, run, index, load_deadline, stats).await;
                drop(permit);
            });
        }
        while let Some(result) = drivers.join_next().await {
            result.expect("a payment driver panicked");
        }
    });

    // The killer: SIGKILL at random moments while the load runs, restart at once.
    let mut killed = 0;
    let mut downtime = Duration::ZERO;
    while killed < kills && !load.is_finished() {
        let wait = rand::rng().random_range(1_000..3_000);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if load.is_finished() {
            break;
        }
        gateway.kill();
        killed += 1;
        let down = Instant::now();
        let pause = rand::rng().random_range(0..400);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        gateway.start().await;
        downtime += down.elapsed();
    }
    load.await.expect("load");
    let load_time = load_started.elapsed();

    // Convergence: bounded, polled.
    let mut conn = sqlx::AnyConnection::connect(&db.url)
        .await
        .expect("connect");
    let converge_started = Instant::now();
    let converge_deadline = converge_started + Duration::from_secs(90);
    let mut state;
    loop {
        state = db_state(&mut conn).await;
        let delivered_hooks = receiver.event_ids();
        let delivered_nats = consumer.event_ids();
        let done = state.unsettled_orders.is_empty()
            && state.unsettled_rows.is_empty()
            && state.inbox_open == 0
            && state.deliveries_open == 0
            && state.outbox_ids.is_subset(&delivered_hooks)
            && state.outbox_ids.is_subset(&delivered_nats);
        if done || Instant::now() >= converge_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let convergence_time = converge_started.elapsed();
    let context = || gateway.log_tail(30);

    // 1. Every payment is terminal or in manual_review, and so are its parts.
    let mut details = String::new();
    for (id, _) in state.unsettled_orders.iter().take(10) {
        details.push_str(&format!(
            "\n{id}: {}",
            describe_payment(&mut conn, id).await
        ));
    }
    if !state.unsettled_orders.is_empty() {
        for p in sandbox.payments() {
            if state
                .unsettled_orders
                .iter()
                .any(|(id, _)| p.reference.starts_with(id.as_str()))
            {
                details.push_str(&format!(
                    "\nPSP: {} {} {:?} received {} capturable {}",
                    p.reference, p.id, p.status, p.amount_received, p.amount_capturable
                ));
            }
        }
        // Keep the gateway's log for a look.
        let kept = root.keep();
        details.push_str(&format!("\ngateway log kept in {}", kept.display()));
    }
    assert!(
        state.unsettled_orders.is_empty() && state.unsettled_rows.is_empty(),
        "not converged after {convergence_time:?}: orders {:?}; rows {:?}{details}\n{}",
        state.unsettled_orders,
        state.unsettled_rows,
        context()
    );
    assert_eq!(
        state.payments,
        stats.created.load(Ordering::Relaxed),
        "every driven payment exists"
    );
    let gave_up = stats.gave_up_at.lock().expect("stats lock").clone();
    assert!(
        !gave_up.iter().any(|(_, stage)| *stage == "create"),
        "the gateway never accepted some payments: {gave_up:?}"
    );

    // 1b. Every payment in manual review is there by construction, never
    //     because of a kill; each one is explained.
    let reviews = review_reasons(&mut conn, &run).await;
    let mut caused_by_a_kill = Vec::new();
    for review in &reviews {
        println!(
            "manual review: payment {} (scenario {} {} {:?}): {}",
            review.payment_id, review.adapter, review.token, review.flow, review.reason
        );
        if !UNRESOLVABLE_BY_CONSTRUCTION.contains(&review.token) {
            caused_by_a_kill.push(format!(
                "{} ({} {} {:?}): {}{}",
                review.payment_id,
                review.adapter,
                review.token,
                review.flow,
                review.reason,
                describe_payment(&mut conn, &review.payment_id).await
            ));
        }
    }
    assert!(
        caused_by_a_kill.is_empty(),
        "{} payments in manual review that a query or a safe re-send should have resolved:\n{}",
        caused_by_a_kill.len(),
        caused_by_a_kill.join("\n")
    );

    // 2. Exactly one charge per successful attempt; none for the others.
    let counts = sandbox.charge_counts();
    let attempts = sqlx::query(
        "SELECT a.reference, a.state, a.payment_id, o.manual_review \
         FROM payment_attempts a JOIN payment_orders o ON o.id = a.payment_id",
    )
    .fetch_all(&mut conn)
    .await
    .expect("attempts");
    let mut succeeded = 0;
    for row in &attempts {
        let reference: String = row.get("reference");
        let attempt_state: String = row.get("state");
        let review: i64 = row.get("manual_review");
        let charges = counts.get(&reference).map_or(0, |c| c.charges);
        match attempt_state.as_str() {
            "SUCCEEDED" => {
                succeeded += 1;
                assert_eq!(
                    charges, 1,
                    "attempt {reference} SUCCEEDED with {charges} charges"
                );
            }
            // In manual review the operator decides; the PSP may hold money.
            _ if review == 1 => {
                assert!(charges <= 1, "attempt {reference} charged {charges} times");
            }
            _ => assert_eq!(
                charges, 0,
                "attempt {reference} is {attempt_state} but the PSP charged {charges} times"
            ),
        }
    }
    let known: BTreeSet<String> = attempts.iter().map(|r| r.get("reference")).collect();
    for (reference, count) in &counts {
        assert!(
            count.charges <= 1,
            "{reference} charged {} times",
            count.charges
        );
        assert!(
            known.contains(reference) || count.charges == 0,
            "the PSP charged {reference}, which no attempt knows"
        );
    }

    // 3. No refund total exceeds what was captured (gateway and PSP).
    let amounts = sqlx::query(
        "SELECT o.id, a.captured_minor, a.refunded_minor, a.refund_reserved_minor, \
                COALESCE((SELECT CAST(SUM(r.amount_minor) AS BIGINT) FROM refunds r \
                          WHERE r.payment_id = o.id AND r.state = 'SUCCEEDED'), 0) AS refunds_ok \
         FROM payment_orders o JOIN payment_amounts a ON a.payment_id = o.id",
    )
    .fetch_all(&mut conn)
    .await
    .expect("amounts");
    let mut refunded_total = 0i64;
    for row in &amounts {
        let id: String = row.get("id");
        let captured: i64 = row.get("captured_minor");
        let refunded: i64 = row.get("refunded_minor");
        let refunds_ok: i64 = row.get("refunds_ok");
        refunded_total += refunded;
        assert!(
            refunded <= captured,
            "{id}: refunded {refunded} > captured {captured}"
        );
        assert_eq!(
            refunded, refunds_ok,
            "{id}: refunded amount vs succeeded refunds"
        );
    }
    for payment in sandbox.payments() {
        assert!(
            payment.amount_refunded <= payment.amount_received,
            "PSP payment {} refunded {} of {}",
            payment.id,
            payment.amount_refunded,
            payment.amount_received
        );
    }
    let refunds_ok: i64 =
        sqlx::query("SELECT COUNT(*) AS n FROM refunds WHERE state = 'SUCCEEDED'")
            .fetch_one(&mut conn)
            .await
            .expect("refunds")
            .get("n");

    // 4. Every webhook the gateway acknowledged was applied.
    let inbox: BTreeMap<(String, String), String> = sqlx::query(
        "SELECT adapter, provider_event_id, status FROM webhook_inbox \
         WHERE provider_event_id IS NOT NULL",
    )
    .fetch_all(&mut conn)
    .await
    .expect("inbox")
    .iter()
    .map(|r| {
        (
            (r.get("adapter"), r.get("provider_event_id")),
            r.get("status"),
        )
    })
    .collect();
    // Event types the adapters turn into payment events (docs/psp-wire-subsets.md);
    // the others are acknowledged with nothing to apply (e.g. the sandbox's
    // `charge.refunded`, which embeds no refund list).
    let carries_events = |connector: &str, kind: &str| {
        connector == "adyen"
            || matches!(
                kind,
                "payment_intent.succeeded"
                    | "payment_intent.payment_failed"
                    | "payment_intent.processing"
                    | "payment_intent.requires_action"
                    | "payment_intent.canceled"
                    | "payment_intent.amount_capturable_updated"
                    | "charge.refund.updated"
                    | "refund.created"
                    | "refund.updated"
                    | "refund.failed"
            )
    };
    let mut acknowledged = BTreeSet::new();
    let mut acknowledged_without_events = BTreeSet::new();
    let mut webhook_requests = 0;
    for delivery in sandbox.deliveries() {
        webhook_requests += 1;
        if !delivery.acknowledged {
            continue;
        }
        for event in &delivery.events {
            let provider_id = if delivery.connector == "adyen" {
                format!("{}:{}:{}", event.id, event.kind, event.success)
            } else {
                event.id.clone()
            };
            if carries_events(&delivery.connector, &event.kind) {
                acknowledged.insert((delivery.connector.clone(), provider_id));
            } else {
                acknowledged_without_events.insert(provider_id);
            }
        }
    }
    for key in &acknowledged {
        assert_eq!(
            inbox.get(key).map(String::as_str),
            Some("processed"),
            "acknowledged webhook {key:?} was not applied"
        );
    }
    assert!(
        !acknowledged.is_empty(),
        "no webhook was acknowledged at all"
    );

    // 5. Every state change has an outbox event, delivered at least once to the
    //    merchant endpoint and to JetStream.
    let outbox: Vec<(String, String, String, String)> =
        sqlx::query("SELECT event_id, event_type, partition_key, aggregate_id FROM outbox")
            .fetch_all(&mut conn)
            .await
            .expect("outbox")
            .iter()
            .map(|r| {
                (
                    r.get("event_id"),
                    r.get("event_type"),
                    r.get("partition_key"),
                    r.get("aggregate_id"),
                )
            })
            .collect();
    let types_of = |payment: &str| -> BTreeSet<String> {
        outbox
            .iter()
            .filter(|(_, _, partition, aggregate)| partition == payment || aggregate == payment)
            .map(|(_, kind, _, _)| kind.clone())
            .collect()
    };
    let orders = sqlx::query("SELECT id, state, capture_mode FROM payment_orders")
        .fetch_all(&mut conn)
        .await
        .expect("orders");
    for row in &orders {
        let id: String = row.get("id");
        let order_state: String = row.get("state");
        let types = types_of(&id);
        let expected: &[&str] = match order_state.as_str() {
            "SUCCEEDED" => &["payment.succeeded", "payment.captured"],
            "FAILED" => &["payment.failed"],
            "CANCELED" => &["payment.canceled"],
            "EXPIRED" => &["payment.expired"],
            _ => &[],
        };
        assert!(
            expected.is_empty() || expected.iter().any(|t| types.contains(*t)),
            "payment {id} is {order_state} without any of {expected:?} in the outbox: {types:?}"
        );
    }
    for row in &attempts {
        let attempt_state: String = row.get("state");
        let payment: String = row.get("payment_id");
        if attempt_state == "FAILED" {
            let types = types_of(&payment);
            assert!(
                types.contains("payment.attempt_failed") || types.contains("payment.failed"),
                "payment {payment} has a FAILED attempt without a failure event: {types:?}"
            );
        }
    }
    let refund_rows = sqlx::query("SELECT id, state FROM refunds")
        .fetch_all(&mut conn)
        .await
        .expect("refunds");
    for row in &refund_rows {
        let id: String = row.get("id");
        let refund_state: String = row.get("state");
        let expected = match refund_state.as_str() {
            "SUCCEEDED" => "refund.succeeded",
            "FAILED" => "refund.failed",
            _ => continue,
        };
        assert!(
            outbox
                .iter()
                .any(|(_, kind, _, aggregate)| kind == expected && aggregate == &id),
            "refund {id} is {refund_state} without {expected} in the outbox"
        );
    }
    let outbox_ids: BTreeSet<String> = outbox.iter().map(|(id, ..)| id.clone()).collect();
    let hooks = receiver.event_ids();
    let nats = consumer.event_ids();
    let missing_hooks: Vec<_> = outbox_ids.difference(&hooks).collect();
    let missing_nats: Vec<_> = outbox_ids.difference(&nats).collect();
    let undelivered = if missing_hooks.is_empty() && missing_nats.is_empty() {
        String::new()
    } else {
        undelivered_summary(&mut conn).await
    };
    assert!(
        missing_hooks.is_empty(),
        "{} outbox events never reached the merchant endpoint after {convergence_time:?}, \
         e.g. {:?}{undelivered}\n{}",
        missing_hooks.len(),
        missing_hooks.iter().take(5).collect::<Vec<_>>(),
        context()
    );
    assert!(
        missing_nats.is_empty(),
        "{} outbox events never reached JetStream after {convergence_time:?}, \
         e.g. {:?}{undelivered}\n{}",
        missing_nats.len(),
        missing_nats.iter().take(5).collect::<Vec<_>>(),
        context()
    );
    assert_eq!(state.deliveries_open, 0, "deliveries not sent");

    let hook_deliveries = receiver.deliveries();
    let nats_messages = consumer.received();
    println!(
        "kill -9 test: {} payments ({} declined and open for other payment details, \
         {} in manual review), \
         {} attempts SUCCEEDED with exactly one charge each, \
         {} captures, {} refunds sent / {} refused / {} SUCCEEDED (total {} minor units); \
         {} kills (gateway started {} times, {:.1} s down in total); \
         {} PSP webhook requests ({} acknowledged events, all applied); \
         {} outbox events: merchant endpoint got {} deliveries ({} duplicates), \
         JetStream consumer got {} messages ({} duplicates); \
         {} flows cut short by the load deadline {:?}; \
         load {:.1} s, convergence {:.1} s, whole test {:.1} s",
        state.payments,
        state.declined_open,
        state.in_review,
        succeeded,
        stats.captures.load(Ordering::Relaxed),
        stats.refunds_sent.load(Ordering::Relaxed),
        stats.refunds_refused.load(Ordering::Relaxed),
        refunds_ok,
        refunded_total,
        killed,
        gateway.starts,
        downtime.as_secs_f64(),
        webhook_requests,
        acknowledged.len(),
        outbox_ids.len(),
        hook_deliveries,
        hook_deliveries - hooks.len(),
        nats_messages,
        nats_messages - nats.len(),
        gave_up.len(),
        gave_up,
        load_time.as_secs_f64(),
        convergence_time.as_secs_f64(),
        test_started.elapsed().as_secs_f64(),
    );
    assert!(killed >= 1, "the load ended before the first kill");

    gateway.kill();
    consumer.delete().await;
    conn.close().await.ok();
    db.drop_now().await;
}
