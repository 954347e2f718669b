//! Issue 11 §4 (seed 000 §6): a Stripe-format attempt, refund or capture
//! recorded as sent by a process killed before the request left. The query proves the
//! PSP has no such object; within the connector's resend window recovery
//! re-sends the original request with the same Idempotency-Key, and the
//! payment converges without a person and with exactly one charge. Outside
//! the window (or with none declared) nothing is re-sent.

use sluice_core::{
    AttemptState, CaptureMode, CaptureState, EventKind, EvidenceSource, PaymentEvent, RefundState,
};
use sluice_orchestrator::{Action, CreatePayment, Target, Trigger};
use sluice_store::{
    ApplyEvent, CaptureRequest, EventTarget, NewAttempt, PaymentAttempt, Provenance, RefundRequest,
};

use crate::common::eur;
use crate::common::sandbox::{E2e, Psp};

/// Declare the connector's resend window (the PSP keeps keys that long).
async fn declare_resend_window(e2e: &E2e, window_ms: Option<i64>) {
    let mut config = e2e.account.config.clone();
    if let Some(window_ms) = window_ms {
        config["resend_window_ms"] = serde_json::json!(window_ms.to_string());
    }
    e2e.db
        .store
        .update_connector_account(&e2e.account.id, Some(&config), None, None)
        .await
        .expect("account config");
}

/// What a process killed right after recording the send leaves behind.
async fn recorded_but_never_sent(e2e: &E2e, order_no: &str) -> PaymentAttempt {
    let create = CreatePayment {
        merchant_order_no: order_no.into(),
        amount: eur(1300),
        capture_mode: CaptureMode::Automatic,
        payment_method_token: Some("pm_card_visa".into()),
        return_url: None,
        description: None,
        metadata: serde_json::json!({}),
        fulfillment: Default::default(),
        confirm: None,
    };
    let created = e2e
        .orch
        .create_payment(&e2e.merchant.id, create)
        .await
        .expect("create payment");
    let store = &e2e.db.store;
    let provenance = Provenance::actor("system:api");
    let attempt = store
        .create_attempt(
            &NewAttempt {
                payment_id: created.view.details.order.id.clone(),
                connector_account_id: e2e.account.id.clone(),
                ..NewAttempt::default()
            },
            &provenance,
        )
        .await
        .expect("attempt");
    record(
        e2e,
        EventTarget::Attempt(attempt.reference.clone()),
        EventKind::AttemptSubmitted,
        &attempt.reference,
        None,
    )
    .await;
    store.get_attempt(&attempt.id).await.expect("attempt")
}

async fn record(
    e2e: &E2e,
    target: EventTarget,
    kind: EventKind,
    attempt_reference: &str,
    action_reference: Option<&str>,
) {
    e2e.db
        .store
        .apply_event(&ApplyEvent {
            target,
            event: PaymentEvent {
                attempt_reference: Some(attempt_reference.to_owned()),
                action_reference: action_reference.map(str::to_owned),
                raw_status: "submitted".into(),
                ..PaymentEvent::new(kind, EvidenceSource::SyncResponse)
            },
            provenance: Provenance::actor("system:api"),
            inbox_id: None,
            next_retry_time: None,
        })
        .await
        .expect("recorded as sent");
}

async fn a_killed_send_is_re_sent_with_the_same_key_and_charges_once(e2e: E2e) {
    declare_resend_window(&e2e, Some(23 * 3_600_000)).await;
    let attempt = recorded_but_never_sent(&e2e, "o-resend").await;
    assert_eq!(attempt.state, AttemptState::Submitted);
    assert_eq!(
        e2e.sandbox.payment_count(&attempt.reference),
        0,
        "nothing left"
    );

    let advanced = e2e
        .orch
        .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
        .await
        .expect("recover");
    assert!(
        matches!(advanced.action, Action::Resent { .. }),
        "{advanced:?}"
    );
    let after = e2e.db.store.get_attempt(&attempt.id).await.unwrap();
    assert_eq!(
        after.state,
        AttemptState::Succeeded,
        "converged without a person"
    );
    assert_eq!(
        e2e.sandbox.charge_count(&attempt.reference),
        1,
        "exactly one charge"
    );
    let again = e2e
        .orch
        .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
        .await
        .unwrap();
    assert_eq!(again.action, Action::Final);
    assert_eq!(e2e.sandbox.payment_count(&attempt.reference), 1);

    // A refund recorded as sent by a killed process: the same exit.
    let refund = e2e
        .db
        .store
        .reserve_refund(
            &RefundRequest {
                payment_id: attempt.payment_id.clone(),
                merchant_id: Some(e2e.merchant.id.clone()),
                amount: eur(500),
                reason: None,
                idempotency_key: None,
            },
            &Provenance::actor("system:api"),
        )
        .await
        .expect("refund reserved")
        .record;
    record(
        &e2e,
        EventTarget::Refund(refund.reference.clone()),
        EventKind::RefundProcessing,
        &attempt.reference,
        Some(&refund.reference),
    )
    .await;
    let advanced = e2e
        .orch
        .advance(Target::Refund(refund.id.clone()), Trigger::Scanner)
        .await
        .expect("recover the refund");
    assert!(
        matches!(advanced.action, Action::Resent { .. }),
        "{advanced:?}"
    );
    let refund = e2e.db.store.get_refund(&refund.id).await.unwrap();
    assert_eq!(refund.state, RefundState::Succeeded);
    let psp = e2e
        .sandbox
        .payments()
        .into_iter()
        .find(|p| p.reference == attempt.reference)
        .expect("the PSP's payment");
    assert_eq!(psp.amount_refunded, 500, "refunded once");
}

