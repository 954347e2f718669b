//! What the database itself enforces: append-only history, immutable outbox
//! events, one live attempt per payment, the scan index, the connection set-up.

use crate::common::*;
use sluice_core::{CaptureMode, EventKind, EvidenceSource};
use sluice_store::{Backend, ScanCursor, StoreError};
use sqlx::Row;

dual_test! {
    async fn history_rows_refuse_raw_update_and_delete(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _) = fx.succeeded(store, "H-1", 100).await;
        let before = store.timeline(&payment.id).await.unwrap();
        assert!(before.len() >= 4);
        for sql in [
            "UPDATE state_history SET to_state = 'FAILED' WHERE payment_id = $1",
            "UPDATE state_history SET reason = 'edited' WHERE payment_id = $1",
            "DELETE FROM state_history WHERE payment_id = $1",
        ] {
            let refused = sqlx::query(sql).bind(&payment.id).execute(store.pool()).await;
            let message = refused.expect_err(sql).to_string();
            assert!(message.contains("append-only"), "{sql}: {message}");
        }
        if db.backend == Backend::Postgres {
            let refused = sqlx::query("TRUNCATE state_history").execute(store.pool()).await;
            assert!(refused.expect_err("truncate").to_string().contains("append-only"));
        }
        assert_eq!(store.timeline(&payment.id).await.unwrap(), before);
    }
}

dual_test! {
    async fn outbox_events_refuse_edits_and_undelivered_deletes_but_delivery_bookkeeping_works(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _) = fx.succeeded(store, "O-1", 100).await;
        let event = store.outbox_for_payment(&payment.id).await.unwrap().remove(0);
        for sql in [
            "UPDATE outbox SET payload = '{}' WHERE event_id = $1",
            "UPDATE outbox SET event_type = 'payment.failed' WHERE event_id = $1",
            "UPDATE outbox SET partition_key = 'x' WHERE event_id = $1",
            "DELETE FROM outbox WHERE event_id = $1",
        ] {
            let refused = sqlx::query(sql).bind(&event.event_id).execute(store.pool()).await;
            let message = refused.expect_err(sql).to_string();
            assert!(message.contains("outbox"), "{sql}: {message}");
        }
        store.outbox_mark_sent(&event.event_id).await.unwrap();
        let sent = store.outbox_for_payment(&payment.id).await.unwrap().remove(0);
        assert_eq!(sent.status, "sent");
        assert_eq!(sent.payload, event.payload);
        // Delivered events may be pruned.
        sqlx::query("DELETE FROM outbox WHERE event_id = $1")
            .bind(&event.event_id)
            .execute(store.pool())
            .await
            .unwrap();
    }
}

dual_test! {
    async fn the_database_refuses_a_second_live_attempt_for_one_payment(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "G-1", 100, CaptureMode::Automatic).await;
        let insert = |id: &'static str, no: i64, state: &'static str| {
            let payment_id = payment.id.clone();
            let account = fx.account.id.clone();
            async move {
                sqlx::query(
                    "INSERT INTO payment_attempts (id, payment_id, attempt_no, reference, adapter, \
                        connector_account_id, amount_minor, currency, capture_mode, state, version, \
                        retry_count, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, 'sandbox', $5, 100, 'EUR', 'automatic', $6, 0, 0, 0, 0)",
                )
                .bind(id)
                .bind(&payment_id)
                .bind(no)
                .bind(format!("raw-{id}"))
                .bind(&account)
                .bind(state)
                .execute(store.pool())
                .await
                .map_err(StoreError::from)
            }
        };
        // The live attempt is SUBMITTED: no other live attempt may exist.
        let second = insert("att_raw_2", 2, "CREATED").await;
        assert!(second.as_ref().is_err_and(|e| e.is_unique_violation()), "{second:?}");
        // A failed attempt next to it is history, not a second charge.
        insert("att_raw_3", 3, "FAILED").await.unwrap();
        // UNKNOWN blocks too.
        store
            .apply_event(&on_attempt(&attempt, event(EventKind::ResultUnknown, EvidenceSource::SyncResponse)))
            .await
            .unwrap();
        let while_unknown = insert("att_raw_4", 4, "CREATED").await;
        assert!(while_unknown.as_ref().is_err_and(|e| e.is_unique_violation()), "{while_unknown:?}");
    }
}

