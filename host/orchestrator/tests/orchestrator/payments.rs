//! Attempts: the happy path, declines, and every way of not learning the outcome.

use std::time::Duration;

use crate::common::*;
use sluice_core::{AttemptState, CaptureMode, ClientStatus, OrderState};
use sluice_orchestrator::{Action, ConfirmOptions, OrchestratorError, Target, Trigger};

dual_test! {
    async fn a_sale_succeeds_with_exactly_one_charge_and_the_adapter_recorded(db) {
        let h = Harness::new(db).await;
        let created = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-1", 1000, CaptureMode::Automatic, true))
            .await
            .unwrap();
        assert!(created.created);
        let view = created.view;
        assert_eq!(view.status, ClientStatus::Succeeded);
        assert!(!view.in_progress);
        assert_eq!(view.details.order.state, OrderState::Succeeded);
        let attempt = &view.details.attempts[0];
        assert_eq!(attempt.state, AttemptState::Succeeded);
        assert_eq!(view.details.amounts.captured_minor, 1000);
        let charges = h.psp.payments_for(&attempt.reference);
        assert_eq!(charges.len(), 1);
        assert_eq!(attempt.psp_reference.as_deref(), Some(charges[0].id.as_str()));
        assert_eq!(h.psp.requests("create_payment"), 1);
        // The answer, built from the rows its decisions left, is the payment as stored.
        let stored = h.store().payment_details(None, &view.details.order.id).await.unwrap();
        assert_eq!(view.details, stored);

        // SUBMITTED was recorded before the PSP's answer, and the answer is
        // attributed to the adapter version that parsed it.
        let timeline = h.store().timeline(&view.details.order.id).await.unwrap();
        let attempt_rows: Vec<_> = timeline
            .iter()
            .filter(|e| e.aggregate_type == "attempt" && e.decision == "applied")
            .map(|e| e.to_state.as_str())
            .collect();
        assert_eq!(attempt_rows, ["CREATED", "SUBMITTED", "SUCCEEDED"]);
        let success = timeline
            .iter()
            .find(|e| e.aggregate_type == "attempt" && e.to_state == "SUCCEEDED")
            .unwrap();
        assert_eq!(success.evidence_source, "sync_response");
        assert_eq!(success.adapter_name.as_deref(), Some(ADAPTER));
        assert_eq!(success.adapter_version.as_deref(), Some("1.0.0"));
        assert_eq!(success.adapter_digest.as_ref().map(String::len), Some(64));
        assert_eq!(success.actor.as_deref(), Some("system:api"));
    }
}

dual_test! {
    async fn a_timeout_after_commit_is_processing_then_a_query_converges_with_one_charge(db) {
        let h = Harness::new(db).await;
        h.psp.set_mode(PspRoute::Payments, Mode::TimeoutAfterCommit(Duration::from_secs(3)));
        let view = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-2", 1000, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        // The PSP took the money but the host got no answer: processing, never failed.
        assert_eq!(view.status, ClientStatus::Processing);
        assert!(view.poll_after_ms.is_some());
        let attempt = view.details.attempts[0].clone();
        assert_eq!(attempt.state, AttemptState::Unknown);
        assert_eq!(attempt.psp_reference, None);
        assert_eq!(h.psp.payments_for(&attempt.reference).len(), 1);

        // The answer is never trusted late: a query with the original reference decides.
        h.psp.set_mode(PspRoute::Payments, Mode::Succeed);
        let advanced = h
            .orch
            .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
            .await
            .unwrap();
        assert!(matches!(advanced.action, Action::Queried { unknown: None, .. }), "{advanced:?}");
        assert_eq!(advanced.state_before, "UNKNOWN");
        assert_eq!(advanced.state_after, "SUCCEEDED");
        let view = h.orch.payment(&h.merchant.id, &view.details.order.id).await.unwrap();
        assert_eq!(view.status, ClientStatus::Succeeded);
        assert_eq!(view.details.amounts.captured_minor, 1000);
        assert_eq!(h.psp.payments_for(&attempt.reference).len(), 1, "exactly one charge");
        assert_eq!(h.psp.requests("create_payment"), 1, "never charged again");
        assert_eq!(h.psp.requests("query_payment"), 1);

        // Terminal now: advancing again does nothing and calls nobody.
        let again = h
            .orch
            .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
            .await
            .unwrap();
        assert_eq!(again.action, Action::Final);
        assert_eq!(h.psp.requests("query_payment"), 1);
    }
}

