//! Operator review through the one door: escalation of an old UNKNOWN, and
//! two-person resolutions (seed 001 §10).

use crate::common::*;
use sluice_core::{AttemptState, CaptureMode, EventKind, EvidenceSource, OrderState};
use sluice_store::{
    ApiKeyPepper, DecisionKind, NewProposal, PaymentAttempt, PaymentOrder, PendingKind,
    ReviewError, ReviewOutcome, Store, ESCALATE_KIND, RESOLVE_KIND,
};

fn pepper() -> ApiKeyPepper {
    ApiKeyPepper::new("review-test-pepper-0123456789").unwrap()
}

async fn unknown_attempt(
    store: &Store,
    fx: &Fixture,
    order_no: &str,
) -> (PaymentOrder, PaymentAttempt) {
    let (payment, attempt) = fx
        .submitted(store, order_no, 500, CaptureMode::Automatic)
        .await;
    store
        .apply_event(&on_attempt(
            &attempt,
            event(EventKind::ResultUnknown, EvidenceSource::SyncResponse),
        ))
        .await
        .unwrap();
    let attempt = store.get_attempt(&attempt.id).await.unwrap();
    assert_eq!(attempt.state, AttemptState::Unknown);
    (payment, attempt)
}

async fn escalate(store: &Store, attempt: &PaymentAttempt) -> sluice_store::Applied {
    store
        .flag_manual_review(
            PendingKind::Attempt,
            &attempt.id,
            "UNKNOWN past its age: an operator must decide",
            &sluice_store::Provenance::actor("system:scanner"),
        )
        .await
        .unwrap()
}

fn proposal(
    payment: &PaymentOrder,
    attempt: &PaymentAttempt,
    outcome: ReviewOutcome,
    by: &str,
) -> NewProposal {
    NewProposal {
        payment_id: payment.id.clone(),
        outcome,
        target_id: Some(attempt.id.clone()),
        reason_code: "psp_statement".into(),
        evidence_note: "settlement report of 2026-11-30 lists the charge".into(),
        amount_minor: None,
        // The evidence of an attempt success (required) is the PSP's payment id.
        psp_reference: outcome.is_success().then(|| format!("pi_{}", attempt.id)),
        proposed_by: by.to_owned(),
    }
}

dual_test! {
    async fn escalating_an_old_unknown_flags_the_payment_once_with_history_and_outbox_and_moves_no_state(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = unknown_attempt(store, &fx, "ESC-1").await;
        let before = store.get_payment(None, &payment.id).await.unwrap();

        let first = escalate(store, &attempt).await;
        assert_eq!(first.decision, DecisionKind::NeedsReconciliation);
        assert_eq!(first.payment_version, before.version + 1, "the flag bumps the payment's version");
        let flagged = store.get_payment(None, &payment.id).await.unwrap();
        assert!(flagged.manual_review);
        assert_eq!(flagged.manual_review_reason.as_deref(), Some("UNKNOWN past its age: an operator must decide"));
        assert_eq!(flagged.state, before.state);
        let after = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!((after.state, after.version), (attempt.state, attempt.version), "no state change");

        // Once only: a second escalation is a duplicate, flags nothing new
        // and records nothing (the scanner and the refund path may ask often).
        let second = escalate(store, &attempt).await;
        assert_eq!(second.decision, DecisionKind::IgnoredDuplicate);
        assert!(second.history_ids.is_empty() && second.outbox_event_ids.is_empty(), "{second:?}");
        assert_eq!(store.get_payment(None, &payment.id).await.unwrap().version, flagged.version);

        let reviews: Vec<_> = store.outbox_for_payment(&payment.id).await.unwrap()
            .into_iter().filter(|m| m.event_type == "payment.needs_review").collect();
        assert_eq!(reviews.len(), 1);
        let rows: Vec<_> = store.timeline(&payment.id).await.unwrap()
            .into_iter().filter(|h| h.event_kind == ESCALATE_KIND).collect();
        assert_eq!(rows.len(), 1, "one history row however often it is escalated");
        assert_eq!(rows[0].decision, "needs_reconciliation");
        assert_eq!(rows[0].actor.as_deref(), Some("system:scanner"));
        assert_eq!((rows[0].from_state.as_deref(), rows[0].to_state.as_str()), (Some("UNKNOWN"), "UNKNOWN"));
    }
}

