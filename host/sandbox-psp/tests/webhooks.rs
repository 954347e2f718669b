//! Webhook delivery: signatures checked independently, duplicates, reordering,
//! delay, retries and the delivery log.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use sluice_sandbox_psp::{
    adyen_hmac_signature, adyen_signing_payload, AdyenSignedFields, DeliveryFaults, Format,
    RefundBehaviour, WebhookTarget,
};

fn header<'a>(r: &'a Received, name: &str) -> &'a str {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

#[test]
fn the_adyen_signer_reproduces_adyens_published_test_vector() {
    let fields = AdyenSignedFields {
        psp_reference: "7914073381342284",
        original_reference: "",
        merchant_account_code: "TestMerchant",
        merchant_reference: "TestPayment-1407325143704",
        value: 1130,
        currency: "EUR",
        event_code: "AUTHORISATION",
        success: true,
    };
    let payload = adyen_signing_payload(&fields);
    assert_eq!(
        payload,
        "7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true"
    );
    let expected = "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=";
    assert_eq!(
        adyen_hmac_signature(ADYEN_HMAC_KEY, &fields).as_deref(),
        Ok(expected)
    );
    // And the independent computation agrees on the same vector.
    assert_eq!(adyen_hmac(ADYEN_HMAC_KEY, &payload), expected);
}

#[tokio::test]
async fn stripe_webhooks_are_signed_over_the_raw_body_with_the_whsec_secret() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = stripe_create(&sb, "att_sig", "pm_card_visa", "1000", "automatic").await;
    let got = receiver.wait_for(1).await;
    let hook = &got[0];
    assert_eq!(hook.path, "/webhooks/stripe/acct_test");
    let signature = header(hook, "stripe-signature");
    assert!(
        stripe_signature_is_valid(signature, &hook.body, WHSEC),
        "{signature}"
    );
    assert!(!stripe_signature_is_valid(
        signature,
        &hook.body,
        "whsec_other"
    ));
    assert!(!stripe_signature_is_valid(
        signature,
        &hook.body.replace("1000", "9999"),
        WHSEC
    ));
    let t: i64 = signature
        .trim_start_matches("t=")
        .split(',')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    assert!((now - t).abs() < 60, "timestamp {t} is not current");

    let event: Value = serde_json::from_str(&hook.body).unwrap_or(Value::Null);
    assert_eq!(event["object"], "event");
    assert!(event["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("evt_")));
    assert_eq!(event["type"], "payment_intent.succeeded");
    assert_eq!(event["data"]["object"]["id"], r.json["id"]);
    assert_eq!(
        event["data"]["object"]["metadata"]["sluice_attempt_reference"],
        "att_sig"
    );
}

#[tokio::test]
async fn adyen_notifications_carry_a_valid_hmac_signature_on_every_item() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_sig"),
        &adyen_payment("att_a_sig", "pm_card_visa", 1130, false),
    )
    .await;
    let got = receiver.wait_for(1).await;
    let body: Value = serde_json::from_str(&got[0].body).unwrap_or(Value::Null);
    assert_eq!(body["live"], "false");
    let items = adyen_items(&got[0].body);
    assert_eq!(items.len(), 2);
    for item in &items {
        let signature = item["additionalData"]["hmacSignature"]
            .as_str()
            .unwrap_or("");
        assert_eq!(
            signature,
            adyen_item_signature(item, ADYEN_HMAC_KEY),
            "{item}"
        );
        assert_ne!(signature, adyen_item_signature(item, &"00".repeat(32)));
        assert_eq!(item["merchantAccountCode"], MERCHANT);
    }
}

#[tokio::test]
async fn every_webhook_is_sent_as_many_times_as_the_duplicates_setting_says() {
    let faults = DeliveryFaults {
        duplicates: 3,
        ..DeliveryFaults::default()
    };
    let (sb, receiver) = sandbox_and_receiver(faults).await;
    stripe_create(&sb, "att_dup", "pm_card_visa", "1000", "automatic").await;
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let got = receiver.received();
    assert_eq!(got.len(), 3);
    let ids: Vec<String> = got
        .iter()
        .map(|r| {
            serde_json::from_str::<Value>(&r.body)
                .map(|v| v["id"].as_str().unwrap_or("").to_owned())
                .unwrap_or_default()
        })
        .collect();
    assert!(
        ids.iter().all(|id| id == &ids[0] && id.starts_with("evt_")),
        "{ids:?}"
    );
    assert!(got.iter().all(|r| stripe_signature_is_valid(
        header(r, "stripe-signature"),
        &r.body,
        WHSEC
    )));
    let copies: Vec<u32> = sb.deliveries().iter().map(|d| d.copy).collect();
    assert_eq!(copies, vec![1, 2, 3]);
}

