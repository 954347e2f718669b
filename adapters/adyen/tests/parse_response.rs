//! parse-response golden tests: fixture answers become exact events.

mod common;

use common::*;
use sluice_adapter_adyen::response::parse_response;
use sluice_adapter_adyen::types::{
    CaptureMode, EventKind, EvidenceSource, FailureCategory, Header, Operation, OperationContext,
    PaymentEvent,
};

use EventKind as K;
use EvidenceSource::{Query, SyncResponse as Sync};
use FailureCategory as C;

fn parse_with(context: &OperationContext, status: u16, fixture_path: &str) -> Vec<PaymentEvent> {
    parse_response(context, &response(status, fixture_path)).expect("an answer always parses")
}

fn parse(op: Operation, status: u16, fixture_path: &str) -> Vec<PaymentEvent> {
    parse_with(&ctx(op), status, fixture_path)
}

fn payment(kind: EventKind, evidence: EvidenceSource, raw: &str) -> PaymentEvent {
    let mut ev = blank(kind, evidence, raw);
    ev.attempt_reference = Some(ATTEMPT.into());
    ev.psp_reference = Some(PSP.into());
    ev
}

/// An error event for `op`, carrying the context's references.
fn error(op: Operation, kind: EventKind, raw: &str) -> PaymentEvent {
    let context = ctx(op);
    let evidence = if matches!(op, Operation::QueryPayment | Operation::QueryRefund) {
        Query
    } else {
        Sync
    };
    let mut ev = blank(kind, evidence, raw);
    ev.attempt_reference = Some(ATTEMPT.into());
    ev.action_reference = context.action_reference.clone();
    match op {
        Operation::Refund | Operation::QueryRefund | Operation::Capture => {
            ev.psp_payment_reference = Some(PSP.into());
        }
        _ => ev.psp_reference = context.psp_payment_reference.clone(),
    }
    ev
}

// ---- /payments resultCodes ----

#[test]
fn authorised_after_authorize_is_payment_authorized() {
    let mut expected = payment(K::PaymentAuthorized, Sync, "Authorised");
    expected.amount = Some(eur(2000));
    assert_eq!(
        parse(
            Operation::Authorize,
            200,
            "responses/payment_authorised.json"
        ),
        vec![expected]
    );
}

#[test]
fn authorised_after_a_sale_is_payment_succeeded() {
    let mut expected = payment(K::PaymentSucceeded, Sync, "Authorised");
    expected.amount = Some(eur(2000));
    assert_eq!(
        parse(Operation::Sale, 200, "responses/payment_authorised.json"),
        vec![expected]
    );
}

#[test]
fn authorised_in_a_query_means_what_it_meant_for_the_attempts_capture_mode() {
    let answer = response(200, "responses/payment_authorised.json");
    let mut manual = ctx(Operation::QueryPayment);
    manual.capture_mode = CaptureMode::Manual;
    let mut authorized = payment(K::PaymentAuthorized, Query, "Authorised");
    authorized.amount = Some(eur(2000));
    assert_eq!(parse_response(&manual, &answer).unwrap(), vec![authorized]);
    // The replayed answer of a sale: the sale succeeded.
    let automatic = ctx(Operation::QueryPayment);
    assert_eq!(automatic.capture_mode, CaptureMode::Automatic);
    let mut succeeded = payment(K::PaymentSucceeded, Query, "Authorised");
    succeeded.amount = Some(eur(2000));
    assert_eq!(
        parse_response(&automatic, &answer).unwrap(),
        vec![succeeded]
    );
}

#[test]
fn authorised_without_an_amount_reports_the_requested_amount() {
    let mut expected = payment(K::PaymentAuthorized, Sync, "Authorised");
    expected.amount = Some(eur(2000));
    assert_eq!(
        parse(
            Operation::Authorize,
            200,
            "responses/payment_authorised_without_amount.json"
        ),
        vec![expected]
    );
}

#[test]
fn refused_is_a_decline_coded_with_the_refusal_reason_code() {
    let mut expected = payment(K::PaymentFailed, Sync, "Refused");
    expected.failure = failure(C::Declined, "12", "Not enough balance");
    assert_eq!(
        parse(Operation::Sale, 200, "responses/payment_refused.json"),
        vec![expected]
    );
}

#[test]
fn refused_without_a_code_is_coded_with_the_refusal_reason() {
    let mut expected = payment(K::PaymentFailed, Sync, "Refused");
    expected.failure = failure(C::Declined, "Refused", "Refused");
    assert_eq!(
        parse(
            Operation::Authorize,
            200,
            "responses/payment_refused_reason_only.json"
        ),
        vec![expected]
    );
}

#[test]
fn pending_and_received_are_payment_processing() {
    assert_eq!(
        parse(Operation::Sale, 200, "responses/payment_pending.json"),
        vec![payment(K::PaymentProcessing, Sync, "Pending")]
    );
    assert_eq!(
        parse(Operation::Sale, 200, "responses/payment_received.json"),
        vec![payment(K::PaymentProcessing, Sync, "Received")]
    );
}

