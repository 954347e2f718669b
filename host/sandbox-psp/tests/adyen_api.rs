//! The Adyen-format subset over real HTTP: payments, modifications, idempotency,
//! fault modes and the notifications they cause.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use sluice_sandbox_psp::{DeliveryFaults, PayStatus};

/// `(eventCode, success, pspReference, originalReference, merchantReference, value)` of every item received.
fn items_of(receiver: &Receiver) -> Vec<(String, String, String, String, String, i64)> {
    receiver
        .received()
        .iter()
        .flat_map(|r| adyen_items(&r.body))
        .map(|i| {
            let s = |k: &str| i[k].as_str().unwrap_or("").to_owned();
            (
                s("eventCode"),
                s("success"),
                s("pspReference"),
                s("originalReference"),
                s("merchantReference"),
                i["amount"]["value"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_adyen_sale_is_authorised_and_notified_as_authorisation_then_capture() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_sale"),
        &adyen_payment("att_a_sale", "pm_card_visa", 1130, false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["resultCode"], "Authorised");
    assert_eq!(r.json["merchantReference"], "att_a_sale");
    let psp = r.json["pspReference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(psp.len(), 16);
    assert_eq!(sb.charge_count("att_a_sale"), 1);

    receiver.wait_for(1).await;
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let items = items_of(&receiver);
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0].0, "AUTHORISATION");
    assert_eq!(
        (
            items[0].1.as_str(),
            items[0].2.as_str(),
            items[0].4.as_str(),
            items[0].5
        ),
        ("true", psp.as_str(), "att_a_sale", 1130)
    );
    assert_eq!(items[1].0, "CAPTURE");
    assert_eq!(
        (items[1].1.as_str(), items[1].3.as_str(), items[1].5),
        ("true", psp.as_str(), 1130)
    );
    assert_ne!(items[1].2, psp, "the capture has its own pspReference");
    // Batched by default: both items in one request.
    assert_eq!(receiver.received().len(), 1);
}

#[tokio::test]
async fn an_adyen_authorisation_notifies_only_authorisation_and_a_partial_capture_notifies_capture()
{
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_auth"),
        &adyen_payment("att_a_auth", "pm_card_visa", 1000, true),
    )
    .await;
    assert_eq!(r.json["resultCode"], "Authorised");
    let psp = r.json["pspReference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        sb.payment(&psp).map(|p| p.status),
        Some(PayStatus::RequiresCapture)
    );

    let cap = adyen_post(
        &sb,
        &format!("/v71/payments/{psp}/captures"),
        Some("cap_a_1"),
        &json!({ "merchantAccount": MERCHANT, "amount": { "value": 600, "currency": "EUR" }, "reference": "cap_a_1" }),
    )
    .await;
    assert_eq!(cap.status, 201, "{}", cap.text);
    assert_eq!(cap.json["status"], "received");
    assert_eq!(cap.json["paymentPspReference"], psp.as_str());
    assert_eq!(cap.json["reference"], "cap_a_1");
    let cap_psp = cap.json["pspReference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let items = items_of(&receiver);
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(
        (items[0].0.as_str(), items[0].1.as_str()),
        ("AUTHORISATION", "true")
    );
    assert_eq!(
        items[1],
        (
            "CAPTURE".into(),
            "true".into(),
            cap_psp,
            psp.clone(),
            "cap_a_1".into(),
            600
        )
    );
    assert_eq!(sb.payment(&psp).map(|p| p.amount_received), Some(600));
}

#[tokio::test]
async fn an_adyen_capture_beyond_the_authorisation_is_received_then_notified_as_failed() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_overcap"),
        &adyen_payment("att_a_overcap", "pm_card_visa", 1000, true),
    )
    .await;
    let psp = r.json["pspReference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let cap = adyen_post(
        &sb,
        &format!("/v71/payments/{psp}/captures"),
        Some("cap_over"),
        &json!({ "merchantAccount": MERCHANT, "amount": { "value": 1001, "currency": "EUR" }, "reference": "cap_over" }),
    )
    .await;
    assert_eq!(cap.status, 201);
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let items = items_of(&receiver);
    assert_eq!(
        (items[1].0.as_str(), items[1].1.as_str()),
        ("CAPTURE", "false")
    );
    assert_eq!(
        sb.payment(&psp).map(|p| p.status),
        Some(PayStatus::RequiresCapture)
    );
}

#[tokio::test]
async fn an_adyen_refused_card_answers_refused_with_reason_and_code() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_decl"),
        &adyen_payment("att_a_decl", "pm_card_chargeDeclined", 500, false),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["resultCode"], "Refused");
    assert_eq!(r.json["refusalReason"], "Refused");
    assert_eq!(r.json["refusalReasonCode"], "2");
    let nsf = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_nsf"),
        &adyen_payment("att_a_nsf", "pm_card_insufficient_funds", 500, false),
    )
    .await;
    assert_eq!(nsf.json["refusalReason"], "Not enough balance");
    assert_eq!(nsf.json["refusalReasonCode"], "12");
    assert_eq!(
        sb.charge_count("att_a_decl") + sb.charge_count("att_a_nsf"),
        0
    );
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let items = items_of(&receiver);
    assert!(
        items
            .iter()
            .all(|i| i.0 == "AUTHORISATION" && i.1 == "false"),
        "{items:?}"
    );
    assert_eq!(items.len(), 2);
}

