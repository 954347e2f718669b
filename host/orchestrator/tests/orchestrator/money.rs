//! Captures and refunds: reservations before any PSP call, amounts that can
//! never be over-refunded, and refunds whose outcome is unknown.

use std::time::Duration;

use crate::common::*;
use sluice_core::{CaptureMode, CaptureState, ClientStatus, RefundState};
use sluice_orchestrator::{OrchestratorError, Target, Trigger};

dual_test! {
    async fn two_concurrent_refunds_of_70_on_100_captured_one_accepted_one_refused(db) {
        let h = Harness::new(db).await;
        let payment_id = h.paid("m-1", 100, CaptureMode::Automatic).await;
        let (a, b) = tokio::join!(
            h.orch.refund(&h.merchant.id, &payment_id, Some(eur(70)), Some("first".into())),
            h.orch.refund(&h.merchant.id, &payment_id, Some(eur(70)), Some("second".into())),
        );
        let (accepted, refused): (Vec<_>, Vec<_>) = [a, b].into_iter().partition(Result::is_ok);
        assert_eq!(accepted.len(), 1, "exactly one refund reserved");
        match refused.into_iter().next().unwrap() {
            Err(OrchestratorError::InsufficientRefundable { requested, available }) => {
                assert_eq!(requested, 70);
                assert!(available <= 30, "available {available}");
            }
            other => panic!("expected InsufficientRefundable, got {other:?}"),
        }
        let refund = accepted.into_iter().next().unwrap().unwrap();
        assert_eq!(refund.refund.state, RefundState::Succeeded);
        assert_eq!(refund.status, "succeeded");
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.details.amounts.refunded_minor, 70);
        assert_eq!(view.details.amounts.refund_reserved_minor, 0);
        assert_eq!(view.details.refunds.len(), 1, "the refused request left no row");
        assert_eq!(view.status, ClientStatus::PartiallyRefunded);
        assert_eq!(h.psp.refunds().len(), 1);
    }
}

dual_test! {
    async fn a_partial_capture_then_refunds_count_against_the_captured_amount_only(db) {
        let h = Harness::new(db).await;
        let payment_id = h.paid("m-2", 100, CaptureMode::Manual).await;
        let captured = h.orch.capture(&h.merchant.id, &payment_id, Some(eur(60))).await.unwrap();
        assert_eq!(captured.capture.state, CaptureState::Succeeded);
        assert_eq!(captured.payment.status, ClientStatus::Succeeded);
        let amounts = captured.payment.details.amounts;
        assert_eq!((amounts.authorized_minor, amounts.captured_minor), (100, 60));
        assert_eq!(h.psp.captures().len(), 1);
        assert_eq!(h.psp.captures()[0].2, 60);

        match h.orch.refund(&h.merchant.id, &payment_id, Some(eur(70)), None).await {
            Err(OrchestratorError::InsufficientRefundable { requested, available }) => {
                assert_eq!((requested, available), (70, 60));
            }
            other => panic!("expected InsufficientRefundable, got {other:?}"),
        }
        let first = h.orch.refund(&h.merchant.id, &payment_id, Some(eur(40)), None).await.unwrap();
        assert_eq!(first.refund.state, RefundState::Succeeded);
        let rest = h.orch.refund(&h.merchant.id, &payment_id, None, None).await.unwrap();
        assert_eq!(rest.refund.amount.amount_minor, 20, "None refunds what is left of the capture");
        assert_eq!(rest.payment.status, ClientStatus::Refunded);
        assert!(matches!(
            h.orch.refund(&h.merchant.id, &payment_id, Some(eur(1)), None).await,
            Err(OrchestratorError::InsufficientRefundable { available: 0, .. })
        ));
        let refunded: i64 = h.psp.refunds().iter().map(|r| r.amount).sum();
        assert_eq!(refunded, 60);
    }
}

dual_test! {
    async fn a_capture_or_refund_in_another_currency_is_refused_and_reserves_nothing(db) {
        let h = Harness::new(db).await;
        let payment_id = h.paid("m-3", 100, CaptureMode::Automatic).await;
        let usd = sluice_core::Money::positive(10, sluice_core::Currency::parse("USD").unwrap()).unwrap();
        assert!(matches!(
            h.orch.refund(&h.merchant.id, &payment_id, Some(usd), None).await,
            Err(OrchestratorError::InvalidRequest(_))
        ));
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.details.amounts.refund_reserved_minor, 0);
        assert!(view.details.refunds.is_empty());
        assert!(h.psp.refunds().is_empty());
    }
}

dual_test! {
    async fn a_refund_timeout_is_refund_unknown_keeps_the_reservation_and_a_query_converges(db) {
        let h = Harness::new(db).await;
        let payment_id = h.paid("m-4", 100, CaptureMode::Automatic).await;
        h.psp.set_mode(PspRoute::Refunds, Mode::TimeoutAfterCommit(Duration::from_secs(3)));
        let view = h.orch.refund(&h.merchant.id, &payment_id, Some(eur(30)), None).await.unwrap();
        assert_eq!(view.refund.state, RefundState::Unknown);
        assert_eq!(view.status, "pending", "UNKNOWN is shown as pending, never failed");
        let amounts = view.payment.details.amounts;
        assert_eq!((amounts.refund_reserved_minor, amounts.refunded_minor), (30, 0));
        // The reservation still counts: only 70 more may be refunded.
        assert!(matches!(
            h.orch.refund(&h.merchant.id, &payment_id, Some(eur(71)), None).await,
            Err(OrchestratorError::InsufficientRefundable { available: 70, .. })
        ));

        let advanced = h
            .orch
            .advance(Target::Refund(view.refund.id.clone()), Trigger::Scanner)
            .await
            .unwrap();
        assert_eq!(advanced.state_after, "SUCCEEDED");
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.details.amounts.refunded_minor, 30);
        assert_eq!(view.details.amounts.refund_reserved_minor, 0);
        assert_eq!(h.psp.refunds().len(), 1, "queried, never refunded twice");
        assert_eq!(h.psp.requests("create_refund"), 1);
    }
}

dual_test! {
    async fn a_declined_refund_releases_its_reservation(db) {
        let h = Harness::new(db).await;
        let payment_id = h.paid("m-5", 100, CaptureMode::Automatic).await;
        h.psp.set_mode(PspRoute::Refunds, Mode::Decline);
        let view = h.orch.refund(&h.merchant.id, &payment_id, Some(eur(100)), None).await.unwrap();
        assert_eq!(view.refund.state, RefundState::Failed);
        assert_eq!(view.payment.details.amounts.refund_reserved_minor, 0);
        assert_eq!(view.payment.status, ClientStatus::Succeeded);
        h.psp.set_mode(PspRoute::Refunds, Mode::Succeed);
        let again = h.orch.refund(&h.merchant.id, &payment_id, Some(eur(100)), None).await.unwrap();
        assert_eq!(again.refund.state, RefundState::Succeeded);
        assert_eq!(again.payment.status, ClientStatus::Refunded);
    }
}
