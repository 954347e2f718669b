//! handle-webhook: `Stripe-Signature` verification and golden event normalisation.

mod common;

use base64::Engine as _;
use common::*;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use sluice_adapter_stripe::types::{
    EventKind, EvidenceSource, FailureCategory, Header, HttpResponse, PaymentEvent,
    WebhookAcceptance, WebhookRejection, WebhookRequest,
};
use sluice_adapter_stripe::webhook::handle_webhook;

use EventKind as K;
use EvidenceSource::Webhook as W;

/// Sign the way Stripe's libraries do in their test helpers (stripe-node
/// `webhooks.generateTestHeaderString`, stripe-python `WebhookSignature`): the secret's
/// UTF-8 bytes are the HMAC-SHA256 key, the message is `"{t}.{payload}"`, the header is
/// `t=<t>,v1=<lower-case hex>`. Written independently of the adapter's own code.
fn stripe_test_header(payload: &[u8], secret: &str, timestamp: i64) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(payload);
    let signature: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("t={timestamp},v1={signature}")
}

fn request(body: Vec<u8>, signature: Option<&str>) -> WebhookRequest {
    let mut headers = vec![Header {
        name: "Content-Type".into(),
        value: "application/json; charset=utf-8".into(),
    }];
    if let Some(sig) = signature {
        headers.push(Header {
            name: "Stripe-Signature".into(),
            value: sig.into(),
        });
    }
    WebhookRequest {
        method: "POST".into(),
        path: "/webhooks/stripe/acct_main".into(),
        headers,
        body,
    }
}

fn signed(fixture_path: &str) -> WebhookRequest {
    let body = fixture(fixture_path);
    let header = stripe_test_header(&body, WEBHOOK_SECRET, NOW_SECONDS - 5);
    request(body, Some(&header))
}

fn accept(fixture_path: &str) -> WebhookAcceptance {
    handle_webhook(&TestHost::configured(), &signed(fixture_path)).expect("webhook accepted")
}

fn events(fixture_path: &str) -> Vec<PaymentEvent> {
    accept(fixture_path).events
}

fn refuse(host: &TestHost, req: &WebhookRequest) -> WebhookRejection {
    handle_webhook(host, req).expect_err("webhook refused")
}

fn pi_event(kind: EventKind, raw: &str, evt: &str) -> PaymentEvent {
    let mut ev = blank(kind, W, raw);
    ev.attempt_reference = Some(ATTEMPT.into());
    ev.psp_reference = Some(PI.into());
    ev.provider_event_id = Some(evt.into());
    ev
}

fn refund_event(kind: EventKind, raw: &str, evt: &str) -> PaymentEvent {
    let mut ev = blank(kind, W, raw);
    ev.attempt_reference = Some(ATTEMPT.into());
    ev.action_reference = Some("rf_55d1".into());
    ev.psp_reference = Some(REFUND.into());
    ev.psp_payment_reference = Some(PI.into());
    ev.amount = Some(eur(500));
    ev.provider_event_id = Some(evt.into());
    ev
}

// ---- signatures ----

#[test]
fn a_webhook_signed_the_way_stripes_libraries_sign_is_accepted_with_the_expected_ack() {
    let acceptance = accept("webhooks/payment_intent.succeeded.json");
    assert_eq!(
        acceptance.ack,
        HttpResponse {
            status: 200,
            headers: vec![Header {
                name: "Content-Type".into(),
                value: "application/json".into()
            }],
            body: br#"{"received":true}"#.to_vec(),
        }
    );
    assert_eq!(acceptance.events.len(), 1);
}

#[test]
fn a_signature_computed_by_openssl_is_accepted() {
    // Computed outside Rust with:
    //   (printf "1733011190." && cat tests/fixtures/webhooks/payment_intent.succeeded.json) \
    //     | openssl sha256 -hmac "whsec_test_5WbX5kEWLlfzsGNjH64I8lOOqUB6e8FH"
    let header = "t=1733011190,v1=2080bdda24cb02328db01e5349b6ddc34463d643d0742e002ad4c1d8836d42c6";
    let req = request(
        fixture("webhooks/payment_intent.succeeded.json"),
        Some(header),
    );
    assert_eq!(
        stripe_test_header(&req.body, WEBHOOK_SECRET, 1_733_011_190),
        header
    );
    assert!(handle_webhook(&TestHost::configured(), &req).is_ok());
}

