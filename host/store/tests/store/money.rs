//! Amount reservations and the database's money invariants (seed 001 §6, §12 C).

use crate::common::*;
use sluice_core::{EventKind, EvidenceSource, Failure, FailureCategory, RefundState};
use sluice_store::{DecisionKind, RefundRequest, StoreError};

fn refund_request(payment_id: &str, amount: i64) -> RefundRequest {
    RefundRequest {
        payment_id: payment_id.to_owned(),
        merchant_id: None,
        amount: eur(amount),
        reason: Some("requested_by_customer".into()),
        idempotency_key: None,
    }
}

dual_test! {
    /// Seed 001 §12 C: captured 100, two concurrent refunds of 70.
    async fn two_concurrent_refunds_of_70_on_a_capture_of_100_reserve_exactly_once(&db) {
        let store = &db.store;
        let other = db.second_store().await;
        let fx = Fixture::new(store, "Acme").await;
        for round in 0..6 {
            let (payment, _) = fx.succeeded(store, &format!("C-{round}"), 100).await;
            let first = refund_request(&payment.id, 70);
            let second = refund_request(&payment.id, 70);
            let provenance = sys();
            let (a, b) = tokio::join!(
                store.reserve_refund(&first, &provenance),
                other.reserve_refund(&second, &provenance),
            );
            let wins = [&a, &b].iter().filter(|r| r.is_ok()).count();
            assert_eq!(wins, 1, "round {round}: {a:?} / {b:?}");
            let loser = if a.is_ok() { b } else { a };
            assert!(
                matches!(loser, Err(StoreError::InsufficientRefundable { requested: 70, available: 30 })),
                "round {round}: {loser:?}"
            );
            let amounts = store.payment_amounts(&payment.id).await.unwrap();
            assert_eq!((amounts.refund_reserved_minor, amounts.refunded_minor), (70, 0));
            assert_eq!(store.list_refunds(&payment.id).await.unwrap().len(), 1);
            let requested = store
                .outbox_for_payment(&payment.id)
                .await
                .unwrap()
                .into_iter()
                .filter(|m| m.event_type == "refund.requested")
                .count();
            assert_eq!(requested, 1);
        }
    }
}

dual_test! {
    /// Success settles the reservation, a definitive failure releases it, an
    /// unknown outcome keeps it and schedules a query.
    async fn refunds_settle_on_success_release_on_failure_and_stay_reserved_while_unknown(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _) = fx.succeeded(store, "RF-1", 100).await;

        let first = store.reserve_refund(&refund_request(&payment.id, 30), &sys()).await.unwrap();
        assert_eq!(first.record.state, RefundState::Created);
        let mut ok = event(EventKind::RefundSucceeded, EvidenceSource::SyncResponse);
        ok.psp_reference = Some("re_1".into());
        ok.amount = Some(eur(30));
        let settled = store.apply_event(&on_refund(&first.record.reference, ok)).await.unwrap();
        assert_eq!(settled.to_state, "SUCCEEDED");
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.refunded_minor, amounts.refund_reserved_minor), (30, 0));

        let second = store.reserve_refund(&refund_request(&payment.id, 50), &sys()).await.unwrap();
        let unknown = store
            .apply_event(&on_refund(&second.record.reference, event(EventKind::RefundUnknown, EvidenceSource::SyncResponse)))
            .await
            .unwrap();
        assert_eq!(unknown.to_state, "UNKNOWN");
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!(amounts.refund_reserved_minor, 50, "unknown keeps the reservation");
        assert!(store.get_refund(&second.record.id).await.unwrap().next_retry_time.is_some());
        let due = store.due_refunds(db.clock.now_ms() + 60_000, 10, None).await.unwrap();
        assert_eq!(due.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), vec![second.record.id.as_str()]);

        let mut ko = event(EventKind::RefundFailed, EvidenceSource::Webhook);
        ko.provider_event_id = Some("evt_rf_ko".into());
        ko.failure = Some(Failure { category: FailureCategory::Declined, code: "expired_card".into(), message: "".into() });
        ko.action_reference = Some(second.record.reference.clone());
        let released = store
            .apply_event(&sluice_store::ApplyEvent {
                target: sluice_store::EventTarget::FromEvent { scope: fx.scope() },
                event: ko,
                provenance: adapter_provenance(),
                inbox_id: None,
                next_retry_time: None,
            })
            .await
            .unwrap();
        assert_eq!(released.to_state, "FAILED");
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.refunded_minor, amounts.refund_reserved_minor), (30, 0));
        assert!(store.due_refunds(db.clock.now_ms() + 60_000, 10, None).await.unwrap().is_empty());

        let third = store.reserve_refund(&refund_request(&payment.id, 70), &sys()).await.unwrap();
        let too_much = store.reserve_refund(&refund_request(&payment.id, 1), &sys()).await;
        assert!(matches!(too_much, Err(StoreError::InsufficientRefundable { available: 0, .. })), "{too_much:?}");
        let canceled = store.cancel_unsent_refund(&third.record.reference, &sys()).await.unwrap();
        assert_eq!(canceled.decision, DecisionKind::Applied);
        assert_eq!(canceled.to_state, "CANCELED");
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.captured_minor, amounts.refunded_minor, amounts.refund_reserved_minor), (100, 30, 0));
        let types: Vec<String> = store.outbox_for_payment(&payment.id).await.unwrap().into_iter().map(|m| m.event_type).collect();
        assert_eq!(
            types,
            vec!["payment.succeeded", "refund.requested", "refund.succeeded", "refund.requested", "refund.failed", "refund.requested"]
        );
    }
}

