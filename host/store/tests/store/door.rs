//! The one door: seed 001 §12 scenarios A, B and D, CAS races, illegal
//! transitions, contradicting evidence, captures and new attempts.

use crate::common::*;
use sluice_core::{
    AttemptState, CaptureMode, CaptureState, EventKind, EvidenceSource, OrderCommand, OrderState,
};
use sluice_store::{
    ApplyEvent, CaptureRequest, DecisionKind, EventTarget, InboxInsert, NewInboxEvent, StoreError,
};

fn count_history(
    history: &[sluice_store::HistoryEntry],
    aggregate_id: &str,
    decision: &str,
    to: &str,
) -> usize {
    history
        .iter()
        .filter(|h| h.aggregate_id == aggregate_id && h.decision == decision && h.to_state == to)
        .count()
}

dual_test! {
    /// Seed 001 §12 A: timeout → query succeeded → delayed processing webhook.
    async fn timeout_then_query_success_then_late_processing_webhook_ends_succeeded_and_records_the_webhook_as_stale(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "A-1", 100, CaptureMode::Automatic).await;

        let timeout = store
            .apply_event(&on_attempt(&attempt, event(EventKind::ResultUnknown, EvidenceSource::SyncResponse)))
            .await
            .unwrap();
        assert_eq!(timeout.decision, DecisionKind::Applied);
        assert_eq!(timeout.to_state, "UNKNOWN");
        assert_eq!(timeout.order_state, OrderState::Processing, "UNKNOWN stays on the attempt");
        let unknown = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(
            unknown.next_retry_time,
            Some(db.clock.now_ms() + 5_000),
            "an unknown outcome is scheduled for a query"
        );

        let mut query = event(EventKind::PaymentSucceeded, EvidenceSource::Query);
        query.psp_reference = Some("pi_A1".into());
        let success = store.apply_event(&on_attempt(&attempt, query)).await.unwrap();
        assert_eq!(success.decision, DecisionKind::Applied);
        assert_eq!((success.from_state.as_str(), success.to_state.as_str()), ("UNKNOWN", "SUCCEEDED"));
        assert_eq!(success.order_state, OrderState::Succeeded);
        assert_eq!(success.outbox_event_ids.len(), 1);

        let mut late = event(EventKind::PaymentProcessing, EvidenceSource::Webhook);
        late.provider_event_id = Some("evt_late".into());
        late.psp_reference = Some("pi_A1".into());
        let stale = store.apply_event(&on_attempt(&attempt, late)).await.unwrap();
        assert_eq!(stale.decision, DecisionKind::IgnoredStale);
        assert_eq!(stale.to_state, "SUCCEEDED");
        assert!(stale.outbox_event_ids.is_empty());

        let attempt_now = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(attempt_now.state, AttemptState::Succeeded);
        assert_eq!(attempt_now.psp_reference.as_deref(), Some("pi_A1"));
        assert_eq!(attempt_now.next_retry_time, None, "terminal rows leave the scan set");
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.authorized_minor, amounts.captured_minor), (100, 100));

        let history = store.aggregate_history(&attempt.payment_id, "attempt", &attempt.id).await.unwrap();
        let path: Vec<(&str, &str)> = history
            .iter()
            .map(|h| (h.to_state.as_str(), h.decision.as_str()))
            .collect();
        assert_eq!(
            path,
            vec![
                ("CREATED", "applied"),
                ("SUBMITTED", "applied"),
                ("UNKNOWN", "applied"),
                ("SUCCEEDED", "applied"),
                ("SUCCEEDED", "ignored_stale"),
            ]
        );
        let last = history.last().unwrap();
        assert_eq!(last.event_kind, "PAYMENT_PROCESSING");
        assert_eq!(last.provider_event_id.as_deref(), Some("evt_late"));
        assert_eq!(last.adapter_name.as_deref(), Some("sandbox"));
        assert_eq!(last.adapter_digest.as_deref(), Some("sha256:abc"));
        assert_eq!(last.trace_id.as_deref(), Some("trace-webhook"));
        assert!(!last.reason.is_empty());
    }
}