#[test]
fn during_a_secret_rotation_a_webhook_signed_with_either_secret_is_accepted() {
    // The keyring holds the new secret and, until the window closes, the old one.
    let rotating = TestHost::configured().rotated("webhook_secret", "whsec_rolled_new_4c1d");
    let old = signed("webhooks/payment_intent.succeeded.json");
    assert!(handle_webhook(&rotating, &old).is_ok());
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let header = stripe_test_header(&body, "whsec_rolled_new_4c1d", NOW_SECONDS);
    let new = request(body, Some(&header));
    assert!(handle_webhook(&rotating, &new).is_ok());
    // After the window, only the new one.
    let rolled =
        TestHost::configured().with_secret_value("webhook_secret", "whsec_rolled_new_4c1d");
    assert!(matches!(
        refuse(&rolled, &old),
        WebhookRejection::BadSignature(_)
    ));
    assert!(handle_webhook(&rolled, &new).is_ok());
}

#[test]
fn a_tampered_body_is_refused_as_a_bad_signature() {
    let mut req = signed("webhooks/payment_intent.succeeded.json");
    let body = String::from_utf8(req.body).unwrap();
    req.body = body
        .replace("\"amount\": 2000", "\"amount\": 200000")
        .into_bytes();
    assert!(matches!(
        refuse(&TestHost::configured(), &req),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn a_signature_made_with_another_secret_is_refused() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let header = stripe_test_header(&body, "whsec_someone_elses_secret", NOW_SECONDS);
    assert!(matches!(
        refuse(&TestHost::configured(), &request(body, Some(&header))),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn the_secret_is_used_as_text_and_never_base64_decoded() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(WEBHOOK_SECRET.trim_start_matches("whsec_test_"))
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&decoded).unwrap();
    mac.update(format!("{NOW_SECONDS}.").as_bytes());
    mac.update(&body);
    let header = format!(
        "t={NOW_SECONDS},v1={}",
        hex::encode(mac.finalize().into_bytes())
    );
    assert!(matches!(
        refuse(&TestHost::configured(), &request(body, Some(&header))),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn a_timestamp_older_than_the_tolerance_is_refused_as_stale() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let header = stripe_test_header(&body, WEBHOOK_SECRET, NOW_SECONDS - 301);
    match refuse(&TestHost::configured(), &request(body, Some(&header))) {
        WebhookRejection::StaleTimestamp(message) => assert!(message.contains("300")),
        other => panic!("expected stale-timestamp, got {other:?}"),
    }
}

#[test]
fn a_timestamp_too_far_in_the_future_is_refused_as_stale() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let header = stripe_test_header(&body, WEBHOOK_SECRET, NOW_SECONDS + 301);
    assert!(matches!(
        refuse(&TestHost::configured(), &request(body, Some(&header))),
        WebhookRejection::StaleTimestamp(_)
    ));
}

#[test]
fn a_timestamp_exactly_at_the_tolerance_is_accepted() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let header = stripe_test_header(&body, WEBHOOK_SECRET, NOW_SECONDS - 300);
    assert!(handle_webhook(&TestHost::configured(), &request(body, Some(&header))).is_ok());
}

#[test]
fn the_configured_tolerance_replaces_the_default() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let header = stripe_test_header(&body, WEBHOOK_SECRET, NOW_SECONDS - 100);
    let req = request(body, Some(&header));
    let strict = TestHost::configured().with_config("webhook_tolerance_seconds", "60");
    assert!(matches!(
        refuse(&strict, &req),
        WebhookRejection::StaleTimestamp(_)
    ));
    let lax = TestHost::configured().with_config("webhook_tolerance_seconds", "120");
    assert!(handle_webhook(&lax, &req).is_ok());
    let broken = TestHost::configured().with_config("webhook_tolerance_seconds", "five");
    assert!(matches!(
        refuse(&broken, &req),
        WebhookRejection::Unsupported(_)
    ));
}

#[test]
fn a_stale_timestamp_with_a_bad_signature_is_reported_as_a_bad_signature() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let header = stripe_test_header(&body, "whsec_other", NOW_SECONDS - 10_000);
    assert!(matches!(
        refuse(&TestHost::configured(), &request(body, Some(&header))),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn any_matching_v1_signature_among_several_is_enough() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let good = stripe_test_header(&body, WEBHOOK_SECRET, NOW_SECONDS);
    let good_v1 = good.split_once(",v1=").unwrap().1;
    let old = stripe_test_header(&body, "whsec_rolled_away", NOW_SECONDS);
    let old_v1 = old.split_once(",v1=").unwrap().1;
    let header = format!(
        "t={NOW_SECONDS},v1={old_v1},v1=not-hex,v1={good_v1},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39,scheme9=x"
    );
    assert!(handle_webhook(&TestHost::configured(), &request(body, Some(&header))).is_ok());
}

#[test]
fn a_header_with_only_v0_or_unknown_schemes_is_a_bad_signature() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    let good = stripe_test_header(&body, WEBHOOK_SECRET, NOW_SECONDS);
    let good_v1 = good.split_once(",v1=").unwrap().1;
    // The right HMAC under a scheme other than v1 must not count.
    let header = format!("t={NOW_SECONDS},v0={good_v1},v2={good_v1}");
    assert!(matches!(
        refuse(&TestHost::configured(), &request(body, Some(&header))),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn a_missing_signature_header_is_a_bad_signature() {
    let req = request(fixture("webhooks/payment_intent.succeeded.json"), None);
    assert!(matches!(
        refuse(&TestHost::configured(), &req),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn an_unparseable_signature_header_is_malformed() {
    let body = fixture("webhooks/payment_intent.succeeded.json");
    for header in [
        "",
        "garbage",
        "v1=abcd",
        "t=,v1=abcd",
        "t=yesterday,v1=abcd",
        "t=1,t=2,v1=abcd",
    ] {
        let rejection = refuse(
            &TestHost::configured(),
            &request(body.clone(), Some(header)),
        );
        assert!(
            matches!(rejection, WebhookRejection::Malformed(_)),
            "{header:?} gave {rejection:?}"
        );
    }
}

#[test]
fn the_signature_header_name_is_case_insensitive() {
    let mut req = signed("webhooks/payment_intent.succeeded.json");
    req.headers[1].name = "stripe-signature".into();
    assert!(handle_webhook(&TestHost::configured(), &req).is_ok());
}

#[test]
fn a_rejection_never_reveals_the_secret_or_the_signature() {
    let mut req = signed("webhooks/payment_intent.succeeded.json");
    req.body.push(b' ');
    let message = format!("{:?}", refuse(&TestHost::configured(), &req));
    assert!(!message.contains(WEBHOOK_SECRET));
    assert!(!message.contains(&req.headers[1].value[20..]));
}

#[test]
fn without_a_webhook_secret_nothing_is_accepted() {
    let host = TestHost::configured().without_secret("webhook_secret");
    let req = signed("webhooks/payment_intent.succeeded.json");
    assert!(matches!(
        refuse(&host, &req),
        WebhookRejection::Unsupported(_)
    ));
}

#[test]
fn a_webhook_that_is_not_a_post_is_unsupported() {
    let mut req = signed("webhooks/payment_intent.succeeded.json");
    req.method = "GET".into();
    assert!(matches!(
        refuse(&TestHost::configured(), &req),
        WebhookRejection::Unsupported(_)
    ));
}

#[test]
fn a_verified_body_that_is_not_an_event_is_malformed() {
    for body in [&b"not json"[..], br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#, br#"{"id":"evt_1","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1"}}}"#] {
        let header = stripe_test_header(body, WEBHOOK_SECRET, NOW_SECONDS);
        let rejection = refuse(&TestHost::configured(), &request(body.to_vec(), Some(&header)));
        assert!(matches!(rejection, WebhookRejection::Malformed(_)), "{rejection:?}");
    }
}

// ---- golden events ----

#[test]
fn payment_intent_succeeded_with_automatic_capture_is_payment_succeeded() {
    let mut expected = pi_event(K::PaymentSucceeded, "succeeded", "evt_1QxSucc");
    expected.amount = Some(eur(2000));
    assert_eq!(
        events("webhooks/payment_intent.succeeded.json"),
        vec![expected]
    );
}

#[test]
fn payment_intent_succeeded_with_manual_capture_is_payment_captured() {
    let mut expected = pi_event(K::PaymentCaptured, "succeeded", "evt_1QxCapt");
    expected.action_reference = Some("cap_91b0".into());
    expected.psp_payment_reference = Some(PI.into());
    expected.amount = Some(eur(1500));
    assert_eq!(
        events("webhooks/payment_intent.succeeded.manual.json"),
        vec![expected]
    );
}

#[test]
fn payment_intent_payment_failed_is_a_decline_with_the_decline_code() {
    let mut expected = pi_event(K::PaymentFailed, "requires_payment_method", "evt_1QxFail");
    expected.failure = failure(
        FailureCategory::Declined,
        "insufficient_funds",
        "Your card has insufficient funds.",
    );
    assert_eq!(
        events("webhooks/payment_intent.payment_failed.json"),
        vec![expected]
    );
}

#[test]
fn payment_intent_processing_is_payment_processing() {
    assert_eq!(
        events("webhooks/payment_intent.processing.json"),
        vec![pi_event(K::PaymentProcessing, "processing", "evt_1QxProc")]
    );
}

#[test]
fn payment_intent_requires_action_is_customer_action_required() {
    let mut expected = pi_event(K::CustomerActionRequired, "requires_action", "evt_1QxActn");
    expected.next_action_url = Some("https://hooks.stripe.com/redirect/authenticate/src_1".into());
    assert_eq!(
        events("webhooks/payment_intent.requires_action.json"),
        vec![expected]
    );
}

#[test]
fn payment_intent_amount_capturable_updated_is_payment_authorized() {
    let mut expected = pi_event(K::PaymentAuthorized, "requires_capture", "evt_1QxAuth");
    expected.amount = Some(eur(2000));
    assert_eq!(
        events("webhooks/payment_intent.amount_capturable_updated.json"),
        vec![expected]
    );
}

#[test]
fn payment_intent_canceled_is_payment_canceled() {
    assert_eq!(
        events("webhooks/payment_intent.canceled.json"),
        vec![pi_event(K::PaymentCanceled, "canceled", "evt_1QxCanc")]
    );
}

#[test]
fn verified_events_the_adapter_does_not_act_on_are_accepted_with_no_events() {
    for path in [
        "webhooks/payment_intent.partially_funded.json",
        "webhooks/payment_intent.created.json",
        "webhooks/customer.created.json",
        "webhooks/charge.refunded.without_refunds.json",
    ] {
        let acceptance = accept(path);
        assert_eq!(acceptance.events, vec![], "{path}");
        assert_eq!(acceptance.ack.status, 200);
    }
}

#[test]
fn charge_refunded_yields_one_event_per_embedded_refund_with_distinct_event_ids() {
    let mut first = refund_event(
        K::RefundSucceeded,
        "succeeded",
        "evt_1QxRfnd:re_3QxYz1LkdIwHu7ix1refund",
    );
    first.provider_event_id = Some(format!("evt_1QxRfnd:{REFUND}"));
    let mut second = refund_event(K::RefundProcessing, "pending", "evt_1QxRfnd:re_3QxSecond");
    second.action_reference = Some("rf_0002".into());
    second.psp_reference = Some("re_3QxSecond".into());
    second.amount = Some(eur(200));
    assert_eq!(events("webhooks/charge.refunded.json"), vec![first, second]);
}

#[test]
fn charge_refund_updated_is_the_refunds_status() {
    assert_eq!(
        events("webhooks/charge.refund.updated.json"),
        vec![refund_event(K::RefundSucceeded, "succeeded", "evt_1QxRfUp")]
    );
}

#[test]
fn refund_created_updated_and_failed_are_the_refunds_status() {
    assert_eq!(
        events("webhooks/refund.created.json"),
        vec![refund_event(K::RefundProcessing, "pending", "evt_1QxReCr")]
    );
    assert_eq!(
        events("webhooks/refund.updated.json"),
        vec![refund_event(K::RefundSucceeded, "succeeded", "evt_1QxReUp")]
    );
    let mut failed = refund_event(K::RefundFailed, "failed", "evt_1QxReFl");
    failed.failure = failure(
        FailureCategory::Declined,
        "lost_or_stolen_card",
        "the refund failed",
    );
    assert_eq!(events("webhooks/refund.failed.json"), vec![failed]);
}

#[test]
fn a_dispute_is_a_chargeback_on_the_payment_intent() {
    let mut expected = blank(K::Chargeback, W, "needs_response");
    expected.psp_reference = Some("du_1QxDispute".into());
    expected.psp_payment_reference = Some(PI.into());
    expected.amount = Some(eur(2000));
    expected.provider_event_id = Some("evt_1QxDisp".into());
    assert_eq!(
        events("webhooks/charge.dispute.created.json"),
        vec![expected]
    );
}
