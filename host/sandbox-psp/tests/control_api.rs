//! The `/_sandbox/` control API over HTTP, and shutdown.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sluice_sandbox_psp::{DeliveryFaults, SandboxConfig};

async fn control_get(base: &str, path: &str) -> Reply {
    reply(
        client()
            .get(format!("{base}/_sandbox{path}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .await
}

async fn control_send(method: reqwest::Method, base: &str, path: &str, body: &Value) -> Reply {
    let r = client()
        .request(method, format!("{base}/_sandbox{path}"))
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    reply(r).await
}

#[tokio::test]
async fn the_control_api_reports_charge_counts_payments_refunds_and_deliveries() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let base = sb.base_url();
    let sale = stripe_create(&sb, "att_ctl", "pm_card_visa", "1000", "automatic").await;
    stripe_create(&sb, "att_ctl", "pm_card_visa", "1000", "automatic").await;
    stripe_create(
        &sb,
        "att_ctl_decl",
        "pm_card_chargeDeclined",
        "1000",
        "automatic",
    )
    .await;
    let id = sale.json["id"].as_str().unwrap_or_default();
    stripe_post(
        &sb,
        "/v1/refunds",
        Some("ref_ctl"),
        &[
            ("payment_intent", id),
            ("amount", "100"),
            ("metadata[sluice_refund_reference]", "ref_ctl"),
        ],
    )
    .await;

    let one = control_get(&base, "/charges/att_ctl").await;
    assert_eq!(
        one.json,
        json!({ "reference": "att_ctl", "payments": 1, "charges": 1 })
    );
    let all = control_get(&base, "/charges").await;
    assert_eq!(
        all.json["att_ctl_decl"],
        json!({ "payments": 1, "charges": 0 })
    );
    let refunds = control_get(&base, "/refund_counts/ref_ctl").await;
    assert_eq!(refunds.json["refunds"], 1);

    let payments = control_get(&base, "/payments").await;
    assert_eq!(payments.json.as_array().map(Vec::len), Some(2));
    let payment = control_get(&base, &format!("/payments/{id}")).await;
    assert_eq!(payment.json["status"], "succeeded");
    assert_eq!(payment.json["amount_refunded"], 100);
    assert!(
        payment.json.get("api_key").is_none(),
        "the API key must not be exposed"
    );
    assert_eq!(control_get(&base, "/payments/pi_nope").await.status, 404);
    let refund_list = control_get(&base, "/refunds").await;
    assert_eq!(refund_list.json[0]["reference"], "ref_ctl");

    let idle = control_send(
        reqwest::Method::POST,
        &base,
        "/wait_idle?timeout_ms=5000",
        &json!({}),
    )
    .await;
    assert_eq!(idle.json["idle"], true);
    let deliveries = control_get(&base, "/deliveries").await;
    let count = deliveries.json.as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(count, receiver.received().len());
    assert_eq!(deliveries.json[0]["acknowledged"], true);
    assert_eq!(deliveries.json[0]["status"], 200);
}

#[tokio::test]
async fn the_control_api_sets_webhook_targets_and_delivery_faults_at_run_time() {
    let sb = sandbox().await;
    let base = sb.base_url();
    let receiver = Receiver::start().await;
    let target = json!({
        "url": format!("{}/webhooks/stripe/acct_ctl", receiver.url),
        "secret": WHSEC,
        "format": "stripe",
    });
    let put = control_send(
        reqwest::Method::PUT,
        &base,
        "/webhook_targets/stripe_ctl",
        &target,
    )
    .await;
    assert_eq!(put.status, 204, "{}", put.text);
    let listed = control_get(&base, "/webhook_targets").await;
    assert_eq!(listed.json["stripe_ctl"]["secret_set"], true);
    assert!(!listed.text.contains(WHSEC), "secrets must not be listed");

    let faults = json!({ "duplicates": 2, "delay_ms": 0, "reorder_window": 0 });
    assert_eq!(
        control_send(reqwest::Method::PUT, &base, "/delivery_faults", &faults)
            .await
            .status,
        204
    );
    assert_eq!(
        control_get(&base, "/delivery_faults").await.json["duplicates"],
        2
    );
    assert_eq!(sb.delivery_faults().duplicates, 2);

    stripe_create(&sb, "att_ctl_hooks", "pm_card_visa", "100", "automatic").await;
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let got = receiver.received();
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|r| {
        let sig = r
            .headers
            .get("stripe-signature")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        stripe_signature_is_valid(sig, &r.body, WHSEC)
    }));

    let deleted = client()
        .delete(format!("{base}/_sandbox/webhook_targets/stripe_ctl"))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .ok();
    assert_eq!(deleted, Some(204));
    stripe_create(&sb, "att_ctl_hooks_2", "pm_card_visa", "100", "automatic").await;
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    assert_eq!(receiver.received().len(), 2);
}