dual_test! {
    /// Seed 001 §12 B: processing → succeeded → the same success again, under
    /// the same and under a different provider event id.
    async fn duplicate_success_webhooks_yield_one_succeeded_history_row_and_one_outbox_event(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "B-1", 100, CaptureMode::Automatic).await;
        let webhook = |kind, id: &str| {
            let mut ev = event(kind, EvidenceSource::Webhook);
            ev.provider_event_id = Some(id.to_owned());
            ev.psp_reference = Some("pi_B1".into());
            ev.attempt_reference = Some(attempt.reference.clone());
            ev
        };
        let deliver = |ev: sluice_core::PaymentEvent| {
            let fx_account = fx.account.id.clone();
            async move {
                let inserted = store
                    .inbox_insert(&NewInboxEvent {
                        adapter: "sandbox".into(),
                        connector_account_id: fx_account,
                        provider_event_id: ev.provider_event_id.clone().unwrap(),
                        payload_digest: format!("sha256:{}", ev.provider_event_id.clone().unwrap()),
                        event: serde_json::to_value(&ev).unwrap(),
                        raw_body_id: None,
                    })
                    .await
                    .unwrap();
                (inserted, ev)
            }
        };
        let process = |inbox_id: String, ev: sluice_core::PaymentEvent| ApplyEvent {
            target: EventTarget::FromEvent { scope: fx.scope() },
            event: ev,
            provenance: adapter_provenance(),
            inbox_id: Some(inbox_id),
            next_retry_time: None,
        };

        let (InboxInsert::Inserted { id: first }, ev) = deliver(webhook(EventKind::PaymentProcessing, "evt_1")).await else {
            panic!("first delivery must be inserted");
        };
        let processing = store.apply_event(&process(first.clone(), ev)).await.unwrap();
        assert_eq!(processing.to_state, "PROCESSING");

        let (InboxInsert::Inserted { id: second }, success_ev) = deliver(webhook(EventKind::PaymentSucceeded, "evt_2")).await else {
            panic!("second delivery must be inserted");
        };
        let success = store.apply_event(&process(second.clone(), success_ev.clone())).await.unwrap();
        assert_eq!(success.decision, DecisionKind::Applied);
        assert_eq!(success.to_state, "SUCCEEDED");

        // Same provider event id again: stopped at the inbox's unique key.
        let (again, _) = deliver(webhook(EventKind::PaymentSucceeded, "evt_2")).await;
        assert_eq!(again, InboxInsert::Duplicate { id: second.clone(), status: "processed".into() });
        // A processor replaying the processed row: transport-level duplicate.
        let replay = store.apply_event(&process(second.clone(), success_ev)).await.unwrap();
        assert_eq!(replay.decision, DecisionKind::IgnoredDuplicate);
        assert!(replay.reason.contains("already processed"), "{}", replay.reason);

        // Same fact under a new provider event id: business-level duplicate.
        let (InboxInsert::Inserted { id: third }, ev) = deliver(webhook(EventKind::PaymentSucceeded, "evt_3")).await else {
            panic!("a new provider event id is a new inbox row");
        };
        let dup = store.apply_event(&process(third.clone(), ev)).await.unwrap();
        assert_eq!(dup.decision, DecisionKind::IgnoredDuplicate);
        assert!(dup.outbox_event_ids.is_empty());

        let history = store.timeline(&payment.id).await.unwrap();
        assert_eq!(count_history(&history, &attempt.id, "applied", "SUCCEEDED"), 1);
        assert_eq!(count_history(&history, &attempt.id, "ignored_duplicate", "SUCCEEDED"), 2);
        let outbox = store.outbox_for_payment(&payment.id).await.unwrap();
        let successes: Vec<_> = outbox.iter().filter(|m| m.event_type == "payment.succeeded").collect();
        assert_eq!(successes.len(), 1, "exactly one success event is published");
        assert_eq!(successes[0].partition_key, payment.id);
        assert_eq!(successes[0].payload["aggregate"]["psp_reference"], "pi_B1");
        assert_eq!(successes[0].payload["order_state"], "SUCCEEDED");
        for id in [first, second, third] {
            assert_eq!(store.inbox_get(&id).await.unwrap().status, "processed");
        }
    }
}

