//! Per-account faults (latency, every Nth call a 500, hang) over HTTP, through
//! the handle and the control API: one account fails while the others answer.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use sluice_sandbox_psp::account_faults::AccountFaults;
use sluice_sandbox_psp::SandboxConfig;

const OTHER_KEY: &str = "sk_test_sluice_other_account";

async fn two_stripe_accounts() -> sluice_sandbox_psp::SandboxHandle {
    sandbox_with(SandboxConfig {
        stripe_api_keys: vec![STRIPE_KEY.into(), OTHER_KEY.into()],
        ..fast_config()
    })
    .await
}

async fn create_as(sb: &sluice_sandbox_psp::SandboxHandle, key: &str, attempt: &str) -> Reply {
    let r = client()
        .post(format!("{}/v1/payment_intents", sb.base_url_stripe()))
        .bearer_auth(key)
        .header("Idempotency-Key", attempt)
        .form(&pi_form(attempt, "pm_card_visa", "1000", "automatic"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    reply(r).await
}

#[tokio::test]
async fn every_nth_call_at_a_failing_account_answers_500_and_executes_nothing() {
    let sb = two_stripe_accounts().await;
    let faults = AccountFaults {
        server_error_every: 2,
        ..AccountFaults::default()
    };
    sb.set_account_faults(STRIPE_KEY, Some(faults));
    let statuses: Vec<u16> = [
        create_as(&sb, STRIPE_KEY, "att_f1").await.status,
        create_as(&sb, STRIPE_KEY, "att_f2").await.status,
        create_as(&sb, STRIPE_KEY, "att_f3").await.status,
        create_as(&sb, STRIPE_KEY, "att_f4").await.status,
    ]
    .into();
    assert_eq!(
        statuses,
        [200, 500, 200, 500],
        "the same calls fail on every run"
    );
    assert_eq!(sb.charge_count("att_f1"), 1);
    assert_eq!(
        sb.payment_count("att_f2"),
        0,
        "a 500 of the fault executed nothing"
    );
    // The other account is untouched.
    assert_eq!(create_as(&sb, OTHER_KEY, "att_other").await.status, 200);
    let state = &sb.account_faults()[STRIPE_KEY];
    assert_eq!((state.calls, state.server_errors), (4, 2));
    sb.set_account_faults(STRIPE_KEY, None);
    assert_eq!(create_as(&sb, STRIPE_KEY, "att_f2").await.status, 200);
    assert_eq!(
        sb.charge_count("att_f2"),
        1,
        "a retry after the outage charges once"
    );
}

#[tokio::test]
async fn an_adyen_merchant_account_fails_alone_under_a_shared_api_key() {
    let sb = sandbox().await;
    let faults = AccountFaults {
        server_error_every: 1,
        ..AccountFaults::default()
    };
    sb.set_account_faults(MERCHANT, Some(faults));
    let failing = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a1"),
        &adyen_payment("att_a1", "pm_card_visa", 1000, false),
    )
    .await;
    assert_eq!(failing.status, 500);
    assert_eq!(sb.payment_count("att_a1"), 0);
    let mut other = adyen_payment("att_a2", "pm_card_visa", 1000, false);
    other["merchantAccount"] = json!("SluiceOtherMerchant");
    let fine = adyen_post(&sb, "/v71/payments", Some("att_a2"), &other).await;
    assert_eq!(fine.status, 200, "{}", fine.text);
    assert_eq!(sb.charge_count("att_a2"), 1);
}

#[tokio::test]
async fn the_control_api_sets_latency_and_hang_per_account_and_clears_them() {
    let sb = two_stripe_accounts().await;
    let base = sb.base_url();
    let put = |account: &str, body: serde_json::Value| {
        client()
            .put(format!("{base}/_sandbox/account_faults/{account}"))
            .json(&body)
            .send()
    };
    let set = put(STRIPE_KEY, json!({ "latency_ms": 150 })).await.unwrap();
    assert_eq!(set.status().as_u16(), 204);
    let started = Instant::now();
    assert_eq!(create_as(&sb, STRIPE_KEY, "att_slow").await.status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );

    let set = put(OTHER_KEY, json!({ "hang": true })).await.unwrap();
    assert_eq!(set.status().as_u16(), 204);
    let short = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let hung = short
        .post(format!("{}/v1/payment_intents", sb.base_url_stripe()))
        .bearer_auth(OTHER_KEY)
        .header("Idempotency-Key", "att_hung")
        .form(&pi_form("att_hung", "pm_card_visa", "1000", "automatic"))
        .send()
        .await;
    assert!(
        hung.is_err_and(|e| e.is_timeout()),
        "a hanging account never answers"
    );
    assert_eq!(sb.payment_count("att_hung"), 0);

    let listed = reply(
        client()
            .get(format!("{base}/_sandbox/account_faults"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(listed.json[STRIPE_KEY]["faults"]["latency_ms"], 150);
    assert_eq!(listed.json[OTHER_KEY]["faults"]["hang"], true);
    assert_eq!(listed.json[OTHER_KEY]["calls"], 1);
    let bad = put(STRIPE_KEY, json!({ "latency": 1 })).await.unwrap();
    assert_eq!(bad.status().as_u16(), 422, "an unknown fault is refused");

    let cleared = client()
        .delete(format!("{base}/_sandbox/account_faults/{OTHER_KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(cleared.status().as_u16(), 204);
    assert_eq!(create_as(&sb, OTHER_KEY, "att_hung").await.status, 200);
    assert_eq!(sb.charge_count("att_hung"), 1);
}