#[test]
fn redirect_shopper_is_customer_action_required_with_the_action_url() {
    let mut expected = blank(K::CustomerActionRequired, Sync, "RedirectShopper");
    expected.attempt_reference = Some(ATTEMPT.into());
    expected.next_action_url = Some(
        "https://checkoutshopper-test.adyen.com/checkoutshopper/threeDS/redirect?MD=M2RzZXJ2ZXI"
            .into(),
    );
    assert_eq!(
        parse(Operation::Authorize, 200, "responses/payment_redirect.json"),
        vec![expected]
    );
}

#[test]
fn cancelled_is_payment_canceled() {
    assert_eq!(
        parse(Operation::Sale, 200, "responses/payment_cancelled.json"),
        vec![payment(K::PaymentCanceled, Sync, "Cancelled")]
    );
}

#[test]
fn error_is_result_unknown() {
    let mut expected = payment(K::ResultUnknown, Sync, "Error");
    expected.failure = failure(C::Unknown, "4", "Acquirer Error");
    assert_eq!(
        parse(Operation::Sale, 200, "responses/payment_error.json"),
        vec![expected]
    );
}

// ---- modification answers ----

#[test]
fn a_received_capture_is_processing_with_the_capture_reference() {
    let mut expected = blank(K::PaymentProcessing, Sync, "received");
    expected.attempt_reference = Some(ATTEMPT.into());
    expected.action_reference = Some("cap_91b0".into());
    expected.psp_reference = Some("C3P0CAPTURE00001".into());
    expected.psp_payment_reference = Some(PSP.into());
    expected.amount = Some(eur(1500));
    assert_eq!(
        parse(Operation::Capture, 201, "responses/capture_received.json"),
        vec![expected]
    );
}

#[test]
fn a_received_cancel_is_processing_of_the_payment() {
    let mut expected = blank(K::PaymentProcessing, Sync, "received");
    expected.attempt_reference = Some(ATTEMPT.into());
    expected.psp_reference = Some(PSP.into());
    assert_eq!(
        parse(Operation::Void, 201, "responses/cancel_received.json"),
        vec![expected]
    );
}

#[test]
fn a_received_refund_is_refund_processing_and_a_replay_says_the_same_as_a_query() {
    let mut expected = blank(K::RefundProcessing, Sync, "received");
    expected.attempt_reference = Some(ATTEMPT.into());
    expected.action_reference = Some("rf_55d1".into());
    expected.psp_reference = Some("R3FUNDREFUND0001".into());
    expected.psp_payment_reference = Some(PSP.into());
    expected.amount = Some(eur(500));
    assert_eq!(
        parse(Operation::Refund, 201, "responses/refund_received.json"),
        vec![expected.clone()]
    );
    expected.evidence = Query;
    assert_eq!(
        parse(
            Operation::QueryRefund,
            201,
            "responses/refund_received.json"
        ),
        vec![expected]
    );
}

// ---- errors by meaning ----

#[test]
fn a_validation_error_on_a_payment_is_a_definitive_failure() {
    let mut expected = error(Operation::Authorize, K::PaymentFailed, "137");
    expected.failure = failure(C::Declined, "137", "HTTP 422: Invalid amount specified");
    assert_eq!(
        parse(Operation::Authorize, 422, "responses/error_validation.json"),
        vec![expected]
    );
}

#[test]
fn a_validation_error_on_a_capture_or_refund_is_their_failure() {
    let mut capture = error(Operation::Capture, K::CaptureFailed, "137");
    capture.failure = failure(C::Declined, "137", "HTTP 422: Invalid amount specified");
    assert_eq!(
        parse(Operation::Capture, 422, "responses/error_validation.json"),
        vec![capture]
    );
    let mut refund = error(Operation::Refund, K::RefundFailed, "137");
    refund.failure = failure(C::Declined, "137", "HTTP 422: Invalid amount specified");
    assert_eq!(
        parse(Operation::Refund, 422, "responses/error_validation.json"),
        vec![refund]
    );
}

#[test]
fn a_validation_error_on_a_void_or_query_is_a_conflict_with_an_unknown_outcome() {
    let mut void = error(Operation::Void, K::ResultUnknown, "137");
    void.failure = failure(C::Conflict, "137", "HTTP 422: Invalid amount specified");
    assert_eq!(
        parse(Operation::Void, 422, "responses/error_validation.json"),
        vec![void]
    );
    let mut query = error(Operation::QueryRefund, K::RefundUnknown, "137");
    query.failure = failure(C::Conflict, "137", "HTTP 422: Invalid amount specified");
    assert_eq!(
        parse(
            Operation::QueryRefund,
            422,
            "responses/error_validation.json"
        ),
        vec![query]
    );
}