dual_test! {
    async fn escalating_an_attempt_that_turned_terminal_flags_nothing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.succeeded(store, "ESC-2", 100).await;
        let applied = escalate(store, &attempt).await;
        assert_eq!(applied.decision, DecisionKind::IgnoredStale);
        let order = store.get_payment(None, &payment.id).await.unwrap();
        assert!(!order.manual_review);
        let missing = store
            .flag_manual_review(PendingKind::Refund, "ref_missing", "x", &sys())
            .await
            .unwrap_err();
        assert!(matches!(missing, sluice_store::StoreError::NotFound { .. }), "{missing:?}");
    }
}

dual_test! {
    async fn a_second_operator_approves_and_the_operator_event_goes_through_the_door_naming_both(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = unknown_attempt(store, &fx, "REV-1").await;
        escalate(store, &attempt).await;
        let alice = store.create_operator("alice", &pepper()).await.unwrap();
        let bob = store.create_operator("bob", &pepper()).await.unwrap();
        assert_eq!(
            store.authenticate_operator(&alice.key, &pepper()).await.unwrap().map(|o| o.id),
            Some(alice.operator.id.clone())
        );
        assert!(store.authenticate_operator("op_sluice_forged", &pepper()).await.unwrap().is_none());

        let p = store
            .create_proposal(&proposal(&payment, &attempt, ReviewOutcome::AttemptSucceeded, &alice.operator.id))
            .await
            .unwrap();
        assert_eq!(p.status, "proposed");
        assert_eq!(store.get_attempt(&attempt.id).await.unwrap().state, AttemptState::Unknown, "a proposal changes nothing");

        let same = store.approve_proposal(&p.id, &alice.operator.id, None).await.unwrap_err();
        assert!(matches!(same, ReviewError::SameOperator), "{same:?}");
        assert_eq!(store.get_proposal(&p.id).await.unwrap().status, "proposed");

        let approved = store.approve_proposal(&p.id, &bob.operator.id, Some("checked")).await.unwrap();
        assert_eq!(approved.status, "applied");
        assert_eq!(approved.decided_by.as_deref(), Some(bob.operator.id.as_str()));
        let after = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::Succeeded);
        let order = store.get_payment(None, &payment.id).await.unwrap();
        assert_eq!(order.state, OrderState::Succeeded);
        assert!(!order.manual_review, "the flag clears when resolved");
        assert_eq!(order.manual_review_reason, None);
        assert_eq!(store.payment_amounts(&payment.id).await.unwrap().captured_minor, 500);

        let timeline = store.timeline(&payment.id).await.unwrap();
        let applied = timeline.iter()
            .find(|h| h.aggregate_type == "attempt" && h.to_state == "SUCCEEDED")
            .expect("the operator event is in history");
        assert_eq!(applied.evidence_source, "operator");
        assert_eq!(applied.decision, "applied");
        assert_eq!(applied.actor.as_deref(), Some("operator:alice+operator:bob"));
        let cleared = timeline.iter().find(|h| h.event_kind == RESOLVE_KIND).expect("flag cleared in history");
        assert!(cleared.reason.contains("proposed by alice, approved by bob"), "{}", cleared.reason);
        let events: Vec<_> = store.outbox_for_payment(&payment.id).await.unwrap()
            .into_iter().map(|m| m.event_type).collect();
        assert!(events.contains(&"payment.succeeded".to_owned()), "{events:?}");

        // Idempotent for the approver; decided for everybody else.
        let again = store.approve_proposal(&p.id, &bob.operator.id, None).await.unwrap();
        assert_eq!(again, approved);
        let carol = store.create_operator("carol", &pepper()).await.unwrap();
        let late = store.approve_proposal(&p.id, &carol.operator.id, None).await.unwrap_err();
        assert!(matches!(late, ReviewError::AlreadyDecided { .. }), "{late:?}");
        assert_eq!(store.timeline(&payment.id).await.unwrap().len(), timeline.len(), "nothing more recorded");
    }
}

