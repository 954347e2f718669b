//! `POST /webhooks/{adapter}/{connector_account}` through real HTTP.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};
use sluice_merchant_api::limits::RateLimit;
use sluice_merchant_api::ApiConfig;

/// A payment whose attempt is UNKNOWN (the PSP committed, the answer was
/// lost): (payment id, attempt reference, PSP payment id).
async fn unknown_payment(
    gw: &Gateway,
    m: &TestMerchant,
    order_no: &str,
) -> (String, String, String) {
    gw.psp.set_mode(
        PspRoute::Payments,
        Mode::TimeoutAfterCommit(Duration::from_secs(3)),
    );
    let mut body = payment_body(order_no, 1000);
    body["connector_account"] = json!(m.account);
    body["confirm"] = json!(true);
    let p = gw
        .post(&m.key, "/v1/payments", &body)
        .await
        .expect(201)
        .json();
    gw.psp.set_mode(PspRoute::Payments, Mode::Succeed);
    assert_eq!(p["status"], "processing", "{p}");
    let reference = p["attempts"][0]["reference"].as_str().unwrap().to_owned();
    let psp_id = gw.psp.payments_for(&reference)[0].id.clone();
    (p["id"].as_str().unwrap().to_owned(), reference, psp_id)
}

fn succeeded_event(event_id: &str, psp_id: &str, reference: &str) -> Value {
    json!({
        "id": event_id,
        "type": "payment.succeeded",
        "data": {"id": psp_id, "reference": reference, "amount": 1000, "currency": "EUR", "status": "succeeded"}
    })
}

async fn inbox_rows(gw: &Gateway, verification: &str) -> i64 {
    use sqlx::Row;
    sqlx::query("SELECT COUNT(*) FROM webhook_inbox WHERE verification = $1")
        .bind(verification)
        .fetch_one(gw.store().pool())
        .await
        .unwrap()
        .try_get::<i64, _>(0)
        .unwrap()
}