dual_test! {
    async fn a_refund_of_an_unpaid_payment_or_in_another_currency_is_refused_without_writing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (unpaid, _) = fx.submitted(store, "RF-2", 100, sluice_core::CaptureMode::Automatic).await;
        let refused = store.reserve_refund(&refund_request(&unpaid.id, 10), &sys()).await;
        assert!(matches!(refused, Err(StoreError::InvalidState { .. })), "{refused:?}");
        let (paid, _) = fx.succeeded(store, "RF-3", 100).await;
        let usd = sluice_core::Money { amount_minor: 10, currency: sluice_core::Currency::parse("USD").unwrap() };
        let wrong = store
            .reserve_refund(&RefundRequest { payment_id: paid.id.clone(), merchant_id: None, amount: usd, reason: None, idempotency_key: None }, &sys())
            .await;
        assert!(matches!(wrong, Err(StoreError::InvalidRequest(_))), "{wrong:?}");
        let foreign = store
            .reserve_refund(&RefundRequest { merchant_id: Some("mer_other".into()), ..refund_request(&paid.id, 10) }, &sys())
            .await;
        assert!(matches!(foreign, Err(StoreError::NotFound { .. })), "{foreign:?}");
        assert!(store.list_refunds(&paid.id).await.unwrap().is_empty());
        assert_eq!(store.payment_amounts(&paid.id).await.unwrap().refund_reserved_minor, 0);
    }
}

dual_test! {
    async fn the_amount_checks_refuse_a_raw_over_refund_and_an_over_capture(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _) = fx.succeeded(store, "CK-1", 100).await;
        for sql in [
            "UPDATE payment_amounts SET refunded_minor = 101 WHERE payment_id = $1",
            "UPDATE payment_amounts SET refunded_minor = 60, refund_reserved_minor = 41 WHERE payment_id = $1",
            "UPDATE payment_amounts SET refund_reserved_minor = -1 WHERE payment_id = $1",
            "UPDATE payment_amounts SET captured_minor = 101 WHERE payment_id = $1",
            "UPDATE payment_amounts SET authorized_minor = 200, captured_minor = 200 WHERE payment_id = $1",
        ] {
            let refused = sqlx::query(sql).bind(&payment.id).execute(store.pool()).await;
            let err = StoreError::from(refused.expect_err(sql));
            assert!(err.is_check_violation(), "{sql}: {err}");
        }
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.captured_minor, amounts.refunded_minor, amounts.refund_reserved_minor), (100, 0, 0));
        // The legal edge is accepted: refunded + reserved == captured.
        sqlx::query("UPDATE payment_amounts SET refunded_minor = 60, refund_reserved_minor = 40 WHERE payment_id = $1")
            .bind(&payment.id)
            .execute(store.pool())
            .await
            .unwrap();
    }
}

