//! End to end through the real adapters and the stateful sandbox PSP, with
//! its signed webhooks delivered over HTTP to the webhook route.

use std::time::Duration;

use crate::common::eventually;
use crate::e2e_test;
use sluice_core::{AttemptState, CaptureMode, CaptureState, ClientStatus, RefundState};
use sluice_orchestrator::{ConfirmOptions, Target, Trigger};
use sluice_sandbox_psp::RefundBehaviour;

const CONVERGE: Duration = Duration::from_secs(20);

e2e_test! {
    async fn authorize_then_capture(e2e) {
        let view = e2e.create("e2e-auth", 2500, CaptureMode::Manual, "pm_card_visa").await;
        assert_eq!(view.status, ClientStatus::Authorized);
        let payment_id = view.details.order.id.clone();
        let reference = view.details.attempts[0].reference.clone();

        let captured = e2e.orch.capture(&e2e.merchant.id, &payment_id, None).await.unwrap();
        let capture_id = captured.capture.id.clone();
        // Stripe answers the capture at once; Adyen only by notification.
        let capture = eventually(CONVERGE, "the capture to succeed", || async {
            let capture = e2e.db.store.get_capture(&capture_id).await.unwrap();
            (capture.state == CaptureState::Succeeded).then_some(capture)
        })
        .await;
        assert_eq!(capture.amount.amount_minor, 2500);
        e2e.settle_webhooks().await;
        let view = e2e.view(&payment_id).await;
        assert_eq!(view.status, ClientStatus::Succeeded);
        assert_eq!(view.details.amounts.captured_minor, 2500);
        assert_eq!(e2e.sandbox.charge_count(&reference), 1);
        assert_eq!(e2e.sandbox.payment_count(&reference), 1);
    }
}