dual_test! {
    async fn a_verified_webhook_is_in_the_inbox_before_its_ack_and_a_duplicate_gets_the_same_ack(&gw) {
        let m = gw.merchant("Acme").await;
        let (payment_id, reference, psp_id) = unknown_payment(gw, &m, "wh-1").await;
        let event = succeeded_event("evt_1", &psp_id, &reference);

        let ack = gw.webhook(&m.account, &event).await.expect(200);
        assert_eq!(ack.bytes, br#"{"received":true}"#, "the adapter's ack, byte for byte");
        assert_eq!(ack.headers.get("content-type").unwrap(), "application/json");
        assert_eq!(inbox_rows(gw, "verified").await, 1, "durably recorded when the 2xx arrives");

        let duplicate = gw.webhook(&m.account, &event).await.expect(200);
        assert_eq!(duplicate.bytes, ack.bytes);
        assert_eq!(inbox_rows(gw, "verified").await, 1);
        let counts = gw.state.webhook_metrics().snapshot();
        assert_eq!((counts.accepted, counts.duplicates), (1, 1));

        let round = gw.orch.process_inbox_once().await.unwrap();
        assert_eq!(round.applied, 1);
        let p = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.json();
        assert_eq!(p["status"], "succeeded", "the verified webhook resolved the UNKNOWN: {p}");
        let timeline = gw.get(&m.key, &format!("/v1/payments/{payment_id}/timeline")).await.json();
        let from_webhook: Vec<&Value> = timeline["data"].as_array().unwrap().iter()
            .filter(|e| e["provider_event_id"] == "evt_1" && e["aggregate_type"] == "attempt")
            .collect();
        assert_eq!(from_webhook.len(), 1, "applied once: {timeline}");
        assert_eq!(from_webhook[0]["source"], "webhook");
        assert_eq!(from_webhook[0]["accepted"], true);
        assert_eq!(from_webhook[0]["adapter"]["name"], ADAPTER);
        assert_eq!(gw.psp.payments().len(), 1);

        // Redelivered after processing: the same ack, nothing applied again.
        gw.webhook(&m.account, &event).await.expect(200);
        assert_eq!(gw.orch.process_inbox_once().await.unwrap().claimed, 0);
    }
}

dual_test! {
    async fn a_webhook_failing_verification_is_refused_by_kind_changes_nothing_and_is_counted(&gw) {
        let m = gw.merchant("Acme").await;
        let (payment_id, reference, psp_id) = unknown_payment(gw, &m, "wh-2").await;
        let body = serde_json::to_vec(&succeeded_event("evt_bad", &psp_id, &reference)).unwrap();
        let now = sluice_store::SystemClock.now_ms() / 1000;

        let wrong_secret = sign("whsec_someone_else", now, &body);
        let refused = gw.webhook_signed(ADAPTER, &m.account, &wrong_secret, &body).await;
        let error = refused.expect_error(401, "webhook_bad_signature");
        assert!(!refused.text().contains(&wrong_secret) && !refused.text().contains(WEBHOOK_SECRET), "{error}");
        assert!(refused.headers.get("www-authenticate").is_none());

        let mut tampered = body.clone();
        tampered.extend_from_slice(b" ");
        gw.webhook_signed(ADAPTER, &m.account, &sign(WEBHOOK_SECRET, now, &body), &tampered)
            .await
            .expect_error(401, "webhook_bad_signature");
        gw.webhook_signed(ADAPTER, &m.account, &sign(WEBHOOK_SECRET, now - 3600, &body), &body)
            .await
            .expect_error(401, "webhook_stale_timestamp");
        let garbage = b"not json".to_vec();
        gw.webhook_signed(ADAPTER, &m.account, &sign(WEBHOOK_SECRET, now, &garbage), &garbage)
            .await
            .expect_error(400, "webhook_malformed");

        let counts = gw.state.webhook_metrics().snapshot();
        assert_eq!((counts.rejected_bad_signature, counts.rejected_stale_timestamp, counts.rejected_malformed), (2, 1, 1));
        assert_eq!(counts.rejected(), 4);
        assert_eq!(counts.accepted, 0);
        assert_eq!(inbox_rows(gw, "verified").await, 0, "nothing reached the state machine");
        assert_eq!(gw.orch.process_inbox_once().await.unwrap().applied, 0);
        let p = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.json();
        assert_eq!(p["status"], "processing");
        let registry = prometheus::Registry::new();
        gw.state.register_metrics(&registry).unwrap();
        let family = registry.gather().into_iter().find(|f| f.name() == "sluice_webhooks_total").unwrap();
        let bad = family.get_metric().iter()
            .find(|m| m.get_label()[0].value() == "rejected_bad_signature")
            .unwrap();
        assert_eq!(bad.get_counter().get_value(), 2.0);
    }
}

dual_test! {
    async fn a_webhook_for_an_unknown_adapter_or_account_is_404(&gw) {
        let m = gw.merchant("Acme").await;
        let event = json!({"id": "evt_x", "type": "payment.succeeded", "data": {}});
        let bytes = serde_json::to_vec(&event).unwrap();
        let signature = sign(WEBHOOK_SECRET, sluice_store::SystemClock.now_ms() / 1000, &bytes);
        for (adapter, account) in [
            ("stripe", m.account.as_str()),
            (ADAPTER, "ca_missing"),
            ("Not-A-Name", m.account.as_str()),
        ] {
            gw.webhook_signed(adapter, account, &signature, &bytes).await.expect_error(404, "resource_missing");
        }
        assert_eq!(gw.state.webhook_metrics().snapshot().not_found, 3);
        assert_eq!(gw.count("webhook_inbox").await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_webhook_route_has_a_body_limit_and_a_per_account_rate_limit() {
    let config = ApiConfig {
        webhook_rate_limit: RateLimit {
            burst: 2,
            per_second: 1,
        },
        ..ApiConfig::default()
    };
    let gw = Gateway::start_with(test_db(Backend::Sqlite).await, config).await;
    let m = gw.merchant("Acme").await;
    // The oversized delivery takes the first token of the burst of 2.
    let huge = vec![b'x'; sluice_merchant_api::MAX_WEBHOOK_BODY_BYTES + 1];
    let too_big = gw
        .webhook_signed(ADAPTER, &m.account, &sign(WEBHOOK_SECRET, 0, &huge), &huge)
        .await;
    too_big.expect_error(413, "body_too_large");
    let event = json!({"id": "evt_rl", "type": "customer.updated", "data": {}});
    gw.webhook(&m.account, &event).await.expect(200);
    let limited = gw.webhook(&m.account, &event).await;
    limited.expect_error(429, "rate_limited");
    assert!(limited.headers.get("retry-after").is_some());
    assert_eq!(gw.state.webhook_metrics().snapshot().rate_limited, 1);
    // Another account has a bucket of its own.
    let other = gw.merchant("Globex").await;
    gw.webhook(&other.account, &event).await.expect(200);
}
