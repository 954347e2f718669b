//! Webhook ingestion and the inbox processor.

use std::time::Duration;

use serde_json::json;

use crate::common::*;
use sluice_core::{AttemptState, CaptureMode, ClientStatus, RefundState};
use sluice_orchestrator::{OrchestratorError, RejectionKind, WebhookOutcome};
use sluice_store::{DecisionKind, NewConnectorAccount};

/// A payment whose first attempt is UNKNOWN (the PSP committed, the answer
/// was lost); returns (payment id, attempt reference, PSP payment id).
async fn unknown_payment(h: &Harness, order_no: &str, amount: i64) -> (String, String, String) {
    h.psp.set_mode(
        PspRoute::Payments,
        Mode::TimeoutAfterCommit(Duration::from_secs(3)),
    );
    let payment_id = h.paid(order_no, amount, CaptureMode::Automatic).await;
    h.psp.set_mode(PspRoute::Payments, Mode::Succeed);
    let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
    let attempt = &view.details.attempts[0];
    assert_eq!(attempt.state, AttemptState::Unknown);
    let psp_id = h.psp.payments_for(&attempt.reference)[0].id.clone();
    (payment_id, attempt.reference.clone(), psp_id)
}

fn payment_event(
    event_id: &str,
    kind: &str,
    psp_id: &str,
    reference: Option<&str>,
    amount: i64,
) -> serde_json::Value {
    let mut data = json!({ "id": psp_id, "amount": amount, "currency": "EUR", "status": kind });
    if let Some(reference) = reference {
        data["reference"] = json!(reference);
    }
    json!({ "id": event_id, "type": format!("payment.{kind}"), "data": data })
}

fn accepted(outcome: WebhookOutcome) -> (u16, Vec<sluice_orchestrator::InboxReceipt>) {
    match outcome {
        WebhookOutcome::Accepted { ack, receipts } => {
            assert_eq!(ack.body, br#"{"received":true}"#, "the adapter's own ack");
            (ack.status, receipts)
        }
        other => panic!("expected Accepted, got {other:?}"),
    }
}

dual_test! {
    async fn a_duplicate_webhook_is_acknowledged_and_applied_once(db) {
        let h = Harness::new(db).await;
        let (payment_id, reference, psp_id) = unknown_payment(&h, "w-1", 1000).await;
        let body = payment_event("evt_dup", "succeeded", &psp_id, Some(&reference), 1000);

        let (status, first) = accepted(h.orch.ingest_webhook(ADAPTER, &h.account.id, h.webhook(&body)).await.unwrap());
        let (again, second) = accepted(h.orch.ingest_webhook(ADAPTER, &h.account.id, h.webhook(&body)).await.unwrap());
        assert_eq!((status, again), (200, 200));
        assert!(!first[0].duplicate);
        assert!(second[0].duplicate);
        assert_eq!(first[0].inbox_id, second[0].inbox_id);

        let round = h.orch.process_inbox_once().await.unwrap();
        assert_eq!((round.claimed, round.applied), (1, 1));
        // A delivery after processing is still acknowledged, and changes nothing.
        let (_, third) = accepted(h.orch.ingest_webhook(ADAPTER, &h.account.id, h.webhook(&body)).await.unwrap());
        assert!(third[0].duplicate);
        assert_eq!(h.orch.process_inbox_once().await.unwrap().claimed, 0);

        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.status, ClientStatus::Succeeded, "verified webhook evidence resolves UNKNOWN");
        assert_eq!(view.details.amounts.captured_minor, 1000);
        let timeline = h.store().timeline(&payment_id).await.unwrap();
        let from_webhook: Vec<_> = timeline
            .iter()
            .filter(|e| e.provider_event_id.as_deref() == Some("evt_dup"))
            .collect();
        assert_eq!(from_webhook.len(), 2, "attempt and order rows of one decision: {from_webhook:?}");
        assert!(from_webhook.iter().all(|e| e.decision == "applied" && e.evidence_source == "webhook"));
        let succeeded = h
            .store()
            .outbox_for_payment(&payment_id)
            .await
            .unwrap()
            .into_iter()
            .filter(|m| m.event_type == "payment.succeeded")
            .count();
        assert_eq!(succeeded, 1);
    }
}

