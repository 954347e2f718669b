//! Issue 11 §3: an authorization keeps an exit. The door records when an
//! authorization was taken and when a void of it was recorded as sent, and
//! the void is recorded once.

use crate::common::*;
use sluice_core::{AttemptState, CaptureMode, EventKind, EvidenceSource, OrderState};
use sluice_store::DecisionKind;

dual_test! {
    async fn a_void_is_recorded_as_sent_once_through_the_door_and_the_attempt_stays_authorized_until_the_psp_cancels(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.submitted(store, "V-1", 500, CaptureMode::Manual).await;

        let mut authorized = event(EventKind::PaymentAuthorized, EvidenceSource::SyncResponse);
        authorized.psp_reference = Some("pi_V1".into());
        store.apply_event(&on_attempt(&attempt, authorized)).await.unwrap();
        let held = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(held.state, AttemptState::Authorized);
        assert_eq!(held.authorized_at, Some(db.clock.now_ms()), "the validity watch starts here");
        assert_eq!(held.void_requested_at, None);

        db.clock.advance(60_000);
        let next_look = db.clock.now_ms() + 3_000;
        let mut void = event(EventKind::VoidSubmitted, EvidenceSource::SyncResponse);
        void.psp_reference = Some("pi_V1".into());
        void.raw_status = "void_requested_by_merchant".into();
        let recorded = store
            .apply_event(&sluice_store::ApplyEvent {
                next_retry_time: Some(next_look),
                ..on_attempt(&attempt, void.clone())
            })
            .await
            .unwrap();
        assert_eq!(recorded.decision, DecisionKind::Applied);
        assert_eq!(recorded.to_state, "AUTHORIZED", "only the PSP's cancel releases the funds");
        assert_eq!(recorded.order_state, OrderState::Authorized);
        let voiding = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(voiding.void_requested_at, Some(db.clock.now_ms()));
        assert_eq!(voiding.authorized_at, held.authorized_at, "kept");
        assert_eq!(voiding.next_retry_time, Some(next_look), "the scanner finds it after a crash");
        let due = store.due_attempts(next_look, 10, None).await.unwrap();
        assert!(due.iter().any(|a| a.id == attempt.id), "in the scan set");

        // A second caller's record is a duplicate: it does not send.
        db.clock.advance(1_000);
        let again = store.apply_event(&on_attempt(&attempt, void)).await.unwrap();
        assert_eq!(again.decision, DecisionKind::IgnoredDuplicate);
        assert_eq!(
            store.get_attempt(&attempt.id).await.unwrap().void_requested_at,
            voiding.void_requested_at,
            "the first record's time stands"
        );

        let mut canceled = event(EventKind::PaymentCanceled, EvidenceSource::Query);
        canceled.psp_reference = Some("pi_V1".into());
        let closed = store.apply_event(&on_attempt(&attempt, canceled)).await.unwrap();
        assert_eq!(closed.to_state, "CANCELED");
        assert_eq!(closed.order_state, OrderState::Canceled);
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!(amounts.authorized_minor, 0, "the hold is released");

        let history = store.aggregate_history(&attempt.payment_id, "attempt", &attempt.id).await.unwrap();
        let void_rows: Vec<_> = history
            .iter()
            .filter(|h| h.event_kind == "VOID_SUBMITTED")
            .map(|h| (h.decision.as_str(), h.raw_status.as_deref()))
            .collect();
        assert_eq!(
            void_rows,
            vec![
                ("applied", Some("void_requested_by_merchant")),
                ("ignored_duplicate", Some("void_requested_by_merchant")),
            ],
            "the reason is evidence in the history"
        );
    }
}

dual_test! {
    async fn a_void_is_never_recorded_on_an_attempt_that_is_not_authorized(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (_, attempt) = fx.submitted(store, "V-2", 500, CaptureMode::Manual).await;
        let void = event(EventKind::VoidSubmitted, EvidenceSource::SyncResponse);
        let refused = store.apply_event(&on_attempt(&attempt, void)).await.unwrap();
        assert_eq!(refused.decision, DecisionKind::IgnoredStale);
        let row = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(row.state, AttemptState::Submitted);
        assert_eq!(row.void_requested_at, None);
        assert_eq!(row.authorized_at, None);
    }
}
