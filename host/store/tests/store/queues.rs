//! The inbox, the outbox and merchant idempotency keys as work queues.

use crate::common::*;
use sluice_store::{IdempotencyBegin, InboxInsert, NewInboxEvent, StoreError};

fn inbox_event(account: &str, id: &str) -> NewInboxEvent {
    NewInboxEvent {
        adapter: "sandbox".into(),
        connector_account_id: account.to_owned(),
        provider_event_id: id.to_owned(),
        payload_digest: format!("sha256:{id}"),
        event: serde_json::json!({"kind": "PAYMENT_SUCCEEDED"}),
        raw_body_id: None,
    }
}

dual_test! {
    async fn inbox_entries_are_claimed_once_retried_when_failed_and_quarantined_when_poisonous(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let mut ids = Vec::new();
        for n in 0..3 {
            let InboxInsert::Inserted { id } = store.inbox_insert(&inbox_event(&fx.account.id, &format!("evt_{n}"))).await.unwrap() else {
                panic!("fresh event must be inserted");
            };
            ids.push(id);
        }
        let dup = store.inbox_insert(&inbox_event(&fx.account.id, "evt_0")).await.unwrap();
        assert_eq!(dup, InboxInsert::Duplicate { id: ids[0].clone(), status: "pending".into() });
        // The same provider event id on another connector account is another event.
        let other = store.inbox_insert(&NewInboxEvent { connector_account_id: "ca_other".into(), ..inbox_event(&fx.account.id, "evt_0") }).await.unwrap();
        assert!(matches!(other, InboxInsert::Inserted { .. }));

        let claimed = store.inbox_claim(3, 30_000).await.unwrap();
        assert_eq!(claimed.len(), 3);
        assert!(claimed.iter().all(|e| e.status == "processing" && e.attempts == 1));
        assert_eq!(store.inbox_claim(10, 30_000).await.unwrap().len(), 1, "claimed rows are not handed out twice");

        store.inbox_mark_processed(&ids[0]).await.unwrap();
        store.inbox_mark_failed(&ids[1], "adapter trapped", db.clock.now_ms() + 1_000).await.unwrap();
        store.inbox_quarantine(&ids[2], "event names no known attempt").await.unwrap();
        assert!(store.inbox_claim(10, 30_000).await.unwrap().is_empty());
        db.clock.advance(1_000);
        let retried = store.inbox_claim(10, 30_000).await.unwrap();
        assert_eq!(retried.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), vec![ids[1].as_str()]);
        assert_eq!(retried[0].attempts, 2);
        assert_eq!(retried[0].last_error.as_deref(), Some("adapter trapped"));

        // A claimer that died: its lease runs out and the row comes back.
        db.clock.advance(31_000);
        let reclaimed = store.inbox_claim(10, 30_000).await.unwrap();
        assert_eq!(reclaimed.len(), 2);

        let quarantined = store.inbox_list_quarantined(10).await.unwrap();
        assert_eq!(quarantined.len(), 1);
        assert_eq!(quarantined[0].quarantine_reason.as_deref(), Some("event names no known attempt"));
        let settled = store.inbox_mark_processed(&ids[0]).await;
        assert!(matches!(settled, Err(StoreError::InvalidState { .. })), "{settled:?}");
    }
}

dual_test! {
    async fn rejected_webhooks_are_kept_as_evidence_without_taking_a_provider_event_id(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let rejected = store.inbox_record_rejected("sandbox", &fx.account.id, "sha256:forged", "bad signature").await.unwrap();
        let entry = store.inbox_get(&rejected).await.unwrap();
        assert_eq!((entry.verification.as_str(), entry.status.as_str()), ("rejected", "quarantined"));
        assert_eq!(entry.provider_event_id, None);
        assert!(store.inbox_claim(10, 1_000).await.unwrap().is_empty());
        let genuine = store.inbox_insert(&inbox_event(&fx.account.id, "evt_forged_id")).await.unwrap();
        assert!(matches!(genuine, InboxInsert::Inserted { .. }));
    }
}

dual_test! {
    async fn outbox_events_are_claimed_in_order_retried_and_declared_dead_after_their_budget(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (first, _) = fx.succeeded(store, "OB-1", 100).await;
        let (second, _) = fx.succeeded(store, "OB-2", 100).await;
        let claimed = store.outbox_claim(10, 30_000).await.unwrap();
        assert_eq!(claimed.iter().map(|m| m.partition_key.as_str()).collect::<Vec<_>>(), vec![first.id.as_str(), second.id.as_str()]);
        assert!(store.outbox_claim(10, 30_000).await.unwrap().is_empty(), "leased events are not handed out twice");

        store.outbox_mark_sent(&claimed[0].event_id).await.unwrap();
        let status = store.outbox_retry(&claimed[1].event_id, "HTTP 503", db.clock.now_ms() + 500, 2).await.unwrap();
        assert_eq!(status, "pending");
        db.clock.advance(500);
        let again = store.outbox_claim(10, 30_000).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].event_id.as_str(), again[0].attempts), (claimed[1].event_id.as_str(), 2));
        let status = store.outbox_retry(&again[0].event_id, "HTTP 503", db.clock.now_ms(), 2).await.unwrap();
        assert_eq!(status, "dead");
        assert_eq!(store.outbox_list_dead(10).await.unwrap().len(), 1);
        assert!(store.outbox_claim(10, 30_000).await.unwrap().is_empty());
        assert!(store.outbox_mark_sent(&claimed[0].event_id).await.is_err(), "sent is final");
    }
}