#[tokio::test]
async fn adyen_three_d_secure_answers_redirect_shopper_and_completing_it_notifies_authorisation() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_3ds"),
        &adyen_payment("att_a_3ds", "pm_card_threeDSecureRequired", 800, true),
    )
    .await;
    assert_eq!(r.json["resultCode"], "RedirectShopper");
    let url = r.json["action"]["url"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(url.starts_with(&sb.base_url()), "{url}");
    assert_eq!(r.json["action"]["type"], "redirect");
    // Never follow the redirect: it leads to the merchant's (non-local) return URL.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let visit = no_redirects
        .get(format!("{url}?outcome=succeed"))
        .send()
        .await;
    assert_eq!(visit.map(|v| v.status().as_u16()).ok(), Some(303));
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let items = items_of(&receiver);
    assert_eq!(items.len(), 1);
    assert_eq!(
        (items[0].0.as_str(), items[0].1.as_str()),
        ("AUTHORISATION", "true")
    );
    assert_eq!(sb.charge_count("att_a_3ds"), 1);
}

#[tokio::test]
async fn adyen_requests_without_a_valid_api_key_get_401() {
    let sb = sandbox().await;
    let r = reply(
        client()
            .post(format!("{}/v71/payments", sb.base_url_adyen()))
            .header("X-API-Key", "wrong")
            .json(&adyen_payment("att_a_401", "pm_card_visa", 100, false))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json["errorType"], "security");
    assert_eq!(sb.payments().len(), 0);
}

#[tokio::test]
async fn adyen_requests_missing_required_fields_get_422_validation_errors() {
    let sb = sandbox().await;
    let mut body = adyen_payment("att_a_422", "pm_card_visa", 100, false);
    body.as_object_mut().map(|o| o.remove("reference"));
    let r = adyen_post(&sb, "/v71/payments", Some("att_a_422"), &body).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json["errorType"], "validation");
    assert_eq!(r.json["errorCode"], "130");
    let unknown = adyen_post(
        &sb,
        "/v71/payments/NOSUCHPSPREF0000/captures",
        None,
        &json!({ "merchantAccount": MERCHANT, "amount": { "value": 1, "currency": "EUR" }, "reference": "x" }),
    )
    .await;
    assert_eq!(unknown.status, 422);
    assert_eq!(sb.payments().len(), 0);
}

#[tokio::test]
async fn an_adyen_replay_with_the_same_key_returns_the_stored_response_and_charges_once() {
    let sb = sandbox().await;
    let body = adyen_payment("att_a_idem", "pm_card_visa", 1000, false);
    let first = adyen_post(&sb, "/v71/payments", Some("att_a_idem"), &body).await;
    let second = adyen_post(&sb, "/v71/payments", Some("att_a_idem"), &body).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.text, second.text);
    assert_eq!(
        second
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok()),
        Some("att_a_idem")
    );
    assert_eq!(sb.charge_count("att_a_idem"), 1);
    assert_eq!(sb.payments().len(), 1);
}

