//! The fulfillment door (issue 7): the payment's success enters
//! awaiting_fulfillment in the same transaction, push and deadline decide
//! through one CAS, the compensation refund is reserved in the decision's
//! transaction, and the database refuses to compensate a fulfilled payment.

use crate::common::*;
use sluice_core::{
    compensation_refund_reference, BusinessFact, CompensationReason, EventKind, EvidenceSource,
    FactReading, FulfillmentDecision, FulfillmentInput, FulfillmentRefusal, FulfillmentState,
    IgnoreReason, RefundState,
};
use sluice_store::{Fulfillment, NewPayment, PaymentAttempt, PaymentOrder, Store, StoreError};

/// Default policy: the deadline settles 10 s after it.
const SETTLE_MS: i64 = 10_000;

async fn fulfillment_payment(
    fx: &Fixture,
    store: &Store,
    order_no: &str,
    biz_key: &str,
    mode: &str,
    deadline: i64,
) -> PaymentOrder {
    store
        .create_payment(
            &NewPayment {
                merchant_id: fx.merchant.id.clone(),
                merchant_order_no: order_no.into(),
                amount: eur(1_000),
                capture_mode: sluice_core::CaptureMode::Automatic,
                payment_method_token: Some("pm_card_visa".into()),
                return_url: None,
                description: None,
                metadata: serde_json::json!({}),
                fulfillment: Fulfillment {
                    biz_key: Some(biz_key.into()),
                    deadline: Some(deadline),
                    mode: Some(mode.into()),
                    ..Fulfillment::default()
                },
            },
            &sys(),
        )
        .await
        .expect("payment")
}

/// A push-mode payment that succeeded (deadline one minute ahead).
async fn paid(
    db: &TestDb,
    fx: &Fixture,
    order_no: &str,
    biz_key: &str,
) -> (PaymentOrder, PaymentAttempt) {
    let store = &db.store;
    let deadline = db.clock.now_ms() + 60_000;
    let payment = fulfillment_payment(fx, store, order_no, biz_key, "push", deadline).await;
    let attempt = fx.attempt(store, &payment).await;
    store
        .apply_event(&on_attempt(
            &attempt,
            event(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse),
        ))
        .await
        .expect("submitted");
    let mut ok = event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse);
    ok.psp_reference = Some(format!("pi_{order_no}"));
    store
        .apply_event(&on_attempt(&attempt, ok))
        .await
        .expect("succeeded");
    (payment, attempt)
}

fn push(reference: &str) -> FulfillmentInput {
    FulfillmentInput::PushConfirmation {
        attributed_to: reference.to_owned(),
    }
}

async fn state_of(store: &Store, payment_id: &str) -> FulfillmentState {
    store
        .fulfillment_snapshot(payment_id)
        .await
        .unwrap()
        .expect("fulfillment block")
        .state
}

dual_test! {
    async fn a_succeeded_payment_with_a_fulfillment_block_awaits_fulfillment_in_the_same_transaction(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = paid(db, &fx, "F-1", "renewal-1").await;
        let snapshot = store.fulfillment_snapshot(&payment.id).await.unwrap().unwrap();
        assert_eq!(snapshot.state, FulfillmentState::AwaitingFulfillment);
        assert_eq!(snapshot.attempt_reference.as_deref(), Some(attempt.reference.as_str()));
        assert_eq!(snapshot.version, 1);
        // The success and the fulfillment's start are one commit: same timeline.
        let timeline = store.timeline(&payment.id).await.unwrap();
        let started = timeline
            .iter()
            .find(|h| h.event_kind == "FULFILLMENT_PAYMENT_SUCCEEDED")
            .expect("fulfillment history row");
        assert_eq!(started.decision, "applied");
        assert_eq!(started.from_state.as_deref(), Some("pending_payment"));
        assert_eq!(started.to_state, "awaiting_fulfillment");
        // Push mode: the next wake-up is when the deadline settles.
        let deadline = payment.fulfillment.deadline.unwrap();
        assert!(store.due_fulfillments(deadline + SETTLE_MS - 1, 10).await.unwrap().is_empty());
        let due = store.due_fulfillments(deadline + SETTLE_MS, 10).await.unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].payment_id, payment.id);
        assert_eq!(due[0].state, "awaiting_fulfillment");
        // A payment without a block has no fulfillment at all.
        let (plain, _) = fx.succeeded(store, "F-plain", 100).await;
        assert!(store.fulfillment_snapshot(&plain.id).await.unwrap().is_none());
    }
}

