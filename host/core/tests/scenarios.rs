//! Seed 001 §12 scenarios at the decision level, plus the order commands and
//! the client projection.

mod common;

use common::*;
use sluice_core::*;

use AttemptState as A;
use EventKind as K;
use EvidenceSource as E;
use OrderState as O;

fn success(evidence: EvidenceSource, provider_event_id: Option<&str>) -> PaymentEvent {
    PaymentEvent {
        psp_reference: Some("pi_1".into()),
        amount: Some(eur(PAYMENT)),
        provider_event_id: provider_event_id.map(str::to_owned),
        raw_status: "succeeded".into(),
        ..PaymentEvent::new(K::PaymentSucceeded, evidence)
    }
}

fn processing_webhook(provider_event_id: &str) -> PaymentEvent {
    PaymentEvent {
        psp_reference: Some("pi_1".into()),
        provider_event_id: Some(provider_event_id.into()),
        raw_status: "processing".into(),
        ..PaymentEvent::new(K::PaymentProcessing, E::Webhook)
    }
}

#[test]
fn scenario_a_timeout_then_query_success_then_a_late_processing_webhook_is_stale() {
    let mut payment = Sim::new(A::Submitted, CaptureMode::Automatic);

    let timeout = PaymentEvent {
        failure: Some(Failure {
            category: FailureCategory::Unknown,
            code: "timeout".into(),
            message: "no answer within 10s".into(),
        }),
        ..PaymentEvent::new(K::ResultUnknown, E::SyncResponse)
    };
    let d1 = payment.feed(&timeout);
    assert_eq!(d1.label(), "applied");
    assert_eq!(payment.attempt.state, A::Unknown);
    assert_eq!(
        payment.order.state,
        O::Processing,
        "UNKNOWN never reaches the order"
    );
    assert!(d1.effects().contains(&Effect::ScheduleQuery));
    assert_eq!(client_status(&payment.view()), ClientStatus::Processing);

    let d2 = payment.feed(&success(E::Query, None));
    assert_eq!(d2.label(), "applied");
    assert_eq!(payment.attempt.state, A::Succeeded);
    assert_eq!(payment.order.state, O::Succeeded);

    let d3 = payment.feed(&processing_webhook("evt_late"));
    assert_eq!(d3, Decision::Ignore(IgnoreReason::Stale));
    assert_eq!(payment.attempt.state, A::Succeeded, "never rolls back");

    assert_eq!(payment.outbox, vec![OutboxEvent::PaymentSucceeded]);
    assert_eq!(
        (
            payment.order.amounts.authorized,
            payment.order.amounts.captured
        ),
        (PAYMENT, PAYMENT)
    );
    assert_eq!(client_status(&payment.view()), ClientStatus::Succeeded);
}

#[test]
fn scenario_b_processing_then_success_then_a_duplicate_success_publishes_one_success() {
    let mut payment = Sim::new(A::Submitted, CaptureMode::Automatic);

    assert_eq!(
        payment.feed(&processing_webhook("evt_1")).label(),
        "applied"
    );
    assert_eq!(payment.attempt.state, A::Processing);

    let succeeded = success(E::Webhook, Some("evt_2"));
    assert_eq!(payment.feed(&succeeded).label(), "applied");
    assert_eq!(payment.attempt.state, A::Succeeded);

    // The PSP redelivers the same notification...
    assert_eq!(
        payment.feed(&succeeded),
        Decision::Ignore(IgnoreReason::Duplicate)
    );
    // ...and a query later tells the same fact again.
    assert_eq!(
        payment.feed(&success(E::Query, None)),
        Decision::Ignore(IgnoreReason::Duplicate)
    );

    assert_eq!(payment.outbox, vec![OutboxEvent::PaymentSucceeded]);
    assert_eq!(
        payment.order.amounts.captured, PAYMENT,
        "captured once, not twice"
    );
}

#[test]
fn scenario_c_two_concurrent_refunds_of_70_on_100_captured_reserve_only_once() {
    let captured = Amounts {
        authorized: 100,
        captured: 100,
        ..Amounts::default()
    };
    let payment = order(O::Succeeded, captured);
    // Both requests read the same snapshot and both look fine on their own...
    let first = request_refund(&payment, eur(70)).unwrap();
    let second = request_refund(&payment, eur(70)).unwrap();
    // ...but the reservation is applied to the current amounts (the store's
    // conditional UPDATE), and only one fits.
    let after_first = captured.apply(&first).unwrap();
    assert_eq!(
        after_first.apply(&second),
        Err(AmountError::ExceedsRefundable {
            requested: 70,
            available: 30
        })
    );
    let reread = order(O::Succeeded, after_first);
    assert!(matches!(
        request_refund(&reread, eur(70)),
        Err(RequestRefused::Amount(
            AmountError::ExceedsRefundable { .. }
        ))
    ));
}

