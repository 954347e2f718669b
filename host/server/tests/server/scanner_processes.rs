//! Two `sluice serve` processes on one PostgreSQL database and one sandbox
//! PSP, with many pending attempts that only queries can resolve (the sandbox
//! sends no webhooks here): no attempt is ever queried by both at the same
//! moment, and every attempt converges with exactly one charge.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use sluice_sandbox_psp::SandboxConfig;
use sqlx::{Connection, Row};
use tokio::time::Instant;

use crate::pg::TestDatabase;
use crate::system::*;

/// Both instances scan every 100 ms and re-query PROCESSING quickly, so they
/// compete for the same rows round after round.
const COMPETING_SCANNERS: &str = "\
scanner_interval_ms = 100
scanner_lease_ms = 10000
submitted_timeout_ms = 500
processing_timeout_ms = 300
query_backoff_ms = 300
max_query_backoff_ms = 600
first_query_delay_ms = 200
in_flight_grace_ms = 200
";

const ATTEMPTS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateway_processes_never_query_one_attempt_at_the_same_moment_and_all_converge() {
    let db = TestDatabase::create().await;
    let sandbox = sluice_sandbox_psp::start(SandboxConfig {
        // Every lookup takes a while, so overlapping queries would show.
        query_delay: Duration::from_millis(250),
        timeout_hold: Duration::from_secs(3),
        // "processing" payments settle after a few seconds; only a query tells.
        late_webhook_delay: Some(Duration::from_secs(3)),
        ..SandboxConfig::default()
    })
    .await
    .expect("sandbox PSP");
    let adapters = real_adapters();
    let root = tempfile::tempdir().expect("temp dir");
    let mut a = Gateway::new(
        "a",
        root.path(),
        &db.url,
        adapters.path(),
        COMPETING_SCANNERS,
        &[],
    );
    let mut b = Gateway::new(
        "b",
        root.path(),
        &db.url,
        adapters.path(),
        COMPETING_SCANNERS,
        &[],
    );
    a.start().await;
    b.start().await;
    // No webhook targets: the PSP's outcome reaches the gateway only by query.
    let merchant = set_up_merchant(&a.url, &sandbox, 400, None, false).await;
    let clients = [
        MerchantClient::new(&a.url, &merchant.api_key),
        MerchantClient::new(&b.url, &merchant.api_key),
    ];

    // Half answer late ("processing" until they settle), half commit and then
    // time out (UNKNOWN): every one needs queries, through either instance.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut creates = tokio::task::JoinSet::new();
    for index in 0..ATTEMPTS {
        let client = clients[index % 2].clone();
        let account = merchant.stripe_account.clone();
        creates.spawn(async move {
            let token = if index % 2 == 0 {
                "pm_sluice_late_webhook_only"
            } else {
                "pm_sluice_commit_then_timeout"
            };
            let body = json!({
                "amount": 2_000 + index,
                "currency": "EUR",
                "merchant_order_no": format!("two-scanners-{index}"),
                "connector_account": account,
                "payment_method": token,
                "confirm": true,
            });
            let (status, payment) = client
                .call(
                    Method::POST,
                    "/v1/payments",
                    Some(&format!("k{index}")),
                    Some(&body),
                    deadline,
                )
                .await
                .expect("create a payment");
            assert!(status.is_success(), "{status} {payment}");
        });
    }
    while let Some(result) = creates.join_next().await {
        result.expect("create task");
    }

    // Converge: every attempt SUCCEEDED.
    let mut conn = sqlx::AnyConnection::connect(&db.url)
        .await
        .expect("connect");
    let started = Instant::now();
    let open = loop {
        let open: i64 =
            sqlx::query("SELECT COUNT(*) AS n FROM payment_attempts WHERE state <> 'SUCCEEDED'")
                .fetch_one(&mut conn)
                .await
                .expect("count")
                .get("n");
        if open == 0 || Instant::now() >= deadline {
            break open;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let convergence = started.elapsed();
    assert_eq!(
        open,
        0,
        "attempts still open after {convergence:?}\n--- a ---\n{}\n--- b ---\n{}",
        a.log_tail(20),
        b.log_tail(20)
    );
    let references: Vec<String> = sqlx::query("SELECT reference FROM payment_attempts")
        .fetch_all(&mut conn)
        .await
        .expect("attempts")
        .iter()
        .map(|r| r.get("reference"))
        .collect();
    assert_eq!(references.len(), ATTEMPTS);
    for reference in &references {
        assert_eq!(sandbox.charge_count(reference), 1, "{reference}");
    }

    // No two lookups of one attempt overlap in time.
    let mut by_reference: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for query in sandbox.queries() {
        by_reference
            .entry(query.reference.clone())
            .or_default()
            .push((query.started_unix_ms, query.ended_unix_ms));
    }
    let mut queries = 0;
    for reference in &references {
        let mut spans = by_reference.remove(reference).unwrap_or_default();
        assert!(!spans.is_empty(), "{reference} converged without any query");
        spans.sort();
        queries += spans.len();
        for pair in spans.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "{reference} was queried twice at the same moment: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }
    let by_a = a.metric_sum("sluice_scanner_psp_queries_total").await;
    let by_b = b.metric_sum("sluice_scanner_psp_queries_total").await;
    println!(
        "two scanner processes: {ATTEMPTS} attempts converged in {:.1} s with {queries} \
         non-overlapping PSP lookups (scanner queries: a {by_a}, b {by_b})",
        convergence.as_secs_f64()
    );
    assert!(
        by_a > 0.0 && by_b > 0.0,
        "both instances should have queried (a {by_a}, b {by_b})"
    );

    a.kill();
    b.kill();
    conn.close().await.ok();
    db.drop_now().await;
}