dual_test! {
    async fn a_push_before_the_deadline_fulfils_and_a_stale_check_afterwards_does_nothing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = paid(db, &fx, "F-2", "renewal-2").await;
        let done = store
            .apply_fulfillment(&payment.id, &push(&attempt.reference), &sys())
            .await
            .unwrap();
        assert_eq!(done.to_state, FulfillmentState::Fulfilled);
        assert!(done.decision.is_apply());
        let events: Vec<_> = store
            .outbox_for_payment(&payment.id)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.event_type)
            .collect();
        assert!(events.iter().any(|t| t == "fulfillment.fulfilled"), "{events:?}");
        // The same confirmation again is an idempotent duplicate.
        let again = store
            .apply_fulfillment(&payment.id, &push(&attempt.reference), &sys())
            .await
            .unwrap();
        assert_eq!(again.decision, FulfillmentDecision::Ignore(IgnoreReason::Duplicate));
        // Long after the deadline a stale scanner task finds nothing to do.
        db.clock.advance(10 * 60_000);
        let stale = store
            .apply_fulfillment(&payment.id, &FulfillmentInput::CheckDue, &sys())
            .await
            .unwrap();
        assert_eq!(stale.decision, FulfillmentDecision::Ignore(IgnoreReason::Stale));
        assert!(store.due_fulfillments(db.clock.now_ms(), 10).await.unwrap().is_empty());
        assert!(store.list_refunds(&payment.id).await.unwrap().is_empty());
        assert_eq!(state_of(store, &payment.id).await, FulfillmentState::Fulfilled);
    }
}

dual_test! {
    async fn the_deadline_without_a_confirmation_starts_exactly_one_compensation_refund_whose_success_compensates(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = paid(db, &fx, "F-3", "renewal-3").await;
        db.clock.advance(60_000 + SETTLE_MS);
        let decided = store
            .apply_fulfillment(&payment.id, &FulfillmentInput::CheckDue, &sys())
            .await
            .unwrap();
        assert_eq!(decided.to_state, FulfillmentState::Compensating);
        let refund = decided.compensation_refund.clone().expect("compensation refund");
        let reference = compensation_refund_reference(&attempt.reference);
        assert_eq!(refund.reference, reference);
        assert_eq!(refund.amount.amount_minor, 1_000);
        assert_eq!(refund.reason.as_deref(), Some("fulfillment_deadline_passed"));
        assert_eq!(refund.state, RefundState::Created);
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!(amounts.refund_reserved_minor, 1_000);
        // The refund is in the recovery scanner's set at once.
        assert_eq!(store.due_refunds(db.clock.now_ms(), 10, None).await.unwrap().len(), 1);
        // A second trigger starts no second refund.
        let second = store
            .apply_fulfillment(&payment.id, &FulfillmentInput::CheckDue, &sys())
            .await
            .unwrap();
        assert!(!second.decision.is_apply());
        assert_eq!(store.list_refunds(&payment.id).await.unwrap().len(), 1);
        // A confirmation now is refused, saying what happens to the money.
        let late = store
            .apply_fulfillment(&payment.id, &push(&attempt.reference), &sys())
            .await
            .unwrap();
        match &late.decision {
            FulfillmentDecision::Reject(refusal @ FulfillmentRefusal::RefundInProgress { refund_reference, reason }) => {
                assert_eq!(refund_reference, &reference);
                assert_eq!(*reason, CompensationReason::FulfillmentDeadlinePassed);
                assert!(refusal.to_string().contains("money is being returned"), "{refusal}");
            }
            other => panic!("expected RefundInProgress, got {other:?}"),
        }
        // The refund's outcome feeds back through the payment door.
        store
            .apply_event(&on_refund(&reference, event(EventKind::RefundProcessing, EvidenceSource::SyncResponse)))
            .await
            .unwrap();
        assert_eq!(state_of(store, &payment.id).await, FulfillmentState::Compensating);
        store
            .apply_event(&on_refund(&reference, event(EventKind::RefundSucceeded, EvidenceSource::Webhook)))
            .await
            .unwrap();
        assert_eq!(state_of(store, &payment.id).await, FulfillmentState::Compensated);
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!((amounts.refunded_minor, amounts.refund_reserved_minor), (1_000, 0));
        let events: Vec<_> = store
            .outbox_for_payment(&payment.id)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.event_type)
            .collect();
        for wanted in ["fulfillment.compensating", "fulfillment.compensated"] {
            assert_eq!(events.iter().filter(|t| *t == wanted).count(), 1, "{wanted}: {events:?}");
        }
        let after = store
            .apply_fulfillment(&payment.id, &push(&attempt.reference), &sys())
            .await
            .unwrap();
        assert!(matches!(after.decision, FulfillmentDecision::Reject(FulfillmentRefusal::Refunded { .. })));
    }
}