/// Make every outbox insert fail, on either backend.
async fn break_outbox(db: &TestDb) {
    let sql = match db.backend {
        sluice_store::Backend::Sqlite => {
            "CREATE TRIGGER test_break_outbox BEFORE INSERT ON outbox \
             BEGIN SELECT RAISE(ABORT, 'injected outbox failure'); END;"
        }
        sluice_store::Backend::Postgres => {
            "CREATE FUNCTION test_break_outbox() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'injected outbox failure'; END $$; \
             CREATE TRIGGER test_break_outbox BEFORE INSERT ON outbox \
             FOR EACH ROW EXECUTE FUNCTION test_break_outbox();"
        }
    };
    sqlx::raw_sql(sql).execute(db.store.pool()).await.unwrap();
}

async fn repair_outbox(db: &TestDb) {
    let sql = match db.backend {
        sluice_store::Backend::Sqlite => "DROP TRIGGER test_break_outbox",
        sluice_store::Backend::Postgres => "DROP TRIGGER test_break_outbox ON outbox",
    };
    sqlx::raw_sql(sql).execute(db.store.pool()).await.unwrap();
}

dual_test! {
    /// Seed 001 §12 D: the outbox row commits with the state change or not at all.
    async fn a_failure_after_the_cas_rolls_back_state_history_amounts_and_outbox_together(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "D-1", 100, CaptureMode::Automatic).await;
        let before = store.get_attempt(&attempt.id).await.unwrap();
        let history_before = store.timeline(&payment.id).await.unwrap().len();

        break_outbox(db).await;
        let success = || on_attempt(&attempt, event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse));
        let failed = store.apply_event(&success()).await;
        assert!(
            matches!(&failed, Err(StoreError::Database(e)) if e.to_string().contains("injected outbox failure")),
            "{failed:?}"
        );
        let after = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!((after.state, after.version), (before.state, before.version), "CAS rolled back");
        assert_eq!(store.get_payment(None, &payment.id).await.unwrap().state, OrderState::Processing);
        assert_eq!(store.payment_amounts(&payment.id).await.unwrap().captured_minor, 0);
        assert_eq!(store.timeline(&payment.id).await.unwrap().len(), history_before);
        assert!(store.outbox_for_payment(&payment.id).await.unwrap().is_empty());

        repair_outbox(db).await;
        let applied = store.apply_event(&success()).await.unwrap();
        assert_eq!(applied.to_state, "SUCCEEDED");
        let outbox = store.outbox_for_payment(&payment.id).await.unwrap();
        assert_eq!(outbox.len(), 1);
        assert_eq!(outbox[0].event_id, applied.outbox_event_ids[0]);
        assert_eq!(outbox[0].payment_version, applied.payment_version);
        assert_eq!(store.payment_amounts(&payment.id).await.unwrap().captured_minor, 100);
    }
}

dual_test! {
    /// Two connections race different events on one UNKNOWN attempt.
    async fn racing_success_and_failure_on_one_attempt_end_in_one_legal_state_with_both_decisions_recorded(&db) {
        let store = &db.store;
        let other = db.second_store().await;
        let fx = Fixture::new(store, "Acme").await;
        for round in 0..5 {
            let (payment, attempt) = fx.submitted(store, &format!("R-{round}"), 100, CaptureMode::Automatic).await;
            store
                .apply_event(&on_attempt(&attempt, event(EventKind::ResultUnknown, EvidenceSource::SyncResponse)))
                .await
                .unwrap();
            let mut ok = event(EventKind::PaymentSucceeded, EvidenceSource::Query);
            ok.psp_reference = Some(format!("pi_R{round}"));
            let mut ko = declined(EvidenceSource::Webhook);
            ko.psp_reference = Some(format!("pi_R{round}"));
            ko.provider_event_id = Some(format!("evt_ko_{round}"));
            let (ok, ko) = (on_attempt(&attempt, ok), on_attempt(&attempt, ko));
            let (a, b) = tokio::join!(store.apply_event(&ok), other.apply_event(&ko));
            let (a, b) = (a.unwrap(), b.unwrap());
            let kinds = [a.decision, b.decision];
            assert!(kinds.contains(&DecisionKind::Applied), "{kinds:?}");
            assert!(kinds.contains(&DecisionKind::NeedsReconciliation), "{kinds:?}");
            let final_attempt = store.get_attempt(&attempt.id).await.unwrap();
            assert!(
                matches!(final_attempt.state, AttemptState::Succeeded | AttemptState::Failed),
                "{:?}", final_attempt.state
            );
            let history = store.aggregate_history(&attempt.payment_id, "attempt", &attempt.id).await.unwrap();
            let tail: Vec<&str> = history.iter().rev().take(2).map(|h| h.decision.as_str()).collect();
            assert!(tail.contains(&"applied") && tail.contains(&"needs_reconciliation"), "{tail:?}");
            let order = store.get_payment(None, &payment.id).await.unwrap();
            assert!(order.manual_review, "contradicting evidence stops automation");
            let amounts = store.payment_amounts(&payment.id).await.unwrap();
            let expected = if final_attempt.state == AttemptState::Succeeded { 100 } else { 0 };
            assert_eq!(amounts.captured_minor, expected);
        }
    }
}