dual_test! {
    async fn idempotency_keys_replay_completed_responses_and_refuse_a_different_request(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let m = &fx.merchant.id;
        let begin = |key: &'static str, fp: &'static str| store.idempotency_begin(m, "POST /v1/payments", key, fp, 30_000);
        assert_eq!(begin("k1", "fp-a").await.unwrap(), IdempotencyBegin::Started);
        assert_eq!(begin("k1", "fp-a").await.unwrap(), IdempotencyBegin::InProgress);
        assert_eq!(begin("k1", "fp-b").await.unwrap(), IdempotencyBegin::FingerprintMismatch);
        store.idempotency_complete(m, "POST /v1/payments", "k1", 201, "{\"id\":\"pay_1\"}").await.unwrap();
        assert_eq!(
            begin("k1", "fp-a").await.unwrap(),
            IdempotencyBegin::Completed { status: 201, body: "{\"id\":\"pay_1\"}".into() }
        );
        // The same key on another endpoint is another key.
        assert_eq!(store.idempotency_begin(m, "POST /v1/refunds", "k1", "fp-a", 30_000).await.unwrap(), IdempotencyBegin::Started);

        // A crashed request's lease expires and a retry takes the key over.
        assert_eq!(begin("k2", "fp-c").await.unwrap(), IdempotencyBegin::Started);
        db.clock.advance(30_001);
        assert_eq!(begin("k2", "fp-c").await.unwrap(), IdempotencyBegin::Started);
        store.idempotency_release(m, "POST /v1/payments", "k2").await.unwrap();
        assert!(store.idempotency_lookup(m, "POST /v1/payments", "k2").await.unwrap().is_none());

        let record = store.idempotency_lookup(m, "POST /v1/payments", "k1").await.unwrap().unwrap();
        assert_eq!((record.state.as_str(), record.response_status), ("completed", Some(201)));
        assert_eq!(store.idempotency_prune(db.clock.now_ms() + 1).await.unwrap(), 1, "only completed keys are pruned");
        assert!(store.idempotency_lookup(m, "POST /v1/payments", "k1").await.unwrap().is_none());
        assert!(store.idempotency_lookup(m, "POST /v1/refunds", "k1").await.unwrap().is_some());
    }
}