dual_test! {
    async fn a_decline_fails_the_attempt_and_a_new_attempt_is_allowed(db) {
        let h = Harness::new(db).await;
        h.psp.set_mode(PspRoute::Payments, Mode::Decline);
        let view = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-3", 500, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        assert_eq!(view.status, ClientStatus::Failed);
        let first = &view.details.attempts[0];
        assert_eq!(first.state, AttemptState::Failed);
        let failure = first.failure.as_ref().unwrap();
        assert_eq!(failure.code, "card_declined");
        // The order stays open: an attempt's failure is not the payment's.
        assert_eq!(view.details.order.state, OrderState::Processing);
        assert!(h.psp.payments().is_empty(), "a decline takes no money");

        h.psp.set_mode(PspRoute::Payments, Mode::Succeed);
        let payment_id = view.details.order.id.clone();
        let view = h.orch.confirm(&h.merchant.id, &payment_id, &ConfirmOptions::default()).await.unwrap();
        assert_eq!(view.status, ClientStatus::Succeeded);
        assert_eq!(view.details.attempts.len(), 2);
        let second = &view.details.attempts[1];
        assert_ne!(second.reference, first.reference, "a new attempt gets a new reference");
        assert_eq!(second.state, AttemptState::Succeeded);
        assert_eq!(h.psp.payments().len(), 1);
    }
}

dual_test! {
    async fn an_unknown_attempt_refuses_a_new_attempt(db) {
        let h = Harness::new(db).await;
        h.psp.set_mode(PspRoute::Payments, Mode::TimeoutAfterCommit(Duration::from_secs(3)));
        let payment_id = h.paid("o-4", 700, CaptureMode::Automatic).await;
        h.psp.set_mode(PspRoute::Payments, Mode::Succeed);
        let refused = h.orch.confirm(&h.merchant.id, &payment_id, &ConfirmOptions::default()).await;
        match refused {
            Err(OrchestratorError::AttemptInFlight { state, .. }) => assert_eq!(state, "UNKNOWN"),
            other => panic!("expected AttemptInFlight, got {other:?}"),
        }
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.details.attempts.len(), 1);
        assert_eq!(h.psp.requests("create_payment"), 1, "no second charge was even tried");
    }
}

dual_test! {
    async fn a_server_error_is_unknown_never_failed(db) {
        let h = Harness::new(db).await;
        h.psp.set_mode(PspRoute::Payments, Mode::ServerError);
        let view = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-5", 900, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        let attempt = &view.details.attempts[0];
        assert_eq!(attempt.state, AttemptState::Unknown);
        assert_eq!(view.status, ClientStatus::Processing);
        assert_eq!(attempt.failure.as_ref().map(|f| f.category.as_str()), Some("unknown"));
        assert!(attempt.next_retry_time.is_some(), "an UNKNOWN is scheduled for a query");
        // A query that finds nothing at the PSP still proves nothing.
        let advanced = h
            .orch
            .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
            .await
            .unwrap();
        assert_eq!(advanced.state_after, "UNKNOWN");
        assert!(h.psp.payments().is_empty());
    }
}

