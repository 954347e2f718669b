//! The details of single decisions: effects, amounts, identities, cascades.

mod common;

use common::*;
use sluice_core::matrix::{self, Row};
use sluice_core::*;

use AttemptState as A;
use EventKind as K;
use EvidenceSource as E;
use OrderState as O;

fn sale_order(state: A) -> OrderSnapshot {
    order(order_for(state), amounts_for(state))
}

#[test]
fn a_sale_success_records_authorized_and_captured_and_emits_payment_succeeded_once() {
    let ev = PaymentEvent {
        psp_reference: Some("pi_1".into()),
        amount: Some(eur(PAYMENT)),
        ..event(K::PaymentSucceeded, E::Webhook)
    };
    let decision = decide_attempt(
        &sale_order(A::Processing),
        &attempt(A::Processing, CaptureMode::Automatic),
        &ev,
    );
    assert_eq!(
        decision,
        Decision::Apply {
            new_state: A::Succeeded,
            cascade: Cascade {
                attempt: None,
                order: Some(O::Succeeded)
            },
            effects: vec![
                Effect::RecordSale {
                    amount_minor: PAYMENT
                },
                Effect::Emit(OutboxEvent::PaymentSucceeded),
                Effect::RecordPspReference {
                    psp_reference: "pi_1".into()
                },
            ],
            rule: "money taken: the sale succeeded",
        }
    );
    let amounts = Amounts::default().apply_all(decision.effects()).unwrap();
    assert_eq!((amounts.authorized, amounts.captured), (PAYMENT, PAYMENT));
}

#[test]
fn a_timeout_makes_the_attempt_unknown_keeps_the_order_processing_and_schedules_a_query() {
    let decision = decide_attempt(
        &sale_order(A::Submitted),
        &attempt(A::Submitted, CaptureMode::Automatic),
        &event(K::ResultUnknown, E::SyncResponse),
    );
    match decision {
        Decision::Apply {
            new_state,
            cascade,
            effects,
            ..
        } => {
            assert_eq!(new_state, A::Unknown);
            assert_eq!(cascade.order, None, "the order stays PROCESSING");
            assert_eq!(effects, vec![Effect::ScheduleQuery]);
        }
        other => panic!("expected Apply, got {other:?}"),
    }
}

#[test]
fn an_attempt_failure_leaves_the_order_open_and_emits_attempt_failed_not_payment_failed() {
    let decision = decide_attempt(
        &sale_order(A::Processing),
        &attempt(A::Processing, CaptureMode::Automatic),
        &event(K::PaymentFailed, E::SyncResponse),
    );
    assert_eq!(summarize(&decision), X::To(A::Failed, Cascade::default()));
    assert_eq!(emitted(&decision), vec![OutboxEvent::PaymentAttemptFailed]);
}

#[test]
fn a_void_releases_the_authorization_and_cancels_the_order() {
    let decision = decide_attempt(
        &sale_order(A::Authorized),
        &attempt(A::Authorized, CaptureMode::Manual),
        &event(K::PaymentCanceled, E::SyncResponse),
    );
    assert_eq!(
        decision.effects(),
        &[
            Effect::VoidAuthorization,
            Effect::Emit(OutboxEvent::PaymentCanceled)
        ]
    );
    let amounts = amounts_for(A::Authorized)
        .apply_all(decision.effects())
        .unwrap();
    assert_eq!(amounts.authorized, 0);
}

#[test]
fn requires_action_records_where_the_customer_must_go() {
    let ev = PaymentEvent {
        next_action_url: Some("https://psp.example/3ds/1".into()),
        ..event(K::CustomerActionRequired, E::SyncResponse)
    };
    let decision = decide_attempt(
        &sale_order(A::Submitted),
        &attempt(A::Submitted, CaptureMode::Automatic),
        &ev,
    );
    assert!(decision.effects().contains(&Effect::RecordNextAction {
        url: "https://psp.example/3ds/1".into()
    }));
    assert!(emitted(&decision).contains(&OutboxEvent::PaymentRequiresAction));
}