#[test]
fn a_request_still_in_flight_under_the_same_key_is_retryable() {
    let mut expected = error(Operation::Sale, K::ResultUnknown, "704");
    expected.failure = failure(
        C::Retryable,
        "704",
        "HTTP 409: request already processed or in progress",
    );
    assert_eq!(
        parse(Operation::Sale, 409, "responses/error_in_flight.json"),
        vec![expected.clone()]
    );
    // Adyen marks the same error as transient with a header, whatever the status.
    let mut marked = response(422, "responses/error_key_reused.json");
    marked.headers.push(Header {
        name: "Transient-Error".into(),
        value: "true".into(),
    });
    expected.failure = failure(
        C::Retryable,
        "704",
        "HTTP 422: request already processed or in progress",
    );
    assert_eq!(
        parse_response(&ctx(Operation::Sale), &marked).unwrap(),
        vec![expected]
    );
}

#[test]
fn a_key_first_used_with_another_body_is_a_conflict_never_a_decline() {
    let mut expected = error(Operation::QueryPayment, K::ResultUnknown, "704");
    expected.evidence = Query;
    expected.failure = failure(
        C::Conflict,
        "704",
        "HTTP 422: request already processed or in progress",
    );
    assert_eq!(
        parse(
            Operation::QueryPayment,
            422,
            "responses/error_key_reused.json"
        ),
        vec![expected]
    );
    let events = parse(Operation::Authorize, 422, "responses/error_key_reused.json");
    assert_eq!(events[0].kind, K::ResultUnknown);
    assert_eq!(events[0].failure.as_ref().unwrap().category, C::Conflict);
}

#[test]
fn an_invalid_merchant_account_is_a_configuration_problem() {
    let mut expected = error(Operation::Authorize, K::ResultUnknown, "901");
    expected.failure = failure(
        C::Configuration,
        "901",
        "HTTP 422: the PSP refused the connector account's credentials or configuration",
    );
    assert_eq!(
        parse(
            Operation::Authorize,
            422,
            "responses/error_invalid_merchant_account.json"
        ),
        vec![expected]
    );
}

#[test]
fn rate_limiting_is_retryable() {
    let mut expected = error(Operation::Refund, K::RefundUnknown, "000");
    expected.failure = failure(C::Retryable, "000", "HTTP 429: Too Many Requests");
    assert_eq!(
        parse(Operation::Refund, 429, "responses/error_rate_limited.json"),
        vec![expected]
    );
}

#[test]
fn unauthorized_and_forbidden_are_configuration_problems() {
    let mut unauthorized = error(Operation::Sale, K::ResultUnknown, "000");
    unauthorized.failure = failure(
        C::Configuration,
        "000",
        "HTTP 401: the PSP refused the connector account's credentials or configuration",
    );
    assert_eq!(
        parse(Operation::Sale, 401, "responses/error_unauthorized.json"),
        vec![unauthorized]
    );
    let mut forbidden = error(Operation::Refund, K::RefundUnknown, "010");
    forbidden.failure = failure(
        C::Configuration,
        "010",
        "HTTP 403: the PSP refused the connector account's credentials or configuration",
    );
    assert_eq!(
        parse(Operation::Refund, 403, "responses/error_forbidden.json"),
        vec![forbidden]
    );
}

#[test]
fn a_5xx_is_result_unknown() {
    let mut expected = error(Operation::Authorize, K::ResultUnknown, "000");
    expected.failure = failure(C::Unknown, "000", "HTTP 500: An internal error occurred");
    assert_eq!(
        parse(Operation::Authorize, 500, "responses/error_internal.json"),
        vec![expected]
    );
}

#[test]
fn a_5xx_with_a_garbage_body_is_result_unknown() {
    let mut expected = error(Operation::Sale, K::ResultUnknown, "http_503");
    expected.failure = failure(
        C::Unknown,
        "http_503",
        "HTTP 503: the PSP's answer has no readable error",
    );
    assert_eq!(
        parse(Operation::Sale, 503, "responses/garbage.txt"),
        vec![expected]
    );
}

#[test]
fn a_2xx_garbage_body_is_result_unknown() {
    let mut expected = error(Operation::Sale, K::ResultUnknown, "http_200");
    expected.failure = failure(
        C::Unknown,
        "unreadable_response",
        "HTTP 200: the body is not the Adyen message this operation returns",
    );
    assert_eq!(
        parse(Operation::Sale, 200, "responses/garbage.txt"),
        vec![expected]
    );
    let mut refund = error(Operation::Refund, K::RefundUnknown, "http_201");
    refund.failure = failure(
        C::Unknown,
        "unreadable_response",
        "HTTP 201: the body is not the Adyen message this operation returns",
    );
    assert_eq!(
        parse(Operation::Refund, 201, "responses/garbage.txt"),
        vec![refund]
    );
}

#[test]
fn a_missing_payment_on_a_modification_is_a_conflict() {
    let mut expected = error(Operation::Capture, K::ResultUnknown, "000");
    expected.failure = failure(C::Conflict, "000", "HTTP 404: Not Found");
    assert_eq!(
        parse(Operation::Capture, 404, "responses/error_not_found.json"),
        vec![expected]
    );
}
