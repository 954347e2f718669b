//! build-request: exact method, URL, headers and JSON body for every operation.

mod common;

use common::*;
use sluice_adapter_adyen::request::build_request;
use sluice_adapter_adyen::types::{
    CaptureMode, FailureCategory, Header, HttpRequest, Operation, OperationContext,
};

const BASE: &str = "http://127.0.0.1:9000/adyen";

fn post(path: &str, key: &str, body: &str) -> HttpRequest {
    HttpRequest {
        method: "POST".into(),
        url: format!("{BASE}{path}"),
        headers: vec![
            Header {
                name: "X-API-Key".into(),
                value: API_KEY.into(),
            },
            Header {
                name: "Content-Type".into(),
                value: "application/json".into(),
            },
            Header {
                name: "Idempotency-Key".into(),
                value: key.into(),
            },
        ],
        body: body.as_bytes().to_vec(),
    }
}

/// The request as it goes on the wire: the adapter's, with the host's keyring
/// substituting the credential placeholders.
fn build(op: Operation) -> HttpRequest {
    wire(&ctx(op))
}

fn wire(context: &OperationContext) -> HttpRequest {
    let host = TestHost::configured();
    let built = build_request(&host, context).expect("request builds");
    substituted(&host.keyring(), &built)
}

#[test]
fn the_adapter_writes_the_api_key_as_a_placeholder_and_never_holds_it() {
    for op in [
        Operation::Authorize,
        Operation::Sale,
        Operation::Capture,
        Operation::Void,
        Operation::Refund,
        Operation::QueryPayment,
        Operation::QueryRefund,
    ] {
        let built = build_request(&TestHost::configured(), &ctx(op)).unwrap();
        let key = built
            .headers
            .iter()
            .find(|h| h.name == "X-API-Key")
            .unwrap();
        assert_eq!(key.value, "{{secret:api_key}}", "{op:?}");
        assert!(!format!("{built:?}").contains(API_KEY), "{op:?}");
    }
}

const AUTHORIZE_BODY: &str = concat!(
    r#"{"amount":{"currency":"EUR","value":2000},"reference":"att_7f3c2a","#,
    r#""merchantAccount":"SluiceTestECOM","#,
    r#""paymentMethod":{"type":"scheme","storedPaymentMethodId":"pm_card_visa"},"#,
    r#""returnUrl":"https://shop.example/return","merchantOrderReference":"order-1001","#,
    r#""additionalData":{"manualCapture":"true"}}"#
);

#[test]
fn authorize_posts_a_manual_capture_payment_keyed_by_the_attempt() {
    assert_eq!(
        build(Operation::Authorize),
        post("/v71/payments", ATTEMPT, AUTHORIZE_BODY)
    );
}

#[test]
fn sale_posts_the_same_payment_without_manual_capture() {
    let mut context = ctx(Operation::Sale);
    context.return_url = None;
    assert_eq!(
        wire(&context),
        post(
            "/v71/payments",
            ATTEMPT,
            concat!(
                r#"{"amount":{"currency":"EUR","value":2000},"reference":"att_7f3c2a","#,
                r#""merchantAccount":"SluiceTestECOM","#,
                r#""paymentMethod":{"type":"scheme","storedPaymentMethodId":"pm_card_visa"},"#,
                r#""merchantOrderReference":"order-1001"}"#
            )
        )
    );
}

#[test]
fn query_payment_replays_the_original_request_with_the_attempts_capture_mode() {
    // A manual-capture attempt: the query is the authorization, byte for byte.
    let mut manual = ctx(Operation::QueryPayment);
    manual.capture_mode = CaptureMode::Manual;
    assert_eq!(
        wire(&manual),
        post("/v71/payments", ATTEMPT, AUTHORIZE_BODY)
    );
    let mut authorize = ctx(Operation::Authorize);
    authorize.capture_mode = CaptureMode::Manual;
    assert_eq!(wire(&manual).body, wire(&authorize).body);
    // An automatic-capture attempt: the query is the sale, never an authorization
    // (which would leave the customer's funds held if the sale never reached Adyen).
    let automatic = ctx(Operation::QueryPayment);
    assert_eq!(automatic.capture_mode, CaptureMode::Automatic);
    let sale = ctx(Operation::Sale);
    assert_eq!(wire(&automatic).body, wire(&sale).body);
    assert!(!String::from_utf8_lossy(&wire(&automatic).body).contains("manualCapture"));
}

