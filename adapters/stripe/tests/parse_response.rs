//! parse-response golden tests: fixture answers become exact events.

mod common;

use common::*;
use sluice_adapter_stripe::response::parse_response;
use sluice_adapter_stripe::types::{
    EventKind, EvidenceSource, FailureCategory, HttpResponse, Operation, OperationContext,
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

/// A payment event about the standard PaymentIntent, echoing the attempt reference.
fn payment(kind: EventKind, evidence: EvidenceSource, raw: &str) -> PaymentEvent {
    let mut ev = blank(kind, evidence, raw);
    ev.attempt_reference = Some(ATTEMPT.into());
    ev.psp_reference = Some(PI.into());
    ev
}

/// An error event for `op`, carrying the context's references.
fn error(op: Operation, kind: EventKind, raw: &str) -> PaymentEvent {
    let context = ctx(op);
    let mut ev = blank(
        kind,
        if matches!(op, Operation::QueryPayment | Operation::QueryRefund) {
            Query
        } else {
            Sync
        },
        raw,
    );
    ev.attempt_reference = Some(ATTEMPT.into());
    ev.action_reference = context.action_reference.clone();
    match op {
        Operation::Refund | Operation::QueryRefund => {
            ev.psp_reference = context.psp_refund_reference.clone();
            ev.psp_payment_reference = Some(PI.into());
        }
        Operation::Capture => {
            ev.psp_reference = Some(PI.into());
            ev.psp_payment_reference = Some(PI.into());
        }
        _ => ev.psp_reference = context.psp_payment_reference.clone(),
    }
    ev
}

fn refund(kind: EventKind, evidence: EvidenceSource, raw: &str) -> PaymentEvent {
    let mut ev = blank(kind, evidence, raw);
    ev.attempt_reference = Some(ATTEMPT.into());
    ev.action_reference = Some("rf_55d1".into());
    ev.psp_reference = Some(REFUND.into());
    ev.psp_payment_reference = Some(PI.into());
    ev.amount = Some(eur(500));
    ev
}

// ---- PaymentIntent statuses ----

#[test]
fn requires_capture_after_authorize_is_payment_authorized_for_the_capturable_amount() {
    let mut expected = payment(K::PaymentAuthorized, Sync, "requires_capture");
    expected.amount = Some(eur(2000));
    assert_eq!(
        parse(
            Operation::Authorize,
            200,
            "responses/pi_requires_capture.json"
        ),
        vec![expected]
    );
}

#[test]
fn succeeded_after_a_sale_is_payment_succeeded_for_the_amount_received() {
    let mut expected = payment(K::PaymentSucceeded, Sync, "succeeded");
    expected.amount = Some(eur(2000));
    assert_eq!(
        parse(
            Operation::Sale,
            200,
            "responses/pi_succeeded_automatic.json"
        ),
        vec![expected]
    );
}

#[test]
fn succeeded_after_a_capture_is_payment_captured_with_the_capture_reference() {
    let mut expected = payment(K::PaymentCaptured, Sync, "succeeded");
    expected.action_reference = Some("cap_91b0".into());
    expected.psp_payment_reference = Some(PI.into());
    expected.amount = Some(eur(1500));
    assert_eq!(
        parse(
            Operation::Capture,
            200,
            "responses/pi_succeeded_captured.json"
        ),
        vec![expected]
    );
}

#[test]
fn requires_action_is_customer_action_required_with_the_redirect_url() {
    let mut expected = payment(K::CustomerActionRequired, Sync, "requires_action");
    expected.next_action_url = Some(
        "https://hooks.stripe.com/3d_secure_2/hosted?merchant=acct_1&payment_intent=pi_3QxYz1LkdIwHu7ix0a1b2c3d".into(),
    );
    assert_eq!(
        parse(Operation::Sale, 200, "responses/pi_requires_action.json"),
        vec![expected]
    );
}

#[test]
fn processing_is_payment_processing() {
    assert_eq!(
        parse(Operation::Sale, 200, "responses/pi_processing.json"),
        vec![payment(K::PaymentProcessing, Sync, "processing")]
    );
}

#[test]
fn requires_confirmation_is_attempt_submitted() {
    assert_eq!(
        parse(
            Operation::Sale,
            200,
            "responses/pi_requires_confirmation.json"
        ),
        vec![payment(K::AttemptSubmitted, Sync, "requires_confirmation")]
    );
}

#[test]
fn requires_payment_method_after_confirmation_is_a_decline_with_the_last_payment_error() {
    let mut expected = payment(K::PaymentFailed, Query, "requires_payment_method");
    expected.failure = failure(C::Declined, "generic_decline", "Your card was declined.");
    assert_eq!(
        parse(
            Operation::QueryPayment,
            200,
            "responses/pi_requires_payment_method.json"
        ),
        vec![expected]
    );
}

#[test]
fn canceled_after_a_void_is_payment_canceled() {
    assert_eq!(
        parse(Operation::Void, 200, "responses/pi_canceled.json"),
        vec![payment(K::PaymentCanceled, Sync, "canceled")]
    );
}

#[test]
fn a_query_by_id_reports_query_evidence() {
    let mut expected = payment(K::PaymentSucceeded, Query, "succeeded");
    expected.amount = Some(eur(2000));
    assert_eq!(
        parse(
            Operation::QueryPayment,
            200,
            "responses/pi_succeeded_automatic.json"
        ),
        vec![expected]
    );
}

#[test]
fn a_search_finds_the_payment_intent_carrying_the_attempt_reference() {
    let mut context = ctx(Operation::QueryPayment);
    context.psp_payment_reference = None;
    let mut expected = payment(K::PaymentAuthorized, Query, "requires_capture");
    expected.amount = Some(eur(2000));
    assert_eq!(
        parse_with(&context, 200, "responses/search_result_one.json"),
        vec![expected]
    );
}

#[test]
fn an_empty_search_is_result_unknown_not_a_failure() {
    let mut context = ctx(Operation::QueryPayment);
    context.psp_payment_reference = None;
    let mut expected = blank(K::ResultUnknown, Query, "not_found");
    expected.attempt_reference = Some(ATTEMPT.into());
    expected.failure = failure(
        C::Unknown,
        "not_found",
        "no PaymentIntent carries this attempt reference (Stripe search can lag behind by about a minute)",
    );
    assert_eq!(
        parse_with(&context, 200, "responses/search_result_empty.json"),
        vec![expected.clone()]
    );
    assert_eq!(
        parse_with(&context, 200, "responses/search_result_other_only.json"),
        vec![expected]
    );
}

#[test]
fn a_2xx_body_of_another_object_type_is_never_read_as_a_payment() {
    let mut expected = error(Operation::Sale, K::ResultUnknown, "http_200");
    expected.failure = failure(
        C::Unknown,
        "unreadable_response",
        "HTTP 200: the body is not the Stripe object this operation returns",
    );
    assert_eq!(
        parse(Operation::Sale, 200, "responses/refund_succeeded.json"),
        vec![expected]
    );
}

#[test]
fn a_2xx_garbage_body_is_result_unknown() {
    let mut expected = error(Operation::Sale, K::ResultUnknown, "http_200");
    expected.failure = failure(
        C::Unknown,
        "unreadable_response",
        "HTTP 200: the body is not the Stripe object this operation returns",
    );
    assert_eq!(
        parse(Operation::Sale, 200, "responses/garbage.txt"),
        vec![expected]
    );
}

#[test]
fn an_empty_2xx_body_is_result_unknown() {
    let events = parse_response(
        &ctx(Operation::Authorize),
        &HttpResponse {
            status: 200,
            headers: vec![],
            body: vec![],
        },
    )
    .unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, K::ResultUnknown);
    assert_eq!(events[0].failure.as_ref().unwrap().category, C::Unknown);
}