dual_test! {
    async fn the_database_refuses_the_compensation_reservation_for_a_fulfilled_payment(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = paid(db, &fx, "F-4", "renewal-4").await;
        store
            .apply_fulfillment(&payment.id, &push(&attempt.reference), &sys())
            .await
            .unwrap();
        // Forcing the reservation past the core: the statement refuses.
        let forced = store.reserve_compensation_refund(&payment.id, &sys()).await;
        assert!(
            matches!(&forced, Err(StoreError::InvalidState { reason, .. }) if reason.contains("never compensated")),
            "{forced:?}"
        );
        assert!(store.list_refunds(&payment.id).await.unwrap().is_empty());
        let amounts = store.payment_amounts(&payment.id).await.unwrap();
        assert_eq!(amounts.refund_reserved_minor, 0);
        // And a raw write that would move it towards a refund is refused too.
        let raw = sqlx::query(
            "UPDATE payment_orders SET fulfillment_state = 'compensating' WHERE id = $1",
        )
        .bind(&payment.id)
        .execute(store.pool())
        .await;
        let message = raw.expect_err("trigger refuses").to_string();
        assert!(message.contains("never compensated"), "{message}");
        assert_eq!(state_of(store, &payment.id).await, FulfillmentState::Fulfilled);
    }
}

dual_test! {
    /// Two instances: the merchant's confirmation and the scanner's deadline
    /// decision land at the same moment. Exactly one wins; the loser is told.
    async fn a_push_racing_the_compensation_decision_has_exactly_one_winner(&db) {
        let store = &db.store;
        let other = db.second_store().await;
        let fx = Fixture::new(store, "Acme").await;
        let mut pushes_won = 0;
        for round in 0..6 {
            let (payment, attempt) = paid(db, &fx, &format!("F-race-{round}"), &format!("goal-{round}")).await;
            db.clock.advance(60_000 + SETTLE_MS);
            let confirm = push(&attempt.reference);
            let provenance = sys();
            let (pushed, checked) = tokio::join!(
                store.apply_fulfillment(&payment.id, &confirm, &provenance),
                other.apply_fulfillment(&payment.id, &FulfillmentInput::CheckDue, &provenance),
            );
            let (pushed, checked) = (pushed.unwrap(), checked.unwrap());
            let refunds = store.list_refunds(&payment.id).await.unwrap();
            match (&pushed.decision, &checked.decision) {
                (FulfillmentDecision::Apply { .. }, FulfillmentDecision::Ignore(IgnoreReason::Stale)) => {
                    pushes_won += 1;
                    assert_eq!(pushed.to_state, FulfillmentState::Fulfilled);
                    assert!(refunds.is_empty(), "round {round}: a fulfilled payment has no refund");
                }
                (FulfillmentDecision::Reject(FulfillmentRefusal::RefundInProgress { .. }), FulfillmentDecision::Apply { .. }) => {
                    assert_eq!(checked.to_state, FulfillmentState::Compensating);
                    assert_eq!(refunds.len(), 1, "round {round}");
                }
                other => panic!("round {round}: not exactly one winner: {other:?}"),
            }
        }
        eprintln!("push won {pushes_won} of 6 races");
    }
}

