//! The PSP's HTTP answer → normalised events.
//!
//! A 2xx answer is a Stripe object and is mapped by [`crate::normalise`]. Anything else is
//! classified by meaning ([`classify_error`]). The adapter never returns `Err` for an
//! answer it cannot read: a garbage body is a `result-unknown` (or `refund-unknown`) event
//! with category `unknown`, so the audit history records what happened.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::events::{event, failure};
use crate::model::{
    ApiError, ErrorEnvelope, List, PaymentIntent, Refund, META_ATTEMPT, META_REFUND,
};
use crate::normalise::{intent_event, refund_event, Origin};
use crate::types::{
    EventKind, EvidenceSource, Failure, FailureCategory, HttpResponse, Operation, OperationContext,
    PaymentEvent,
};

/// Interpret `response`, the answer to the request built for `ctx`.
pub fn parse_response(
    ctx: &OperationContext,
    response: &HttpResponse,
) -> Result<Vec<PaymentEvent>, Failure> {
    if !(200..300).contains(&response.status) {
        return Ok(vec![error_event(ctx, response)]);
    }
    let origin = Origin {
        evidence: Some(evidence_for(ctx.operation)),
        provider_event_id: None,
        operation: Some(ctx.operation),
        attempt_reference: Some(ctx.attempt_reference.as_str()),
        action_reference: ctx.action_reference.as_deref(),
    };
    let events = match ctx.operation {
        Operation::Authorize | Operation::Sale | Operation::Capture | Operation::Void => {
            match object::<PaymentIntent>(&response.body, "payment_intent") {
                Some(pi) => vec![intent_event(&pi, &origin)],
                None => vec![unreadable(ctx, response.status)],
            }
        }
        Operation::QueryPayment if known(&ctx.psp_payment_reference) => {
            match object::<PaymentIntent>(&response.body, "payment_intent") {
                Some(pi) => vec![intent_event(&pi, &origin)],
                None => vec![unreadable(ctx, response.status)],
            }
        }
        Operation::QueryPayment => {
            match list::<PaymentIntent>(&response.body, "search_result", "payment_intent") {
                Some(found) => {
                    let mine: Vec<_> = found
                        .into_iter()
                        .filter(|pi| pi.metadata.get(META_ATTEMPT) == Some(&ctx.attempt_reference))
                        .collect();
                    match mine.as_slice() {
                        [pi] => vec![intent_event(pi, &origin)],
                        [] => vec![not_found(ctx, "no PaymentIntent carries this attempt reference (Stripe search can lag behind by about a minute)")],
                        _ => vec![ambiguous(ctx, "several PaymentIntents carry this attempt reference")],
                    }
                }
                None => vec![unreadable(ctx, response.status)],
            }
        }
        Operation::Refund => match object::<Refund>(&response.body, "refund") {
            Some(re) => vec![refund_event(&re, &origin)],
            None => vec![unreadable(ctx, response.status)],
        },
        Operation::QueryRefund if known(&ctx.psp_refund_reference) => {
            match object::<Refund>(&response.body, "refund") {
                Some(re) => vec![refund_event(&re, &origin)],
                None => vec![unreadable(ctx, response.status)],
            }
        }
        Operation::QueryRefund => match list::<Refund>(&response.body, "list", "refund") {
            Some(found) => {
                let wanted = ctx.action_reference.as_deref();
                let mine: Vec<_> = found
                    .into_iter()
                    .filter(|re| wanted.is_some() && re.metadata.get(META_REFUND) == wanted)
                    .collect();
                match mine.as_slice() {
                    [re] => vec![refund_event(re, &origin)],
                    [] => vec![not_found(
                        ctx,
                        "no refund of this payment carries this refund reference",
                    )],
                    _ => vec![ambiguous(
                        ctx,
                        "several refunds carry this refund reference",
                    )],
                }
            }
            None => vec![unreadable(ctx, response.status)],
        },
    };
    Ok(events)
}

/// Query operations produce `query` evidence; everything else is a sync response.
pub fn evidence_for(operation: Operation) -> EvidenceSource {
    match operation {
        Operation::QueryPayment | Operation::QueryRefund => EvidenceSource::Query,
        _ => EvidenceSource::SyncResponse,
    }
}

