//! Scan cost of the recovery scanner's due-work query on PostgreSQL: one full
//! pass over the due attempts (`Store::due_attempts`, pages of 100 with the
//! per-round cursor, exactly as the scanner reads them) with 1k pending
//! attempts alone, then with the same 1k pending plus 1M terminal attempts
//! (and their 1M orders) inserted with `generate_series`. The partial index
//! `payment_attempts_scan` should make both cost about the same.
//!
//! Run (PostgreSQL on 127.0.0.1:5432, or `SLUICE_TEST_DATABASE_URL`):
//! `cargo bench -p sluice-store --bench scan_cost`
//!
//! It creates and drops its own database, checks that EXPLAIN of the scan
//! query uses the partial index (custom and generic plans), and prints the
//! medians of individually timed passes and their ratio after criterion.

use std::time::{Duration, Instant};

use criterion::Criterion;
use sluice_store::{NewConnectorAccount, ScanCursor, Store};
use sqlx::{Connection, Row};

const PENDING: i64 = 1_000;
const TERMINAL: i64 = 1_000_000;
const PAGE: i64 = 100;
const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The scanner's query, as `Store::due_attempts` sends it (its columns trimmed).
const SCAN_SQL: &str = "SELECT id FROM payment_attempts \
     WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED') AND next_retry_time <= $1 \
       AND ($2 IS NULL OR next_retry_time > $2 OR (next_retry_time = $2 AND id > $3)) \
     ORDER BY next_retry_time, id LIMIT $4";

fn with_database(admin_url: &str, name: &str) -> String {
    let scheme_end = admin_url.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match admin_url[scheme_end..].find('/') {
        Some(slash) => &admin_url[..scheme_end + slash],
        None => admin_url,
    };
    format!("{base}/{name}")
}

/// One full pass over the due set, as a scanner round reads it.
async fn full_pass(store: &Store, now: i64) -> usize {
    let mut cursor: Option<ScanCursor> = None;
    let mut rows = 0;
    loop {
        let page = store
            .due_attempts(now, PAGE, cursor.as_ref())
            .await
            .expect("due attempts");
        rows += page.len();
        let full = page.len() as i64 >= PAGE;
        cursor = page.last().map(|a| ScanCursor {
            next_retry_time: a.next_retry_time.expect("due rows have a retry time"),
            id: a.id.clone(),
        });
        if !full {
            return rows;
        }
    }
}

fn median(rt: &tokio::runtime::Runtime, store: &Store, now: i64, runs: usize) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            let rows = rt.block_on(full_pass(store, now));
            assert_eq!(rows as i64, PENDING);
            started.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

