//! Issue 17: a pooled PostgreSQL connection is pinged only after it sat idle
//! (`StoreOptions::ping_after_idle`). These tests drop the store's connection
//! from the server's side, as a restart or a broken link would, and show both
//! sides of the trade: after an idle spell the ping finds the dead connection
//! and the statement runs on a new one; within the window nothing is pinged,
//! so the dead connection fails one statement (no transaction commits on it)
//! and the pool then replaces it. SQLite connections are never pinged.

use std::time::Duration;

use sluice_core::CaptureMode;
use sluice_store::{Backend, Store, StoreError, StoreOptions};
use sluice_test_support::TestDb;

use crate::common::{sys, Fixture};
use sluice_test_support::door::new_payment;

/// Terminate every server process of the store's database but our own, and
/// wait until the server has let them go.
async fn drop_connections_server_side(url: &str) {
    // One connection, so "every process but our own" is every other one.
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("admin connection");
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&admin)
    .await
    .expect("terminate");
    sluice_test_support::eventually(Duration::from_secs(10), "the backends to exit", || {
        let admin = admin.clone();
        async move {
            let left: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .fetch_one(&admin)
            .await
            .expect("count");
            (left == 0).then_some(())
        }
    })
    .await;
    admin.close().await;
}

/// A one-connection store that opened its connection, which the server has
/// since dropped. The database handle keeps the test database alive.
async fn store_with_a_dead_connection(ping_after_idle: Duration) -> (TestDb, Store) {
    let db: TestDb = TestDb::open(Backend::Postgres).await;
    let store = db
        .store_with(StoreOptions {
            max_connections: 1,
            ping_after_idle,
            ..db.options()
        })
        .await;
    store
        .list_merchants()
        .await
        .expect("first use opens the connection");
    drop_connections_server_side(&db.url).await;
    (db, store)
}

#[tokio::test]
async fn a_connection_dropped_by_the_server_while_idle_is_replaced_before_a_statement_uses_it() {
    let (_db, store) = store_with_a_dead_connection(Duration::ZERO).await;
    let after = store.list_merchants().await;
    assert!(
        after.is_ok(),
        "the ping should have found the dead connection: {after:?}"
    );
}

#[tokio::test]
async fn a_connection_used_within_the_idle_window_is_not_pinged_so_a_dead_one_fails_one_statement()
{
    let (_db, store) = store_with_a_dead_connection(Duration::from_secs(3600)).await;
    let first = store.list_merchants().await;
    assert!(
        first.is_err(),
        "no ping within the window, so the dead connection is used: {first:?}"
    );
    let second = store.list_merchants().await;
    assert!(
        second.is_ok(),
        "the pool replaces a connection that failed: {second:?}"
    );
}

/// One request's writes: the idempotency key (autocommit), the payment (a
/// write transaction), the stored response (autocommit).
async fn one_request(store: Store, merchant_id: String, i: usize) -> Result<(), StoreError> {
    let key = format!("key-{i}");
    let endpoint = "POST /v1/payments";
    store
        .idempotency_begin(&merchant_id, endpoint, &key, "fingerprint", 60_000)
        .await?;
    let new = new_payment(
        &merchant_id,
        &format!("order-{i}"),
        1_000,
        CaptureMode::Automatic,
    );
    store.create_payment(&new, &sys()).await?;
    store
        .idempotency_complete(&merchant_id, endpoint, &key, 201, "{}")
        .await
}

dual_test! {
    /// SQLite admits one writer at a time. Writers of one process used to meet
    /// in SQLite's busy handler, which sleeps and retries in no order, so one
    /// could lose again and again (SQLite's p99 in BENCHMARKS.md) or fail once
    /// the busy timeout ran out. They now queue for the store's one write
    /// connection: with a busy timeout of 1 ms, 48 requests' writes at once
    /// still all succeed.
    async fn many_writers_at_once_all_get_their_turn_even_with_a_one_millisecond_busy_timeout(&db) {
        let store = db
            .store_with(StoreOptions {
                max_connections: 8,
                sqlite_busy_timeout: Duration::from_millis(1),
                ..db.options()
            })
            .await;
        let shop = Fixture::new(&store, "many writers").await;
        let requests: Vec<_> = (0..48)
            .map(|i| tokio::spawn(one_request(store.clone(), shop.merchant.id.clone(), i)))
            .collect();
        for (i, request) in requests.into_iter().enumerate() {
            let outcome = request.await.expect("the request task");
            assert!(outcome.is_ok(), "request {i} failed: {outcome:?}");
        }
        let payments = crate::common::count(
            &store,
            "SELECT COUNT(*) FROM payment_orders WHERE merchant_id = $1",
            &shop.merchant.id,
        )
        .await;
        assert_eq!(payments, 48);
    }
}