/// On PostgreSQL the idempotency key's writes commit without waiting for the WAL flush
/// (`synchronous_commit` off for their own transaction). That setting must end with the
/// statement: a pooled connection that kept it would commit the next request's money
/// writes lazily too. One connection, so every statement runs where the check looks.
#[tokio::test]
async fn on_postgres_an_idempotency_keys_lazy_commit_never_outlives_its_own_statement() {
    let base = sluice_store::StoreOptions {
        max_connections: 1,
        ..sluice_store::StoreOptions::default()
    };
    let db: TestDb =
        sluice_test_support::TestDb::open_with(sluice_store::Backend::Postgres, base).await;
    let store = &db.store;
    let fx = Fixture::new(store, "Acme").await;
    let m = &fx.merchant.id;
    let setting = || async {
        sqlx::query_scalar::<_, String>("SELECT current_setting('synchronous_commit')")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    let begin =
        |key: &'static str| store.idempotency_begin(m, "POST /v1/payments", key, "fp", 30_000);
    assert_eq!(setting().await, "on");
    assert_eq!(begin("k1").await.unwrap(), IdempotencyBegin::Started);
    assert_eq!(setting().await, "on", "after the key is taken");
    store
        .idempotency_complete(m, "POST /v1/payments", "k1", 201, "{}")
        .await
        .unwrap();
    assert_eq!(setting().await, "on", "after the response is stored");
    assert_eq!(begin("k2").await.unwrap(), IdempotencyBegin::Started);
    db.clock.advance(30_001);
    assert_eq!(
        begin("k2").await.unwrap(),
        IdempotencyBegin::Started,
        "the lease is taken over"
    );
    assert_eq!(setting().await, "on", "after a lease is taken over");
    store
        .idempotency_release(m, "POST /v1/payments", "k2")
        .await
        .unwrap();
    assert_eq!(setting().await, "on", "after a key is released");
    let record = store
        .idempotency_lookup(m, "POST /v1/payments", "k1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (record.state.as_str(), record.response_status),
        ("completed", Some(201)),
        "the writes themselves happened"
    );
}

dual_test! {
    /// A claim picks the oldest due rows through `webhook_inbox_work`, never by reading and
    /// sorting every row not yet processed: after a PSP's outage the backlog is tens of
    /// thousands of rows, and every claim of the processor would pay for all of them.
    async fn an_inbox_claim_reads_through_the_work_index_whatever_the_backlog(&db) {
        let sql = format!(
            "SELECT id FROM webhook_inbox WHERE {} ORDER BY next_attempt_at, id LIMIT 50",
            sluice_store::inbox::CLAIMABLE.replace("$1", "0")
        );
        let plan = query_plan(db, &sql).await;
        assert!(
            plan.iter().any(|line| line.contains("webhook_inbox_work")),
            "{sql}: {plan:?}"
        );
        assert!(
            !plan.iter().any(|line| line.contains("TEMP B-TREE") || line.contains("Sort")),
            "the index gives the order; nothing is sorted: {plan:?}"
        );
    }
}

/// Rows of a queue, written straight into its table: `{from}`..=`{to}`, due in that order
/// from `{now}` − 100 s on.
const INBOX_BACKLOG: &str =
    "WITH RECURSIVE g(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM g WHERE n < {to}) \
    INSERT INTO webhook_inbox (id, adapter, connector_account_id, \
    provider_event_id, payload_digest, verification, event_json, status, next_attempt_at, \
    received_at) \
    SELECT 'inb_backlog_' || n, 'sandbox', 'ca_backlog', 'evt_backlog_' || n, 'sha256:' || n, \
        'verified', '{}', 'pending', {now} - 100000 + n, {now} FROM g";
const OUTBOX_BACKLOG: &str =
    "WITH RECURSIVE g(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM g WHERE n < {to}) \
    INSERT INTO outbox (event_id, event_type, partition_key, \
    merchant_id, aggregate_type, aggregate_id, payment_version, payload, next_attempt_at, \
    created_at) \
    SELECT 'evt_backlog_' || n, 'payment.succeeded', 'pay_backlog_' || n, 'mer_backlog', \
        'order', 'pay_backlog_' || n, 1, '{}', {now} - 100000 + n, {now} FROM g";

async fn write_backlog(db: &TestDb, template: &str, from: u64, to: u64) {
    let now = db.clock.now_ms();
    sluice_test_support::plans::write_rows(db.store.pool(), template, now, from, to).await;
}

dual_test! {
    /// A claim of the inbox or the outbox reads the rows it claims and about as many more,
    /// however long the queue grew after the claim's plan was made. On PostgreSQL the claim
    /// is a prepared statement on a pooled connection: its generic plan, made while the queue
    /// was nearly empty, is what every later claim runs. A plan joining the picked rows
    /// against a walk of the queue's index read the whole backlog on every claim (64 ms a
    /// claim on average, up to 482 ms, during the bench's webhook ingest), so a backlog
    /// after a PSP's outage drained in time growing with its square. SQLite has no such
    /// plans; there the update must look its rows up by key.
    async fn a_queue_claim_reads_the_rows_it_claims_not_the_backlog_behind_them(&db) {
        use sluice_store::{inbox, outbox};
        let queues = [
            (inbox::claim_sql(db.backend), "webhook_inbox", INBOX_BACKLOG),
            (outbox::claim_sql(db.backend), "outbox", OUTBOX_BACKLOG),
        ];
        for (sql, table, backlog) in queues {
            write_backlog(db, backlog, 1, 5).await;
            if db.backend == sluice_store::Backend::Sqlite {
                let plan = query_plan(db, &sql).await;
                assert!(
                    plan.iter().any(|line| line.starts_with(&format!("SEARCH {table} USING"))),
                    "{table}: the claimed rows are looked up by key: {plan:?}"
                );
                write_backlog(db, backlog, 6, 3_000).await;
                continue;
            }
            let now = db.clock.now_ms();
            let args = format!("{now}, {}, 50", now + 30_000);
            let mut claim = sluice_test_support::plans::GenericPlan::prepare(
                db.store.pool(), &sql, "bigint, bigint, bigint", &args).await;
            write_backlog(db, backlog, 6, 3_000).await;
            let read = claim.rows_read(table).await;
            assert!(read <= 150, "{table}: a claim of 50 read {read} rows of a backlog of 3,000");
        }
        // The claims themselves: the 50 oldest due rows, each once.
        let claimed = db.store.inbox_claim(50, 30_000).await.unwrap();
        let expected: Vec<String> = (1..=50).map(|n| format!("inb_backlog_{n}")).collect();
        assert_eq!(claimed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), expected);
        let next = db.store.inbox_claim(50, 30_000).await.unwrap();
        assert_eq!(next.first().map(|e| e.id.as_str()), Some("inb_backlog_51"));
        let events = db.store.outbox_claim(50, 30_000).await.unwrap();
        assert_eq!(events.len(), 50);
        assert_eq!(events.last().map(|m| m.event_id.as_str()), Some("evt_backlog_50"));
    }
}
