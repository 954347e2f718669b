//! `/metrics` after real traffic: a real server, the real Stripe adapter and
//! the sandbox PSP, payments over HTTP, then a scrape.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_server::demo_setup;
use sluice_store::PendingKind;

use crate::common::{adapters_subset, config, start};

/// The value of the first sample whose line starts with `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// The sum of every sample of `name` whose labels include all of `labels`
/// (`key="value"` pairs, in any order among the others).
fn sum_with(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .filter(|line| labels.iter().all(|l| line.contains(l)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn pay(http: &reqwest::Client, base: &str, key: &str, body: Value) -> Value {
    let response = http
        .post(format!("{base}/v1/payments"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("create payment");
    assert_eq!(response.status(), 201);
    response.json().await.expect("payment JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_expose_pending_states_manual_review_psp_calls_and_cas_conflicts_after_real_traffic(
) {
    let data = tempfile::tempdir().unwrap();
    let adapters = adapters_subset(&["stripe"]);
    let server = start(&config(data.path(), Some(adapters.path().to_path_buf()))).await;
    let base = server.url();
    let store = server.services().orchestrator.store().clone();
    let setup = demo_setup::set_up(&store, &server.services().merchant_api.pepper, &base)
        .await
        .expect("sandbox PSP and demo merchant");
    let account = &setup
        .accounts
        .iter()
        .find(|(a, _)| a == "stripe")
        .unwrap()
        .1;
    let http = reqwest::Client::new();
    let body = |order: &str, token: &str, confirm: bool| {
        json!({"amount": 1999, "currency": "EUR", "merchant_order_no": order,
               "capture_mode": "automatic", "connector_account": account,
               "payment_method": token, "confirm": confirm})
    };
    let paid = pay(
        &http,
        &base,
        &setup.api_key,
        body("m-1", "pm_card_visa", true),
    )
    .await;
    pay(
        &http,
        &base,
        &setup.api_key,
        body("m-2", "pm_card_visa", false),
    )
    .await;
    let action = pay(
        &http,
        &base,
        &setup.api_key,
        body("m-3", "pm_card_threeDSecureRequired", true),
    )
    .await;
    // The payment method type is the merchant's: its own label value.
    let mut sepa = body("m-4", "pm_card_visa", true);
    sepa["payment_method_type"] = json!("sepa_debit");
    pay(&http, &base, &setup.api_key, sepa).await;
    // Wait for the sale to settle (the sandbox answers at once; webhooks may follow).
    let deadline = Instant::now() + Duration::from_secs(20);
    let paid_id = paid["id"].as_str().unwrap();
    loop {
        let view = store.get_payment(None, paid_id).await.unwrap();
        if view.state == sluice_core::OrderState::Succeeded {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "payment never succeeded: {view:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attempt = store
        .list_attempts(action["id"].as_str().unwrap())
        .await
        .unwrap()
        .pop()
        .expect("an attempt waiting for the customer");
    assert_eq!(attempt.state, sluice_core::AttemptState::RequiresAction);
    store
        .flag_manual_review(
            PendingKind::Attempt,
            &attempt.id,
            "test: a person must look",
            &sluice_store::Provenance::actor("test"),
        )
        .await
        .unwrap();

    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let get =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("{series} missing:\n{text}"));
    assert_eq!(
        get(r#"sluice_pending_total{aggregate="order",state="CREATED"}"#),
        1.0
    );
    assert_eq!(
        get(r#"sluice_pending_total{aggregate="order",state="REQUIRES_ACTION"}"#),
        1.0
    );
    assert_eq!(
        get(r#"sluice_pending_total{aggregate="attempt",state="REQUIRES_ACTION"}"#),
        1.0
    );
    assert_eq!(
        get(r#"sluice_pending_total{aggregate="attempt",state="UNKNOWN"}"#),
        0.0
    );
    assert_eq!(
        get(r#"sluice_pending_oldest_age_seconds{aggregate="attempt",state="UNKNOWN"}"#),
        0.0
    );
    assert!(get(r#"sluice_pending_oldest_age_seconds{aggregate="order",state="CREATED"}"#) >= 0.0);
    assert_eq!(get("sluice_manual_review_payments"), 1.0);
    // Every reconciliation class has its series, 0 while no run found any.
    assert_eq!(
        get(r#"sluice_reconciliation_unresolved_differences{class="missing_ours"}"#),
        0.0
    );
    assert_eq!(
        get(r#"sluice_reconciliation_unresolved_amount_minor{class="duplicate"}"#),
        0.0
    );
    assert_eq!(
        get("sluice_reconciliation_oldest_unresolved_age_seconds"),
        0.0
    );
    // Per adapter, connector account and payment method (seed 001 §11).
    let sale = [
        r#"adapter="stripe""#,
        r#"operation="sale""#,
        r#"payment_method="card""#,
        "connector_account=\"",
    ];
    let answered = [&sale[..], &[r#"outcome="answered""#, r#"reason="2xx""#]].concat();
    assert!(
        sum_with(&text, "sluice_psp_calls_total", &answered) >= 2.0,
        "{text}"
    );
    assert!(
        sum_with(&text, "sluice_psp_call_duration_seconds_count", &sale) >= 2.0,
        "{text}"
    );
    let sepa = [r#"adapter="stripe""#, r#"payment_method="sepa_debit""#];
    assert!(
        sum_with(&text, "sluice_psp_calls_total", &sepa) >= 1.0,
        "{text}"
    );
    let succeeded = [&sale[..], &[r#"result="PAYMENT_SUCCEEDED""#]].concat();
    assert!(
        sum_with(&text, "sluice_psp_results_total", &succeeded) >= 1.0,
        "{text}"
    );
    assert!(get("sluice_cas_conflicts_total") >= 0.0);
    assert!(get(r#"sluice_inbox_backlog{status="failed"}"#) >= 0.0);
    assert!(get("sluice_inbox_oldest_backlog_age_seconds") >= 0.0);
    assert!(
        text.contains("sluice_webhooks_total"),
        "webhook counters are exported"
    );
    assert!(
        text.contains("sluice_scanner_rounds_total"),
        "scanner counters are exported"
    );
    assert!(
        text.contains("sluice_outbox_oldest_pending_age_seconds"),
        "outbox lag is exported"
    );
    server.shutdown().await.expect("clean shutdown");
}