dual_test! {
    /// The door (order row, then amounts) and a reservation on the same
    /// payment take their locks in the same order, so they never deadlock.
    async fn a_refund_settling_while_another_is_reserved_on_the_same_payment_never_deadlocks(&db) {
        let store = &db.store;
        let other = db.second_store().await;
        let fx = Fixture::new(store, "Acme").await;
        for round in 0..60 {
            let (payment, _) = fx.succeeded(store, &format!("DL-{round}"), 100).await;
            let first = store.reserve_refund(&refund_request(&payment.id, 30), &sys()).await.unwrap();
            let mut ok = event(EventKind::RefundSucceeded, EvidenceSource::SyncResponse);
            ok.amount = Some(eur(30));
            let settle = on_refund(&first.record.reference, ok);
            let second = refund_request(&payment.id, 30);
            let provenance = sys();
            let (settled, reserved) = tokio::join!(store.apply_event(&settle), other.reserve_refund(&second, &provenance));
            assert_eq!(settled.unwrap().to_state, "SUCCEEDED", "round {round}");
            reserved.unwrap();
            let amounts = store.payment_amounts(&payment.id).await.unwrap();
            assert_eq!((amounts.refunded_minor, amounts.refund_reserved_minor), (30, 30), "round {round}");
        }
    }
}

dual_test! {
    /// A process that dies between reserving a refund or capture and its first
    /// PSP call must not strand the reserved money: the new row is in the
    /// recovery scan set once the first query delay has passed (found by the
    /// kill -9 test: a capture stayed CREATED with its amount reserved).
    async fn a_reserved_refund_and_capture_enter_the_recovery_scan_set_before_any_psp_call(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _) = fx.succeeded(store, "RS-1", 100).await;
        let refund = store.reserve_refund(&refund_request(&payment.id, 30), &sys()).await.unwrap();
        let (manual, attempt) = fx.submitted(store, "RS-2", 100, sluice_core::CaptureMode::Manual).await;
        let mut auth = event(EventKind::PaymentAuthorized, EvidenceSource::SyncResponse);
        auth.psp_reference = Some("pi_RS2".into());
        store.apply_event(&on_attempt(&attempt, auth)).await.unwrap();
        let capture = store
            .reserve_capture(
                &sluice_store::CaptureRequest {
                    payment_id: manual.id.clone(),
                    merchant_id: None,
                    amount: eur(100),
                    idempotency_key: None,
                },
                &sys(),
            )
            .await
            .unwrap();

        let now = db.clock.now_ms();
        assert!(store.due_refunds(now, 10, None).await.unwrap().is_empty(), "not before the delay");
        assert!(store.due_captures(now, 10, None).await.unwrap().is_empty(), "not before the delay");
        let later = now + 60_000;
        let refunds: Vec<String> =
            store.due_refunds(later, 10, None).await.unwrap().into_iter().map(|r| r.id).collect();
        assert_eq!(refunds, vec![refund.record.id.clone()]);
        let captures: Vec<String> =
            store.due_captures(later, 10, None).await.unwrap().into_iter().map(|c| c.id).collect();
        assert_eq!(captures, vec![capture.record.id.clone()]);
        assert!(refund.record.next_retry_time.is_some_and(|t| t > now && t <= later));
    }
}