dual_test! {
    /// A CAS that misses (someone committed in between) is re-decided on fresh state.
    async fn a_decision_that_loses_the_cas_is_taken_again_on_the_fresh_state(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "CAS-1", 100, CaptureMode::Automatic).await;
        let version_before = store.get_payment(None, &payment.id).await.unwrap().version;
        let conflicts_before = sluice_store::cas_conflicts_total();

        // A concurrent writer holds the payment row, mid-transaction.
        let mut writer = concurrent_writer(db).await;
        sqlx::query("UPDATE payment_orders SET version = version + 1 WHERE id = $1")
            .bind(&payment.id)
            .execute(&mut *writer)
            .await
            .unwrap();
        let racer = {
            let store = store.clone();
            let apply = on_attempt(&attempt, event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse));
            tokio::spawn(async move { store.apply_event(&apply).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        writer.commit().await.unwrap();
        let applied = racer.await.unwrap().unwrap();

        assert_eq!(applied.to_state, "SUCCEEDED");
        assert_eq!(applied.payment_version, version_before + 2);
        match db.backend {
            // PostgreSQL: the door read the old version, its CAS missed, it re-decided.
            // The miss is counted for `sluice_cas_conflicts_total` (process-wide,
            // so other tests may add to it too).
            sluice_store::Backend::Postgres => {
                assert_eq!(applied.tries, 2);
                assert!(sluice_store::cas_conflicts_total() > conflicts_before);
            }
            // SQLite: BEGIN IMMEDIATE queued the door behind the writer.
            sluice_store::Backend::Sqlite => assert_eq!(applied.tries, 1),
        }
        let history = store.aggregate_history(&attempt.payment_id, "attempt", &attempt.id).await.unwrap();
        assert_eq!(count_history(&history, &attempt.id, "applied", "SUCCEEDED"), 1);
    }
}

dual_test! {
    /// Rejected decisions change nothing but are recorded in history as evidence.
    async fn an_illegal_transition_is_rejected_changes_nothing_and_is_recorded(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "IL-1", 100, CaptureMode::Automatic).await;
        store
            .apply_event(&on_attempt(&attempt, event(EventKind::ResultUnknown, EvidenceSource::SyncResponse)))
            .await
            .unwrap();
        let before = store.get_attempt(&attempt.id).await.unwrap();
        let order_before = store.get_payment(None, &payment.id).await.unwrap();

        // The sync path produced the UNKNOWN; only verified evidence may close it.
        let rejected = store
            .apply_event(&on_attempt(&attempt, event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse)))
            .await
            .unwrap();
        assert_eq!(rejected.decision, DecisionKind::Rejected);
        assert!(rejected.reason.contains("evidence"), "{}", rejected.reason);

        // A refund event aimed at an attempt is refused too.
        let wrong = store
            .apply_event(&on_attempt(&attempt, event(EventKind::RefundSucceeded, EvidenceSource::Webhook)))
            .await
            .unwrap();
        assert_eq!(wrong.decision, DecisionKind::Rejected);

        let after = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!((after.state, after.version), (before.state, before.version));
        let order_after = store.get_payment(None, &payment.id).await.unwrap();
        assert_eq!((order_after.state, order_after.version), (order_before.state, order_before.version));
        assert_eq!(store.payment_amounts(&payment.id).await.unwrap().captured_minor, 0);
        assert!(store.outbox_for_payment(&payment.id).await.unwrap().is_empty());
        let history = store.aggregate_history(&attempt.payment_id, "attempt", &attempt.id).await.unwrap();
        let rejected_rows: Vec<_> = history.iter().filter(|h| h.decision == "rejected").collect();
        assert_eq!(rejected_rows.len(), 2);
        assert!(rejected_rows.iter().all(|h| h.from_state.as_deref() == Some("UNKNOWN") && h.to_state == "UNKNOWN"));
    }
}