dual_test! {
    async fn a_garbage_answer_is_unknown_and_a_query_converges(db) {
        let h = Harness::new(db).await;
        h.psp.set_mode(PspRoute::Payments, Mode::Garbage);
        let payment_id = h.paid("o-6", 1200, CaptureMode::Automatic).await;
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        let attempt = view.details.attempts[0].clone();
        assert_eq!(attempt.state, AttemptState::Unknown);
        assert_eq!(attempt.failure.as_ref().map(|f| f.code.as_str()), Some("malformed_response"));

        let advanced = h.orch.advance(Target::Attempt(attempt.id), Trigger::Api).await.unwrap();
        assert_eq!(advanced.state_after, "SUCCEEDED");
        assert_eq!(h.psp.payments().len(), 1);
        assert_eq!(h.psp.requests("create_payment"), 1);
    }
}

dual_test! {
    async fn a_slow_answer_returns_processing_and_completes_in_the_background(db) {
        let mut config = test_config();
        config.sync_wait = Duration::from_millis(300);
        config.psp_timeout = Duration::from_secs(5);
        let h = Harness::with_config(db, config).await;
        h.psp.set_mode(PspRoute::Payments, Mode::Slow(Duration::from_millis(1500)));
        let view = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-7", 300, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        assert!(view.in_progress, "the wait budget ran out first");
        assert_eq!(view.status, ClientStatus::Processing);
        let payment_id = view.details.order.id.clone();
        let attempt_id = view.details.attempts[0].id.clone();

        // While the call is within its budget, an API retry does not query.
        eventually(Duration::from_secs(5), "the call to be on its way", || async {
            let attempt = h.store().get_attempt(&attempt_id).await.unwrap();
            (attempt.state == AttemptState::Submitted && attempt.last_psp_call_at.is_some())
                .then_some(())
        })
        .await;
        let advanced = h
            .orch
            .advance(Target::Attempt(attempt_id.clone()), Trigger::Api)
            .await
            .unwrap();
        assert!(matches!(advanced.action, Action::Waiting { .. }), "{advanced:?}");
        assert_eq!(h.psp.requests("query_payment"), 0);

        let status = eventually(Duration::from_secs(15), "the background call", || async {
            let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
            (view.status != ClientStatus::Processing).then_some(view.status)
        })
        .await;
        assert_eq!(status, ClientStatus::Succeeded);
        assert_eq!(h.psp.payments().len(), 1);
        assert_eq!(h.psp.requests("create_payment"), 1);
    }
}

dual_test! {
    async fn authorize_then_void_releases_the_hold(db) {
        let h = Harness::new(db).await;
        let payment_id = h.paid("o-8", 2000, CaptureMode::Manual).await;
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.status, ClientStatus::Authorized);
        assert_eq!(view.details.amounts.authorized_minor, 2000);
        assert_eq!(view.details.amounts.captured_minor, 0);

        let view = h.orch.void(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.status, ClientStatus::Canceled);
        assert_eq!(view.details.attempts[0].state, AttemptState::Canceled);
        assert_eq!(view.details.amounts.authorized_minor, 0);
        assert_eq!(h.psp.payments()[0].status, "canceled");
        // Nothing left to void.
        assert!(matches!(
            h.orch.void(&h.merchant.id, &payment_id).await,
            Err(OrchestratorError::InvalidState(_))
        ));
    }
}

dual_test! {
    async fn creating_again_with_the_same_order_number_is_idempotent_and_a_mismatch_conflicts(db) {
        let h = Harness::new(db).await;
        let params = h.payment("o-9", 1500, CaptureMode::Automatic, true);
        let first = h.orch.create_payment(&h.merchant.id, params.clone()).await.unwrap();
        let again = h.orch.create_payment(&h.merchant.id, params.clone()).await.unwrap();
        assert!(first.created);
        assert!(!again.created);
        assert_eq!(again.view.details.order.id, first.view.details.order.id);
        assert_eq!(again.view.details.attempts.len(), 1, "no second attempt");
        assert_eq!(h.psp.requests("create_payment"), 1);

        let mut other = params;
        other.amount = eur(1600);
        let conflict = h.orch.create_payment(&h.merchant.id, other).await;
        assert!(
            matches!(&conflict, Err(OrchestratorError::OrderNoConflict { fields, .. }) if *fields == ["amount"]),
            "{conflict:?}"
        );
    }
}