dual_test! {
    async fn a_goal_reached_by_another_payment_of_the_same_biz_key_refunds_this_one_and_keeps_that_one(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (first, first_attempt) = paid(db, &fx, "F-5a", "ticket-5").await;
        let (second, second_attempt) = paid(db, &fx, "F-5b", "ticket-5").await;
        let kept = store
            .apply_fulfillment(&second.id, &push(&second_attempt.reference), &sys())
            .await
            .unwrap();
        assert_eq!(kept.to_state, FulfillmentState::Fulfilled);
        // The business reports the goal reached by the second payment.
        let now = db.clock.now_ms();
        let fact = FulfillmentInput::Fact(FactReading {
            fact: BusinessFact::Fulfilled { attributed_to: Some(second_attempt.reference.clone()) },
            read_started_at_ms: now,
        });
        let elsewhere = store.apply_fulfillment(&first.id, &fact, &sys()).await.unwrap();
        assert_eq!(elsewhere.to_state, FulfillmentState::Compensating);
        let refund = elsewhere.compensation_refund.expect("refund");
        assert_eq!(refund.reference, compensation_refund_reference(&first_attempt.reference));
        assert_eq!(refund.reason.as_deref(), Some("fulfilled_elsewhere"));
        // A fact naming a stranger freezes automation and raises the alert.
        let (third, _) = paid(db, &fx, "F-5c", "ticket-5c").await;
        let contradiction = FulfillmentInput::Fact(FactReading {
            fact: BusinessFact::Fulfilled { attributed_to: Some("att_nobody_knows".into()) },
            read_started_at_ms: now,
        });
        let frozen = store.apply_fulfillment(&third.id, &contradiction, &sys()).await.unwrap();
        assert_eq!(frozen.to_state, FulfillmentState::ManualReview);
        assert!(frozen.alert);
        assert!(store.list_refunds(&third.id).await.unwrap().is_empty());
        assert!(store.list_refunds(&second.id).await.unwrap().is_empty());
    }
}