dual_test! {
    async fn contradicting_evidence_flags_the_payment_for_review_and_tells_the_merchant_once(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.succeeded(store, "NR-1", 100).await;
        for n in 0..2 {
            let mut ko = declined(EvidenceSource::Webhook);
            ko.provider_event_id = Some(format!("evt_contra_{n}"));
            let applied = store.apply_event(&on_attempt(&attempt, ko)).await.unwrap();
            assert_eq!(applied.decision, DecisionKind::NeedsReconciliation);
            assert_eq!(applied.to_state, "SUCCEEDED", "never last-writer-wins");
        }
        let order = store.get_payment(None, &payment.id).await.unwrap();
        assert!(order.manual_review);
        assert!(order.manual_review_reason.unwrap().contains("contradicts"));
        let reviews = store
            .outbox_for_payment(&payment.id)
            .await
            .unwrap()
            .into_iter()
            .filter(|m| m.event_type == "payment.needs_review")
            .count();
        assert_eq!(reviews, 1);
        assert_eq!(store.get_attempt(&attempt.id).await.unwrap().state, AttemptState::Succeeded);
    }
}

dual_test! {
    async fn a_manual_capture_reserves_then_settles_and_moves_attempt_and_order_to_succeeded(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "MC-1", 100, CaptureMode::Manual).await;
        let mut auth = event(EventKind::PaymentAuthorized, EvidenceSource::SyncResponse);
        auth.psp_reference = Some("pi_MC1".into());
        let authorized = store.apply_event(&on_attempt(&attempt, auth)).await.unwrap();
        assert_eq!(authorized.order_state, OrderState::Authorized);
        assert_eq!(store.payment_amounts(&payment.id).await.unwrap().authorized_minor, 100);

        let reservation = store
            .reserve_capture(
                &CaptureRequest { payment_id: payment.id.clone(), merchant_id: Some(fx.merchant.id.clone()), amount: eur(60), idempotency_key: None },
                &sys(),
            )
            .await
            .unwrap();
        assert_eq!(reservation.record.state, CaptureState::Created);
        assert_eq!(store.payment_amounts(&payment.id).await.unwrap().capture_reserved_minor, 60);

        let over = store
            .reserve_capture(
                &CaptureRequest { payment_id: payment.id.clone(), merchant_id: None, amount: eur(50), idempotency_key: None },
                &sys(),
            )
            .await;
        assert!(matches!(over, Err(StoreError::InsufficientCapturable { requested: 50, available: 40 })), "{over:?}");

        let mut captured = event(EventKind::PaymentCaptured, EvidenceSource::Webhook);
        captured.psp_reference = Some("pi_MC1".into());
        captured.provider_event_id = Some("evt_cap".into());
        captured.amount = Some(eur(60));
        // No capture reference in the event: the one capture in flight is matched.
        let settled = store
            .apply_event(&ApplyEvent {
                target: EventTarget::FromEvent { scope: fx.scope() },
                event: captured,
                provenance: adapter_provenance(),
                inbox_id: None,
                next_retry_time: None,
            })
            .await
            .unwrap();
        assert_eq!(settled.aggregate_id, reservation.record.id);
        assert_eq!(settled.to_state, "SUCCEEDED");
        assert_eq!(settled.order_state, OrderState::Succeeded);
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.captured_minor, amounts.capture_reserved_minor), (60, 0));
        assert_eq!(store.get_attempt(&attempt.id).await.unwrap().state, AttemptState::Succeeded);
        let types: Vec<String> = store
            .outbox_for_payment(&payment.id)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.event_type)
            .collect();
        assert_eq!(types, vec!["payment.authorized", "capture.requested", "payment.captured", "payment.succeeded"]);
        let history = store.timeline(&payment.id).await.unwrap();
        assert!(history.iter().any(|h| h.aggregate_type == "attempt" && h.to_state == "SUCCEEDED" && h.reason.starts_with("follows capture")));
    }
}