e2e_test! {
    async fn a_sale_succeeds_once_and_its_webhooks_change_nothing(e2e) {
        let view = e2e.create("e2e-sale", 1800, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(view.status, ClientStatus::Succeeded);
        let payment_id = view.details.order.id.clone();
        let reference = view.details.attempts[0].reference.clone();
        e2e.settle_webhooks().await;
        let view = e2e.view(&payment_id).await;
        assert_eq!(view.status, ClientStatus::Succeeded, "{:?}", view.details.order);
        assert!(!view.details.order.manual_review);
        assert_eq!(view.details.amounts.captured_minor, 1800);
        assert_eq!(e2e.sandbox.charge_count(&reference), 1);
        let succeeded = e2e
            .db
            .store
            .outbox_for_payment(&payment_id)
            .await
            .unwrap()
            .into_iter()
            .filter(|m| m.event_type == "payment.succeeded")
            .count();
        assert_eq!(succeeded, 1);
    }
}

e2e_test! {
    async fn a_decline_fails_the_attempt_and_new_details_succeed(e2e) {
        let view = e2e.create("e2e-decline", 900, CaptureMode::Automatic, "pm_card_chargeDeclined").await;
        assert_eq!(view.status, ClientStatus::Failed);
        let first = view.details.attempts[0].clone();
        assert_eq!(first.state, AttemptState::Failed);
        assert_eq!(e2e.sandbox.charge_count(&first.reference), 0);

        let options = ConfirmOptions {
            payment_method_token: Some("pm_card_visa".into()),
            ..ConfirmOptions::default()
        };
        let view = e2e.orch.confirm(&e2e.merchant.id, &view.details.order.id, &options).await.unwrap();
        assert_eq!(view.status, ClientStatus::Succeeded);
        let second = &view.details.attempts[1];
        assert_eq!(e2e.sandbox.charge_count(&second.reference), 1);
        e2e.settle_webhooks().await;
        let view = e2e.view(&view.details.order.id).await;
        assert_eq!(view.status, ClientStatus::Succeeded);
        assert_eq!(view.details.attempts[0].state, AttemptState::Failed);
    }
}

e2e_test! {
    async fn commit_then_timeout_converges_through_a_query_with_one_charge(e2e) {
        // Only the host's query may resolve it: no webhooks.
        e2e.webhooks_off();
        let view = e2e
            .create("e2e-timeout", 3100, CaptureMode::Manual, "pm_sluice_commit_then_timeout")
            .await;
        assert_eq!(view.status, ClientStatus::Processing);
        let attempt = view.details.attempts[0].clone();
        assert_eq!(attempt.state, AttemptState::Unknown);

        let advanced = e2e
            .orch
            .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
            .await
            .unwrap();
        assert_eq!(advanced.state_after, "AUTHORIZED", "{advanced:?}");
        let view = e2e.view(&view.details.order.id).await;
        assert_eq!(view.status, ClientStatus::Authorized);
        assert_eq!(view.details.amounts.authorized_minor, 3100);
        assert_eq!(e2e.sandbox.charge_count(&attempt.reference), 1);
        assert_eq!(e2e.sandbox.payment_count(&attempt.reference), 1);
    }
}

e2e_test! {
    async fn a_refund_is_settled_by_its_webhook(e2e) {
        e2e.sandbox.set_refund_behaviour(RefundBehaviour::PendingThenSucceed);
        let view = e2e.create("e2e-refund", 5000, CaptureMode::Manual, "pm_card_visa").await;
        let payment_id = view.details.order.id.clone();
        let captured = e2e.orch.capture(&e2e.merchant.id, &payment_id, None).await.unwrap();
        let capture_id = captured.capture.id;
        eventually(CONVERGE, "the capture", || async {
            let capture = e2e.db.store.get_capture(&capture_id).await.unwrap();
            (capture.state == CaptureState::Succeeded).then_some(())
        })
        .await;

        let refund = e2e
            .orch
            .refund(&e2e.merchant.id, &payment_id, Some(crate::common::eur(2000)), None)
            .await
            .unwrap();
        assert_eq!(refund.status, "pending", "{:?}", refund.refund);
        let refund_id = refund.refund.id.clone();
        let refund = eventually(CONVERGE, "the refund's webhook", || async {
            let refund = e2e.db.store.get_refund(&refund_id).await.unwrap();
            (refund.state == RefundState::Succeeded).then_some(refund)
        })
        .await;
        let timeline = e2e.db.store.timeline(&payment_id).await.unwrap();
        let settled_by = timeline
            .iter()
            .find(|e| e.aggregate_id == refund_id && e.to_state == "SUCCEEDED" && e.decision == "applied")
            .unwrap();
        assert_eq!(settled_by.evidence_source, "webhook");
        e2e.settle_webhooks().await;
        let view = e2e.view(&payment_id).await;
        assert_eq!(view.details.amounts.refunded_minor, 2000);
        assert_eq!(view.details.amounts.refund_reserved_minor, 0);
        assert_eq!(view.status, ClientStatus::PartiallyRefunded);
        assert_eq!(e2e.sandbox.refund_count(&refund.reference), 1);
    }
}

e2e_test! {
    async fn a_duplicate_and_out_of_order_webhook_storm_converges_to_one_result(e2e) {
        e2e.storm();
        let modes = [
            CaptureMode::Manual,
            CaptureMode::Automatic,
            CaptureMode::Manual,
            CaptureMode::Automatic,
        ];
        let mut payments = Vec::new();
        for (i, mode) in modes.into_iter().enumerate() {
            let view = e2e
                .create(&format!("e2e-storm-{i}"), 1000 + i as i64, mode, "pm_card_visa")
                .await;
            if mode == CaptureMode::Manual {
                e2e.orch
                    .capture(&e2e.merchant.id, &view.details.order.id, None)
                    .await
                    .unwrap();
            }
            payments.push((view.details.order.id.clone(), mode));
        }
        e2e.settle_webhooks().await;
        for (payment_id, mode) in &payments {
            let view = eventually(CONVERGE, "the payment to settle", || async {
                let view = e2e.view(payment_id).await;
                (view.status == ClientStatus::Succeeded).then_some(view)
            })
            .await;
            assert!(!view.details.order.manual_review, "{:?}", view.details.order);
            let amount = view.details.order.amount.amount_minor;
            assert_eq!(view.details.amounts.captured_minor, amount);
            let reference = &view.details.attempts[0].reference;
            assert_eq!(e2e.sandbox.charge_count(reference), 1);
            let outbox = e2e.db.store.outbox_for_payment(payment_id).await.unwrap();
            let expected: &[(&str, usize)] = match mode {
                CaptureMode::Manual => &[
                    ("payment.authorized", 1),
                    ("payment.captured", 1),
                    ("payment.succeeded", 1),
                ],
                CaptureMode::Automatic => &[
                    ("payment.authorized", 0),
                    ("payment.captured", 0),
                    ("payment.succeeded", 1),
                ],
            };
            for (event_type, count) in expected {
                assert_eq!(
                    outbox.iter().filter(|m| m.event_type == *event_type).count(),
                    *count,
                    "{event_type} for a {mode:?} payment"
                );
            }
        }
        let deliveries = e2e.sandbox.deliveries();
        assert!(
            deliveries.iter().any(|d| d.copy > 1),
            "the storm sent duplicates"
        );
        let refused: Vec<_> = deliveries
            .iter()
            .filter(|d| !d.acknowledged)
            .map(|d| (&d.status, &d.response_body))
            .collect();
        assert!(refused.is_empty(), "every delivery acknowledged: {refused:?}");
    }
}

e2e_test! {
    async fn an_expired_customer_step_is_canceled_at_the_psp_through_the_adapter(e2e) {
        let view = e2e
            .create("e2e-3ds-expired", 1300, CaptureMode::Automatic, "pm_card_threeDSecureRequired")
            .await;
        assert_eq!(view.details.attempts[0].state, AttemptState::RequiresAction);
        let payment_id = view.details.order.id.clone();
        let attempt = view.details.attempts[0].clone();

        let state = e2e.orch.cancel_expired_attempt(&payment_id, &attempt.id).await.unwrap();
        // Stripe cancels synchronously; Adyen only acknowledges the cancel
        // (`received`, normalised to processing) and confirms by notification,
        // which may already have landed when the call returns.
        let allowed: &[AttemptState] = match e2e.psp {
            Psp::Stripe => &[AttemptState::Canceled],
            Psp::Adyen => &[AttemptState::Processing, AttemptState::Canceled],
        };
        assert!(allowed.contains(&state), "{state:?}");
        // Stripe answers the cancel at once; Adyen by its CANCELLATION notification.
        eventually(CONVERGE, "the attempt to be canceled", || async {
            let attempt = e2e.db.store.get_attempt(&attempt.id).await.unwrap();
            (attempt.state == AttemptState::Canceled).then_some(())
        })
        .await;
        let at_psp: Vec<_> = e2e
            .sandbox
            .payments()
            .into_iter()
            .filter(|p| p.reference == attempt.reference)
            .collect();
        assert_eq!(at_psp.len(), 1);
        assert_eq!(at_psp[0].status, sluice_sandbox_psp::PayStatus::Canceled);
        assert_eq!(e2e.sandbox.charge_count(&attempt.reference), 0, "no money was taken");

        // Closing an attempt that is no longer waiting for the customer is a no-op.
        let again = e2e.orch.cancel_expired_attempt(&payment_id, &attempt.id).await.unwrap();
        assert_eq!(again, AttemptState::Canceled);
    }
}

/// Issue 11 §3: the Adyen-format query replays the creation; it used to replay it with
/// `manualCapture=true` whatever the attempt's capture mode, so a sale that never reached
/// the PSP was executed by its "query" as an authorization and left the customer's funds
/// held with the attempt AUTHORIZED forever. The query now replays exactly the sale.
mod a_query_of_a_lost_sale_replays_the_sale_and_never_authorizes_only {
    use super::*;
    use crate::common::sandbox::{E2e, Psp};
    use sluice_core::AttemptState;

    async fn run(e2e: E2e) {
        e2e.webhooks_off();
        e2e.transport.lose_next_creation();
        let view = e2e
            .create(
                "e2e-lost-sale",
                2100,
                CaptureMode::Automatic,
                "pm_card_visa",
            )
            .await;
        let attempt = view.details.attempts[0].clone();
        assert_eq!(attempt.state, AttemptState::Unknown, "{attempt:?}");
        assert_eq!(
            e2e.sandbox.payment_count(&attempt.reference),
            0,
            "the sale never reached the PSP"
        );

        // The recovery scanner queries with the original reference.
        let attempt = eventually(CONVERGE, "the attempt to converge", || async {
            e2e.orch
                .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
                .await
                .expect("advance");
            let now = e2e.db.store.get_attempt(&attempt.id).await.unwrap();
            now.state.is_terminal().then_some(now)
        })
        .await;
        assert_eq!(attempt.state, AttemptState::Succeeded);

        // At the PSP: one payment, captured, never an authorization waiting for a
        // capture nobody will send.
        let payments: Vec<_> = e2e
            .sandbox
            .payments()
            .into_iter()
            .filter(|p| p.reference == attempt.reference)
            .collect();
        assert_eq!(payments.len(), 1, "{payments:?}");
        assert!(!payments[0].manual_capture, "{:?}", payments[0]);
        assert_eq!(payments[0].amount_capturable, 0, "{:?}", payments[0]);
        assert_eq!(payments[0].amount_received, 2100, "{:?}", payments[0]);
        assert_eq!(e2e.sandbox.charge_count(&attempt.reference), 1);
        let view = e2e.view(&view.details.order.id).await;
        assert_eq!(view.status, ClientStatus::Succeeded);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn adyen_on_sqlite() {
        run(E2e::start(
            crate::common::test_subject(sluice_store::Backend::Sqlite).await,
            Psp::Adyen,
        )
        .await)
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn adyen_on_postgres() {
        run(E2e::start(
            crate::common::test_subject(sluice_store::Backend::Postgres).await,
            Psp::Adyen,
        )
        .await)
        .await;
    }
}