dual_test! {
    async fn another_merchants_payment_is_not_found(db) {
        let h = Harness::new(db).await;
        let payment_id = h.paid("o-10", 100, CaptureMode::Automatic).await;
        let other = h.store().create_merchant("Someone Else").await.unwrap();
        for result in [
            h.orch.payment(&other.id, &payment_id).await.map(|_| ()),
            h.orch.confirm(&other.id, &payment_id, &ConfirmOptions::default()).await.map(|_| ()),
            h.orch.refund(&other.id, &payment_id, Some(eur(10)), None).await.map(|_| ()),
            h.orch.void(&other.id, &payment_id).await.map(|_| ()),
        ] {
            assert!(
                matches!(result, Err(OrchestratorError::NotFound { .. })),
                "{result:?}"
            );
        }
        assert!(h.psp.refunds().is_empty());
    }
}

dual_test! {
    async fn two_concurrent_advances_of_a_new_attempt_send_it_once(db) {
        let h = Harness::new(db).await;
        let created = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-11", 400, CaptureMode::Automatic, false))
            .await
            .unwrap();
        let payment_id = created.view.details.order.id;
        let attempt = h
            .store()
            .create_attempt(
                &sluice_store::NewAttempt {
                    payment_id: payment_id.clone(),
                    connector_account_id: h.account.id.clone(),
                    ..Default::default()
                },
                &sluice_store::Provenance::actor("test"),
            )
            .await
            .unwrap();
        h.psp.set_mode(PspRoute::Payments, Mode::Slow(Duration::from_millis(300)));
        let target = Target::Attempt(attempt.id.clone());
        let (a, b) = tokio::join!(
            h.orch.advance(target.clone(), Trigger::Scanner),
            h.orch.advance(target.clone(), Trigger::Api),
        );
        let actions = [a.unwrap().action, b.unwrap().action];
        let sent = actions.iter().filter(|a| matches!(a, Action::Sent { .. })).count();
        assert_eq!(sent, 1, "{actions:?}");
        assert_eq!(h.psp.requests("create_payment"), 1, "only the caller that recorded SUBMITTED sends");
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.status, ClientStatus::Succeeded);
    }
}

dual_test! {
    async fn a_request_the_adapter_cannot_build_is_never_sent_and_closes_without_money(db) {
        let h = Harness::new(db).await;
        // A connector account without base_url: the adapter refuses to build.
        h.store()
            .update_connector_account(&h.account.id, Some(&serde_json::json!({})), None, None)
            .await
            .unwrap();
        let view = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-12", 400, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        let attempt = &view.details.attempts[0];
        assert_eq!(attempt.state, AttemptState::Canceled);
        assert_eq!(attempt.failure.as_ref().map(|f| f.code.as_str()), Some("missing_base_url"));
        assert_eq!(view.status, ClientStatus::Failed, "the client may retry");
        assert_eq!(view.details.order.state, OrderState::Processing);
        assert_eq!(h.psp.requests("create_payment"), 0);
    }
}

dual_test! {
    async fn a_refund_that_cannot_be_sent_is_canceled_and_releases_its_reservation(db) {
        let h = Harness::new(db).await;
        let payment_id = h.paid("o-13", 100, CaptureMode::Automatic).await;
        h.store()
            .update_connector_account(&h.account.id, Some(&serde_json::json!({})), None, None)
            .await
            .unwrap();
        let refund = h.orch.refund(&h.merchant.id, &payment_id, Some(eur(50)), None).await.unwrap();
        assert_eq!(refund.refund.state, sluice_core::RefundState::Canceled);
        assert_eq!(refund.status, "canceled");
        assert_eq!(refund.payment.details.amounts.refund_reserved_minor, 0);
        assert_eq!(refund.payment.details.amounts.refunded_minor, 0);
        assert_eq!(h.psp.requests("create_refund"), 0);
    }
}