#[tokio::test]
async fn the_control_api_settles_pending_work_and_completes_customer_actions() {
    let sb = sandbox().await;
    let base = sb.base_url();
    let late = stripe_create(
        &sb,
        "att_ctl_late",
        "pm_sluice_late_webhook_only",
        "100",
        "automatic",
    )
    .await;
    let settled = control_send(reqwest::Method::POST, &base, "/settle_pending", &json!({})).await;
    assert_eq!(settled.json["settled"], 1);
    let id = late.json["id"].as_str().unwrap_or_default();
    assert_eq!(
        stripe_get(&sb, &format!("/v1/payment_intents/{id}"))
            .await
            .json["status"],
        "succeeded"
    );

    let action = stripe_create(
        &sb,
        "att_ctl_3ds",
        "pm_card_threeDSecureRequired",
        "100",
        "manual",
    )
    .await;
    let action_id = action.json["id"].as_str().unwrap_or_default();
    let done = control_send(
        reqwest::Method::POST,
        &base,
        &format!("/payments/{action_id}/complete_action"),
        &json!({ "authenticated": true }),
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.text);
    assert_eq!(done.json["status"], "requires_capture");
    let twice = control_send(
        reqwest::Method::POST,
        &base,
        &format!("/payments/{action_id}/complete_action"),
        &json!({ "authenticated": true }),
    )
    .await;
    assert_eq!(twice.status, 404);
    assert_eq!(sb.charge_count("att_ctl_3ds"), 1);
}

#[tokio::test]
async fn the_control_api_switches_the_refund_behaviour() {
    let sb = sandbox().await;
    let base = sb.base_url();
    let put = control_send(
        reqwest::Method::PUT,
        &base,
        "/refund_behaviour",
        &json!({ "behaviour": "pending_then_succeed" }),
    )
    .await;
    assert_eq!(put.status, 204);
    assert_eq!(
        control_get(&base, "/refund_behaviour").await.json["behaviour"],
        "pending_then_succeed"
    );
    let sale = stripe_create(&sb, "att_ctl_refund", "pm_card_visa", "100", "automatic").await;
    let id = sale.json["id"].as_str().unwrap_or_default();
    let r = stripe_post(&sb, "/v1/refunds", Some("rc_1"), &[("payment_intent", id)]).await;
    assert_eq!(r.json["status"], "pending");
    assert_eq!(r.json["amount"], 100);
    assert_eq!(sb.settle_pending(), 1);
    let refund_id = r.json["id"].as_str().unwrap_or_default();
    assert_eq!(
        stripe_get(&sb, &format!("/v1/refunds/{refund_id}"))
            .await
            .json["status"],
        "succeeded"
    );
}