dual_test! {
    /// Seed 001 §4/§9: a new attempt only after a definitive failure, never while UNKNOWN.
    async fn a_new_attempt_is_allowed_after_a_definitive_failure_and_refused_while_one_is_unknown(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, first) = fx.submitted(store, "NA-1", 100, CaptureMode::Automatic).await;

        let busy = store
            .create_attempt(
                &sluice_store::NewAttempt { payment_id: payment.id.clone(), connector_account_id: fx.account.id.clone(), ..Default::default() },
                &sys(),
            )
            .await;
        assert!(matches!(&busy, Err(StoreError::AttemptInFlight { attempt_id, .. }) if *attempt_id == first.id), "{busy:?}");

        let failed = store.apply_event(&on_attempt(&first, declined(EvidenceSource::SyncResponse))).await.unwrap();
        assert_eq!(failed.to_state, "FAILED");
        assert_eq!(failed.order_state, OrderState::Processing, "an attempt's failure is not the order's");
        let failed_row = store.get_attempt(&first.id).await.unwrap();
        assert_eq!(failed_row.failure.as_ref().map(|f| f.code.as_str()), Some("card_declined"));

        let second = fx.attempt(store, &payment).await;
        assert_eq!(second.attempt_no, 2);
        assert_ne!(second.reference, first.reference);
        store
            .apply_event(&on_attempt(&second, event(EventKind::ResultUnknown, EvidenceSource::SyncResponse)))
            .await
            .unwrap();
        let refused = store
            .create_attempt(
                &sluice_store::NewAttempt { payment_id: payment.id.clone(), connector_account_id: fx.account.id.clone(), ..Default::default() },
                &sys(),
            )
            .await;
        assert!(matches!(&refused, Err(StoreError::AttemptInFlight { state, .. }) if state == "UNKNOWN"), "{refused:?}");
        let history = store.timeline(&payment.id).await.unwrap();
        let refusals = history.iter().filter(|h| h.event_kind == "COMMAND_START_ATTEMPT" && h.decision == "rejected").count();
        assert_eq!(refusals, 2, "refused commands are recorded as evidence");
        assert_eq!(store.list_attempts(&payment.id).await.unwrap().len(), 2);
    }
}

dual_test! {
    async fn order_commands_go_through_the_door_and_respect_attempts_in_flight(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "OC-1", 100, CaptureMode::Automatic).await;
        let refused = store.apply_order_command(&payment.id, OrderCommand::Cancel, &sys()).await.unwrap();
        assert_eq!(refused.decision, DecisionKind::Rejected);
        store.apply_event(&on_attempt(&attempt, declined(EvidenceSource::SyncResponse))).await.unwrap();
        let canceled = store.apply_order_command(&payment.id, OrderCommand::Cancel, &sys()).await.unwrap();
        assert_eq!(canceled.decision, DecisionKind::Applied);
        assert_eq!(canceled.order_state, OrderState::Canceled);
        let again = store.apply_order_command(&payment.id, OrderCommand::Cancel, &sys()).await.unwrap();
        assert_eq!(again.decision, DecisionKind::IgnoredDuplicate);
        let types: Vec<String> = store.outbox_for_payment(&payment.id).await.unwrap().into_iter().map(|m| m.event_type).collect();
        assert_eq!(types, vec!["payment.attempt_failed", "payment.canceled"]);
    }
}