// ---- errors by meaning ----

#[test]
fn a_card_error_is_a_definitive_decline_with_the_decline_code() {
    let mut expected = error(Operation::Sale, K::PaymentFailed, "card_declined");
    expected.psp_reference = Some(PI.into());
    expected.failure = failure(
        C::Declined,
        "generic_decline",
        "HTTP 402: Your card was declined.",
    );
    assert_eq!(
        parse(Operation::Sale, 402, "responses/error_card_declined.json"),
        vec![expected]
    );
}

#[test]
fn insufficient_funds_is_a_decline_coded_insufficient_funds() {
    let mut expected = error(Operation::Authorize, K::PaymentFailed, "card_declined");
    expected.psp_reference = Some(PI.into());
    expected.failure = failure(
        C::Declined,
        "insufficient_funds",
        "HTTP 402: Your card has insufficient funds.",
    );
    assert_eq!(
        parse(
            Operation::Authorize,
            402,
            "responses/error_insufficient_funds.json"
        ),
        vec![expected]
    );
}

#[test]
fn a_card_error_without_decline_code_uses_the_error_code() {
    let mut expected = error(Operation::Sale, K::PaymentFailed, "expired_card");
    expected.failure = failure(
        C::Declined,
        "expired_card",
        "HTTP 402: Your card has expired.",
    );
    assert_eq!(
        parse(Operation::Sale, 402, "responses/error_expired_card.json"),
        vec![expected]
    );
}