dual_test! {
    async fn a_bad_signature_changes_nothing(db) {
        let h = Harness::new(db).await;
        let (payment_id, reference, psp_id) = unknown_payment(&h, "w-2", 1000).await;
        let body = payment_event("evt_forged", "succeeded", &psp_id, Some(&reference), 1000);
        let forged = signed_webhook(&h.account.id, "whsec_not_the_secret", &body);
        let signature = forged.headers[1].value.clone();
        let outcome = h.orch.ingest_webhook(ADAPTER, &h.account.id, forged).await.unwrap();
        let WebhookOutcome::Rejected { kind, detail, evidence_id } = outcome else {
            panic!("expected a rejection, got {outcome:?}");
        };
        assert_eq!(kind, RejectionKind::BadSignature);
        assert_eq!(kind.http_status(), 401);
        assert!(!detail.contains(&signature["t=".len()..]), "the detail never echoes the signature");
        let evidence = h.store().inbox_get(&evidence_id.unwrap()).await.unwrap();
        assert_eq!(evidence.verification, "rejected");
        assert_eq!(evidence.event, None);

        // A tampered body under a genuine signature is refused too.
        let mut tampered = h.webhook(&body);
        tampered.body = serde_json::to_vec(&payment_event("evt_forged", "succeeded", &psp_id, Some(&reference), 1)).unwrap();
        assert!(matches!(
            h.orch.ingest_webhook(ADAPTER, &h.account.id, tampered).await.unwrap(),
            WebhookOutcome::Rejected { kind: RejectionKind::BadSignature, .. }
        ));

        assert_eq!(h.orch.process_inbox_once().await.unwrap().claimed, 0);
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.details.attempts[0].state, AttemptState::Unknown);
        assert!(h
            .store()
            .timeline(&payment_id)
            .await
            .unwrap()
            .iter()
            .all(|e| e.evidence_source != "webhook"));
        // The genuine event is not pre-empted by the forged one.
        let (_, receipts) = accepted(h.orch.ingest_webhook(ADAPTER, &h.account.id, h.webhook(&body)).await.unwrap());
        assert!(!receipts[0].duplicate);
    }
}

dual_test! {
    async fn an_unknown_adapter_or_account_is_not_found(db) {
        let h = Harness::new(db).await;
        let body = payment_event("evt_x", "succeeded", "fp_1", None, 10);
        let request = h.webhook(&body);
        assert_eq!(
            h.orch.ingest_webhook("no-such-adapter", &h.account.id, request.clone()).await.unwrap(),
            WebhookOutcome::NotFound
        );
        assert_eq!(
            h.orch.ingest_webhook(ADAPTER, "ca_missing", request.clone()).await.unwrap(),
            WebhookOutcome::NotFound
        );
        // An account of another adapter is not this adapter's route.
        let other = h
            .store()
            .create_connector_account(&NewConnectorAccount {
                merchant_id: h.merchant.id.clone(),
                adapter: "stripe".into(),
                label: "stripe".into(),
                config: json!({}),
                secrets: json!({}),
            })
            .await
            .unwrap();
        assert_eq!(
            h.orch.ingest_webhook(ADAPTER, &other.id, request).await.unwrap(),
            WebhookOutcome::NotFound
        );
    }
}

dual_test! {
    async fn a_webhook_before_the_api_response_converges(db) {
        let mut config = test_config();
        config.sync_wait = Duration::from_millis(300);
        config.psp_timeout = Duration::from_secs(5);
        let h = Harness::with_config(db, config).await;
        h.psp.set_mode(PspRoute::Payments, Mode::Slow(Duration::from_millis(1500)));
        let view = h
            .orch
            .create_payment(&h.merchant.id, h.payment("w-3", 1000, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        assert!(view.in_progress);
        let payment_id = view.details.order.id.clone();
        let reference = view.details.attempts[0].reference.clone();
        let psp_id = eventually(Duration::from_secs(5), "the PSP to commit", || async {
            h.psp.payments_for(&reference).first().map(|p| p.id.clone())
        })
        .await;

        // The PSP's webhook overtakes its own answer.
        let body = payment_event("evt_early", "succeeded", &psp_id, Some(&reference), 1000);
        accepted(h.orch.ingest_webhook(ADAPTER, &h.account.id, h.webhook(&body)).await.unwrap());
        let round = h.orch.process_inbox_once().await.unwrap();
        assert_eq!(round.applied, 1);
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.status, ClientStatus::Succeeded);

        // Then the answer arrives, and is recognised as the same fact.
        let late = eventually(Duration::from_secs(15), "the late sync answer", || async {
            h.store()
                .timeline(&payment_id)
                .await
                .unwrap()
                .into_iter()
                .find(|e| e.aggregate_type == "attempt" && e.evidence_source == "sync_response"
                    && e.event_kind == "PAYMENT_SUCCEEDED")
        })
        .await;
        assert_eq!(late.decision, "ignored_duplicate");
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.status, ClientStatus::Succeeded);
        assert_eq!(view.details.amounts.captured_minor, 1000);
        assert_eq!(h.psp.payments().len(), 1);
    }
}