#[tokio::test]
async fn with_several_senders_that_many_webhooks_are_in_flight_at_once_and_none_is_lost() {
    let (sb, receiver) = sandbox_and_gated_receiver(4).await;
    for n in 0..6 {
        stripe_create(
            &sb,
            &format!("att_par_{n}"),
            "pm_card_visa",
            "1000",
            "automatic",
        )
        .await;
    }
    receiver.wait_in_flight(4).await;
    // One answered frees one sender, which takes the next webhook.
    receiver.release(1);
    receiver.wait_in_flight(4).await;
    receiver.release(1_000);
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let deliveries = sb.deliveries();
    assert!(deliveries.len() >= 6, "{}", deliveries.len());
    assert!(deliveries.iter().all(|d| d.acknowledged));
    assert_eq!(receiver.received().len(), deliveries.len());
    assert_eq!(receiver.max_in_flight(), 4);
}

#[tokio::test]
async fn reordering_shuffles_a_window_of_webhooks_and_loses_none() {
    let faults = DeliveryFaults {
        reorder_window: 6,
        reorder_flush: Duration::from_secs(2),
        ..DeliveryFaults::default()
    };
    let (sb, receiver) = sandbox_and_receiver(faults).await;
    let mut created = Vec::new();
    for i in 0..6 {
        let attempt = format!("att_reorder_{i}");
        let r = stripe_create(&sb, &attempt, "pm_card_visa", "100", "automatic").await;
        created.push(r.json["id"].as_str().unwrap_or_default().to_owned());
    }
    let got = receiver.wait_for(6).await;
    let delivered: Vec<String> = got
        .iter()
        .map(|r| {
            serde_json::from_str::<Value>(&r.body)
                .map(|v| v["data"]["object"]["id"].as_str().unwrap_or("").to_owned())
                .unwrap_or_default()
        })
        .collect();
    assert_ne!(delivered, created, "the window was not reordered");
    let mut sorted_delivered = delivered.clone();
    sorted_delivered.sort();
    let mut sorted_created = created.clone();
    sorted_created.sort();
    assert_eq!(sorted_delivered, sorted_created);
}

#[tokio::test]
async fn a_partly_filled_reorder_window_is_flushed_after_the_flush_time() {
    let faults = DeliveryFaults {
        reorder_window: 10,
        reorder_flush: Duration::from_millis(150),
        ..DeliveryFaults::default()
    };
    let (sb, receiver) = sandbox_and_receiver(faults).await;
    stripe_create(&sb, "att_flush", "pm_card_visa", "100", "automatic").await;
    let got = receiver.wait_for(1).await;
    assert_eq!(got.len(), 1);
}

#[tokio::test]
async fn unacknowledged_webhooks_are_retried_until_the_gateway_answers_2xx() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    receiver.fail_next(2);
    stripe_create(&sb, "att_retry", "pm_card_visa", "100", "automatic").await;
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    assert_eq!(receiver.received().len(), 3);
    let log = sb.deliveries();
    let attempts: Vec<(u32, Option<u16>, bool)> = log
        .iter()
        .map(|d| (d.attempt, d.status, d.acknowledged))
        .collect();
    assert_eq!(
        attempts,
        vec![
            (1, Some(500), false),
            (2, Some(500), false),
            (3, Some(200), true)
        ]
    );
    assert_eq!(log[2].response_body.as_deref(), Some("[accepted]"));
    assert_eq!(log[0].response_body.as_deref(), Some("busy"));
    assert_eq!(log[0].connector, "stripe_test");
}

#[tokio::test]
async fn retries_give_up_after_the_configured_number_of_attempts() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    receiver.fail_next(1000);
    stripe_create(&sb, "att_giveup", "pm_card_visa", "100", "automatic").await;
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    assert_eq!(
        receiver.received().len(),
        4,
        "fast_config allows 4 attempts"
    );
    assert!(sb.deliveries().iter().all(|d| !d.acknowledged));
}

#[tokio::test]
async fn an_unreachable_gateway_is_recorded_as_a_failed_delivery() {
    let mut config = fast_config();
    config.retry.max_attempts = 1;
    // A port nothing listens on: bind one, learn it, free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(1);
    config.webhook_targets.insert(
        "down".into(),
        WebhookTarget {
            url: format!("http://127.0.0.1:{port}/webhooks/stripe/x"),
            secret: WHSEC.into(),
            format: Format::Stripe,
            api_key: None,
        },
    );
    let sb = sandbox_with(config).await;
    stripe_create(&sb, "att_down", "pm_card_visa", "100", "automatic").await;
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let log = sb.deliveries();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].status, None);
    assert!(log[0].error.is_some());
}