#[test]
fn idempotency_key_in_use_is_retryable_and_the_outcome_unknown() {
    let mut expected = error(Operation::Sale, K::ResultUnknown, "idempotency_key_in_use");
    expected.failure = failure(
        C::Retryable,
        "idempotency_key_in_use",
        "HTTP 409: There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): att_7f3c2a. Please try again later.",
    );
    assert_eq!(
        parse(
            Operation::Sale,
            409,
            "responses/error_idempotency_key_in_use.json"
        ),
        vec![expected]
    );
}

#[test]
fn rate_limiting_is_retryable_and_the_outcome_unknown() {
    let mut expected = error(Operation::Authorize, K::ResultUnknown, "rate_limit");
    expected.failure = failure(
        C::Retryable,
        "rate_limit",
        "HTTP 429: Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits.",
    );
    assert_eq!(
        parse(Operation::Authorize, 429, "responses/error_rate_limit.json"),
        vec![expected]
    );
}

#[test]
fn an_idempotency_error_is_a_conflict_with_an_unknown_outcome() {
    let mut expected = error(Operation::Sale, K::ResultUnknown, "idempotency_error");
    expected.failure = failure(
        C::Conflict,
        "idempotency_error",
        "HTTP 400: Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than 'att_7f3c2a' if you meant to execute a different request.",
    );
    assert_eq!(
        parse(
            Operation::Sale,
            400,
            "responses/error_idempotency_error.json"
        ),
        vec![expected]
    );
}

#[test]
fn a_5xx_is_result_unknown() {
    let mut expected = error(Operation::Sale, K::ResultUnknown, "api_error");
    expected.failure = failure(
        C::Unknown,
        "api_error",
        "HTTP 500: An unknown error occurred",
    );
    assert_eq!(
        parse(Operation::Sale, 500, "responses/error_api_error.json"),
        vec![expected]
    );
}

#[test]
fn a_5xx_with_a_garbage_body_is_result_unknown() {
    let mut expected = error(Operation::Authorize, K::ResultUnknown, "http_502");
    expected.failure = failure(
        C::Unknown,
        "http_502",
        "HTTP 502: the PSP's answer has no readable error",
    );
    assert_eq!(
        parse(Operation::Authorize, 502, "responses/garbage.txt"),
        vec![expected]
    );
}

#[test]
fn unauthorized_is_a_configuration_problem_and_never_echoes_the_key() {
    let mut expected = error(Operation::Sale, K::ResultUnknown, "invalid_request_error");
    expected.failure = failure(
        C::Configuration,
        "invalid_request_error",
        "HTTP 401: the PSP refused the connector account's credentials",
    );
    assert_eq!(
        parse(Operation::Sale, 401, "responses/error_authentication.json"),
        vec![expected]
    );
}

#[test]
fn forbidden_is_a_configuration_problem() {
    let mut expected = error(Operation::Refund, K::RefundUnknown, "secret_key_required");
    expected.failure = failure(
        C::Configuration,
        "secret_key_required",
        "HTTP 403: the PSP refused the connector account's credentials",
    );
    assert_eq!(
        parse(Operation::Refund, 403, "responses/error_permission.json"),
        vec![expected]
    );
}

#[test]
fn an_unexpected_state_on_capture_is_a_conflict_to_resolve_by_query() {
    let mut expected = error(
        Operation::Capture,
        K::ResultUnknown,
        "payment_intent_unexpected_state",
    );
    expected.failure = failure(
        C::Conflict,
        "payment_intent_unexpected_state",
        "HTTP 400: This PaymentIntent could not be captured because it has a status of canceled. Only a PaymentIntent with one of the following statuses may be captured: requires_capture.",
    );
    assert_eq!(
        parse(
            Operation::Capture,
            400,
            "responses/error_unexpected_state.json"
        ),
        vec![expected]
    );
}

#[test]
fn an_unexpected_state_on_void_is_a_conflict_to_resolve_by_query() {
    let events = parse(
        Operation::Void,
        400,
        "responses/error_unexpected_state.json",
    );
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, K::ResultUnknown);
    assert_eq!(events[0].failure.as_ref().unwrap().category, C::Conflict);
}

#[test]
fn an_invalid_creation_request_is_a_definitive_failure() {
    let mut expected = error(Operation::Authorize, K::PaymentFailed, "amount_too_small");
    expected.failure = failure(
        C::Declined,
        "amount_too_small",
        "HTTP 400: Amount must be at least €0.50 eur",
    );
    assert_eq!(
        parse(
            Operation::Authorize,
            400,
            "responses/error_amount_too_small.json"
        ),
        vec![expected]
    );
}