#[test]
fn scenario_e_an_unknown_attempt_blocks_a_new_attempt_until_a_query_proves_failure() {
    let mut payment = Sim::new(A::Submitted, CaptureMode::Automatic);
    payment.feed(&PaymentEvent::new(K::ResultUnknown, E::SyncResponse));
    assert_eq!(
        decide_order(
            &payment.order,
            Some(payment.attempt.state),
            OrderCommand::StartAttempt
        ),
        Decision::Reject(RejectReason::AttemptInFlight(A::Unknown))
    );
    // A sync "declined" cannot close the UNKNOWN; a verified query can.
    assert!(matches!(
        payment.feed(&event(K::PaymentFailed, E::SyncResponse)),
        Decision::Reject(RejectReason::EvidenceNotAllowed { .. })
    ));
    payment.feed(&event(K::PaymentFailed, E::Query));
    assert_eq!(payment.attempt.state, A::Failed);
    assert_eq!(payment.order.state, O::Processing);
    assert_eq!(client_status(&payment.view()), ClientStatus::Failed);
    assert!(decide_order(&payment.order, Some(A::Failed), OrderCommand::StartAttempt).is_apply());
}

#[test]
#[rustfmt::skip]
fn a_new_attempt_is_allowed_only_after_the_latest_one_ended_without_money() {
    let open = order(O::Processing, Amounts::default());
    let table = [
        (None, "applied"),
        (Some(A::Created), "rejected"),
        (Some(A::Submitted), "rejected"),
        (Some(A::Processing), "rejected"),
        (Some(A::RequiresAction), "rejected"),
        (Some(A::Authorized), "rejected"),
        (Some(A::Succeeded), "rejected"),
        (Some(A::Failed), "applied"),
        (Some(A::Canceled), "applied"),
        (Some(A::Unknown), "rejected"),
    ];
    for (latest, expected) in table {
        assert_eq!(decide_order(&open, latest, OrderCommand::StartAttempt).label(), expected, "latest attempt {latest:?}");
    }
}

#[test]
fn closing_commands_end_an_open_order_and_repeat_as_duplicates() {
    let open = order(O::Processing, Amounts::default());
    let cases = [
        (
            OrderCommand::Cancel,
            O::Canceled,
            OutboxEvent::PaymentCanceled,
        ),
        (
            OrderCommand::Expire,
            O::Expired,
            OutboxEvent::PaymentExpired,
        ),
        (OrderCommand::GiveUp, O::Failed, OutboxEvent::PaymentFailed),
    ];
    for (command, closed, outbox) in cases {
        let decision = decide_order(&open, Some(A::Failed), command);
        assert_eq!(
            summarize(&decision),
            X::To(closed, Cascade::default()),
            "{command:?}"
        );
        assert_eq!(emitted(&decision), vec![outbox]);
        let again = decide_order(&order(closed, Amounts::default()), Some(A::Failed), command);
        assert_eq!(
            again,
            Decision::Ignore(IgnoreReason::Duplicate),
            "{command:?} again"
        );
    }
}

#[test]
fn a_closed_order_refuses_other_commands_and_an_open_attempt_blocks_closing() {
    let succeeded = order(O::Succeeded, amounts_for(A::Succeeded));
    assert_eq!(
        decide_order(&succeeded, Some(A::Succeeded), OrderCommand::Cancel),
        Decision::Reject(RejectReason::OrderClosed(O::Succeeded))
    );
    let authorized = order(O::Authorized, amounts_for(A::Authorized));
    assert_eq!(
        decide_order(&authorized, Some(A::Authorized), OrderCommand::Cancel),
        Decision::Reject(RejectReason::AttemptInFlight(A::Authorized)),
        "an authorization must be voided at the PSP first"
    );
    let waiting = order(O::RequiresAction, Amounts::default());
    assert_eq!(
        decide_order(&waiting, Some(A::RequiresAction), OrderCommand::Expire),
        Decision::Reject(RejectReason::AttemptInFlight(A::RequiresAction))
    );
}