dual_test! {
    /// Seed 000 §1: the merchant's Idempotency-Key names the refund. A re-run of
    /// the same request (a retry that took the key over after a crash) finds the
    /// same reservation and the same reference; it never reserves twice.
    async fn a_keyed_refund_reserved_again_is_the_same_refund_and_one_reservation(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _) = fx.succeeded(store, "KR-1", 100).await;
        let keyed = RefundRequest { idempotency_key: Some("key-1".into()), ..refund_request(&payment.id, 30) };
        let first = store.reserve_refund(&keyed, &sys()).await.unwrap();
        assert!(!first.replayed);
        assert_eq!(first.record.reference, sluice_store::keyed_refund_reference(&payment.id, "key-1"));
        let again = store.reserve_refund(&keyed, &sys()).await.unwrap();
        assert!(again.replayed);
        assert_eq!((&again.record.id, &again.record.reference), (&first.record.id, &first.record.reference));
        assert_eq!((again.history_id, &again.outbox_event_id), (first.history_id, &first.outbox_event_id));
        // Also once the reservation is settled and nothing is left to refund.
        let mut ok = event(EventKind::RefundSucceeded, EvidenceSource::SyncResponse);
        ok.psp_reference = Some("re_KR1".into());
        ok.amount = Some(eur(30));
        assert_eq!(store.apply_event(&on_refund(&first.record.reference, ok)).await.unwrap().to_state, "SUCCEEDED");
        let all = store.reserve_refund(&RefundRequest { idempotency_key: Some("all".into()), ..refund_request(&payment.id, 70) }, &sys()).await.unwrap();
        assert!(!all.replayed);
        let late = store.reserve_refund(&keyed, &sys()).await.unwrap();
        assert_eq!((late.record.id, late.replayed), (first.record.id.clone(), true));
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.refunded_minor, amounts.refund_reserved_minor), (30, 70));
        assert_eq!(store.list_refunds(&payment.id).await.unwrap().len(), 2);
        let requested = store.outbox_for_payment(&payment.id).await.unwrap().into_iter()
            .filter(|m| m.event_type == "refund.requested")
            .count();
        assert_eq!(requested, 2, "one refund.requested per refund");
    }
}

dual_test! {
    async fn the_same_key_with_another_amount_or_reason_is_refused_and_changes_nothing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _) = fx.succeeded(store, "KR-2", 100).await;
        let keyed = RefundRequest { idempotency_key: Some("key-1".into()), ..refund_request(&payment.id, 30) };
        store.reserve_refund(&keyed, &sys()).await.unwrap();
        let other_amount = RefundRequest { amount: eur(31), ..keyed.clone() };
        let refused = store.reserve_refund(&other_amount, &sys()).await;
        assert!(matches!(refused, Err(StoreError::IdempotencyMismatch)), "{refused:?}");
        let other_reason = RefundRequest { reason: Some("another".into()), ..keyed.clone() };
        let refused = store.reserve_refund(&other_reason, &sys()).await;
        assert!(matches!(refused, Err(StoreError::IdempotencyMismatch)), "{refused:?}");
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!(amounts.refund_reserved_minor, 30);
        // Another key, or no key, is another refund.
        let other_key = RefundRequest { idempotency_key: Some("key-2".into()), ..keyed.clone() };
        let second = store.reserve_refund(&other_key, &sys()).await.unwrap();
        let unkeyed = store.reserve_refund(&refund_request(&payment.id, 30), &sys()).await.unwrap();
        assert!(!second.replayed && !unkeyed.replayed);
        assert!(unkeyed.record.reference.starts_with("rfdref_"));
        assert_eq!(store.list_refunds(&payment.id).await.unwrap().len(), 3);
        assert_eq!(store.payment_amounts(&payment.id).await.unwrap().refund_reserved_minor, 90);
    }
}

dual_test! {
    async fn a_keyed_capture_reserved_again_is_the_same_capture_and_one_reservation(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (manual, attempt) = fx.submitted(store, "KC-1", 100, sluice_core::CaptureMode::Manual).await;
        let mut auth = event(EventKind::PaymentAuthorized, EvidenceSource::SyncResponse);
        auth.psp_reference = Some("pi_KC1".into());
        store.apply_event(&on_attempt(&attempt, auth)).await.unwrap();
        let keyed = sluice_store::CaptureRequest {
            payment_id: manual.id.clone(),
            merchant_id: None,
            amount: eur(60),
            idempotency_key: Some("cap-1".into()),
        };
        let first = store.reserve_capture(&keyed, &sys()).await.unwrap();
        assert_eq!(first.record.reference, sluice_store::keyed_capture_reference(&manual.id, "cap-1"));
        let again = store.reserve_capture(&keyed, &sys()).await.unwrap();
        assert_eq!((again.record.id, again.replayed), (first.record.id.clone(), true));
        let more = sluice_store::CaptureRequest { amount: eur(40), ..keyed.clone() };
        let refused = store.reserve_capture(&more, &sys()).await;
        assert!(matches!(refused, Err(StoreError::IdempotencyMismatch)), "{refused:?}");
        assert_eq!(store.list_captures(&manual.id).await.unwrap().len(), 1);
        assert_eq!(store.payment_amounts(&manual.id).await.unwrap().capture_reserved_minor, 60);
    }
}
