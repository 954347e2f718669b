//! Routing and failover (issue 13) end to end: the real adapters, the
//! sandbox PSP over HTTP with two accounts, both databases. Webhooks are off,
//! so only the host's own calls move anything.

use crate::e2e_test;
use sluice_core::{AttemptState, CaptureMode, ClientStatus, CREDENTIALS_REFUSED_CODE};
use sluice_orchestrator::PaymentView;
use sluice_sandbox_psp::faults::Decline;

use crate::common::sandbox::E2e;

/// The history reason of each attempt's creation, in attempt order.
async fn route_reasons(e2e: &E2e, view: &PaymentView) -> Vec<String> {
    let timeline = e2e.db.store.timeline(&view.details.order.id).await.unwrap();
    view.details
        .attempts
        .iter()
        .map(|a| {
            timeline
                .iter()
                .find(|h| h.aggregate_id == a.id && h.from_state.is_none())
                .map(|h| h.reason.clone())
                .unwrap_or_default()
        })
        .collect()
}

/// Create and confirm a 7 EUR card sale, at `account` when named, routed
/// otherwise; the orchestrator's answer as is (a refusal included).
async fn try_sale(
    e2e: &E2e,
    order_no: &str,
    account: Option<&str>,
) -> Result<sluice_orchestrator::Created, sluice_orchestrator::OrchestratorError> {
    let confirm = sluice_orchestrator::ConfirmOptions {
        connector_account_id: account.map(str::to_owned),
        ..Default::default()
    };
    e2e.orch
        .create_payment(
            &e2e.merchant.id,
            sluice_orchestrator::CreatePayment {
                merchant_order_no: order_no.into(),
                amount: crate::common::eur(700),
                capture_mode: CaptureMode::Automatic,
                payment_method_token: Some("pm_card_visa".into()),
                return_url: None,
                description: None,
                metadata: serde_json::json!({}),
                fulfillment: Default::default(),
                confirm: Some(confirm),
            },
        )
        .await
}