dual_test! {
    async fn webhook_events_are_located_by_psp_reference_and_unknown_targets_are_not_found(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (_payment, attempt) = fx.succeeded(store, "LOC-1", 100).await;
        let mut ev = event(EventKind::Chargeback, EvidenceSource::Webhook);
        ev.psp_reference = Some("pi_LOC-1".into());
        ev.provider_event_id = Some("evt_cb".into());
        let applied = store
            .apply_event(&ApplyEvent {
                target: EventTarget::PspReference { scope: fx.scope(), psp_reference: "pi_LOC-1".into() },
                event: ev.clone(),
                provenance: adapter_provenance(),
                inbox_id: None,
                next_retry_time: None,
            })
            .await
            .unwrap();
        assert_eq!(applied.aggregate_id, attempt.id);
        assert_eq!(applied.decision, DecisionKind::Applied);
        let missing = store
            .apply_event(&ApplyEvent {
                target: EventTarget::PspReference { scope: sluice_store::AccountScope::new(&fx.account.id, "other"), psp_reference: "pi_LOC-1".into() },
                event: ev,
                provenance: adapter_provenance(),
                inbox_id: None,
                next_retry_time: None,
            })
            .await;
        assert!(matches!(missing, Err(StoreError::NotFound { .. })), "{missing:?}");
    }
}

dual_test! {
    /// A CAS that can never land (a trigger swallows every order update, as an
    /// endless stream of concurrent writers would) ends in a typed error after
    /// the bounded number of tries, having written nothing.
    async fn a_cas_that_never_lands_gives_up_with_cas_exhausted_and_writes_nothing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "EX-1", 100, CaptureMode::Automatic).await;
        let history_before = store.timeline(&payment.id).await.unwrap().len();
        let swallow = match db.backend {
            sluice_store::Backend::Sqlite => {
                "CREATE TRIGGER test_swallow BEFORE UPDATE ON payment_orders BEGIN SELECT RAISE(IGNORE); END;"
            }
            sluice_store::Backend::Postgres => {
                "CREATE FUNCTION test_swallow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$; \
                 CREATE TRIGGER test_swallow BEFORE UPDATE ON payment_orders FOR EACH ROW EXECUTE FUNCTION test_swallow();"
            }
        };
        sqlx::raw_sql(swallow).execute(store.pool()).await.unwrap();
        let outcome = store
            .apply_event(&on_attempt(&attempt, event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse)))
            .await;
        assert!(
            matches!(outcome, Err(StoreError::CasExhausted { tries, .. }) if tries == sluice_store::MAX_CAS_TRIES),
            "{outcome:?}"
        );
        assert_eq!(store.get_attempt(&attempt.id).await.unwrap().state, AttemptState::Submitted);
        assert_eq!(store.timeline(&payment.id).await.unwrap().len(), history_before);
        assert!(store.outbox_for_payment(&payment.id).await.unwrap().is_empty());
    }
}

dual_test! {
    /// Issue 15: an attempt follows the adapter version that built its first request,
    /// whatever is active when it is looked at again. The pin and the time of the call
    /// are written by the record of the send itself (issue 17: one transaction, not three).
    async fn the_record_of_a_send_pins_the_adapter_version_once_and_notes_the_call(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let payment = fx.payment(store, "PIN-1", 100, CaptureMode::Manual).await;
        let attempt = fx.attempt(store, &payment).await;
        let first = sluice_store::AdapterPin { version: "1.0.0".into(), digest: "sha256:aaa".into() };
        let later = sluice_store::AdapterPin { version: "1.1.0".into(), digest: "sha256:bbb".into() };
        let sent = |pin: &sluice_store::AdapterPin| sluice_store::SentCall { pin: Some(pin.clone()), known: None };
        let submitted = event(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse);

        db.clock.advance(1_000);
        let recorded = store.apply_sent(&on_attempt(&attempt, submitted.clone()), &sent(&first)).await.unwrap();
        assert_eq!(recorded.decision, DecisionKind::Applied);
        let after = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.adapter_pin, Some(first.clone()));
        assert_eq!(after.last_psp_call_at, Some(db.clock.now_ms()));

        // A second record of the same send is a duplicate: nothing is written.
        db.clock.advance(1_000);
        let again = store.apply_sent(&on_attempt(&attempt, submitted), &sent(&later)).await.unwrap();
        assert_ne!(again.decision, DecisionKind::Applied, "{again:?}");
        let unchanged = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(unchanged.adapter_pin, Some(first.clone()));
        assert_eq!(unchanged.last_psp_call_at, after.last_psp_call_at);

        // A later send about the same attempt (its void) notes the call and keeps the pin.
        let mut authorized = event(EventKind::PaymentAuthorized, EvidenceSource::SyncResponse);
        authorized.psp_reference = Some("pi_PIN1".into());
        store.apply_event(&on_attempt(&attempt, authorized)).await.unwrap();
        db.clock.advance(1_000);
        let mut void = event(EventKind::VoidSubmitted, EvidenceSource::SyncResponse);
        void.psp_reference = Some("pi_PIN1".into());
        let voided = store.apply_sent(&on_attempt(&attempt, void), &sent(&later)).await.unwrap();
        assert_eq!(voided.decision, DecisionKind::Applied);
        let voiding = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(voiding.adapter_pin, Some(first), "a pin is never replaced");
        assert_eq!(voiding.last_psp_call_at, Some(db.clock.now_ms()));

        // An event that is not the record of a send leaves the call's time alone.
        db.clock.advance(1_000);
        let mut canceled = event(EventKind::PaymentCanceled, EvidenceSource::SyncResponse);
        canceled.psp_reference = Some("pi_PIN1".into());
        let closed = store.apply_event(&on_attempt(&attempt, canceled)).await.unwrap();
        assert_eq!(closed.decision, DecisionKind::Applied);
        let plain = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(plain.state, AttemptState::Canceled);
        assert_eq!(plain.last_psp_call_at, voiding.last_psp_call_at);
    }
}