/// Found by the kill -9 test (CI, stop 19): a capture recorded as sent by a
/// process killed before the request left stayed PROCESSING until an
/// operator, because the query of an uncaptured payment proved nothing.
async fn a_killed_capture_is_re_sent_with_the_same_key_and_captures_once(e2e: E2e) {
    declare_resend_window(&e2e, Some(23 * 3_600_000)).await;
    let view = e2e
        .create(
            "o-capture-resend",
            2400,
            CaptureMode::Manual,
            "pm_card_visa",
        )
        .await;
    let payment_id = view.details.order.id.clone();
    let attempt = view.details.attempts[0].clone();
    assert_eq!(attempt.state, AttemptState::Authorized);
    let capture = e2e
        .db
        .store
        .reserve_capture(
            &CaptureRequest {
                payment_id: payment_id.clone(),
                merchant_id: Some(e2e.merchant.id.clone()),
                amount: eur(1500),
                idempotency_key: None,
            },
            &Provenance::actor("system:api"),
        )
        .await
        .expect("capture reserved")
        .record;
    record(
        &e2e,
        EventTarget::Capture(capture.reference.clone()),
        EventKind::AttemptSubmitted,
        &attempt.reference,
        Some(&capture.reference),
    )
    .await;
    let recorded = e2e.db.store.get_capture(&capture.id).await.unwrap();
    assert_eq!(recorded.state, CaptureState::Processing);

    let advanced = e2e
        .orch
        .advance(Target::Capture(capture.id.clone()), Trigger::Scanner)
        .await
        .expect("recover the capture");
    assert!(
        matches!(advanced.action, Action::Resent { .. }),
        "{advanced:?}"
    );
    let after = e2e.db.store.get_capture(&capture.id).await.unwrap();
    assert_eq!(
        after.state,
        CaptureState::Succeeded,
        "converged without a person"
    );
    let psp = || {
        e2e.sandbox
            .payments()
            .into_iter()
            .find(|p| p.reference == attempt.reference)
            .expect("the PSP's payment")
    };
    assert_eq!(
        psp().amount_received,
        1500,
        "captured once, the amount asked"
    );

    // Recovery looks again: the capture is final, nothing is sent.
    let again = e2e
        .orch
        .advance(Target::Capture(capture.id.clone()), Trigger::Scanner)
        .await
        .unwrap();
    assert_eq!(again.action, Action::Final);
    assert_eq!(psp().amount_received, 1500);
    assert_eq!(e2e.sandbox.charge_count(&attempt.reference), 1);
}

async fn without_a_resend_window_nothing_is_re_sent(e2e: E2e) {
    declare_resend_window(&e2e, None).await;
    let attempt = recorded_but_never_sent(&e2e, "o-no-resend").await;
    let advanced = e2e
        .orch
        .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
        .await
        .unwrap();
    assert!(
        matches!(advanced.action, Action::Queried { .. }),
        "{advanced:?}"
    );
    let after = e2e.db.store.get_attempt(&attempt.id).await.unwrap();
    assert_eq!(
        after.state,
        AttemptState::Unknown,
        "queried on, then a person by age"
    );
    assert_eq!(
        e2e.sandbox.payment_count(&attempt.reference),
        0,
        "never sent"
    );

    // A window shorter than the attempt's age is no window.
    declare_resend_window(&e2e, Some(1)).await;
    let advanced = e2e
        .orch
        .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
        .await
        .unwrap();
    assert!(
        matches!(advanced.action, Action::Queried { .. }),
        "{advanced:?}"
    );
    assert_eq!(e2e.sandbox.payment_count(&attempt.reference), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stripe_format_send_killed_before_it_left_is_re_sent_with_the_same_key_on_sqlite() {
    let e2e = E2e::start(
        crate::common::test_subject(sluice_store::Backend::Sqlite).await,
        Psp::Stripe,
    )
    .await;
    a_killed_send_is_re_sent_with_the_same_key_and_charges_once(e2e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stripe_format_send_killed_before_it_left_is_re_sent_with_the_same_key_on_postgres() {
    let e2e = E2e::start(
        crate::common::test_subject(sluice_store::Backend::Postgres).await,
        Psp::Stripe,
    )
    .await;
    a_killed_send_is_re_sent_with_the_same_key_and_charges_once(e2e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_declared_resend_window_a_killed_send_is_only_queried_on_sqlite() {
    let e2e = E2e::start(
        crate::common::test_subject(sluice_store::Backend::Sqlite).await,
        Psp::Stripe,
    )
    .await;
    without_a_resend_window_nothing_is_re_sent(e2e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_declared_resend_window_a_killed_send_is_only_queried_on_postgres() {
    let e2e = E2e::start(
        crate::common::test_subject(sluice_store::Backend::Postgres).await,
        Psp::Stripe,
    )
    .await;
    without_a_resend_window_nothing_is_re_sent(e2e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stripe_format_capture_killed_before_it_left_is_re_sent_with_the_same_key_on_sqlite() {
    let e2e = E2e::start(
        crate::common::test_subject(sluice_store::Backend::Sqlite).await,
        Psp::Stripe,
    )
    .await;
    a_killed_capture_is_re_sent_with_the_same_key_and_captures_once(e2e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stripe_format_capture_killed_before_it_left_is_re_sent_with_the_same_key_on_postgres() {
    let e2e = E2e::start(
        crate::common::test_subject(sluice_store::Backend::Postgres).await,
        Psp::Stripe,
    )
    .await;
    a_killed_capture_is_re_sent_with_the_same_key_and_captures_once(e2e).await;
}