#[tokio::test]
async fn the_delivery_delay_holds_webhooks_back() {
    let faults = DeliveryFaults {
        delay: Duration::from_millis(400),
        ..DeliveryFaults::default()
    };
    let (sb, receiver) = sandbox_and_receiver(faults).await;
    let started = Instant::now();
    stripe_create(&sb, "att_delay", "pm_card_visa", "100", "automatic").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(receiver.received().len(), 0);
    receiver.wait_for(1).await;
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test]
async fn adyen_items_go_one_per_request_when_batching_is_off() {
    let faults = DeliveryFaults {
        adyen_batch: false,
        ..DeliveryFaults::default()
    };
    let (sb, receiver) = sandbox_and_receiver(faults).await;
    adyen_post(
        &sb,
        "/v71/payments",
        Some("att_a_split"),
        &adyen_payment("att_a_split", "pm_card_visa", 100, false),
    )
    .await;
    let got = receiver.wait_for(2).await;
    let codes: Vec<String> = got
        .iter()
        .map(|r| {
            let items = adyen_items(&r.body);
            assert_eq!(items.len(), 1);
            items[0]["eventCode"].as_str().unwrap_or("").to_owned()
        })
        .collect();
    assert_eq!(codes, vec!["AUTHORISATION", "CAPTURE"]);
}

#[tokio::test]
async fn webhooks_go_only_to_targets_of_the_payments_format_and_api_key() {
    let receiver = Receiver::start().await;
    let mut config = fast_config();
    config.stripe_api_keys.push("sk_test_other".into());
    let mut only_other = receiver.stripe_target();
    only_other.url = format!("{}/webhooks/stripe/acct_other", receiver.url);
    only_other.api_key = Some("sk_test_other".into());
    config
        .webhook_targets
        .insert("stripe_other".into(), only_other);
    config
        .webhook_targets
        .insert("adyen".into(), receiver.adyen_target());
    let sb = sandbox_with(config).await;
    stripe_create(&sb, "att_route", "pm_card_visa", "100", "automatic").await;
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    assert_eq!(
        receiver.received().len(),
        0,
        "neither target should get this payment's webhook"
    );
    sb.set_webhook_target("stripe_all", receiver.stripe_target());
    stripe_create(&sb, "att_route_2", "pm_card_visa", "100", "automatic").await;
    let got = receiver.wait_for(1).await;
    assert_eq!(got[0].path, "/webhooks/stripe/acct_test");
}

#[tokio::test]
async fn a_stripe_refund_is_announced_as_created_charge_refunded_and_updated() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let sale = stripe_create(&sb, "att_ref_hooks", "pm_card_visa", "1000", "automatic").await;
    let id = sale.json["id"].as_str().unwrap_or_default();
    stripe_post(
        &sb,
        "/v1/refunds",
        Some("rh_1"),
        &[
            ("payment_intent", id),
            ("amount", "400"),
            ("metadata[sluice_refund_reference]", "rh_1"),
        ],
    )
    .await;
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let types: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| stripe_event_type(&r.body))
        .collect();
    assert_eq!(
        types,
        vec![
            "payment_intent.succeeded",
            "refund.created",
            "charge.refunded",
            "refund.updated"
        ]
    );
    let updated: Value = serde_json::from_str(&receiver.received()[3].body).unwrap_or(Value::Null);
    assert_eq!(
        updated["data"]["object"]["metadata"]["sluice_refund_reference"],
        "rh_1"
    );
    assert_eq!(updated["data"]["object"]["status"], "succeeded");
    let charge: Value = serde_json::from_str(&receiver.received()[2].body).unwrap_or(Value::Null);
    assert_eq!(charge["data"]["object"]["amount_refunded"], 400);
    assert_eq!(charge["data"]["object"]["payment_intent"], id);
}

#[tokio::test]
async fn a_pending_refund_that_fails_is_announced_by_refund_failed_and_frees_its_amount() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    sb.set_refund_behaviour(RefundBehaviour::PendingThenFail);
    let sale = stripe_create(&sb, "att_ref_fail", "pm_card_visa", "1000", "automatic").await;
    let id = sale.json["id"].as_str().unwrap_or_default();
    let r = stripe_post(
        &sb,
        "/v1/refunds",
        Some("rf_1"),
        &[("payment_intent", id), ("amount", "1000")],
    )
    .await;
    assert_eq!(r.json["status"], "pending");
    assert_eq!(sb.settle_pending(), 1);
    assert!(sb.wait_webhooks_idle(Duration::from_secs(5)).await);
    let types: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| stripe_event_type(&r.body))
        .collect();
    assert_eq!(
        types,
        vec![
            "payment_intent.succeeded",
            "refund.created",
            "refund.failed"
        ]
    );
    let refund_id = r.json["id"].as_str().unwrap_or_default();
    let after = stripe_get(&sb, &format!("/v1/refunds/{refund_id}")).await;
    assert_eq!(after.json["status"], "failed");
    sb.set_refund_behaviour(RefundBehaviour::Succeed);
    let again = stripe_post(
        &sb,
        "/v1/refunds",
        Some("rf_2"),
        &[("payment_intent", id), ("amount", "1000")],
    )
    .await;
    assert_eq!(again.json["status"], "succeeded", "{}", again.text);
}