/// The event kind for "failed definitively", if the operation has one.
fn failed_kind(operation: Operation) -> Option<EventKind> {
    match operation {
        Operation::Authorize | Operation::Sale => Some(EventKind::PaymentFailed),
        Operation::Capture => Some(EventKind::CaptureFailed),
        Operation::Refund => Some(EventKind::RefundFailed),
        Operation::Void | Operation::QueryPayment | Operation::QueryRefund => None,
    }
}

/// The event kind for "outcome not known".
fn unknown_kind(operation: Operation) -> EventKind {
    match operation {
        Operation::Refund | Operation::QueryRefund => EventKind::RefundUnknown,
        _ => EventKind::ResultUnknown,
    }
}

/// How an error answer is classified: the event kind and the failure category.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    pub kind: EventKind,
    pub category: FailureCategory,
}

/// Classify a non-2xx answer by meaning.
///
/// | answer | category | kind |
/// |---|---|---|
/// | 401, 403, `authentication_error`, `permission_error` | configuration | unknown kind: nothing happened, but an operator's mistake must not become a customer's decline |
/// | 429, `rate_limit_error`, 409 `idempotency_key_in_use`, `lock_timeout` | retryable | unknown kind: the same request may be retried with the same key |
/// | `idempotency_error` (key reused with other parameters) | conflict | unknown kind: a request with this key exists, its outcome is not this answer |
/// | 5xx, `api_error` | unknown | unknown kind |
/// | `card_error` | declined | failed kind (`payment-failed`, `capture-failed`, `refund-failed`); unknown kind for void and queries |
/// | `invalid_request_error` `payment_intent_unexpected_state`, or `resource_missing` on an existing object | conflict | unknown kind: our view of the PSP's state is stale, query it |
/// | other `invalid_request_error` | declined | failed kind: Stripe refused the request and stored nothing; unknown kind (conflict) for void and queries |
/// | any other answer, or an unreadable body | unknown | unknown kind |
///
/// "Unknown kind" is `refund-unknown` for refund operations and `result-unknown` otherwise.
pub fn classify_error(
    operation: Operation,
    status: u16,
    error: Option<&ApiError>,
) -> Classification {
    let unknown = |category| Classification {
        kind: unknown_kind(operation),
        category,
    };
    let error_type = error.and_then(|e| e.kind.as_deref()).unwrap_or("");
    let code = error.and_then(|e| e.code.as_deref()).unwrap_or("");
    let creates = matches!(operation, Operation::Authorize | Operation::Sale);
    if status == 401
        || status == 403
        || matches!(error_type, "authentication_error" | "permission_error")
    {
        return unknown(FailureCategory::Configuration);
    }
    if status == 429
        || error_type == "rate_limit_error"
        || matches!(code, "idempotency_key_in_use" | "lock_timeout")
    {
        return unknown(FailureCategory::Retryable);
    }
    if error_type == "idempotency_error" {
        return unknown(FailureCategory::Conflict);
    }
    if status >= 500 || error_type == "api_error" {
        return unknown(FailureCategory::Unknown);
    }
    if !(400..500).contains(&status) {
        return unknown(FailureCategory::Unknown);
    }
    match error_type {
        "card_error" => match failed_kind(operation) {
            Some(kind) => Classification {
                kind,
                category: FailureCategory::Declined,
            },
            None => unknown(FailureCategory::Unknown),
        },
        "invalid_request_error" => {
            let stale_view = code == "payment_intent_unexpected_state"
                || (code == "resource_missing" && !creates);
            match failed_kind(operation) {
                Some(kind) if !stale_view => Classification {
                    kind,
                    category: FailureCategory::Declined,
                },
                _ => unknown(FailureCategory::Conflict),
            }
        }
        _ => unknown(FailureCategory::Unknown),
    }
}