#[tokio::test]
async fn an_adyen_key_reused_with_another_body_is_refused_with_error_704() {
    let sb = sandbox().await;
    adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_diff"),
        &adyen_payment("att_a_diff", "pm_card_visa", 1000, false),
    )
    .await;
    let other = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_diff"),
        &adyen_payment("att_a_diff", "pm_card_visa", 1001, false),
    )
    .await;
    assert_eq!(other.status, 422, "{}", other.text);
    assert_eq!(other.json["errorCode"], "704");
    assert!(other.headers.get("transient-error").is_none());
    assert_eq!(sb.payment_count("att_a_diff"), 1);
}

#[tokio::test]
async fn an_adyen_key_in_flight_is_refused_with_a_transient_409() {
    let mut config = fast_config();
    config.slow_delay = Duration::from_millis(1500);
    let sb = sandbox_with(config).await;
    let body = adyen_payment("att_a_inflight", "pm_sluice_slow", 1000, false);
    let url = format!("{}/v71/payments", sb.base_url_adyen());
    let first = {
        let body = body.clone();
        tokio::spawn(async move {
            reply(
                client()
                    .post(url)
                    .header("X-API-Key", ADYEN_KEY)
                    .header("Idempotency-Key", "att_a_inflight")
                    .json(&body)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = adyen_post(&sb, "/v71/payments", Some("att_a_inflight"), &body).await;
    assert_eq!(second.status, 409, "{}", second.text);
    assert_eq!(second.json["errorCode"], "704");
    assert_eq!(
        second
            .headers
            .get("transient-error")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    let first = first.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first.json["resultCode"], "Authorised");
    assert_eq!(sb.charge_count("att_a_inflight"), 1);
}

#[tokio::test]
async fn an_adyen_refund_beyond_the_captured_amount_is_received_then_notified_as_failed() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_ref"),
        &adyen_payment("att_a_ref", "pm_card_visa", 1000, false),
    )
    .await;
    let psp = r.json["pspReference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let refund = |reference: &'static str, value: i64| json!({ "merchantAccount": MERCHANT, "amount": { "value": value, "currency": "EUR" }, "reference": reference });
    let ok = adyen_post(
        &sb,
        &format!("/v71/payments/{psp}/refunds"),
        Some("ref_a_1"),
        &refund("ref_a_1", 700),
    )
    .await;
    assert_eq!(ok.status, 201);
    let refund_psp = ok.json["pspReference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let over = adyen_post(
        &sb,
        &format!("/v71/payments/{psp}/refunds"),
        Some("ref_a_2"),
        &refund("ref_a_2", 301),
    )
    .await;
    assert_eq!(over.status, 201);

    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let refunds: Vec<_> = items_of(&receiver)
        .into_iter()
        .filter(|i| i.0 == "REFUND")
        .collect();
    assert_eq!(refunds.len(), 2, "{refunds:?}");
    assert_eq!(
        refunds[0],
        (
            "REFUND".into(),
            "true".into(),
            refund_psp,
            psp.clone(),
            "ref_a_1".into(),
            700
        )
    );
    assert_eq!(
        (refunds[1].1.as_str(), refunds[1].4.as_str()),
        ("false", "ref_a_2")
    );
    assert_eq!(sb.payment(&psp).map(|p| p.amount_refunded), Some(700));
    assert_eq!(sb.refund_count("ref_a_1"), 1);
    assert_eq!(sb.refund_count("ref_a_2"), 0);
}

#[tokio::test]
async fn an_adyen_cancel_of_an_authorisation_notifies_cancellation() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_void"),
        &adyen_payment("att_a_void", "pm_card_visa", 1000, true),
    )
    .await;
    let psp = r.json["pspReference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let c = adyen_post(
        &sb,
        &format!("/v71/payments/{psp}/cancels"),
        Some("void_a"),
        &json!({ "merchantAccount": MERCHANT, "reference": "att_a_void" }),
    )
    .await;
    assert_eq!(c.status, 201, "{}", c.text);
    assert_eq!(c.json["status"], "received");
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let items = items_of(&receiver);
    assert_eq!(
        (
            items[1].0.as_str(),
            items[1].1.as_str(),
            items[1].3.as_str()
        ),
        ("CANCELLATION", "true", psp.as_str())
    );
    assert_eq!(
        sb.payment(&psp).map(|p| p.status),
        Some(PayStatus::Canceled)
    );
}

#[tokio::test]
async fn adyen_commit_then_timeout_times_out_and_the_replay_shows_the_committed_authorisation() {
    let sb = sandbox().await;
    let body = adyen_payment("att_a_cto", "pm_sluice_commit_then_timeout", 1000, false);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let outcome = impatient
        .post(format!("{}/v71/payments", sb.base_url_adyen()))
        .header("X-API-Key", ADYEN_KEY)
        .header("Idempotency-Key", "att_a_cto")
        .json(&body)
        .send()
        .await;
    assert!(
        outcome.as_ref().is_err_and(|e| e.is_timeout()),
        "{outcome:?}"
    );
    let started = Instant::now();
    let replay = adyen_post(&sb, "/v71/payments", Some("att_a_cto"), &body).await;
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(replay.json["resultCode"], "Authorised");
    assert_eq!(sb.charge_count("att_a_cto"), 1);
    assert_eq!(sb.payment_count("att_a_cto"), 1);
}

#[tokio::test]
async fn adyen_server_error_answers_500_and_commits_nothing() {
    let sb = sandbox().await;
    let r = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_500"),
        &adyen_payment("att_a_500", "pm_sluice_server_error", 1000, false),
    )
    .await;
    assert_eq!(r.status, 500);
    assert_eq!(r.json["errorType"], "internal");
    assert_eq!(sb.payment_count("att_a_500"), 0);
}