#[test]
fn capture_posts_to_the_payments_captures_keyed_by_the_capture_reference() {
    assert_eq!(
        build(Operation::Capture),
        post(
            &format!("/v71/payments/{PSP}/captures"),
            "cap_91b0",
            r#"{"merchantAccount":"SluiceTestECOM","amount":{"currency":"EUR","value":1500},"reference":"cap_91b0"}"#
        )
    );
}

#[test]
fn void_posts_to_cancels_with_its_own_key() {
    assert_eq!(
        build(Operation::Void),
        post(
            &format!("/v71/payments/{PSP}/cancels"),
            "att_7f3c2a:void",
            r#"{"merchantAccount":"SluiceTestECOM","reference":"att_7f3c2a"}"#
        )
    );
}

#[test]
fn refund_and_query_refund_post_the_same_refund_keyed_by_the_refund_reference() {
    let expected = post(
        &format!("/v71/payments/{PSP}/refunds"),
        "rf_55d1",
        r#"{"merchantAccount":"SluiceTestECOM","amount":{"currency":"EUR","value":500},"reference":"rf_55d1"}"#,
    );
    assert_eq!(build(Operation::Refund), expected);
    assert_eq!(build(Operation::QueryRefund), expected);
}

#[test]
fn a_missing_setting_is_a_configuration_failure() {
    for (host, key) in [
        (
            TestHost::configured().without_config("base_url"),
            "base_url",
        ),
        (
            TestHost::configured().without_config("merchant_account"),
            "merchant_account",
        ),
    ] {
        let failure = build_request(&host, &ctx(Operation::Authorize)).unwrap_err();
        assert_eq!(failure.category, FailureCategory::Configuration, "{key}");
        assert!(failure.message.contains(key), "{key}");
    }
}

#[test]
fn modifications_need_the_psp_reference_and_captures_and_refunds_their_own_reference() {
    for op in [Operation::Capture, Operation::Void, Operation::Refund] {
        let mut context = ctx(op);
        context.psp_payment_reference = None;
        assert_eq!(
            build_request(&TestHost::configured(), &context)
                .unwrap_err()
                .code,
            "psp_payment_reference_required",
            "{op:?}"
        );
    }
    for op in [
        Operation::Capture,
        Operation::Refund,
        Operation::QueryRefund,
    ] {
        let mut context = ctx(op);
        context.action_reference = None;
        assert_eq!(
            build_request(&TestHost::configured(), &context)
                .unwrap_err()
                .code,
            "action_reference_required",
            "{op:?}"
        );
    }
}

#[test]
fn an_idempotency_key_longer_than_adyen_accepts_is_refused() {
    let mut context = ctx(Operation::Void);
    context.attempt_reference = "a".repeat(60);
    let failure = build_request(&TestHost::configured(), &context).unwrap_err();
    assert_eq!(failure.category, FailureCategory::Unsupported);
    assert_eq!(failure.code, "idempotency_key_too_long");
}

#[test]
fn a_psp_reference_cannot_escape_its_path_segment() {
    let mut context = ctx(Operation::Refund);
    context.psp_payment_reference = Some("X/../../payments".into());
    assert_eq!(
        build_request(&TestHost::configured(), &context)
            .unwrap()
            .url,
        format!("{BASE}/v71/payments/X%2F..%2F..%2Fpayments/refunds")
    );
    context.psp_payment_reference = Some("..".into());
    assert_eq!(
        build_request(&TestHost::configured(), &context)
            .unwrap_err()
            .code,
        "invalid_psp_reference"
    );
}

#[test]
fn a_payment_without_token_or_with_a_bad_amount_is_refused_before_any_call() {
    let mut context = ctx(Operation::Sale);
    context.payment_method_token = None;
    assert_eq!(
        build_request(&TestHost::configured(), &context)
            .unwrap_err()
            .code,
        "payment_method_required"
    );
    let mut context = ctx(Operation::Sale);
    context.amount.amount_minor = -5;
    assert_eq!(
        build_request(&TestHost::configured(), &context)
            .unwrap_err()
            .code,
        "invalid_amount"
    );
}