async fn explain(conn: &mut sqlx::PgConnection, generic: bool, now: i64) -> String {
    let mode = if generic {
        "force_generic_plan"
    } else {
        "force_custom_plan"
    };
    sqlx::query(&format!("SET plan_cache_mode = {mode}"))
        .execute(&mut *conn)
        .await
        .expect("plan cache mode");
    let _ = sqlx::query("DEALLOCATE scan").execute(&mut *conn).await;
    sqlx::query(&format!(
        "PREPARE scan (BIGINT, BIGINT, TEXT, BIGINT) AS {SCAN_SQL}"
    ))
    .execute(&mut *conn)
    .await
    .expect("prepare");
    let rows = sqlx::query(&format!("EXPLAIN EXECUTE scan ({now}, NULL, '', {PAGE})"))
        .fetch_all(&mut *conn)
        .await
        .expect("explain");
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let admin_url =
        std::env::var("SLUICE_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
    let name = format!("sluice_scan_bench_{}", uuid::Uuid::new_v4().simple());
    let url = with_database(&admin_url, &name);
    let (store, now) = rt.block_on(async {
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL is required at {admin_url}: {e}"));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create database");
        let store = Store::connect(&url).await.expect("connect");
        store.migrate().await.expect("migrate");
        let merchant = store.create_merchant("bench").await.expect("merchant");
        let account = store
            .create_connector_account(&NewConnectorAccount {
                merchant_id: merchant.id.clone(),
                adapter: "stripe".into(),
                label: "bench".into(),
                config: serde_json::json!({ "base_url": "http://127.0.0.1:9" }),
                secrets: serde_json::json!({ "api_key": "k" }),
            })
            .await
            .expect("account");
        let now = store.now_ms();
        let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
        insert(
            &mut conn,
            "p",
            1,
            PENDING,
            &merchant.id,
            &account.id,
            "PROCESSING",
            "UNKNOWN",
            now,
        )
        .await;
        sqlx::query("ANALYZE")
            .execute(&mut conn)
            .await
            .expect("analyze");
        (store, now)
    });

    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(30)
        .measurement_time(Duration::from_secs(5));
    criterion.bench_function("scan_due_attempts/1k_pending_alone", |b| {
        b.iter(|| rt.block_on(full_pass(&store, now)))
    });
    let alone = median(&rt, &store, now, 200);

    let (plan_custom, plan_generic) = rt.block_on(async {
        let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
        let merchant: String = sqlx::query("SELECT id FROM merchants")
            .fetch_one(&mut conn)
            .await
            .expect("merchant")
            .get(0);
        let account: String = sqlx::query("SELECT id FROM connector_accounts")
            .fetch_one(&mut conn)
            .await
            .expect("account")
            .get(0);
        let started = Instant::now();
        insert(
            &mut conn,
            "t",
            1,
            TERMINAL,
            &merchant,
            &account,
            "SUCCEEDED",
            "SUCCEEDED",
            now,
        )
        .await;
        sqlx::query("ANALYZE")
            .execute(&mut conn)
            .await
            .expect("analyze");
        eprintln!(
            "inserted {TERMINAL} terminal orders and attempts in {:?}",
            started.elapsed()
        );
        (
            explain(&mut conn, false, now).await,
            explain(&mut conn, true, now).await,
        )
    });
    criterion.bench_function("scan_due_attempts/1k_pending_with_1m_terminal", |b| {
        b.iter(|| rt.block_on(full_pass(&store, now)))
    });
    let with_history = median(&rt, &store, now, 200);
    criterion.final_summary();

    println!(
        "\nEXPLAIN (custom plan):\n{plan_custom}\n\nEXPLAIN (generic plan):\n{plan_generic}\n"
    );
    println!(
        "full pass over {PENDING} due attempts (pages of {PAGE}), median of 200:\n  \
         1k pending alone:                 {alone:?}\n  \
         1k pending + 1M terminal:         {with_history:?}\n  \
         ratio:                            {:.2}",
        with_history.as_secs_f64() / alone.as_secs_f64()
    );
    rt.block_on(async {
        store.close().await;
        if let Ok(mut admin) = sqlx::PgConnection::connect(&admin_url).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut admin)
                .await;
        }
    });
    for (label, plan) in [("custom", &plan_custom), ("generic", &plan_generic)] {
        assert!(
            plan.contains("payment_attempts_scan"),
            "the {label} plan of the scan query does not use the partial index:\n{plan}"
        );
    }
}

/// `count` orders and one attempt each, ids `{tag}{n}`, with `generate_series`.
#[allow(clippy::too_many_arguments)]
async fn insert(
    conn: &mut sqlx::PgConnection,
    tag: &str,
    from: i64,
    count: i64,
    merchant: &str,
    account: &str,
    order_state: &str,
    attempt_state: &str,
    now: i64,
) {
    let to = from + count - 1;
    sqlx::query(&format!(
        "INSERT INTO payment_orders (id, merchant_id, merchant_order_no, amount_minor, currency, \
             capture_mode, state, version, created_at, updated_at) \
         SELECT 'pay_{tag}' || g, $1, 'order_{tag}' || g, 1000, 'EUR', 'automatic', $2, 2, $3, $3 \
         FROM generate_series({from}, {to}) AS g"
    ))
    .bind(merchant)
    .bind(order_state)
    .bind(now - 3_600_000)
    .execute(&mut *conn)
    .await
    .expect("insert orders");
    // Pending rows are due (next_retry_time in the past); terminal rows have
    // none, as the door leaves them.
    let retry = if attempt_state == "SUCCEEDED" {
        "NULL".to_owned()
    } else {
        format!("{now} - 1000 - g")
    };
    sqlx::query(&format!(
        "INSERT INTO payment_attempts (id, payment_id, attempt_no, reference, adapter, \
             connector_account_id, amount_minor, currency, capture_mode, state, version, \
             next_retry_time, retry_count, created_at, updated_at) \
         SELECT 'att_{tag}' || g, 'pay_{tag}' || g, 1, 'ref_{tag}' || g, 'stripe', $1, 1000, \
             'EUR', 'automatic', $2, 2, {retry}, 0, $3, $3 \
         FROM generate_series({from}, {to}) AS g"
    ))
    .bind(account)
    .bind(attempt_state)
    .bind(now - 3_600_000)
    .execute(&mut *conn)
    .await
    .expect("insert attempts");
}
