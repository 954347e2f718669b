//! build-request: exact method, URL, headers and body for every operation.

mod common;

use common::*;
use sluice_adapter_stripe::request::build_request;
use sluice_adapter_stripe::types::{
    FailureCategory, Header, HttpRequest, Operation, OperationContext,
};

const BASE: &str = "http://127.0.0.1:9000/stripe";

fn headers(pairs: &[(&str, &str)]) -> Vec<Header> {
    pairs
        .iter()
        .map(|(n, v)| Header {
            name: n.to_string(),
            value: v.to_string(),
        })
        .collect()
}

fn post(url: &str, key: &str, body: &str) -> HttpRequest {
    HttpRequest {
        method: "POST".into(),
        url: url.into(),
        headers: headers(&[
            ("Authorization", &format!("Bearer {API_KEY}")),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Idempotency-Key", key),
        ]),
        body: body.as_bytes().to_vec(),
    }
}

fn get(url: &str) -> HttpRequest {
    HttpRequest {
        method: "GET".into(),
        url: url.into(),
        headers: headers(&[("Authorization", &format!("Bearer {API_KEY}"))]),
        body: vec![],
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
        let auth = built
            .headers
            .iter()
            .find(|h| h.name == "Authorization")
            .unwrap();
        assert_eq!(auth.value, "Bearer {{secret:api_key}}", "{op:?}");
        let text = format!("{built:?}");
        assert!(!text.contains(API_KEY), "{op:?}: {text}");
    }
}

#[test]
fn authorize_creates_and_confirms_a_manual_capture_payment_intent_keyed_by_the_attempt() {
    assert_eq!(
        build(Operation::Authorize),
        post(
            &format!("{BASE}/v1/payment_intents"),
            ATTEMPT,
            "amount=2000&currency=eur&payment_method=pm_card_visa&confirm=true&capture_method=manual\
             &metadata%5Bsluice_attempt_reference%5D=att_7f3c2a&metadata%5Bmerchant_order_no%5D=order-1001\
             &return_url=https%3A%2F%2Fshop.example%2Freturn",
        )
    );
}

#[test]
fn sale_creates_an_automatic_capture_payment_intent_and_omits_an_absent_return_url() {
    let mut context = ctx(Operation::Sale);
    context.return_url = None;
    let request = wire(&context);
    assert_eq!(
        request,
        post(
            &format!("{BASE}/v1/payment_intents"),
            ATTEMPT,
            "amount=2000&currency=eur&payment_method=pm_card_visa&confirm=true&capture_method=automatic\
             &metadata%5Bsluice_attempt_reference%5D=att_7f3c2a&metadata%5Bmerchant_order_no%5D=order-1001",
        )
    );
}

#[test]
fn the_form_body_decodes_to_stripe_bracket_keys() {
    let request = build(Operation::Authorize);
    let pairs: Vec<(String, String)> = form_urlencoded::parse(&request.body).into_owned().collect();
    assert!(pairs.contains(&(
        "metadata[sluice_attempt_reference]".to_string(),
        ATTEMPT.to_string()
    )));
    assert!(pairs.contains(&(
        "return_url".to_string(),
        "https://shop.example/return".to_string()
    )));
}

#[test]
fn capture_sends_amount_to_capture_and_is_keyed_by_the_capture_reference() {
    assert_eq!(
        build(Operation::Capture),
        post(
            &format!("{BASE}/v1/payment_intents/{PI}/capture"),
            "cap_91b0",
            "amount_to_capture=1500&metadata%5Bsluice_capture_reference%5D=cap_91b0",
        )
    );
}

#[test]
fn void_cancels_the_payment_intent_with_a_key_derived_from_the_attempt() {
    assert_eq!(
        build(Operation::Void),
        post(
            &format!("{BASE}/v1/payment_intents/{PI}/cancel"),
            "att_7f3c2a:void",
            "",
        )
    );
}

#[test]
fn refund_names_the_payment_intent_and_is_keyed_by_the_refund_reference() {
    assert_eq!(
        build(Operation::Refund),
        post(
            &format!("{BASE}/v1/refunds"),
            "rf_55d1",
            "payment_intent=pi_3QxYz1LkdIwHu7ix0a1b2c3d&amount=500\
             &metadata%5Bsluice_refund_reference%5D=rf_55d1&metadata%5Bsluice_attempt_reference%5D=att_7f3c2a",
        )
    );
}