dual_test! {
    async fn a_proposal_is_refused_as_stale_once_the_payment_moved_and_nothing_changes(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = unknown_attempt(store, &fx, "REV-2").await;
        let alice = store.create_operator("alice", &pepper()).await.unwrap();
        let bob = store.create_operator("bob", &pepper()).await.unwrap();
        let p = store
            .create_proposal(&proposal(&payment, &attempt, ReviewOutcome::AttemptFailed, &alice.operator.id))
            .await
            .unwrap();
        // Meanwhile a verified query settles the attempt.
        store
            .apply_event(&on_attempt(&attempt, event(EventKind::PaymentSucceeded, EvidenceSource::Query)))
            .await
            .unwrap();
        let before = store.get_payment(None, &payment.id).await.unwrap();
        let timeline = store.timeline(&payment.id).await.unwrap();

        let stale = store.approve_proposal(&p.id, &bob.operator.id, None).await.unwrap_err();
        assert!(matches!(stale, ReviewError::Stale(_)), "{stale:?}");
        assert!(stale.to_string().contains("moved since the proposal"), "{stale}");
        let p = store.get_proposal(&p.id).await.unwrap();
        assert_eq!(p.status, "stale");
        let after = store.get_payment(None, &payment.id).await.unwrap();
        assert_eq!((after.state, after.version), (before.state, before.version));
        assert_eq!(store.timeline(&payment.id).await.unwrap(), timeline);
        assert_eq!(store.get_attempt(&attempt.id).await.unwrap().state, AttemptState::Succeeded);
    }
}

dual_test! {
    async fn two_approvals_at_once_apply_the_resolution_once(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = unknown_attempt(store, &fx, "REV-3").await;
        escalate(store, &attempt).await;
        let alice = store.create_operator("alice", &pepper()).await.unwrap();
        let bob = store.create_operator("bob", &pepper()).await.unwrap();
        let carol = store.create_operator("carol", &pepper()).await.unwrap();
        let p = store
            .create_proposal(&proposal(&payment, &attempt, ReviewOutcome::AttemptFailed, &alice.operator.id))
            .await
            .unwrap();
        let other = db.second_store().await;
        let (a, b) = tokio::join!(
            store.approve_proposal(&p.id, &bob.operator.id, None),
            other.approve_proposal(&p.id, &carol.operator.id, None),
        );
        let loser = match (a, b) {
            (Ok(_), Err(loser)) | (Err(loser), Ok(_)) => loser,
            other => panic!("exactly one approval applies: {other:?}"),
        };
        assert!(matches!(loser, ReviewError::AlreadyDecided { .. }), "{loser:?}");
        let timeline = store.timeline(&payment.id).await.unwrap();
        let failed = timeline.iter()
            .filter(|h| h.aggregate_type == "attempt" && h.evidence_source == "operator").count();
        assert_eq!(failed, 1, "one operator event went through the door");
        assert_eq!(timeline.iter().filter(|h| h.event_kind == RESOLVE_KIND).count(), 1);
        let attempt = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(attempt.state, AttemptState::Failed);
        assert_eq!(attempt.failure.as_ref().map(|f| f.code.as_str()), Some("psp_statement"));
    }
}

dual_test! {
    async fn the_database_refuses_a_proposal_decided_by_its_proposer(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = unknown_attempt(store, &fx, "REV-4").await;
        let alice = store.create_operator("alice", &pepper()).await.unwrap();
        let p = store
            .create_proposal(&proposal(&payment, &attempt, ReviewOutcome::AttemptFailed, &alice.operator.id))
            .await
            .unwrap();
        let refused = sqlx::query("UPDATE review_proposals SET decided_by = proposed_by WHERE id = $1")
            .bind(&p.id)
            .execute(store.pool())
            .await;
        assert!(refused.is_err(), "the CHECK keeps two people");
        let dup = store.create_operator("alice", &pepper()).await.unwrap_err();
        assert!(matches!(dup, sluice_store::StoreError::Conflict(_)), "{dup:?}");
    }
}