dual_test! {
    async fn migrations_are_idempotent_and_sqlite_runs_in_wal_with_foreign_keys(&db) {
        let store = &db.store;
        store.migrate().await.unwrap();
        store.ping().await.unwrap();
        if db.backend == Backend::Sqlite {
            let mode: String = sqlx::query("PRAGMA journal_mode").fetch_one(store.pool()).await.unwrap().try_get(0).unwrap();
            assert_eq!(mode.to_lowercase(), "wal");
            let fk: i64 = sqlx::query("PRAGMA foreign_keys").fetch_one(store.pool()).await.unwrap().try_get(0).unwrap();
            assert_eq!(fk, 1);
            let busy: i64 = sqlx::query("PRAGMA busy_timeout").fetch_one(store.pool()).await.unwrap().try_get(0).unwrap();
            assert!(busy >= 5_000, "busy timeout {busy}");
        }
        // Foreign keys hold on both backends.
        let orphan = sqlx::query("INSERT INTO api_keys (id, merchant_id, key_hash, key_prefix, created_at) VALUES ('k', 'nobody', 'h', 'p', 0)")
            .execute(store.pool())
            .await
            .map_err(StoreError::from);
        assert!(orphan.is_err_and(|e| e.db_is_fk_violation()));
    }
}

dual_test! {
    /// The recovery scan reads only the pending set, through the partial index.
    async fn the_recovery_scan_uses_the_partial_index_and_returns_due_rows_in_order(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let plan_sql = "SELECT id FROM payment_attempts \
                        WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED') AND next_retry_time <= 1000 \
                        ORDER BY next_retry_time, id LIMIT 10";
        let plan = query_plan(db, plan_sql).await;
        assert!(plan.iter().any(|line| line.contains("payment_attempts_scan")), "{plan:?}");

        let now = db.clock.now_ms();
        let mut due = Vec::new();
        for n in 0..4 {
            let (_, attempt) = fx.submitted(store, &format!("S-{n}"), 100, CaptureMode::Automatic).await;
            store
                .apply_event(&sluice_store::ApplyEvent {
                    next_retry_time: Some(now + 100 * (4 - n)),
                    ..on_attempt(&attempt, event(EventKind::ResultUnknown, EvidenceSource::SyncResponse))
                })
                .await
                .unwrap();
            due.push(attempt);
        }
        // A finished attempt is never due, whatever its old schedule said.
        let (_, done) = fx.succeeded(store, "S-done", 100).await;
        assert_eq!(store.get_attempt(&done.id).await.unwrap().next_retry_time, None);

        let first_page = store.due_attempts(now + 350, 2, None).await.unwrap();
        let ids: Vec<&str> = first_page.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, vec![due[3].id.as_str(), due[2].id.as_str()]);
        let last = first_page.last().unwrap();
        let cursor = ScanCursor { next_retry_time: last.next_retry_time.unwrap(), id: last.id.clone() };
        let second_page = store.due_attempts(now + 350, 10, Some(&cursor)).await.unwrap();
        let ids: Vec<&str> = second_page.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, vec![due[1].id.as_str()], "the attempt due at now+400 is not yet due");

        store.reschedule_after(sluice_store::PendingKind::Attempt, &due[3].id, 10_000).await.unwrap();
        let rescheduled = store.get_attempt(&due[3].id).await.unwrap();
        assert_eq!(
            (rescheduled.next_retry_time, rescheduled.retry_count, rescheduled.last_psp_call_at),
            (Some(now + 10_000), 1, Some(now))
        );
        db.clock.advance(7);
        store.note_psp_call(sluice_store::PendingKind::Attempt, &due[2].id).await.unwrap();
        assert_eq!(store.get_attempt(&due[2].id).await.unwrap().last_psp_call_at, Some(now + 7));
        let refused = store.reschedule_after(sluice_store::PendingKind::Attempt, &done.id, 0).await;
        assert!(matches!(refused, Err(StoreError::NotFound { .. })));
    }
}