#[test]
fn query_payment_retrieves_a_known_payment_intent_by_id() {
    assert_eq!(
        build(Operation::QueryPayment),
        get(&format!("{BASE}/v1/payment_intents/{PI}"))
    );
}

#[test]
fn query_payment_searches_by_attempt_metadata_when_the_id_is_unknown() {
    let mut context = ctx(Operation::QueryPayment);
    context.psp_payment_reference = None;
    assert_eq!(
        wire(&context),
        get(&format!(
            "{BASE}/v1/payment_intents/search?query=metadata%5B%27sluice_attempt_reference%27%5D%3A%27att_7f3c2a%27"
        ))
    );
}

#[test]
fn a_quote_in_the_attempt_reference_is_escaped_in_the_search_query() {
    let mut context = ctx(Operation::QueryPayment);
    context.psp_payment_reference = None;
    context.attempt_reference = "a'b".into();
    let request = wire(&context);
    let query = request.url.split_once('?').unwrap().1;
    let (_, value) = form_urlencoded::parse(query.as_bytes()).next().unwrap();
    assert_eq!(value, r"metadata['sluice_attempt_reference']:'a\'b'");
}

#[test]
fn query_refund_retrieves_a_known_refund_by_id() {
    assert_eq!(
        build(Operation::QueryRefund),
        get(&format!("{BASE}/v1/refunds/{REFUND}"))
    );
}

#[test]
fn query_refund_lists_the_payment_intents_refunds_when_the_refund_id_is_unknown() {
    let mut context = ctx(Operation::QueryRefund);
    context.psp_refund_reference = None;
    assert_eq!(
        wire(&context),
        get(&format!("{BASE}/v1/refunds?payment_intent={PI}&limit=100"))
    );
}

#[test]
fn a_psp_reference_cannot_escape_its_path_segment() {
    let mut context = ctx(Operation::Capture);
    context.psp_payment_reference = Some("pi_1/../../v1/refunds?x=1".into());
    let request = wire(&context);
    assert_eq!(
        request.url,
        format!("{BASE}/v1/payment_intents/pi_1%2F..%2F..%2Fv1%2Frefunds%3Fx%3D1/capture")
    );
    context.psp_payment_reference = Some("..".into());
    let refused = build_request(&TestHost::configured(), &context).unwrap_err();
    assert_eq!(refused.category, FailureCategory::Unsupported);
    assert_eq!(refused.code, "invalid_psp_reference");
}

#[test]
fn a_missing_base_url_is_a_configuration_failure() {
    let host = TestHost::configured().without_config("base_url");
    let failure = build_request(&host, &ctx(Operation::Sale)).unwrap_err();
    assert_eq!(failure.category, FailureCategory::Configuration);
    assert_eq!(failure.code, "missing_setting");
    assert!(failure.message.contains("base_url"));
}

#[test]
fn a_payment_without_a_payment_method_token_is_refused_before_any_call() {
    let mut context = ctx(Operation::Sale);
    context.payment_method_token = None;
    let failure = build_request(&TestHost::configured(), &context).unwrap_err();
    assert_eq!(failure.category, FailureCategory::Unsupported);
    assert_eq!(failure.code, "payment_method_required");
}

#[test]
fn capture_and_refund_need_the_psp_payment_reference_and_their_own_reference() {
    for op in [Operation::Capture, Operation::Refund, Operation::Void] {
        let mut context = ctx(op);
        context.psp_payment_reference = None;
        let failure = build_request(&TestHost::configured(), &context).unwrap_err();
        assert_eq!(failure.code, "psp_payment_reference_required", "{op:?}");
    }
    for op in [Operation::Capture, Operation::Refund] {
        let mut context = ctx(op);
        context.action_reference = None;
        let failure = build_request(&TestHost::configured(), &context).unwrap_err();
        assert_eq!(failure.code, "action_reference_required", "{op:?}");
    }
}

#[test]
fn a_non_positive_amount_or_a_malformed_currency_is_refused() {
    let mut context = ctx(Operation::Sale);
    context.amount.amount_minor = 0;
    assert_eq!(
        build_request(&TestHost::configured(), &context)
            .unwrap_err()
            .code,
        "invalid_amount"
    );
    let mut context = ctx(Operation::Sale);
    context.amount.currency = "EU".into();
    assert_eq!(
        build_request(&TestHost::configured(), &context)
            .unwrap_err()
            .code,
        "invalid_currency"
    );
}