#[test]
fn a_success_for_another_amount_needs_reconciliation() {
    let ev = PaymentEvent {
        amount: Some(eur(999)),
        ..event(K::PaymentSucceeded, E::Webhook)
    };
    let decision = decide_attempt(
        &sale_order(A::Processing),
        &attempt(A::Processing, CaptureMode::Automatic),
        &ev,
    );
    assert_eq!(
        decision,
        Decision::NeedsReconciliation(ReconciliationReason::AmountMismatch {
            expected: eur(PAYMENT),
            got: eur(999)
        })
    );
}

#[test]
fn a_success_in_another_currency_needs_reconciliation() {
    let usd = Money {
        amount_minor: PAYMENT,
        currency: Currency::parse("USD").unwrap(),
    };
    let ev = PaymentEvent {
        amount: Some(usd),
        ..event(K::PaymentSucceeded, E::Webhook)
    };
    let decision = decide_attempt(
        &sale_order(A::Processing),
        &attempt(A::Processing, CaptureMode::Automatic),
        &ev,
    );
    assert!(matches!(
        decision,
        Decision::NeedsReconciliation(ReconciliationReason::AmountMismatch { .. })
    ));
}

#[test]
fn an_event_about_another_psp_payment_needs_reconciliation() {
    let snapshot = AttemptSnapshot {
        psp_reference: Some("pi_1".into()),
        ..attempt(A::Processing, CaptureMode::Automatic)
    };
    let ev = PaymentEvent {
        psp_reference: Some("pi_2".into()),
        ..event(K::PaymentSucceeded, E::Webhook)
    };
    let decision = decide_attempt(&sale_order(A::Processing), &snapshot, &ev);
    assert!(matches!(
        decision,
        Decision::NeedsReconciliation(ReconciliationReason::PspReferenceMismatch { .. })
    ));
}

#[test]
fn a_capture_report_of_a_sale_is_matched_by_its_payment_reference() {
    // Adyen's CAPTURE item of an automatic sale: pspReference is the
    // capture's own, originalReference the payment's.
    let snapshot = AttemptSnapshot {
        psp_reference: Some("pi_1".into()),
        ..attempt(A::Processing, CaptureMode::Automatic)
    };
    let ev = PaymentEvent {
        psp_reference: Some("cap_9".into()),
        psp_payment_reference: Some("pi_1".into()),
        ..event(K::PaymentCaptured, E::Webhook)
    };
    let decision = decide_attempt(&sale_order(A::Processing), &snapshot, &ev);
    assert!(decision.is_apply(), "{decision:?}");
    let other_payment = PaymentEvent {
        psp_payment_reference: Some("pi_2".into()),
        ..ev
    };
    assert!(matches!(
        decide_attempt(&sale_order(A::Processing), &snapshot, &other_payment),
        Decision::NeedsReconciliation(ReconciliationReason::PspReferenceMismatch { .. })
    ));
}

#[test]
fn an_event_naming_another_attempt_is_rejected() {
    let ev = PaymentEvent {
        attempt_reference: Some("att_other".into()),
        ..event(K::PaymentSucceeded, E::Webhook)
    };
    let decision = decide_attempt(
        &sale_order(A::Processing),
        &attempt(A::Processing, CaptureMode::Automatic),
        &ev,
    );
    assert!(matches!(
        decision,
        Decision::Reject(RejectReason::ReferenceMismatch { .. })
    ));
}

#[test]
fn the_same_notification_again_is_a_duplicate_even_when_the_state_would_allow_it() {
    // REQUIRES_ACTION → PROCESSING is legal, but this exact notification was
    // already the last one accepted.
    let ev = PaymentEvent {
        provider_event_id: Some("evt_1".into()),
        ..event(K::PaymentProcessing, E::Webhook)
    };
    let snapshot = AttemptSnapshot {
        last_event: Some(EventIdentity::of(&ev)),
        ..attempt(A::RequiresAction, CaptureMode::Automatic)
    };
    let decision = decide_attempt(&sale_order(A::RequiresAction), &snapshot, &ev);
    assert_eq!(decision, Decision::Ignore(IgnoreReason::Duplicate));
}