/// The single event an error answer produces.
fn error_event(ctx: &OperationContext, response: &HttpResponse) -> PaymentEvent {
    let error = serde_json::from_slice::<ErrorEnvelope>(&response.body)
        .ok()
        .map(|e| e.error);
    let class = classify_error(ctx.operation, response.status, error.as_ref());
    let http = format!("http_{}", response.status);
    let code = error
        .as_ref()
        .and_then(|e| e.best_code().or(e.kind.as_deref()))
        .unwrap_or(&http)
        .to_string();
    let raw_status = error
        .as_ref()
        .and_then(|e| e.code.as_deref().or(e.kind.as_deref()))
        .unwrap_or(&http)
        .to_string();
    let message = match (class.category, &error) {
        // Stripe's authentication messages quote (part of) the key: never echo them.
        (FailureCategory::Configuration, _) => {
            "the PSP refused the connector account's credentials".to_string()
        }
        (
            _,
            Some(ApiError {
                message: Some(m), ..
            }),
        ) => m.clone(),
        (_, Some(_)) => "the PSP answered with an error".to_string(),
        (_, None) => "the PSP's answer has no readable error".to_string(),
    };
    let mut ev = context_event(ctx, class.kind, &raw_status);
    // A card error while confirming names the PaymentIntent it created.
    if !matches!(ctx.operation, Operation::Refund | Operation::QueryRefund) {
        if let Some(pi) = error.as_ref().and_then(ApiError::payment_intent) {
            ev.psp_reference = Some(pi.id);
        }
    }
    ev.failure = Some(failure(
        class.category,
        &code,
        &format!("HTTP {}: {message}", response.status),
    ));
    ev
}

/// An event about the context's own objects, before the PSP told us anything usable.
fn context_event(ctx: &OperationContext, kind: EventKind, raw_status: &str) -> PaymentEvent {
    let mut ev = event(kind, evidence_for(ctx.operation), raw_status);
    ev.attempt_reference = Some(ctx.attempt_reference.clone());
    ev.action_reference = ctx.action_reference.clone();
    match ctx.operation {
        Operation::Refund | Operation::QueryRefund => {
            ev.psp_reference = ctx.psp_refund_reference.clone();
            ev.psp_payment_reference = ctx.psp_payment_reference.clone();
        }
        Operation::Capture => {
            ev.psp_reference = ctx.psp_payment_reference.clone();
            ev.psp_payment_reference = ctx.psp_payment_reference.clone();
        }
        _ => ev.psp_reference = ctx.psp_payment_reference.clone(),
    }
    ev
}

/// A 2xx answer whose body is not the object the operation returns.
fn unreadable(ctx: &OperationContext, status: u16) -> PaymentEvent {
    let mut ev = context_event(ctx, unknown_kind(ctx.operation), &format!("http_{status}"));
    ev.failure = Some(failure(
        FailureCategory::Unknown,
        "unreadable_response",
        &format!("HTTP {status}: the body is not the Stripe object this operation returns"),
    ));
    ev
}

fn not_found(ctx: &OperationContext, message: &str) -> PaymentEvent {
    let mut ev = context_event(ctx, unknown_kind(ctx.operation), "not_found");
    ev.failure = Some(failure(FailureCategory::Unknown, "not_found", message));
    ev
}

fn ambiguous(ctx: &OperationContext, message: &str) -> PaymentEvent {
    let mut ev = context_event(ctx, unknown_kind(ctx.operation), "ambiguous");
    ev.failure = Some(failure(FailureCategory::Conflict, "ambiguous", message));
    ev
}

fn known(value: &Option<String>) -> bool {
    value.as_deref().is_some_and(|v| !v.is_empty())
}

/// The body as a Stripe object of type `expected` (`"object": expected`).
fn object<T: DeserializeOwned>(body: &[u8], expected: &str) -> Option<T> {
    let value: Value = serde_json::from_slice(body).ok()?;
    typed(value, expected)
}

fn typed<T: DeserializeOwned>(value: Value, expected: &str) -> Option<T> {
    if value.get("object").and_then(Value::as_str) != Some(expected) {
        return None;
    }
    serde_json::from_value(value).ok()
}

/// The body as a list-like object (`list`, `search_result`) of `item` objects. Items of
/// another type or shape are skipped; a body that is not such a list is None.
fn list<T: DeserializeOwned>(body: &[u8], list_object: &str, item: &str) -> Option<Vec<T>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    if value.get("object").and_then(Value::as_str) != Some(list_object) {
        return None;
    }
    let page: List<Value> = serde_json::from_value(value).ok()?;
    Some(
        page.data
            .into_iter()
            .filter_map(|v| typed(v, item))
            .collect(),
    )
}