#[test]
fn refund_capture_and_void_requests_check_state_currency_and_amounts() {
    let usd = Money {
        amount_minor: 10,
        currency: Currency::parse("USD").unwrap(),
    };
    let processing = order(O::Processing, Amounts::default());
    assert_eq!(
        request_refund(&processing, eur(10)),
        Err(RequestRefused::NotRefundable(O::Processing))
    );
    let succeeded = order(O::Succeeded, amounts_for(A::Succeeded));
    assert!(matches!(
        request_refund(&succeeded, usd),
        Err(RequestRefused::Money(MoneyError::CurrencyMismatch { .. }))
    ));
    assert_eq!(
        request_refund(&succeeded, eur(PAYMENT)),
        Ok(Effect::ReserveRefund {
            amount_minor: PAYMENT
        })
    );

    let authorized = order(O::Authorized, amounts_for(A::Authorized));
    let manual = attempt(A::Authorized, CaptureMode::Manual);
    assert_eq!(
        request_capture(
            &authorized,
            &attempt(A::Authorized, CaptureMode::Automatic),
            eur(10)
        ),
        Err(RequestRefused::AutomaticCapture)
    );
    assert_eq!(
        request_capture(&authorized, &manual, eur(400)),
        Ok(Effect::ReserveCapture { amount_minor: 400 })
    );
    assert!(matches!(
        request_capture(&authorized, &manual, eur(PAYMENT + 1)),
        Err(RequestRefused::Amount(
            AmountError::ExceedsCapturable { .. }
        ))
    ));
    assert_eq!(request_void(&authorized, &manual), Ok(()));
    let capturing = order(
        O::Authorized,
        Amounts {
            authorized: PAYMENT,
            capture_reserved: 400,
            ..Amounts::default()
        },
    );
    assert_eq!(
        request_void(&capturing, &manual),
        Err(RequestRefused::Amount(AmountError::CaptureInFlight(400)))
    );
}

#[test]
fn only_a_refund_that_was_never_sent_can_be_canceled() {
    let created = refund(RefundState::Created, 300);
    let decision = cancel_unsent_refund(&created);
    assert_eq!(
        decision.effects(),
        &[Effect::ReleaseRefund { amount_minor: 300 }]
    );
    assert_eq!(
        cancel_unsent_refund(&refund(RefundState::Unknown, 300)),
        Decision::Reject(RejectReason::AlreadySent(Aggregate::Refund))
    );
    assert_eq!(
        cancel_unsent_refund(&refund(RefundState::Canceled, 300)),
        Decision::Ignore(IgnoreReason::Duplicate)
    );
}

#[test]
#[rustfmt::skip]
fn the_client_status_never_claims_more_than_the_evidence() {
    let none = Amounts::default();
    let sold = amounts_for(A::Succeeded);
    let part = Amounts { refunded: 300, ..sold };
    let all = Amounts { refunded: PAYMENT, ..sold };
    let reserved_only = Amounts { refund_reserved: PAYMENT, ..sold };
    let table = [
        (O::Created, None, none, false, ClientStatus::Created),
        (O::Processing, Some(A::Created), none, false, ClientStatus::Processing),
        (O::Processing, Some(A::Submitted), none, false, ClientStatus::Processing),
        (O::Processing, Some(A::Unknown), none, false, ClientStatus::Processing),
        (O::Processing, Some(A::Failed), none, false, ClientStatus::Failed),
        (O::Processing, Some(A::Canceled), none, false, ClientStatus::Failed),
        (O::RequiresAction, Some(A::RequiresAction), none, false, ClientStatus::RequiresAction),
        (O::Authorized, Some(A::Authorized), amounts_for(A::Authorized), false, ClientStatus::Authorized),
        (O::Succeeded, Some(A::Succeeded), sold, false, ClientStatus::Succeeded),
        (O::Succeeded, Some(A::Succeeded), reserved_only, false, ClientStatus::Succeeded),
        (O::Succeeded, Some(A::Succeeded), part, false, ClientStatus::PartiallyRefunded),
        (O::Succeeded, Some(A::Succeeded), all, false, ClientStatus::Refunded),
        (O::Succeeded, Some(A::Succeeded), sold, true, ClientStatus::ManualReview),
        (O::Failed, Some(A::Failed), none, false, ClientStatus::Failed),
        (O::Canceled, Some(A::Canceled), none, false, ClientStatus::Canceled),
        (O::Expired, None, none, false, ClientStatus::Expired),
    ];
    for (order, latest_attempt, amounts, manual_review, expected) in table {
        let view = PaymentView { order, latest_attempt, amounts, manual_review };
        assert_eq!(client_status(&view), expected, "{view:?}");
    }
    assert_eq!(refund_client_status(RefundState::Unknown), "pending");
}