#[test]
fn the_same_fact_under_a_new_notification_id_is_a_business_duplicate() {
    let first = PaymentEvent {
        provider_event_id: Some("evt_1".into()),
        psp_reference: Some("pi_1".into()),
        ..event(K::PaymentProcessing, E::Webhook)
    };
    let again = PaymentEvent {
        provider_event_id: Some("evt_2".into()),
        evidence: E::Query,
        ..first.clone()
    };
    assert!(EventIdentity::of(&first).same_as(&EventIdentity::of(&again)));
    let other_result = PaymentEvent {
        kind: K::CustomerActionRequired,
        ..again.clone()
    };
    assert!(!EventIdentity::of(&first).same_as(&EventIdentity::of(&other_result)));
}

#[test]
fn a_refund_success_settles_its_reservation_and_never_touches_the_payment() {
    let amounts = Amounts {
        authorized: PAYMENT,
        captured: PAYMENT,
        refund_reserved: 300,
        ..Amounts::default()
    };
    let decision = decide_refund(
        &order(O::Succeeded, amounts),
        &refund(RefundState::Processing, 300),
        &event(K::RefundSucceeded, E::Webhook),
    );
    match &decision {
        Decision::Apply {
            new_state,
            cascade,
            effects,
            ..
        } => {
            assert_eq!(*new_state, RefundState::Succeeded);
            assert_eq!(*cascade, Cascade::default());
            assert_eq!(
                effects,
                &vec![
                    Effect::SettleRefund { amount_minor: 300 },
                    Effect::Emit(OutboxEvent::RefundSucceeded)
                ]
            );
        }
        other => panic!("expected Apply, got {other:?}"),
    }
    let after = amounts.apply_all(decision.effects()).unwrap();
    assert_eq!((after.refunded, after.refund_reserved), (300, 0));
}

#[test]
fn a_refund_failure_releases_its_reservation() {
    let amounts = Amounts {
        authorized: PAYMENT,
        captured: PAYMENT,
        refund_reserved: 300,
        ..Amounts::default()
    };
    let decision = decide_refund(
        &order(O::Succeeded, amounts),
        &refund(RefundState::Unknown, 300),
        &event(K::RefundFailed, E::Query),
    );
    let after = amounts.apply_all(decision.effects()).unwrap();
    assert_eq!((after.refunded, after.refund_reserved), (0, 0));
    assert_eq!(emitted(&decision), vec![OutboxEvent::RefundFailed]);
}

#[test]
fn a_refund_success_without_its_reservation_needs_reconciliation() {
    // The store's amounts disagree with the refund row: never settle money
    // that was not reserved.
    let amounts = Amounts {
        authorized: PAYMENT,
        captured: PAYMENT,
        ..Amounts::default()
    };
    let decision = decide_refund(
        &order(O::Succeeded, amounts),
        &refund(RefundState::Processing, 300),
        &event(K::RefundSucceeded, E::Webhook),
    );
    assert!(matches!(
        decision,
        Decision::NeedsReconciliation(ReconciliationReason::AmountInvariant(_))
    ));
}

#[test]
fn a_second_capture_on_a_succeeded_attempt_moves_only_the_capture() {
    let amounts = Amounts {
        authorized: PAYMENT,
        captured: 400,
        capture_reserved: 600,
        ..Amounts::default()
    };
    let decision = decide_capture(
        &order(O::Succeeded, amounts),
        &attempt(A::Succeeded, CaptureMode::Manual),
        &capture(CaptureState::Processing, 600),
        &event(K::PaymentCaptured, E::Webhook),
    );
    assert_eq!(
        summarize(&decision),
        X::To(CaptureState::Succeeded, Cascade::default())
    );
    assert_eq!(emitted(&decision), vec![OutboxEvent::PaymentCaptured]);
    let after = amounts.apply_all(decision.effects()).unwrap();
    assert_eq!((after.captured, after.capture_reserved), (PAYMENT, 0));
}