#[test]
fn a_card_error_on_capture_is_capture_failed() {
    let mut expected = error(Operation::Capture, K::CaptureFailed, "expired_card");
    expected.failure = failure(
        C::Declined,
        "expired_card",
        "HTTP 402: Your card has expired.",
    );
    assert_eq!(
        parse(Operation::Capture, 402, "responses/error_expired_card.json"),
        vec![expected]
    );
}

#[test]
fn a_missing_payment_intent_on_query_is_a_conflict_not_a_failure() {
    let mut expected = error(
        Operation::QueryPayment,
        K::ResultUnknown,
        "resource_missing",
    );
    expected.failure = failure(
        C::Conflict,
        "resource_missing",
        "HTTP 404: No such payment_intent: 'pi_missing'",
    );
    assert_eq!(
        parse(
            Operation::QueryPayment,
            404,
            "responses/error_resource_missing.json"
        ),
        vec![expected]
    );
}

#[test]
fn a_refused_refund_is_refund_failed() {
    let mut expected = error(
        Operation::Refund,
        K::RefundFailed,
        "charge_already_refunded",
    );
    expected.failure = failure(
        C::Declined,
        "charge_already_refunded",
        "HTTP 400: Charge ch_3QxYz1LkdIwHu7ix0charge has already been refunded.",
    );
    assert_eq!(
        parse(
            Operation::Refund,
            400,
            "responses/error_charge_already_refunded.json"
        ),
        vec![expected]
    );
}

#[test]
fn a_refund_5xx_or_rate_limit_is_refund_unknown() {
    let mut expected = error(Operation::Refund, K::RefundUnknown, "api_error");
    expected.failure = failure(
        C::Unknown,
        "api_error",
        "HTTP 500: An unknown error occurred",
    );
    assert_eq!(
        parse(Operation::Refund, 500, "responses/error_api_error.json"),
        vec![expected]
    );
    let events = parse(Operation::Refund, 429, "responses/error_rate_limit.json");
    assert_eq!(events[0].kind, K::RefundUnknown);
    assert_eq!(events[0].failure.as_ref().unwrap().category, C::Retryable);
}

// ---- refund statuses ----

#[test]
fn a_pending_refund_is_refund_processing() {
    assert_eq!(
        parse(Operation::Refund, 200, "responses/refund_pending.json"),
        vec![refund(K::RefundProcessing, Sync, "pending")]
    );
}

#[test]
fn a_refund_requiring_action_is_still_processing() {
    assert_eq!(
        parse(
            Operation::Refund,
            200,
            "responses/refund_requires_action.json"
        ),
        vec![refund(K::RefundProcessing, Sync, "requires_action")]
    );
}

#[test]
fn a_succeeded_refund_is_refund_succeeded() {
    assert_eq!(
        parse(Operation::Refund, 200, "responses/refund_succeeded.json"),
        vec![refund(K::RefundSucceeded, Sync, "succeeded")]
    );
}

#[test]
fn a_failed_refund_is_refund_failed_with_the_failure_reason() {
    let mut expected = refund(K::RefundFailed, Query, "failed");
    expected.failure = failure(C::Declined, "expired_or_canceled_card", "the refund failed");
    assert_eq!(
        parse(Operation::QueryRefund, 200, "responses/refund_failed.json"),
        vec![expected]
    );
}

#[test]
fn a_canceled_refund_is_refund_failed() {
    let mut expected = refund(K::RefundFailed, Query, "canceled");
    expected.failure = failure(C::Declined, "canceled", "the refund was canceled");
    assert_eq!(
        parse(
            Operation::QueryRefund,
            200,
            "responses/refund_canceled.json"
        ),
        vec![expected]
    );
}

#[test]
fn a_refund_list_is_searched_for_the_refund_reference() {
    let mut context = ctx(Operation::QueryRefund);
    context.psp_refund_reference = None;
    assert_eq!(
        parse_with(&context, 200, "responses/refund_list.json"),
        vec![refund(K::RefundSucceeded, Query, "succeeded")]
    );
    context.action_reference = Some("rf_never_sent".into());
    let mut expected = blank(K::RefundUnknown, Query, "not_found");
    expected.attempt_reference = Some(ATTEMPT.into());
    expected.action_reference = Some("rf_never_sent".into());
    expected.psp_payment_reference = Some(PI.into());
    expected.failure = failure(
        C::Unknown,
        "not_found",
        "no refund of this payment carries this refund reference",
    );
    assert_eq!(
        parse_with(&context, 200, "responses/refund_list.json"),
        vec![expected]
    );
}