dual_test! {
    /// Interleave pushes, business facts, deadline ticks, duplicate triggers
    /// and compensation refund outcomes in pseudo-random orders (fixed seeds),
    /// checking the money invariants after every step, in the database.
    async fn interleaved_inputs_never_refund_a_fulfilled_payment_and_compensate_at_most_once(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let mut endings = std::collections::BTreeMap::<String, u32>::new();
        for seed in 1..=10u64 {
            let mut rng = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let mut next = move |n: u64| {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (rng >> 33) % n
            };
            let goal = format!("goal-interleaved-{seed}");
            let (payment, attempt) = paid(db, &fx, &format!("F-i{seed}a"), &goal).await;
            let (_, sibling) = paid(db, &fx, &format!("F-i{seed}b"), &goal).await;
            let cmp = compensation_refund_reference(&attempt.reference);
            for step in 0..14 {
                let now = db.clock.now_ms();
                let input = match next(7) {
                    0 => Some(push(&attempt.reference)),
                    1 if next(3) == 0 => Some(push(&sibling.reference)),
                    1 => Some(push(&attempt.reference)),
                    2 => Some(FulfillmentInput::CheckDue),
                    3 => Some(FulfillmentInput::Fact(FactReading {
                        fact: match next(3) {
                            0 => BusinessFact::Fulfilled { attributed_to: Some(attempt.reference.clone()) },
                            1 if next(2) == 0 => BusinessFact::Fulfilled { attributed_to: Some(sibling.reference.clone()) },
                            _ => BusinessFact::NotFulfilled,
                        },
                        read_started_at_ms: now,
                    })),
                    4 => {
                        db.clock.advance(20_000);
                        None
                    }
                    5 => {
                        // The refund's own outcome, through the payment door.
                        if store.get_refund_by_reference(&cmp).await.is_ok() {
                            let kind = if next(2) == 0 { EventKind::RefundSucceeded } else { EventKind::RefundProcessing };
                            let _ = store.apply_event(&on_refund(&cmp, event(kind, EvidenceSource::Webhook))).await;
                        }
                        None
                    }
                    _ => {
                        // A stale duplicate of whatever came last.
                        Some(FulfillmentInput::CheckDue)
                    }
                };
                if let Some(input) = input {
                    store.apply_fulfillment(&payment.id, &input, &sys()).await.unwrap();
                }
                let state = state_of(store, &payment.id).await;
                let refunds = store.list_refunds(&payment.id).await.unwrap();
                let context = format!("seed {seed} step {step}: {state:?} {refunds:?}");
                assert!(refunds.len() <= 1, "{context}");
                assert!(refunds.iter().all(|r| r.reference == cmp), "{context}");
                match state {
                    FulfillmentState::Fulfilled => assert!(refunds.is_empty(), "{context}"),
                    FulfillmentState::Compensating => assert_eq!(refunds.len(), 1, "{context}"),
                    FulfillmentState::Compensated => {
                        assert_eq!(refunds.len(), 1, "{context}");
                        assert_eq!(refunds[0].state, RefundState::Succeeded, "{context}");
                    }
                    _ => {}
                }
            }
            *endings.entry(state_of(store, &payment.id).await.to_string()).or_default() += 1;
        }
        // The seeds reach both outcomes, so the invariants were really exercised.
        assert!(endings.contains_key("fulfilled"), "{endings:?}");
        assert!(
            endings.contains_key("compensated") || endings.contains_key("compensating"),
            "{endings:?}"
        );
    }
}

/// A paid push-mode payment whose fulfillment froze in manual_review: the
/// business named an attempt nobody knows.
async fn frozen(db: &TestDb, fx: &Fixture, order_no: &str) -> (PaymentOrder, PaymentAttempt) {
    let store = &db.store;
    let (payment, attempt) = paid(db, fx, order_no, &format!("goal-{order_no}")).await;
    let contradiction = FulfillmentInput::Fact(FactReading {
        fact: BusinessFact::Fulfilled {
            attributed_to: Some("att_nobody_knows".into()),
        },
        read_started_at_ms: db.clock.now_ms(),
    });
    let frozen = store
        .apply_fulfillment(&payment.id, &contradiction, &sys())
        .await
        .unwrap();
    assert_eq!(frozen.to_state, FulfillmentState::ManualReview);
    (payment, attempt)
}

fn operator_proposal(
    payment: &PaymentOrder,
    outcome: sluice_store::ReviewOutcome,
    reason_code: &str,
    by: &str,
) -> sluice_store::NewProposal {
    sluice_store::NewProposal {
        payment_id: payment.id.clone(),
        outcome,
        target_id: None,
        reason_code: reason_code.into(),
        evidence_note: "the business's ledger shows no renewal for this payment".into(),
        amount_minor: None,
        psp_reference: None,
        proposed_by: by.to_owned(),
    }
}

fn operator_pepper() -> sluice_store::ApiKeyPepper {
    sluice_store::ApiKeyPepper::new("fulfillment-review-pepper-0123456789").unwrap()
}

