//! handle-webhook: per-item HMAC verification, batch policy and golden events.

mod common;

use common::*;
use sluice_adapter_adyen::hmac_signature::{decode_key, is_valid, sign, SignedFields};
use sluice_adapter_adyen::notification::handle_webhook;
use sluice_adapter_adyen::types::{
    EventKind, EvidenceSource, FailureCategory, Header, HttpResponse, Money, PaymentEvent,
    WebhookAcceptance, WebhookRejection, WebhookRequest,
};

use EventKind as K;
use EvidenceSource::Webhook as W;

fn request(body: Vec<u8>) -> WebhookRequest {
    WebhookRequest {
        method: "POST".into(),
        path: "/webhooks/adyen/acct_main".into(),
        headers: vec![Header {
            name: "Content-Type".into(),
            value: "application/json".into(),
        }],
        body,
    }
}

fn accept(fixture_path: &str) -> WebhookAcceptance {
    handle_webhook(&TestHost::configured(), &request(fixture(fixture_path)))
        .expect("notification accepted")
}

fn events(fixture_path: &str) -> Vec<PaymentEvent> {
    accept(fixture_path).events
}

fn refuse(host: &TestHost, body: Vec<u8>) -> WebhookRejection {
    handle_webhook(host, &request(body)).expect_err("notification refused")
}

fn vector_fields() -> SignedFields {
    SignedFields {
        psp_reference: "7914073381342284".into(),
        original_reference: String::new(),
        merchant_account_code: "TestMerchant".into(),
        merchant_reference: "TestPayment-1407325143704".into(),
        value: "1130".into(),
        currency: "EUR".into(),
        event_code: "AUTHORISATION".into(),
        success: "true".into(),
    }
}

fn with_event(mut ev: PaymentEvent, psp: &str, code: &str, success: &str) -> PaymentEvent {
    ev.provider_event_id = Some(format!("{psp}:{code}:{success}"));
    ev
}

// ---- signatures ----

#[test]
fn the_published_adyen_test_vector_is_reproduced() {
    let key = decode_key(HMAC_KEY).unwrap();
    assert_eq!(
        vector_fields().data_to_sign(),
        "7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true"
    );
    assert_eq!(
        sign(&key, &vector_fields()),
        "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0="
    );
    assert!(is_valid(
        &key,
        &vector_fields(),
        "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0="
    ));
    let mut changed = vector_fields();
    changed.value = "1131".into();
    assert!(!is_valid(
        &key,
        &changed,
        "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0="
    ));
}

/// The connector account of Adyen's published vector (merchant account `TestMerchant`).
fn vector_host() -> TestHost {
    TestHost::configured().with_config("merchant_account", "TestMerchant")
}

#[test]
fn the_published_vector_notification_is_accepted_and_acknowledged() {
    let acceptance = handle_webhook(
        &vector_host(),
        &request(fixture("notifications/authorisation_vector.json")),
    )
    .expect("notification accepted");
    assert_eq!(
        acceptance.ack,
        HttpResponse {
            status: 200,
            headers: vec![Header {
                name: "Content-Type".into(),
                value: "text/plain".into()
            }],
            body: b"[accepted]".to_vec(),
        }
    );
    let mut expected = blank(K::PaymentAuthorized, W, "AUTHORISATION");
    expected.attempt_reference = Some("TestPayment-1407325143704".into());
    expected.psp_reference = Some("7914073381342284".into());
    expected.amount = Some(Money {
        amount_minor: 1130,
        currency: "EUR".into(),
    });
    expected.provider_event_id = Some("7914073381342284:AUTHORISATION:true".into());
    assert_eq!(acceptance.events, vec![expected]);
}