#[test]
fn the_first_capture_makes_the_payment_succeeded_and_says_so_once() {
    let amounts = Amounts {
        authorized: PAYMENT,
        capture_reserved: 400,
        ..Amounts::default()
    };
    let decision = decide_capture(
        &order(O::Authorized, amounts),
        &attempt(A::Authorized, CaptureMode::Manual),
        &capture(CaptureState::Processing, 400),
        &event(K::PaymentCaptured, E::SyncResponse),
    );
    assert_eq!(
        emitted(&decision),
        vec![OutboxEvent::PaymentCaptured, OutboxEvent::PaymentSucceeded]
    );
}

#[test]
fn a_capture_success_on_a_voided_attempt_needs_reconciliation() {
    // Amounts as if the reservation were still there, so only the attempt's
    // state can refuse the cascade.
    let amounts = Amounts {
        authorized: PAYMENT,
        capture_reserved: 400,
        ..Amounts::default()
    };
    let decision = decide_capture(
        &order(O::Canceled, amounts),
        &attempt(A::Canceled, CaptureMode::Manual),
        &capture(CaptureState::Processing, 400),
        &event(K::PaymentCaptured, E::Webhook),
    );
    assert_eq!(
        decision,
        Decision::NeedsReconciliation(ReconciliationReason::CaptureOnClosedAttempt(A::Canceled))
    );
}

#[test]
fn a_closed_order_cannot_follow_an_attempt_that_moves_on() {
    assert_eq!(
        order_after(O::Failed, A::Unknown, A::Succeeded),
        Err(ReconciliationReason::OrderClosed {
            order: O::Failed,
            attempt: A::Succeeded
        })
    );
    assert_eq!(
        order_after(O::Succeeded, A::Succeeded, A::Succeeded),
        Ok(None)
    );
}

#[test]
#[rustfmt::skip]
fn the_order_mirrors_its_attempt_as_written_down() {
    // (attempt from, attempt to, order before, order after)
    let table = [
        (A::Created, A::Submitted, O::Created, Some(O::Processing)),
        (A::Submitted, A::Unknown, O::Processing, None),
        (A::Unknown, A::Processing, O::Processing, None),
        (A::Processing, A::RequiresAction, O::Processing, Some(O::RequiresAction)),
        (A::RequiresAction, A::Processing, O::RequiresAction, Some(O::Processing)),
        (A::Processing, A::Authorized, O::Processing, Some(O::Authorized)),
        (A::Authorized, A::Succeeded, O::Authorized, Some(O::Succeeded)),
        (A::Unknown, A::Succeeded, O::Processing, Some(O::Succeeded)),
        (A::RequiresAction, A::Failed, O::RequiresAction, Some(O::Processing)),
        (A::Processing, A::Failed, O::Processing, None),
        (A::Authorized, A::Canceled, O::Authorized, Some(O::Canceled)),
        (A::RequiresAction, A::Canceled, O::RequiresAction, Some(O::Processing)),
    ];
    for (from, to, before, after) in table {
        assert_eq!(order_after(before, from, to), Ok(after), "{from} → {to} with order {before}");
    }
}

/// Every row must be the first match for at least one (state, kind,
/// evidence); a row that never wins is dead text that misleads an auditor.
fn assert_no_shadowed_rows<S: Copy + PartialEq + std::fmt::Debug>(
    name: &str,
    table: &'static [Row<S>],
) {
    for (index, row) in table.iter().enumerate() {
        let wins = row.from.iter().any(|state| {
            row.kinds.iter().any(|kind| {
                row.evidence.iter().any(|evidence| {
                    matrix::resolve(table, *state, *kind, *evidence)
                        .is_ok_and(|found| std::ptr::eq(found, row))
                })
            })
        });
        assert!(
            wins,
            "{name} row {index} ({}) is shadowed by earlier rows",
            row.rule
        );
    }
}

/// Every state × kind of an aggregate has a rule for at least one evidence source.
fn assert_complete<S: Copy + PartialEq + std::fmt::Debug>(
    name: &str,
    table: &'static [Row<S>],
    states: &[S],
    kinds: &[EventKind],
) {
    for state in states {
        for kind in kinds {
            let any = EvidenceSource::ALL
                .iter()
                .any(|e| matrix::resolve(table, *state, *kind, *e).is_ok());
            assert!(any, "{name}: no rule for {state:?} + {kind}");
        }
    }
}