dual_test! {
    /// Every rule of an order's, an attempt's and an inbox row's CHECKs, one
    /// raw write breaking it at a time (on PostgreSQL each table's rules are
    /// one function since migration 0023; SQLite keeps the CHECKs): each is a
    /// check violation that writes nothing, and the legal edges pass.
    async fn the_database_refuses_a_row_breaking_any_of_its_checks_and_writes_nothing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.succeeded(store, "CK-2", 100).await;
        let account = fx.account.id.as_str();
        let accepted = store
            .accept_webhook(sluice_store::AcceptedWebhook {
                connector_account_id: account,
                payload_digest: "d1",
                body: b"{}",
                events: vec![sluice_store::NewInboxEvent {
                    adapter: "stripe".into(),
                    connector_account_id: account.to_owned(),
                    provider_event_id: "evt_ck".into(),
                    payload_digest: "d1".into(),
                    event: serde_json::json!({"kind": "payment_succeeded"}),
                    raw_body_id: None,
                }],
            })
            .await
            .unwrap();
        let sluice_store::InboxInsert::Inserted { id: inbox_id } = &accepted.1[0] else {
            panic!("a new inbox row: {accepted:?}");
        };
        let refused = [
            ("UPDATE payment_orders SET amount_minor = 0 WHERE id = $1", &payment.id),
            ("UPDATE payment_orders SET currency = 'EURO' WHERE id = $1", &payment.id),
            ("UPDATE payment_orders SET capture_mode = 'later' WHERE id = $1", &payment.id),
            ("UPDATE payment_orders SET state = 'PAID' WHERE id = $1", &payment.id),
            ("UPDATE payment_orders SET manual_review = 2 WHERE id = $1", &payment.id),
            ("UPDATE payment_orders SET compensation_reason = 'felt like it' WHERE id = $1", &payment.id),
            ("UPDATE payment_attempts SET amount_minor = -1 WHERE id = $1", &attempt.id),
            ("UPDATE payment_attempts SET capture_mode = 'later' WHERE id = $1", &attempt.id),
            ("UPDATE payment_attempts SET state = 'PAID' WHERE id = $1", &attempt.id),
            ("UPDATE payment_attempts SET attempt_no = 0 WHERE id = $1", &attempt.id),
            ("UPDATE webhook_inbox SET status = 'lost' WHERE id = $1", inbox_id),
            ("UPDATE webhook_inbox SET verification = 'trusted' WHERE id = $1", inbox_id),
            ("UPDATE webhook_inbox SET provider_event_id = NULL WHERE id = $1", inbox_id),
            ("UPDATE webhook_inbox SET verification = 'rejected' WHERE id = $1", inbox_id),
            (
                "UPDATE webhook_inbox SET verification = 'rejected', provider_event_id = NULL WHERE id = $1",
                inbox_id,
            ),
        ];
        for (sql, id) in refused {
            let result = sqlx::query(sql).bind(id).execute(store.pool()).await;
            let err = StoreError::from(result.expect_err(sql));
            assert!(err.is_check_violation(), "{sql}: {err}");
        }
        let order = store.get_payment(None, &payment.id).await.unwrap();
        assert_eq!((order.state.as_str(), order.amount.amount_minor), ("SUCCEEDED", 100));
        assert_eq!(store.inbox_get(inbox_id).await.unwrap().status, "pending");
        for (sql, id) in [
            ("UPDATE payment_orders SET compensation_reason = 'fulfilled_elsewhere', manual_review = 1 WHERE id = $1", &payment.id),
            ("UPDATE payment_orders SET compensation_reason = NULL, manual_review = 0 WHERE id = $1", &payment.id),
            (
                "UPDATE webhook_inbox SET verification = 'rejected', provider_event_id = NULL, status = 'quarantined' WHERE id = $1",
                inbox_id,
            ),
        ] {
            sqlx::query(sql).bind(id).execute(store.pool()).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }
}

dual_test! {
    /// The door finds an event's rows by PSP reference at one adapter through the index on
    /// `psp_reference` (migration 0025 dropped the one on `(adapter, psp_reference)` of
    /// attempts): on PostgreSQL on the generic plan its prepared statements run, made before
    /// the table had a row; refunds keep their unique one. An aggregate's history is read
    /// through its payment's index.
    async fn the_doors_lookups_by_psp_reference_and_an_aggregates_history_go_through_an_index(&db) {
        let store = &db.store;
        let (_, attempt) = Fixture::new(store, "Acme").await.succeeded(store, "IDX-1", 100).await;
        let lookups = sluice_store::psp_reference_lookups();
        assert_eq!(lookups.len(), 2, "attempts and refunds");
        for (table, sql) in lookups {
            // Either of refunds' two indexes leads with `psp_reference` or finds it at one adapter.
            let indexes: &[&str] = match table {
                "payment_attempts" => &["payment_attempts_by_psp_reference"],
                _ => &["refunds_psp_reference", "refunds_by_psp_reference"],
            };
            let plan = match db.backend {
                Backend::Sqlite => sluice_test_support::plans::sqlite_query_plan(store.pool(), &sql).await,
                Backend::Postgres => {
                    let args = "'pi_IDX-1', 'sandbox'";
                    let mut prepared = sluice_test_support::plans::GenericPlan::prepare(
                        store.pool(), &sql, "text, text", args).await;
                    prepared.plan().await
                }
            };
            assert!(
                plan.iter().any(|line| indexes.iter().any(|index| line.contains(index))),
                "{sql}: {plan:?}"
            );
        }
        let history = format!(
            "SELECT id FROM state_history WHERE payment_id = '{}' AND aggregate_type = 'attempt' \
             AND aggregate_id = '{}' ORDER BY id",
            attempt.payment_id, attempt.id
        );
        let plan = query_plan(db, &history).await;
        assert!(plan.iter().any(|line| line.contains("state_history_by_payment")), "{plan:?}");
        let entries = store.aggregate_history(&attempt.payment_id, "attempt", &attempt.id).await.unwrap();
        assert!(!entries.is_empty() && entries.iter().all(|e| e.aggregate_id == attempt.id), "{entries:?}");
    }
}