dual_test! {
    async fn two_operators_resolve_a_frozen_fulfillment_with_a_compensation_refund_through_the_door(&db) {
        use sluice_store::{ReviewError, ReviewOutcome};
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = frozen(db, &fx, "F-OP-1").await;
        let alice = store.create_operator("alice", &operator_pepper()).await.unwrap().operator;
        let bob = store.create_operator("bob", &operator_pepper()).await.unwrap().operator;

        // The reason code must name a compensation reason.
        let vague = store
            .create_proposal(&operator_proposal(&payment, ReviewOutcome::FulfillmentCompensate,
                "looks_wrong", &alice.id))
            .await;
        assert!(matches!(vague, Err(ReviewError::NotApplicable(_))), "{vague:?}");

        let proposed = store
            .create_proposal(&operator_proposal(&payment, ReviewOutcome::FulfillmentCompensate,
                "fulfillment_deadline_passed", &alice.id))
            .await
            .unwrap();
        let own = store.approve_proposal(&proposed.id, &alice.id, None).await;
        assert!(matches!(own, Err(ReviewError::SameOperator)), "{own:?}");
        assert_eq!(state_of(store, &payment.id).await, FulfillmentState::ManualReview);
        assert!(store.list_refunds(&payment.id).await.unwrap().is_empty(), "one person moves nothing");

        let approved = store.approve_proposal(&proposed.id, &bob.id, None).await.unwrap();
        assert_eq!(approved.status, "applied");
        assert_eq!(state_of(store, &payment.id).await, FulfillmentState::Compensating);
        let refunds = store.list_refunds(&payment.id).await.unwrap();
        assert_eq!(refunds.len(), 1);
        assert_eq!(refunds[0].reference, compensation_refund_reference(&attempt.reference));
        assert_eq!(refunds[0].amount.amount_minor, 1_000);
        assert_eq!(refunds[0].state, RefundState::Created);
        assert_eq!(approved.result.as_ref().unwrap()["refund_id"], refunds[0].id.as_str());
        let timeline = store.timeline(&payment.id).await.unwrap();
        let resolution = timeline
            .iter()
            .find(|h| h.event_kind == "FULFILLMENT_OPERATOR")
            .expect("the resolution went through the fulfillment door");
        assert_eq!(resolution.decision, "applied");
        assert_eq!(resolution.to_state, "compensating");
        assert_eq!(resolution.actor.as_deref(), Some("operator:alice+operator:bob"));
    }
}

dual_test! {
    async fn an_operator_fulfillment_resolution_is_refused_unless_the_fulfillment_is_frozen(&db) {
        use sluice_store::{ReviewError, ReviewOutcome};
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _attempt) = paid(db, &fx, "F-OP-2", "goal-F-OP-2").await;
        let alice = store.create_operator("alice", &operator_pepper()).await.unwrap().operator;
        let refused = store
            .create_proposal(&operator_proposal(&payment, ReviewOutcome::FulfillmentFulfilled,
                "business_ledger", &alice.id))
            .await;
        assert!(matches!(refused, Err(ReviewError::NotApplicable(_))), "{refused:?}");
        assert_eq!(state_of(store, &payment.id).await, FulfillmentState::AwaitingFulfillment);

        // Frozen, then resolved as fulfilled by two people: no refund, ever.
        let (frozen_payment, _) = frozen(db, &fx, "F-OP-3").await;
        let bob = store.create_operator("bob", &operator_pepper()).await.unwrap().operator;
        let proposed = store
            .create_proposal(&operator_proposal(&frozen_payment, ReviewOutcome::FulfillmentFulfilled,
                "business_ledger", &alice.id))
            .await
            .unwrap();
        store.approve_proposal(&proposed.id, &bob.id, None).await.unwrap();
        assert_eq!(state_of(store, &frozen_payment.id).await, FulfillmentState::Fulfilled);
        let later = store
            .apply_fulfillment(&frozen_payment.id, &FulfillmentInput::CheckDue, &sys())
            .await
            .unwrap();
        assert!(!later.decision.is_apply());
        assert!(store.list_refunds(&frozen_payment.id).await.unwrap().is_empty());
    }
}