dual_test! {
    async fn a_webhook_naming_only_the_psp_reference_is_retried_until_the_api_response_lands(db) {
        let mut config = test_config();
        config.sync_wait = Duration::from_millis(300);
        config.psp_timeout = Duration::from_secs(5);
        config.inbox.max_tries = 10;
        let h = Harness::with_config(db, config).await;
        h.psp.set_mode(PspRoute::Payments, Mode::Slow(Duration::from_millis(1500)));
        let view = h
            .orch
            .create_payment(&h.merchant.id, h.payment("w-4", 1000, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        let payment_id = view.details.order.id.clone();
        let reference = view.details.attempts[0].reference.clone();
        let psp_id = eventually(Duration::from_secs(5), "the PSP to commit", || async {
            h.psp.payments_for(&reference).first().map(|p| p.id.clone())
        })
        .await;
        let body = payment_event("evt_psp_only", "succeeded", &psp_id, None, 1000);
        let (_, receipts) = accepted(h.orch.ingest_webhook(ADAPTER, &h.account.id, h.webhook(&body)).await.unwrap());

        // The PSP reference is not recorded yet: not applicable, retried later.
        let round = h.orch.process_inbox_once().await.unwrap();
        assert_eq!((round.retried, round.applied), (1, 0));
        let entry = h.store().inbox_get(&receipts[0].inbox_id).await.unwrap();
        assert_eq!(entry.status, "failed");

        eventually(Duration::from_secs(15), "the API response", || async {
            let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
            (view.status == ClientStatus::Succeeded).then_some(())
        })
        .await;
        let round = h.orch.process_inbox_once().await.unwrap();
        assert_eq!(round.decided, 1);
        let entry = h.store().inbox_get(&receipts[0].inbox_id).await.unwrap();
        assert_eq!(entry.status, "processed");
        let webhook_rows: Vec<_> = h
            .store()
            .timeline(&payment_id)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.provider_event_id.as_deref() == Some("evt_psp_only"))
            .collect();
        assert_eq!(webhook_rows.len(), 1);
        assert_eq!(webhook_rows[0].decision, "ignored_duplicate");
    }
}

dual_test! {
    async fn out_of_order_webhooks_converge_and_never_roll_back(db) {
        let h = Harness::new(db).await;
        let (payment_id, reference, psp_id) = unknown_payment(&h, "w-5", 1000).await;
        for body in [
            payment_event("evt_s", "succeeded", &psp_id, Some(&reference), 1000),
            payment_event("evt_p", "processing", &psp_id, Some(&reference), 1000),
            payment_event("evt_s", "succeeded", &psp_id, Some(&reference), 1000),
        ] {
            accepted(h.orch.ingest_webhook(ADAPTER, &h.account.id, h.webhook(&body)).await.unwrap());
        }
        let round = h.orch.process_inbox_once().await.unwrap();
        assert_eq!(round.claimed, 2, "the redelivery never reached the inbox twice");
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.details.attempts[0].state, AttemptState::Succeeded);
        let late = h
            .store()
            .timeline(&payment_id)
            .await
            .unwrap()
            .into_iter()
            .find(|e| e.provider_event_id.as_deref() == Some("evt_p"))
            .unwrap();
        assert_eq!(late.decision, "ignored_stale");
    }
}

dual_test! {
    async fn a_refund_webhook_settles_an_unknown_refund(db) {
        let h = Harness::new(db).await;
        let payment_id = h.paid("w-6", 100, CaptureMode::Automatic).await;
        h.psp.set_mode(PspRoute::Refunds, Mode::TimeoutAfterCommit(Duration::from_secs(3)));
        let refund = h.orch.refund(&h.merchant.id, &payment_id, Some(eur(40)), None).await.unwrap().refund;
        assert_eq!(refund.state, RefundState::Unknown);
        let at_psp = h.psp.refunds()[0].clone();
        let body = json!({
            "id": "evt_refund",
            "type": "refund.succeeded",
            "data": { "id": at_psp.id, "payment": at_psp.payment, "reference": refund.reference,
                      "amount": 40, "currency": "EUR", "status": "succeeded" }
        });
        accepted(h.orch.ingest_webhook(ADAPTER, &h.account.id, h.webhook(&body)).await.unwrap());
        assert_eq!(h.orch.process_inbox_once().await.unwrap().applied, 1);
        let refund = h.store().get_refund(&refund.id).await.unwrap();
        assert_eq!(refund.state, RefundState::Succeeded);
        assert_eq!(refund.psp_reference.as_deref(), Some(at_psp.id.as_str()));
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.details.amounts.refunded_minor, 40);
        assert_eq!(view.details.amounts.refund_reserved_minor, 0);
        assert_eq!(h.psp.requests("create_refund"), 1);
    }
}