dual_test! {
    async fn a_dismissal_clears_the_flag_naming_both_operators_and_moves_no_state(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.succeeded(store, "DIS-1", 100).await;
        let alice = store.create_operator("alice", &pepper()).await.unwrap();
        let bob = store.create_operator("bob", &pepper()).await.unwrap();
        let dismiss = NewProposal {
            payment_id: payment.id.clone(),
            outcome: ReviewOutcome::Dismiss,
            target_id: None,
            reason_code: "psp_confirms_success".into(),
            evidence_note: "the PSP dashboard shows the charge captured".into(),
            amount_minor: None,
            psp_reference: None,
            proposed_by: alice.operator.id.clone(),
        };
        let not_flagged = store.create_proposal(&dismiss).await.unwrap_err();
        assert!(matches!(not_flagged, ReviewError::NotApplicable(_)), "{not_flagged:?}");

        // A contradicting webhook flags the payment; the success stands.
        let mut ko = declined(EvidenceSource::Webhook);
        ko.provider_event_id = Some("evt_contra".into());
        store.apply_event(&on_attempt(&attempt, ko)).await.unwrap();
        assert!(store.get_payment(None, &payment.id).await.unwrap().manual_review);

        // An operator cannot turn the established success into a failure.
        let wrong = store
            .create_proposal(&proposal(&payment, &attempt, ReviewOutcome::AttemptFailed, &alice.operator.id))
            .await
            .unwrap();
        let refused = store.approve_proposal(&wrong.id, &bob.operator.id, None).await.unwrap_err();
        assert!(matches!(refused, ReviewError::Refused(_)), "{refused:?}");
        assert_eq!(store.get_proposal(&wrong.id).await.unwrap().status, "refused");
        assert_eq!(store.get_attempt(&attempt.id).await.unwrap().state, AttemptState::Succeeded);
        let flagged = store.get_payment(None, &payment.id).await.unwrap();
        assert!(flagged.manual_review, "a refused resolution leaves the flag");

        let p = store.create_proposal(&dismiss).await.unwrap();
        let applied = store.approve_proposal(&p.id, &bob.operator.id, None).await.unwrap();
        assert_eq!(applied.status, "applied");
        let after = store.get_payment(None, &payment.id).await.unwrap();
        assert!(!after.manual_review);
        assert_eq!(after.state, flagged.state);
        assert_eq!(after.version, flagged.version + 1);
        assert_eq!(store.get_attempt(&attempt.id).await.unwrap().state, AttemptState::Succeeded);
        let row = store.timeline(&payment.id).await.unwrap().into_iter()
            .find(|h| h.event_kind == RESOLVE_KIND).expect("resolution in history");
        assert_eq!(row.evidence_source, "operator");
        assert_eq!(row.actor.as_deref(), Some("operator:alice+operator:bob"));
    }
}

dual_test! {
    async fn an_unknown_refund_resolved_as_failed_by_two_operators_releases_its_reservation(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _) = fx.succeeded(store, "RFU-1", 100).await;
        let reserved = store
            .reserve_refund(
                &sluice_store::RefundRequest {
                    payment_id: payment.id.clone(),
                    merchant_id: None,
                    amount: eur(40),
                    reason: None,
                    idempotency_key: None,
                },
                &sys(),
            )
            .await
            .unwrap();
        store
            .apply_event(&on_refund(&reserved.record.reference, event(EventKind::RefundUnknown, EvidenceSource::SyncResponse)))
            .await
            .unwrap();
        assert_eq!(store.payment_amounts(&payment.id).await.unwrap().refund_reserved_minor, 40);
        store
            .flag_manual_review(PendingKind::Refund, &reserved.record.id, "refund UNKNOWN too long", &sys())
            .await
            .unwrap();
        let alice = store.create_operator("alice", &pepper()).await.unwrap();
        let bob = store.create_operator("bob", &pepper()).await.unwrap();
        let p = store
            .create_proposal(&NewProposal {
                payment_id: payment.id.clone(),
                outcome: ReviewOutcome::RefundFailed,
                target_id: Some(reserved.record.id.clone()),
                reason_code: "psp_never_received".into(),
                evidence_note: "PSP support: no refund with this reference".into(),
                amount_minor: None,
                psp_reference: None,
                proposed_by: alice.operator.id.clone(),
            })
            .await
            .unwrap();
        assert_eq!(p.target_type, "refund");
        let applied = store.approve_proposal(&p.id, &bob.operator.id, None).await.unwrap();
        assert_eq!(applied.status, "applied", "{applied:?}");
        let refund = store.get_refund(&reserved.record.id).await.unwrap();
        assert_eq!(refund.state, sluice_core::RefundState::Failed);
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.refund_reserved_minor, amounts.refunded_minor), (0, 0), "reservation released");
        assert!(!store.get_payment(None, &payment.id).await.unwrap().manual_review);
    }
}