#[tokio::test]
async fn adyen_garbage_answers_200_with_a_body_that_is_not_json() {
    let sb = sandbox().await;
    let body = adyen_payment("att_a_garbage", "pm_sluice_garbage", 1000, false);
    let r = adyen_post(&sb, "/v71/payments", Some("att_a_garbage"), &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json, Value::Null, "body was JSON: {}", r.text);
    let replay = adyen_post(&sb, "/v71/payments", Some("att_a_garbage"), &body).await;
    assert_eq!(replay.json["resultCode"], "Authorised");
    assert_eq!(sb.charge_count("att_a_garbage"), 1);
}

#[tokio::test]
async fn adyen_late_webhook_answers_received_and_authorises_only_by_notification() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let body = adyen_payment("att_a_late", "pm_sluice_late_webhook_only", 1000, false);
    let r = adyen_post(&sb, "/v71/payments", Some("att_a_late"), &body).await;
    assert_eq!(r.json["resultCode"], "Received");
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    assert_eq!(receiver.received().len(), 0);
    assert_eq!(sb.settle_pending(), 1);
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let items = items_of(&receiver);
    let codes: Vec<&str> = items.iter().map(|i| i.0.as_str()).collect();
    assert_eq!(codes, vec!["AUTHORISATION", "CAPTURE"]);
    // Adyen has no lookup: the replay still shows the first answer.
    let replay = adyen_post(&sb, "/v71/payments", Some("att_a_late"), &body).await;
    assert_eq!(replay.json["resultCode"], "Received");
    assert_eq!(sb.charge_count("att_a_late"), 1);
}

#[tokio::test]
async fn adyen_webhook_before_response_is_acknowledged_before_the_answer() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_wbr"),
        &adyen_payment("att_a_wbr", "pm_sluice_webhook_before_response", 1000, true),
    )
    .await;
    assert_eq!(r.json["resultCode"], "Authorised");
    assert_eq!(receiver.received().len(), 1);
    assert!(sb.deliveries().iter().all(|d| d.acknowledged));
}