#[test]
fn the_published_vector_verifies_through_the_keyring_during_a_key_rotation() {
    let body = fixture("notifications/authorisation_vector.json");
    // The vector's key is the previous one, a new key is current: still valid.
    let rotating = vector_host().rotated(
        "webhook_secret",
        "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF",
    );
    assert!(handle_webhook(&rotating, &request(body.clone())).is_ok());
    // Once the rotation window closed (the old key gone), the item is refused.
    let rotated = TestHost::configured()
        .with_config("merchant_account", "TestMerchant")
        .with_secret(
            "webhook_secret",
            "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF",
        );
    assert!(matches!(
        refuse(&rotated, body),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn an_item_for_another_merchant_account_is_refused_with_its_batch() {
    // Correctly signed with the (company-level) key, but for merchant account
    // `TestMerchant`, while this connector account is `SluiceTestECOM`.
    let rejection = refuse(
        &TestHost::configured(),
        fixture("notifications/authorisation_vector.json"),
    );
    let WebhookRejection::Unsupported(detail) = rejection else {
        panic!("expected an unsupported rejection, got {rejection:?}");
    };
    assert!(detail.contains("TestMerchant"), "{detail}");
    // Without a configured merchant account nothing can be attributed.
    let unattributed = TestHost::configured().without_config("merchant_account");
    assert!(matches!(
        refuse(
            &unattributed,
            fixture("notifications/authorisation_success.json")
        ),
        WebhookRejection::Unsupported(_)
    ));
}

#[test]
fn a_tampered_item_is_refused_as_a_bad_signature() {
    let body = String::from_utf8(fixture("notifications/authorisation_success.json")).unwrap();
    let tampered = body.replace("\"value\": 2000", "\"value\": 20");
    assert_ne!(body, tampered);
    assert!(matches!(
        refuse(&TestHost::configured(), tampered.into_bytes()),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn a_notification_signed_with_another_key_is_refused() {
    let host = TestHost::configured().with_secret(
        "webhook_secret",
        "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF",
    );
    assert!(matches!(
        refuse(&host, fixture("notifications/authorisation_vector.json")),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn a_batch_with_one_tampered_item_is_refused_as_a_whole() {
    match refuse(
        &TestHost::configured(),
        fixture("notifications/batch_one_bad.json"),
    ) {
        WebhookRejection::BadSignature(message) => {
            assert!(message.contains("item 1"), "{message}");
            assert!(message.contains("whole batch"), "{message}");
        }
        other => panic!("expected bad-signature, got {other:?}"),
    }
}

#[test]
fn a_batch_with_one_unsigned_item_is_refused_as_a_whole() {
    assert!(matches!(
        refuse(
            &TestHost::configured(),
            fixture("notifications/batch_one_unsigned.json")
        ),
        WebhookRejection::BadSignature(_)
    ));
}

#[test]
fn a_rejection_never_reveals_the_key_or_a_signature() {
    let message = format!(
        "{:?}",
        refuse(
            &TestHost::configured(),
            fixture("notifications/batch_one_bad.json")
        )
    );
    let batch: serde_json::Value =
        serde_json::from_slice(&fixture("notifications/batch_one_bad.json")).unwrap();
    for item in batch["notificationItems"].as_array().unwrap() {
        let signature = item["NotificationRequestItem"]["additionalData"]["hmacSignature"]
            .as_str()
            .unwrap();
        assert!(!message.contains(signature));
    }
    assert!(!message.to_lowercase().contains(&HMAC_KEY.to_lowercase()));
}

#[test]
fn an_account_without_a_usable_hmac_key_accepts_nothing() {
    let body = fixture("notifications/authorisation_vector.json");
    let missing = TestHost::configured().without_secret("webhook_secret");
    assert!(matches!(
        refuse(&missing, body.clone()),
        WebhookRejection::Unsupported(_)
    ));
    let not_hex = TestHost::configured().with_secret("webhook_secret", "not-a-hex-key");
    assert!(matches!(
        refuse(&not_hex, body),
        WebhookRejection::Unsupported(_)
    ));
}

#[test]
fn a_notification_that_is_not_a_post_is_unsupported() {
    let mut req = request(fixture("notifications/authorisation_vector.json"));
    req.method = "PUT".into();
    assert!(matches!(
        handle_webhook(&TestHost::configured(), &req),
        Err(WebhookRejection::Unsupported(_))
    ));
}

#[test]
fn a_body_that_is_not_a_notification_is_malformed() {
    for body in [
        &b"[accepted]"[..],
        br#"{"live":"false"}"#,
        br#"{"live":"false","notificationItems":[]}"#,
        br#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"pspReference":"1","amount":{"value":"12","currency":"EUR"}}}]}"#,
        br#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"pspReference":17}}]}"#,
    ] {
        let rejection = refuse(&TestHost::configured(), body.to_vec());
        assert!(
            matches!(rejection, WebhookRejection::Malformed(_)),
            "{rejection:?}"
        );
    }
}

// ---- golden events ----

fn authorised() -> PaymentEvent {
    let mut ev = blank(K::PaymentAuthorized, W, "AUTHORISATION");
    ev.attempt_reference = Some(ATTEMPT.into());
    ev.psp_reference = Some(PSP.into());
    ev.amount = Some(eur(2000));
    with_event(ev, PSP, "AUTHORISATION", "true")
}

fn modification(kind: EventKind, code: &str, psp: &str, ours: &str, amount: i64) -> PaymentEvent {
    let mut ev = blank(kind, W, code);
    ev.action_reference = Some(ours.into());
    ev.psp_reference = Some(psp.into());
    ev.psp_payment_reference = Some(PSP.into());
    ev.amount = Some(eur(amount));
    ev
}

#[test]
fn a_successful_authorisation_is_payment_authorized() {
    assert_eq!(
        events("notifications/authorisation_success.json"),
        vec![authorised()]
    );
}

#[test]
fn a_failed_authorisation_is_a_decline_with_the_reason() {
    let mut expected = authorised();
    expected.kind = K::PaymentFailed;
    expected.failure = failure(FailureCategory::Declined, "CVC Declined", "CVC Declined");
    let expected = with_event(expected, PSP, "AUTHORISATION", "false");
    assert_eq!(
        events("notifications/authorisation_refused.json"),
        vec![expected]
    );
}

#[test]
fn a_capture_is_payment_captured_for_the_capture_reference() {
    let expected = with_event(
        modification(
            K::PaymentCaptured,
            "CAPTURE",
            "C3P0CAPTURE00001",
            "cap_91b0",
            1500,
        ),
        "C3P0CAPTURE00001",
        "CAPTURE",
        "true",
    );
    assert_eq!(events("notifications/capture.json"), vec![expected]);
}

#[test]
fn a_rejected_capture_and_capture_failed_are_capture_failed() {
    let mut rejected = modification(
        K::CaptureFailed,
        "CAPTURE",
        "C3P0CAPTURE00001",
        "cap_91b0",
        1500,
    );
    rejected.failure = failure(
        FailureCategory::Declined,
        "Insufficient balance on payment",
        "Insufficient balance on payment",
    );
    assert_eq!(
        events("notifications/capture_rejected.json"),
        vec![with_event(rejected, "C3P0CAPTURE00001", "CAPTURE", "false")]
    );
    let mut failed = modification(
        K::CaptureFailed,
        "CAPTURE_FAILED",
        "C3P0CAPTURE00001",
        "cap_91b0",
        1500,
    );
    failed.failure = failure(
        FailureCategory::Declined,
        "Capture failed at the acquirer",
        "Capture failed at the acquirer",
    );
    assert_eq!(
        events("notifications/capture_failed.json"),
        vec![with_event(
            failed,
            "C3P0CAPTURE00001",
            "CAPTURE_FAILED",
            "true"
        )]
    );
}

#[test]
fn a_cancellation_is_payment_canceled_on_the_original_payment() {
    let mut expected = blank(K::PaymentCanceled, W, "CANCELLATION");
    expected.attempt_reference = Some(ATTEMPT.into());
    expected.psp_reference = Some(PSP.into());
    assert_eq!(
        events("notifications/cancellation.json"),
        vec![with_event(
            expected,
            "V01DCANCEL000001",
            "CANCELLATION",
            "true"
        )]
    );
}

#[test]
fn a_refused_cancellation_is_a_conflict_to_resolve_by_query() {
    let mut expected = blank(K::ResultUnknown, W, "CANCELLATION");
    expected.attempt_reference = Some(ATTEMPT.into());
    expected.psp_reference = Some(PSP.into());
    expected.failure = failure(
        FailureCategory::Conflict,
        "Transaction already captured",
        "Adyen refused the cancellation; the payment's state must be queried",
    );
    assert_eq!(
        events("notifications/cancellation_rejected.json"),
        vec![with_event(
            expected,
            "V01DCANCEL000001",
            "CANCELLATION",
            "false"
        )]
    );
}

#[test]
fn a_refund_is_refund_succeeded_for_the_refund_reference() {
    let expected = modification(
        K::RefundSucceeded,
        "REFUND",
        "R3FUNDREFUND0001",
        "rf_55d1",
        500,
    );
    assert_eq!(
        events("notifications/refund.json"),
        vec![with_event(expected, "R3FUNDREFUND0001", "REFUND", "true")]
    );
}

#[test]
fn a_rejected_refund_and_refund_failed_are_refund_failed() {
    let mut rejected = modification(
        K::RefundFailed,
        "REFUND",
        "R3FUNDREFUND0001",
        "rf_55d1",
        500,
    );
    rejected.failure = failure(
        FailureCategory::Declined,
        "Refund exceeds captured amount",
        "Refund exceeds captured amount",
    );
    assert_eq!(
        events("notifications/refund_rejected.json"),
        vec![with_event(rejected, "R3FUNDREFUND0001", "REFUND", "false")]
    );
    let mut failed = modification(
        K::RefundFailed,
        "REFUND_FAILED",
        "R3FUNDREFUND0001",
        "rf_55d1",
        500,
    );
    failed.failure = failure(FailureCategory::Declined, "REFUND_FAILED", "REFUND_FAILED");
    assert_eq!(
        events("notifications/refund_failed.json"),
        vec![with_event(
            failed,
            "R3FUNDREFUND0001",
            "REFUND_FAILED",
            "true"
        )]
    );
}

#[test]
fn a_chargeback_is_recorded_against_the_original_payment() {
    let mut expected = blank(K::Chargeback, W, "CHARGEBACK");
    expected.attempt_reference = Some(ATTEMPT.into());
    expected.psp_reference = Some("CHBK000000000001".into());
    expected.psp_payment_reference = Some(PSP.into());
    expected.amount = Some(eur(2000));
    assert_eq!(
        events("notifications/chargeback.json"),
        vec![with_event(
            expected,
            "CHBK000000000001",
            "CHARGEBACK",
            "true"
        )]
    );
}

#[test]
fn a_verified_item_of_another_event_code_is_accepted_with_no_events() {
    // Its signature covers empty amount fields, so this also proves missing fields sign
    // as empty strings.
    let acceptance = accept("notifications/report_available.json");
    assert_eq!(acceptance.events, vec![]);
    assert_eq!(acceptance.ack.body, b"[accepted]".to_vec());
}

#[test]
fn a_sale_batch_reports_the_authorisation_and_then_the_automatic_capture() {
    let capture = with_event(
        modification(
            K::PaymentCaptured,
            "CAPTURE",
            "C4PTAUTOMATIC001",
            ATTEMPT,
            2000,
        ),
        "C4PTAUTOMATIC001",
        "CAPTURE",
        "true",
    );
    assert_eq!(
        events("notifications/batch_sale.json"),
        vec![authorised(), capture]
    );
}