#[test]
fn every_matrix_row_is_reachable_and_every_state_and_kind_has_a_rule() {
    assert_no_shadowed_rows("attempt", matrix::ATTEMPT_MATRIX);
    assert_no_shadowed_rows("refund", matrix::REFUND_MATRIX);
    assert_no_shadowed_rows("capture", matrix::CAPTURE_MATRIX);
    assert_complete(
        "attempt",
        matrix::ATTEMPT_MATRIX,
        AttemptState::ALL,
        matrix::ATTEMPT_KINDS,
    );
    assert_complete(
        "refund",
        matrix::REFUND_MATRIX,
        RefundState::ALL,
        matrix::REFUND_KINDS,
    );
    assert_complete(
        "capture",
        matrix::CAPTURE_MATRIX,
        CaptureState::ALL,
        matrix::CAPTURE_KINDS,
    );
}

#[test]
fn only_rules_that_leave_a_terminal_state_in_place_start_from_one() {
    // Terminal states are never left: a row from a terminal state may only
    // keep it (a recorded chargeback) or ignore / flag the event.
    for row in matrix::ATTEMPT_MATRIX {
        for from in row.from.iter().filter(|s| s.is_terminal()) {
            if let matrix::Outcome::To(to) = row.outcome {
                assert_eq!(to, *from, "attempt row '{}' leaves {from}", row.rule);
            }
        }
    }
    for row in matrix::REFUND_MATRIX {
        for from in row.from.iter().filter(|s| s.is_terminal()) {
            assert!(
                !matches!(row.outcome, matrix::Outcome::To(to) if to != *from),
                "refund row '{}'",
                row.rule
            );
        }
    }
    for row in matrix::CAPTURE_MATRIX {
        for from in row.from.iter().filter(|s| s.is_terminal()) {
            assert!(
                !matches!(row.outcome, matrix::Outcome::To(to) if to != *from),
                "capture row '{}'",
                row.rule
            );
        }
    }
}

#[test]
fn events_are_routed_to_the_aggregate_they_are_about() {
    let with_action = |kind| PaymentEvent {
        action_reference: Some("cap_1".into()),
        ..event(kind, E::Webhook)
    };
    let table = [
        (
            event(K::RefundSucceeded, E::Webhook),
            CaptureMode::Automatic,
            Aggregate::Refund,
        ),
        (
            event(K::RefundUnknown, E::SyncResponse),
            CaptureMode::Manual,
            Aggregate::Refund,
        ),
        (
            event(K::PaymentCaptured, E::Webhook),
            CaptureMode::Manual,
            Aggregate::Capture,
        ),
        (
            event(K::PaymentCaptured, E::Webhook),
            CaptureMode::Automatic,
            Aggregate::Attempt,
        ),
        (
            with_action(K::ResultUnknown),
            CaptureMode::Manual,
            Aggregate::Capture,
        ),
        (
            event(K::ResultUnknown, E::SyncResponse),
            CaptureMode::Manual,
            Aggregate::Attempt,
        ),
        (
            event(K::PaymentSucceeded, E::Webhook),
            CaptureMode::Manual,
            Aggregate::Attempt,
        ),
        (
            event(K::Chargeback, E::Webhook),
            CaptureMode::Manual,
            Aggregate::Attempt,
        ),
    ];
    for (ev, mode, expected) in table {
        assert_eq!(route_event(&ev, mode), expected, "{} in {mode:?}", ev.kind);
    }
}

#[test]
fn the_rendered_matrix_lists_every_row_in_match_order() {
    let text = matrix::to_markdown(matrix::ATTEMPT_MATRIX);
    assert_eq!(text.lines().count(), matrix::ATTEMPT_MATRIX.len() + 2);
    assert!(text.contains(
        "| UNKNOWN | PAYMENT_SUCCEEDED | webhook, query, operator, reconciliation | → SUCCEEDED | RecordSale, emit payment.succeeded | verified success resolves UNKNOWN |"
    ));
}