dual_test! {
    async fn resolving_a_frozen_fulfillment_leaves_a_payment_flagged_for_a_reconciliation_difference_in_review(&db) {
        use sluice_store::{PendingKind, ReviewOutcome};
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = frozen(db, &fx, "F-OP-4").await;
        let reason = "settlement report: the PSP settled 900, we recorded 1000";
        store
            .flag_reconciliation_review(PendingKind::Attempt, &attempt.id, reason, &sys())
            .await
            .unwrap();
        let alice = store.create_operator("alice", &operator_pepper()).await.unwrap().operator;
        let bob = store.create_operator("bob", &operator_pepper()).await.unwrap().operator;
        let proposed = store
            .create_proposal(&operator_proposal(&payment, ReviewOutcome::FulfillmentFulfilled,
                "business_ledger", &alice.id))
            .await
            .unwrap();
        let approved = store.approve_proposal(&proposed.id, &bob.id, None).await.unwrap();
        assert_eq!(approved.status, "applied", "{approved:?}");
        assert_eq!(state_of(store, &payment.id).await, FulfillmentState::Fulfilled);
        let order = store.get_payment(None, &payment.id).await.unwrap();
        assert!(order.manual_review, "the difference was never looked at");
        assert_eq!(order.manual_review_reason.as_deref(), Some(reason));
        assert!(approved.result.as_ref().unwrap().get("review_cleared_history_id").is_none());
    }
}

/// The merchant's own (after-sales) refund of `amount`, settled by the PSP.
async fn merchant_refund(store: &Store, payment: &PaymentOrder, amount: i64) {
    let reserved = store
        .reserve_refund(
            &sluice_store::RefundRequest {
                payment_id: payment.id.clone(),
                merchant_id: None,
                amount: eur(amount),
                reason: Some("customer asked".into()),
                idempotency_key: None,
            },
            &sys(),
        )
        .await
        .expect("merchant refund");
    store
        .apply_event(&on_refund(
            &reserved.record.reference,
            event(EventKind::RefundSucceeded, EvidenceSource::Webhook),
        ))
        .await
        .expect("refund succeeded");
}

dual_test! {
    async fn a_payment_the_merchant_already_refunded_in_full_goes_to_review_instead_of_a_compensation(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, _attempt) = paid(db, &fx, "F-NTR-1", "renewal-ntr-1").await;
        merchant_refund(store, &payment, 1_000).await;
        db.clock.advance(60_000 + SETTLE_MS);
        let decided = store
            .apply_fulfillment(&payment.id, &FulfillmentInput::CheckDue, &sys())
            .await
            .unwrap();
        assert_eq!(decided.to_state, FulfillmentState::ManualReview);
        assert!(decided.compensation_refund.is_none());
        assert!(!decided.alert, "nothing contradicts: no alert");
        assert!(matches!(
            decided.snapshot.review,
            Some(sluice_core::ReviewReason::NothingLeftToRefund { refunded_minor: 1_000 })
        ));
        assert_eq!(store.list_refunds(&payment.id).await.unwrap().len(), 1, "only the merchant's");
        // Frozen: the next wake-up changes nothing.
        let again = store
            .apply_fulfillment(&payment.id, &FulfillmentInput::CheckDue, &sys())
            .await
            .unwrap();
        assert_eq!(again.to_state, FulfillmentState::ManualReview);
        assert_eq!(store.list_refunds(&payment.id).await.unwrap().len(), 1);
    }
}

dual_test! {
    async fn a_partly_refunded_payment_is_compensated_with_what_is_left(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = paid(db, &fx, "F-NTR-2", "renewal-ntr-2").await;
        merchant_refund(store, &payment, 400).await;
        db.clock.advance(60_000 + SETTLE_MS);
        let decided = store
            .apply_fulfillment(&payment.id, &FulfillmentInput::CheckDue, &sys())
            .await
            .unwrap();
        assert_eq!(decided.to_state, FulfillmentState::Compensating);
        let refund = decided.compensation_refund.expect("compensation refund");
        assert_eq!(refund.reference, compensation_refund_reference(&attempt.reference));
        assert_eq!(refund.amount.amount_minor, 600, "never more than is left");
    }
}
