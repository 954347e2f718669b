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

        // Named directly, without any other account to go to: failed, not processing.
        let named = e2e.orch.create_payment(&e2e.merchant.id, sluice_orchestrator::CreatePayment {
            merchant_order_no: "fo-creds-named".into(),
            amount: crate::common::eur(700),
            capture_mode: CaptureMode::Automatic,
            payment_method_token: Some("pm_card_visa".into()),
            return_url: None,
            description: None,
            metadata: serde_json::json!({}),
            fulfillment: Default::default(),
            confirm: Some(sluice_orchestrator::ConfirmOptions {
                connector_account_id: Some(mistyped.id.clone()),
                ..Default::default()
            }),
        }).await.unwrap().view;
        assert_eq!(named.status, ClientStatus::Failed);
        assert_eq!(named.details.attempts.len(), 1);
        assert_eq!(named.details.attempts[0].failure.as_ref().unwrap().code, CREDENTIALS_REFUSED_CODE);
    }
}