dual_test! {
    async fn a_poison_inbox_event_is_quarantined_after_bounded_tries_and_can_be_replayed(db) {
        let h = Harness::new(db).await;
        let (payment_id, _reference, psp_id) = unknown_payment(&h, "w-7", 1000).await;
        // A success naming only a PSP reference the host has not learned yet.
        let body = payment_event("evt_poison", "succeeded", &psp_id, None, 1000);
        let (_, receipts) = accepted(h.orch.ingest_webhook(ADAPTER, &h.account.id, h.webhook(&body)).await.unwrap());
        let inbox_id = receipts[0].inbox_id.clone();
        let max_tries = h.orch.config().inbox.max_tries;
        let mut quarantined = 0;
        for _ in 0..max_tries {
            quarantined += h.orch.process_inbox_once().await.unwrap().quarantined;
        }
        assert_eq!(quarantined, 1);
        let entry = h.store().inbox_get(&inbox_id).await.unwrap();
        assert_eq!(entry.status, "quarantined");
        assert_eq!(entry.attempts, max_tries);
        let reason = entry.quarantine_reason.unwrap();
        assert!(reason.contains(&format!("after {max_tries} tries")) && reason.contains("not found"), "{reason}");
        // Quarantined rows are never picked up again automatically.
        assert_eq!(h.orch.process_inbox_once().await.unwrap().claimed, 0);
        assert_eq!(
            h.store().inbox_list_quarantined(10).await.unwrap().iter().filter(|e| e.id == inbox_id).count(),
            1
        );

        // A replay before anything changed fails again and keeps it quarantined.
        assert!(h.orch.replay_quarantined(&inbox_id, "operator:alice").await.is_err());
        assert_eq!(h.store().inbox_get(&inbox_id).await.unwrap().status, "quarantined");

        // The PSP reports the payment as still processing: the host learns its
        // PSP reference, without a result.
        h.psp.set_status(&psp_id, "processing");
        let attempt_id = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap().details.attempts[0].id.clone();
        let advanced = h
            .orch
            .advance(sluice_orchestrator::Target::Attempt(attempt_id), sluice_orchestrator::Trigger::Operator)
            .await
            .unwrap();
        assert_eq!(advanced.state_after, "PROCESSING");

        // Now the operator's replay applies the quarantined success.
        let replayed = h.orch.replay_quarantined(&inbox_id, "operator:alice").await.unwrap();
        assert_eq!(replayed.applied.decision, DecisionKind::Applied);
        assert_eq!(replayed.applied.to_state, "SUCCEEDED");
        assert_eq!(h.store().inbox_get(&inbox_id).await.unwrap().status, "processed");
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.status, ClientStatus::Succeeded);
        let row = h
            .store()
            .timeline(&payment_id)
            .await
            .unwrap()
            .into_iter()
            .find(|e| e.provider_event_id.as_deref() == Some("evt_poison"))
            .unwrap();
        assert_eq!(row.actor.as_deref(), Some("operator:alice"));
        assert_eq!(row.inbox_id.as_deref(), Some(inbox_id.as_str()));
        // Replaying twice is refused: it is processed now.
        assert!(matches!(
            h.orch.replay_quarantined(&inbox_id, "operator:alice").await,
            Err(OrchestratorError::InvalidState(_))
        ));
    }
}

dual_test! {
    async fn a_webhook_verified_for_one_account_cannot_move_another_accounts_payment(db) {
        let h = Harness::new(db).await;
        let (payment_id, reference, psp_id) = unknown_payment(&h, "w-8", 1000).await;
        let intruder = h
            .store()
            .create_connector_account(&NewConnectorAccount {
                merchant_id: h.merchant.id.clone(),
                adapter: ADAPTER.into(),
                label: "second".into(),
                config: json!({ "base_url": h.psp.base_url() }),
                secrets: json!({ "api_key": API_KEY, "webhook_secret": "whsec_second" }),
            })
            .await
            .unwrap();
        let body = payment_event("evt_cross", "succeeded", &psp_id, Some(&reference), 1000);
        // Signed with the first account's secret but posted to the second's route: refused.
        assert!(matches!(
            h.orch.ingest_webhook(ADAPTER, &intruder.id, h.webhook(&body)).await.unwrap(),
            WebhookOutcome::Rejected { kind: RejectionKind::BadSignature, .. }
        ));
        // Signed with the second account's own secret: verified, but it names
        // the first account's attempt, so it is quarantined, never applied.
        let request = signed_webhook(&intruder.id, "whsec_second", &body);
        accepted(h.orch.ingest_webhook(ADAPTER, &intruder.id, request).await.unwrap());
        let round = h.orch.process_inbox_once().await.unwrap();
        assert_eq!((round.applied, round.quarantined), (0, 1));
        let view = h.orch.payment(&h.merchant.id, &payment_id).await.unwrap();
        assert_eq!(view.details.attempts[0].state, AttemptState::Unknown);
    }
}