dual_test! {
    /// The database's net under the core: amounts another writer changed after
    /// the door read them make the movement's conditional update find no row,
    /// and the whole decision (on PostgreSQL one statement with the order's and
    /// the attempt's updates, its history and its outbox event) is rolled back.
    /// On SQLite the writer is serialised before the door reads, and the core
    /// sends the payment to reconciliation on the fresh amounts. Either way
    /// nothing is captured twice and the attempt does not move.
    async fn amounts_that_change_under_a_decision_are_never_moved_twice(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "AMT-1", 100, CaptureMode::Automatic).await;
        let history_before = store.timeline(&payment.id).await.unwrap().len();
        let version_before = store.get_payment(None, &payment.id).await.unwrap().version;

        let mut writer = concurrent_writer(db).await;
        sqlx::query("UPDATE payment_amounts SET authorized_minor = 100, captured_minor = 100 WHERE payment_id = $1")
            .bind(&payment.id)
            .execute(&mut *writer)
            .await
            .unwrap();
        let racer = {
            let store = store.clone();
            let apply = on_attempt(&attempt, event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse));
            tokio::spawn(async move { store.apply_event(&apply).await })
        };
        if db.backend == sluice_store::Backend::Postgres {
            // The door has read the old amounts and waits on the writer's row lock.
            sluice_test_support::eventually(std::time::Duration::from_secs(10), "the door waiting on the amounts row", || async {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(store.pool())
                .await
                .unwrap();
                (waiting > 0).then_some(())
            })
            .await;
        }
        writer.commit().await.unwrap();
        let outcome = racer.await.unwrap();

        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.authorized_minor, amounts.captured_minor), (100, 100), "the writer's, once");
        assert_eq!(store.get_attempt(&attempt.id).await.unwrap().state, AttemptState::Submitted);
        match db.backend {
            sluice_store::Backend::Postgres => {
                assert!(matches!(outcome, Err(StoreError::AmountInvariant(_))), "{outcome:?}");
                assert_eq!(store.get_payment(None, &payment.id).await.unwrap().version, version_before);
                assert_eq!(store.timeline(&payment.id).await.unwrap().len(), history_before);
                assert!(store.outbox_for_payment(&payment.id).await.unwrap().is_empty());
            }
            sluice_store::Backend::Sqlite => {
                let applied = outcome.unwrap();
                assert_eq!(applied.decision, DecisionKind::NeedsReconciliation, "{applied:?}");
            }
        }
    }
}

/// A transaction of another writer, open: on SQLite it holds the write lock
/// from its start (`BEGIN IMMEDIATE`), on PostgreSQL the rows it changes.
async fn concurrent_writer(db: &TestSubject) -> sqlx::Transaction<'static, sqlx::Any> {
    match db.backend {
        sluice_store::Backend::Sqlite => {
            db.store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap()
        }
        sluice_store::Backend::Postgres => db.store.pool().begin().await.unwrap(),
    }
}
