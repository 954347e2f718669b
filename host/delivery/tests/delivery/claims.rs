//! What a claim of due deliveries reads, however long the queue grew.

use crate::common::*;

/// `{from}`..=`{to}` events, handed over already, each of its own payment, and one
/// JetStream delivery of each, due in that order from `{now}` − 100 s on.
const BACKLOG: [&str; 2] = [
    "WITH RECURSIVE g(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM g WHERE n < {to}) \
     INSERT INTO outbox (event_id, event_type, partition_key, merchant_id, aggregate_type, \
        aggregate_id, payment_version, payload, status, next_attempt_at, created_at) \
     SELECT 'evt_backlog_' || n, 'payment.succeeded', 'pay_backlog_' || n, 'mer_backlog', \
        'order', 'pay_backlog_' || n, 1, '{}', 'sent', {now}, {now} FROM g",
    "WITH RECURSIVE g(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM g WHERE n < {to}) \
     INSERT INTO event_deliveries (id, event_id, event_seq, event_created_at, partition_key, \
        payment_version, merchant_id, sink, target, status, next_attempt_at, created_at) \
     SELECT 'dlv_backlog_' || n, 'evt_backlog_' || n, n, {now}, 'pay_backlog_' || n, 1, \
        'mer_backlog', 'nats', 'stream_backlog', 'pending', {now} - 100000 + n, {now} FROM g",
];

/// `{from}`..=`{to}` events of other payments not fanned out yet.
const NOT_FANNED_OUT: &str =
    "WITH RECURSIVE g(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM g WHERE n < {to}) \
     INSERT INTO outbox (event_id, event_type, partition_key, merchant_id, aggregate_type, \
        aggregate_id, payment_version, payload, next_attempt_at, created_at) \
     SELECT 'evt_waiting_' || n, 'payment.succeeded', 'pay_waiting_' || n, 'mer_backlog', \
        'order', 'pay_waiting_' || n, 1, '{}', {now}, {now} FROM g";

async fn write_backlog(db: &TestDb, from: u64, to: u64) {
    write(db, &BACKLOG, from, to).await;
}

async fn write(db: &TestDb, templates: &[&str], from: u64, to: u64) {
    let now = db.clock.now_ms();
    for template in templates {
        sluice_test_support::plans::write_rows(db.store.pool(), template, now, from, to).await;
    }
}

dual_test! {
    /// A claim of deliveries reads the deliveries it claims and about as many more, however
    /// long the queue grew after the claim's plan was made (PostgreSQL: the generic plan of
    /// a prepared statement, made while the queue was nearly empty; see the store's
    /// `a_queue_claim_reads_the_rows_it_claims_not_the_backlog_behind_them`). SQLite has
    /// no such plans; there the update must look its rows up by key.
    async fn a_delivery_claim_reads_the_deliveries_it_claims_not_the_backlog_behind_them(&db) {
        let sql = sluice_delivery::deliveries::claim_sql(db.backend);
        write_backlog(db, 1, 5).await;
        if db.backend == sluice_store::Backend::Sqlite {
            let plan = sluice_test_support::plans::sqlite_query_plan(db.store.pool(), &sql).await;
            assert!(
                plan.iter().any(|line| line.starts_with("SEARCH event_deliveries USING")),
                "the claimed deliveries are looked up by key: {plan:?}"
            );
            return;
        }
        let now = db.clock.now_ms();
        let args = format!("{now}, {}, 50, 'nats', 5, 'token', ''", now + 30_000);
        let types = "bigint, bigint, bigint, text, bigint, text, text";
        let mut claim =
            sluice_test_support::plans::GenericPlan::prepare(db.store.pool(), &sql, types, &args).await;
        write_backlog(db, 6, 3_000).await;
        write(db, &[NOT_FANNED_OUT], 1, 3_000).await;
        let read = claim.rows_read("event_deliveries").await;
        assert!(read <= 150, "a claim of 50 read {read} deliveries of a backlog of 3,000");
        // Events of other payments waiting to be fanned out cost a claim nothing either.
        let before = claim.buffers().await;
        write(db, &[NOT_FANNED_OUT], 3_001, 12_000).await;
        let after = claim.buffers().await;
        assert!(
            after < before + before / 4,
            "9,000 more events of other payments took a claim from {before} to {after} buffers"
        );
    }
}