#[tokio::test]
async fn shutdown_cuts_a_held_answer_short_and_stops_the_server() {
    let mut config = fast_config();
    config.timeout_hold = Duration::from_secs(60);
    let sb = sandbox_with(config).await;
    let url = format!("{}/v1/payment_intents", sb.base_url_stripe());
    let held = tokio::spawn(async move {
        client()
            .post(url)
            .bearer_auth(STRIPE_KEY)
            .header("Idempotency-Key", "att_hold")
            .form(&pi_form(
                "att_hold",
                "pm_sluice_commit_then_timeout",
                "100",
                "automatic",
            ))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let base = sb.base_url();
    let started = std::time::Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(5), sb.shutdown()).await;
    assert!(matches!(stopped, Ok(Ok(()))), "{stopped:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let held = held.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        held.ok(),
        Some(200),
        "the held answer is released at shutdown"
    );
    assert!(client()
        .get(format!("{base}/_sandbox/health"))
        .send()
        .await
        .is_err());
}

#[tokio::test]
async fn the_query_log_records_every_lookup_with_its_attempt_reference_and_duration() {
    let sb = sandbox_with(SandboxConfig {
        query_delay: Duration::from_millis(120),
        ..fast_config()
    })
    .await;
    let created = stripe_create(&sb, "att_q", "pm_card_visa", "1000", "automatic").await;
    let id = created.json["id"].as_str().unwrap_or_default().to_owned();
    let (search_url, retrieve_url) = (search_path("att_q"), format!("/v1/payment_intents/{id}"));
    let (search, retrieve) =
        tokio::join!(stripe_get(&sb, &search_url), stripe_get(&sb, &retrieve_url),);
    assert_eq!(search.status, 200, "{}", search.json);
    assert_eq!(retrieve.status, 200, "{}", retrieve.json);

    let log = control_get(&sb.base_url(), "/queries").await;
    let records = log.json.as_array().cloned().unwrap_or_default();
    assert_eq!(records.len(), 2, "{}", log.json);
    let mut kinds: Vec<&str> = records.iter().filter_map(|r| r["kind"].as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, ["retrieve", "search"]);
    for record in &records {
        assert_eq!(record["reference"], "att_q", "{record}");
        let took = record["ended_unix_ms"].as_i64().unwrap_or(0)
            - record["started_unix_ms"].as_i64().unwrap_or(0);
        assert!(
            took >= 120,
            "the lookup answered before the query delay: {record}"
        );
    }
    // The two lookups ran at the same time, and the log shows it.
    assert!(
        records[0]["started_unix_ms"].as_i64() < records[1]["ended_unix_ms"].as_i64()
            && records[1]["started_unix_ms"].as_i64() < records[0]["ended_unix_ms"].as_i64(),
        "{}",
        log.json
    );
    assert_eq!(sb.queries().len(), 2);
}

#[tokio::test]
async fn a_settlement_report_is_served_as_csv_for_an_account_and_period_with_its_discrepancies() {
    let sb = sandbox().await;
    let base = sb.base_url();
    stripe_create(&sb, "att_rep", "pm_card_visa", "1250", "automatic").await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let body = json!({
        "account": sluice_sandbox_psp::DEFAULT_STRIPE_API_KEY,
        "period_start": now - 60,
        "period_end": now + 60,
        "discrepancies": { "duplicate_charge": ["att_rep"] },
    });
    let report = control_send(
        reqwest::Method::POST,
        &base,
        "/settlement_reports/stripe",
        &body,
    )
    .await;
    assert_eq!(report.status, 200, "{}", report.text);
    assert_eq!(
        report
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/csv")
    );
    let lines: Vec<&str> = report.text.lines().collect();
    assert!(lines[0].starts_with(
        "balance_transaction_id,created_utc,currency,gross,fee,net,reporting_category"
    ));
    assert_eq!(
        lines.len(),
        3,
        "a header and the charge twice: {}",
        report.text
    );
    assert!(
        lines[1].contains(",12.50,") && lines[1].contains(",att_rep,"),
        "{}",
        report.text
    );

    let elsewhere =
        json!({ "account": "sk_other", "period_start": now - 60, "period_end": now + 60 });
    let empty = control_send(
        reqwest::Method::POST,
        &base,
        "/settlement_reports/adyen",
        &elsewhere,
    )
    .await;
    assert_eq!(
        empty.text.lines().count(),
        1,
        "only the header: {}",
        empty.text
    );
    let unknown = json!({ "account": "x", "period_start": 0, "period_end": 1, "bogus": 1 });
    let refused = control_send(
        reqwest::Method::POST,
        &base,
        "/settlement_reports/stripe",
        &unknown,
    )
    .await;
    assert!((400..500).contains(&refused.status), "{}", refused.text);
}