dual_test! {
    async fn a_manual_refund_leaves_a_payment_flagged_for_an_unknown_refund_in_review_until_nothing_is_open(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _) = fx.succeeded(store, "MRF-1", 100).await;
        let request = |amount| sluice_store::RefundRequest {
            payment_id: payment.id.clone(),
            merchant_id: None,
            amount: eur(amount),
            reason: None,
            idempotency_key: None,
        };
        let stuck = store.reserve_refund(&request(40), &sys()).await.unwrap().record;
        store
            .apply_event(&on_refund(&stuck.reference, event(EventKind::RefundUnknown, EvidenceSource::SyncResponse)))
            .await
            .unwrap();
        let reason = "refund UNKNOWN too long";
        store.flag_manual_review(PendingKind::Refund, &stuck.id, reason, &sys()).await.unwrap();
        let alice = store.create_operator("alice", &pepper()).await.unwrap().operator;
        let bob = store.create_operator("bob", &pepper()).await.unwrap().operator;
        let decide = |outcome, target_id: Option<String>, amount_minor| {
            let new = NewProposal {
                payment_id: payment.id.clone(),
                outcome,
                target_id,
                reason_code: "customer_complaint".into(),
                evidence_note: "the customer wrote to support".into(),
                amount_minor,
                psp_reference: None,
                proposed_by: alice.id.clone(),
            };
            let (store, bob) = (store.clone(), bob.id.clone());
            async move {
                let p = store.create_proposal(&new).await.unwrap();
                store.approve_proposal(&p.id, &bob, None).await.unwrap()
            }
        };
        let in_review = || {
            let (store, id) = (store.clone(), payment.id.clone());
            async move { store.get_payment(None, &id).await.unwrap() }
        };

        let manual = decide(ReviewOutcome::ManualRefund, None, Some(20)).await;
        assert_eq!(manual.status, "applied", "{manual:?}");
        let order = in_review().await;
        assert!(order.manual_review, "the UNKNOWN refund still needs an operator");
        assert_eq!(order.manual_review_reason.as_deref(), Some(reason));

        // The stuck refund resolved while the manual refund is still open.
        let failed = decide(ReviewOutcome::RefundFailed, Some(stuck.id.clone()), None).await;
        assert_eq!(failed.status, "applied", "{failed:?}");
        assert_eq!(store.get_refund(&stuck.id).await.unwrap().state, sluice_core::RefundState::Failed);
        assert!(in_review().await.manual_review, "the manual refund is still in flight");

        let sent = store.list_refunds(&payment.id).await.unwrap()
            .into_iter().find(|r| r.id != stuck.id).expect("the manual refund");
        let mut ok = event(EventKind::RefundSucceeded, EvidenceSource::Webhook);
        ok.psp_reference = Some("re_manual".into());
        ok.amount = Some(eur(20));
        store.apply_event(&on_refund(&sent.reference, ok)).await.unwrap();
        assert!(in_review().await.manual_review, "automation never clears the flag");

        let dismissed = decide(ReviewOutcome::Dismiss, None, None).await;
        assert_eq!(dismissed.status, "applied", "{dismissed:?}");
        let order = in_review().await;
        assert!(!order.manual_review);
        assert_eq!(order.manual_review_reason, None);
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.refunded_minor, amounts.refund_reserved_minor), (20, 0));
    }
}