e2e_test! {
    async fn a_cascadable_decline_fails_over_to_the_next_account_with_one_charge_in_total(e2e) {
        e2e.webhooks_off();
        let (second, _) = e2e.another_account("B", None).await;
        e2e.route_in_order(&[&e2e.account, &second]).await;
        e2e.sandbox.set_account_decline(&e2e.psp_account(), Some(Decline::IssuerUnavailable));

        let view = e2e.create("fo-cascade", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(view.status, ClientStatus::Succeeded);
        let attempts = &view.details.attempts;
        assert_eq!(attempts.len(), 2);
        assert_eq!((attempts[0].state, attempts[0].connector_account_id.as_str()), (AttemptState::Failed, e2e.account.id.as_str()));
        assert_eq!((attempts[1].state, attempts[1].connector_account_id.as_str()), (AttemptState::Succeeded, second.id.as_str()));
        assert!(attempts[0].reference.ends_with("_a1") && attempts[1].reference.ends_with("_a2"));
        let charges: u32 = attempts.iter().map(|a| e2e.sandbox.charge_count(&a.reference)).sum();
        assert_eq!(charges, 1, "one charge in total at the PSP");
        let reasons = route_reasons(&e2e, &view).await;
        assert!(reasons[0].contains("rule all"), "{reasons:?}");
        let code = attempts[0].failure.as_ref().unwrap().code.clone();
        assert!(reasons[1].contains(&format!("failover after {code}")), "{reasons:?}");
    }
}

e2e_test! {
    async fn a_fraud_or_stolen_card_decline_never_fails_over(e2e) {
        e2e.webhooks_off();
        let (second, _) = e2e.another_account("B", None).await;
        e2e.route_in_order(&[&e2e.account, &second]).await;
        for (n, decline) in [Decline::Fraud, Decline::StolenCard].into_iter().enumerate() {
            e2e.sandbox.set_account_decline(&e2e.psp_account(), Some(decline));
            let view = e2e.create(&format!("fo-fraud-{n}"), 1500, CaptureMode::Automatic, "pm_card_visa").await;
            assert_eq!(view.status, ClientStatus::Failed, "{decline:?}");
            assert_eq!(view.details.attempts.len(), 1, "{decline:?}: no second attempt");
            assert_eq!(view.details.attempts[0].connector_account_id, e2e.account.id);
        }
    }
}

e2e_test! {
    async fn an_unknown_outcome_never_fails_over_seed_001_test_e(e2e) {
        e2e.webhooks_off();
        let (second, _) = e2e.another_account("B", None).await;
        e2e.route_in_order(&[&e2e.account, &second]).await;
        // A 5xx: the PSP may or may not have executed it.
        let view = e2e.create("fo-unknown", 1500, CaptureMode::Automatic, "pm_sluice_server_error").await;
        assert_eq!(view.status, ClientStatus::Processing);
        assert_eq!(view.details.attempts.len(), 1, "never a second charge while one is unknown");
        assert_eq!(view.details.attempts[0].state, AttemptState::Unknown);
        // A confirm while it is unknown is refused, routed or not.
        let again = e2e.orch.confirm(&e2e.merchant.id, &view.details.order.id, &Default::default()).await;
        assert!(again.is_err(), "{again:?}");
        assert_eq!(e2e.view(&view.details.order.id).await.details.attempts.len(), 1);
    }
}

e2e_test! {
    async fn refused_credentials_fail_over_and_never_sit_in_processing(e2e) {
        e2e.webhooks_off();
        let (mistyped, _) = e2e.another_account("Mistyped", Some("sk_test_mistyped_key")).await;
        e2e.route_in_order(&[&mistyped, &e2e.account]).await;
        let view = e2e.create("fo-creds", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(view.status, ClientStatus::Succeeded);
        let attempts = &view.details.attempts;
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[0].state, AttemptState::Failed);
        let failure = attempts[0].failure.as_ref().unwrap();
        assert_eq!(failure.code, CREDENTIALS_REFUSED_CODE);
        assert!(failure.message.starts_with("credentials refused"), "{}", failure.message);
        assert_eq!(attempts[1].connector_account_id, e2e.account.id);
        let timeline = e2e.db.store.timeline(&view.details.order.id).await.unwrap();
        assert!(timeline.iter().any(|h| h.aggregate_id == attempts[0].id
            && h.to_state == "FAILED"
            && h.failure_code.as_deref() == Some(CREDENTIALS_REFUSED_CODE)));

        // Named directly while its breaker is open: refused, saying why.
        let refused = try_sale(&e2e, "fo-creds-named", Some(&mistyped.id)).await.expect_err("breaker open").to_string();
        assert!(refused.contains("credentials refused"), "{refused}");
        // Its probe, without any other account to go to: failed, not processing.
        e2e.clock.advance(sluice_core::BreakerPolicy::default().open_ms);
        let probe = try_sale(&e2e, "fo-creds-probe", Some(&mistyped.id)).await.unwrap().view;
        assert_eq!(probe.status, ClientStatus::Failed);
        assert_eq!(probe.details.attempts.len(), 1);
        assert_eq!(probe.details.attempts[0].failure.as_ref().unwrap().code, CREDENTIALS_REFUSED_CODE);
    }
}

e2e_test! {
    async fn an_open_breaker_routes_around_the_account_and_an_answered_probe_closes_it_again(e2e) {
        e2e.webhooks_off();
        let (mistyped, _) = e2e.another_account("Mistyped", Some("sk_test_mistyped_key")).await;
        e2e.route_in_order(&[&mistyped, &e2e.account]).await;
        let first = e2e.create("br-1", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(first.details.attempts.len(), 2, "failed over from the refused credentials");
        let health = e2e.orch.account_health(&e2e.merchant.id, &mistyped.id).await.unwrap();
        assert_eq!(health.breaker.state.name(), "open");
        assert!(health.refusal.as_deref().is_some_and(|r| r.contains("credentials refused")), "{:?}", health.refusal);

        // Open: the next payment goes straight to the second account, and says why.
        let second = e2e.create("br-2", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(second.status, ClientStatus::Succeeded);
        assert_eq!(second.details.attempts.len(), 1);
        assert_eq!(second.details.attempts[0].connector_account_id, e2e.account.id);
        let reasons = route_reasons(&e2e, &second).await;
        assert!(reasons[0].contains(&mistyped.id) && reasons[0].contains("breaker open"), "{reasons:?}");
        assert_eq!(e2e.sandbox.charge_count(&second.details.attempts[0].reference), 1);

        // The operator fixes the key; after the open time one probe goes there and closes it.
        let fixed = serde_json::json!({"api_key": e2e.psp.api_key(), "webhook_secret": "unused"});
        e2e.db.store.update_connector_account(&mistyped.id, None, Some(&fixed), None).await.unwrap();
        e2e.clock.advance(sluice_core::BreakerPolicy::default().open_ms);
        let third = e2e.create("br-3", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(third.status, ClientStatus::Succeeded);
        assert_eq!(third.details.attempts.len(), 1);
        assert_eq!(third.details.attempts[0].connector_account_id, mistyped.id, "the probe");
        let health = e2e.orch.account_health(&e2e.merchant.id, &mistyped.id).await.unwrap();
        assert_eq!(health.breaker.state.name(), "closed");
        assert_eq!(health.refusal, None);
        let moves: Vec<&str> = health.history.iter().rev().map(|e| e.detail.as_str()).collect();
        assert_eq!(moves.len(), 3, "{moves:?}");
        assert!(moves[0].ends_with("closed -> open: credentials refused"), "{moves:?}");
        assert!(moves[1].contains("open -> half_open"), "{moves:?}");
        assert!(moves[2].contains("half_open -> closed"), "{moves:?}");
    }
}

e2e_test! {
    async fn a_paused_account_takes_no_new_attempts_while_its_open_attempts_converge(e2e) {
        // Webhooks on: an Adyen-format capture is confirmed only by notification.
        let (second, _) = e2e.another_account("B", None).await;
        e2e.route_in_order(&[&e2e.account, &second]).await;
        let held = e2e.create("pause-held", 2000, CaptureMode::Manual, "pm_card_visa").await;
        assert_eq!(held.details.attempts[0].state, AttemptState::Authorized);
        assert_eq!(held.details.attempts[0].connector_account_id, e2e.account.id);

        let health = e2e.orch.pause_account(&e2e.merchant.id, &e2e.account.id, "PSP incident 42", "operator:alice").await.unwrap();
        assert_eq!(health.refusal.as_deref(), Some("paused by an operator: PSP incident 42"));
        assert_eq!((health.history[0].kind.as_str(), health.history[0].actor.as_str()), ("paused", "operator:alice"));

        // New attempts go elsewhere, saying why.
        let routed = e2e.create("pause-new", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(routed.details.attempts.len(), 1);
        assert_eq!(routed.details.attempts[0].connector_account_id, second.id);
        let reasons = route_reasons(&e2e, &routed).await;
        assert!(reasons[0].contains("paused by an operator: PSP incident 42"), "{reasons:?}");
        // The attempt already there keeps going: it is captured at the paused account.
        let captured = e2e.orch.capture(&e2e.merchant.id, &held.details.order.id, None).await.unwrap();
        let capture_id = captured.capture.id.clone();
        crate::common::eventually(std::time::Duration::from_secs(20), "the capture at the paused account", || async {
            let capture = e2e.db.store.get_capture(&capture_id).await.unwrap();
            (capture.state == sluice_core::CaptureState::Succeeded).then_some(())
        })
        .await;

        // With nothing else to go to, the merchant is told which account was skipped and why.
        e2e.route_in_order(&[&e2e.account]).await;
        let refused = try_sale(&e2e, "pause-nowhere", None).await;
        let message = refused.expect_err("no eligible account").to_string();
        assert!(message.contains(&e2e.account.id) && message.contains("PSP incident 42"), "{message}");

        e2e.orch.resume_account(&e2e.merchant.id, &e2e.account.id, "operator:bob").await.unwrap();
        let back = e2e.create("pause-back", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(back.details.attempts[0].connector_account_id, e2e.account.id);
    }
}

e2e_test! {
    async fn an_account_failing_with_5xx_opens_its_breaker_routing_goes_around_it_and_a_probe_closes_it(e2e) {
        use sluice_orchestrator::{Target, Trigger};
        use sluice_sandbox_psp::account_faults::AccountFaults;
        e2e.webhooks_off();
        let (failing, psp_name) = e2e.another_account("Failing", None).await;
        // Within the PSP's key retention a query proving absence re-sends
        // the original with the same key, so the UNKNOWN converges later.
        let mut config = failing.config.clone();
        config["resend_window_ms"] = serde_json::json!("3600000");
        e2e.db.store.update_connector_account(&failing.id, Some(&config), None, None).await.unwrap();
        e2e.route_in_order(&[&failing, &e2e.account]).await;
        let every_call = AccountFaults { server_error_every: 1, ..AccountFaults::default() };
        e2e.sandbox.set_account_faults(&psp_name, Some(every_call));

        // A 5xx may have executed: UNKNOWN, never a failover (seed 001 test
        // E); each new payment's unanswered call feeds the breaker until it opens.
        let policy = sluice_core::BreakerPolicy::default();
        let mut stuck = Vec::new();
        for n in 0..policy.min_calls {
            let view = e2e.create(&format!("br5-{n}"), 1500, CaptureMode::Automatic, "pm_card_visa").await;
            assert_eq!(view.status, ClientStatus::Processing);
            assert_eq!(view.details.attempts.len(), 1);
            let attempt = view.details.attempts[0].clone();
            assert_eq!((attempt.state, attempt.connector_account_id.as_str()), (AttemptState::Unknown, failing.id.as_str()));
            stuck.push(attempt);
        }
        let health = e2e.orch.account_health(&e2e.merchant.id, &failing.id).await.unwrap();
        assert_eq!(health.breaker.state.name(), "open", "{health:?}");
        assert_eq!(health.breaker.window_unanswered, health.breaker.window_calls);

        // New payments go around it, saying why, and charge once.
        let around = e2e.create("br5-around", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(around.status, ClientStatus::Succeeded);
        assert_eq!(around.details.attempts.len(), 1);
        assert_eq!(around.details.attempts[0].connector_account_id, e2e.account.id);
        let reasons = route_reasons(&e2e, &around).await;
        assert!(reasons[0].contains(&failing.id) && reasons[0].contains("breaker open"), "{reasons:?}");
        assert_eq!(e2e.sandbox.charge_count(&around.details.attempts[0].reference), 1);

        // The PSP recovers. Queries were never held back by the breaker: the
        // UNKNOWN converges while it is still open, with one charge.
        e2e.sandbox.set_account_faults(&psp_name, None);
        for attempt in &stuck[..3] {
            e2e.orch.advance(Target::Attempt(attempt.id.clone()), Trigger::Operator).await.unwrap();
            let converged = e2e.db.store.get_attempt(&attempt.id).await.unwrap();
            assert_eq!(converged.state, AttemptState::Succeeded);
            assert_eq!(e2e.sandbox.charge_count(&attempt.reference), 1);
        }
        // After the open time one probe goes to the account and closes the breaker.
        e2e.clock.advance(policy.open_ms);
        let probe = e2e.create("br5-probe", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(probe.status, ClientStatus::Succeeded);
        assert_eq!(probe.details.attempts[0].connector_account_id, failing.id, "the probe");
        let health = e2e.orch.account_health(&e2e.merchant.id, &failing.id).await.unwrap();
        assert_eq!(health.breaker.state.name(), "closed");
        let moves: Vec<&str> = health.history.iter().rev().map(|e| e.detail.as_str()).collect();
        assert!(moves[0].starts_with("closed -> open"), "{moves:?}");
        assert!(moves.last().is_some_and(|m| m.contains("half_open -> closed")), "{moves:?}");
    }
}
