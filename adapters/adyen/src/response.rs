//! The PSP's HTTP answer → normalised events.
//!
//! `/payments` answers carry a `resultCode`; modification answers (`/captures`,
//! `/cancels`, `/refunds`) only say `received`, because Adyen reports their outcome later
//! in a notification. Error answers are classified by meaning ([`classify_error`]). An
//! unreadable answer is an unknown-kind event, never `Err`, so the history records it.
//!
//! | `resultCode` | authorize | sale | query-payment |
//! |---|---|---|---|
//! | `Authorised` | `payment-authorized` | `payment-succeeded` | as the original: by the context's `capture-mode` (see below) |
//! | `Refused` | `payment-failed`, declined, code `refusalReasonCode` (else `refusalReason`) | same | same |
//! | `Pending`, `Received` | `payment-processing` | same | same |
//! | `RedirectShopper`, `IdentifyShopper`, `ChallengeShopper` | `customer-action-required` (`action.url` when given) | same | same |
//! | `Cancelled` | `payment-canceled` | same | same |
//! | `Error`, anything else | `result-unknown` (unknown) | same | same |
//!
//! A query replays the original request (with the attempt's capture mode, see
//! [`crate::request`]) and gets the original answer, so `Authorised` means what it meant
//! for the original: `payment-succeeded` for an automatic-capture attempt (a sale),
//! `payment-authorized` for a manual one. The `CAPTURE` notification of a sale confirms
//! the capture.
//!
//! | modification answer `received` | event |
//! |---|---|
//! | capture | `payment-processing` with `action-reference` = the capture reference |
//! | void | `payment-processing` |
//! | refund, query-refund | `refund-processing` |

use serde::de::DeserializeOwned;

use crate::events::{event, failure, money};
use crate::model::{Amount, ModificationResponse, PaymentResponse, ServiceError};
use crate::types::{
    CaptureMode, EventKind, EvidenceSource, Failure, FailureCategory, HttpResponse, Money,
    Operation, OperationContext, PaymentEvent,
};

/// Adyen's error code for "request already processed or in progress" (idempotency).
pub const ERROR_CODE_IN_PROGRESS: &str = "704";
/// Adyen's error code for "Invalid Merchant Account".
pub const ERROR_CODE_INVALID_MERCHANT_ACCOUNT: &str = "901";
/// The header Adyen sets on errors worth retrying with the same idempotency key.
pub const TRANSIENT_ERROR_HEADER: &str = "transient-error";

/// Interpret `response`, the answer to the request built for `ctx`.
pub fn parse_response(
    ctx: &OperationContext,
    response: &HttpResponse,
) -> Result<Vec<PaymentEvent>, Failure> {
    if !(200..300).contains(&response.status) {
        return Ok(vec![error_event(ctx, response)]);
    }
    let event = match ctx.operation {
        Operation::Authorize | Operation::Sale | Operation::QueryPayment => {
            match body::<PaymentResponse>(&response.body) {
                Some(answer) => payment_event(ctx, &answer),
                None => unreadable(ctx, response.status),
            }
        }
        Operation::Capture | Operation::Void | Operation::Refund | Operation::QueryRefund => {
            match body::<ModificationResponse>(&response.body) {
                Some(answer) => modification_event(ctx, &answer),
                None => unreadable(ctx, response.status),
            }
        }
    };
    Ok(vec![event])
}

/// Query operations produce `query` evidence; everything else is a sync response.
pub fn evidence_for(operation: Operation) -> EvidenceSource {
    match operation {
        Operation::QueryPayment | Operation::QueryRefund => EvidenceSource::Query,
        _ => EvidenceSource::SyncResponse,
    }
}

/// A sale, or the query replaying one.
fn is_sale(ctx: &OperationContext) -> bool {
    ctx.operation == Operation::Sale
        || (ctx.operation == Operation::QueryPayment && ctx.capture_mode == CaptureMode::Automatic)
}

fn payment_event(ctx: &OperationContext, answer: &PaymentResponse) -> PaymentEvent {
    let code = answer.result_code.as_str();
    let kind = match code {
        "Authorised" if is_sale(ctx) => EventKind::PaymentSucceeded,
        "Authorised" => EventKind::PaymentAuthorized,
        "Refused" => EventKind::PaymentFailed,
        "Pending" | "Received" => EventKind::PaymentProcessing,
        "RedirectShopper" | "IdentifyShopper" | "ChallengeShopper" => {
            EventKind::CustomerActionRequired
        }
        "Cancelled" => EventKind::PaymentCanceled,
        _ => EventKind::ResultUnknown,
    };
    let mut ev = event(kind, evidence_for(ctx.operation), code);
    ev.attempt_reference = Some(
        answer
            .merchant_reference
            .clone()
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| ctx.attempt_reference.clone()),
    );
    ev.psp_reference = answer
        .psp_reference
        .clone()
        .or_else(|| ctx.psp_payment_reference.clone());
    let refusal_code = answer
        .refusal_reason_code
        .as_deref()
        .or(answer.refusal_reason.as_deref())
        .filter(|c| !c.is_empty());
    match kind {
        // Adyen authorises exactly the requested amount unless it says otherwise
        // (`PartiallyAuthorised` is not a code this adapter accepts as success).
        EventKind::PaymentAuthorized | EventKind::PaymentSucceeded => {
            ev.amount = answer
                .amount
                .as_ref()
                .and_then(to_money)
                .or_else(|| Some(ctx.amount.clone()));
        }
        EventKind::PaymentFailed => {
            ev.failure = Some(failure(
                FailureCategory::Declined,
                refusal_code.unwrap_or("Refused"),
                answer.refusal_reason.as_deref().unwrap_or("Refused"),
            ));
        }
        EventKind::CustomerActionRequired => {
            ev.next_action_url = answer.action.as_ref().and_then(|a| a.url.clone());
        }
        EventKind::ResultUnknown => {
            ev.failure = Some(failure(
                FailureCategory::Unknown,
                refusal_code.unwrap_or(code),
                answer
                    .refusal_reason
                    .as_deref()
                    .unwrap_or("Adyen did not report an outcome"),
            ));
        }
        _ => {}
    }
    ev
}

fn modification_event(ctx: &OperationContext, answer: &ModificationResponse) -> PaymentEvent {
    if answer.status != "received" {
        let mut ev = context_event(ctx, unknown_kind(ctx.operation), &answer.status);
        ev.failure = Some(failure(
            FailureCategory::Unknown,
            "unrecognised_status",
            &format!(
                "modification status `{}` is not one the adapter knows",
                answer.status
            ),
        ));
        return ev;
    }
    let kind = match ctx.operation {
        Operation::Refund | Operation::QueryRefund => EventKind::RefundProcessing,
        _ => EventKind::PaymentProcessing,
    };
    let mut ev = context_event(ctx, kind, &answer.status);
    if let Some(reference) = answer.reference.clone().filter(|r| !r.is_empty()) {
        match ctx.operation {
            Operation::Void => ev.attempt_reference = Some(reference),
            _ => ev.action_reference = Some(reference),
        }
    }
    // A void is a payment event: it is about the payment itself. Captures and refunds
    // are objects of their own at Adyen, with their own PSP reference.
    if ctx.operation != Operation::Void {
        ev.psp_reference = answer.psp_reference.clone().or(ev.psp_reference);
        ev.psp_payment_reference = answer
            .payment_psp_reference
            .clone()
            .or(ev.psp_payment_reference);
        ev.amount = answer
            .amount
            .as_ref()
            .and_then(to_money)
            .or_else(|| Some(ctx.amount.clone()));
    }
    ev
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
/// | 401, 403, `errorType` `security` or `configuration`, `errorCode` 901 (invalid merchant account) | configuration | unknown kind: nothing happened, but an operator's mistake must not become a customer's decline |
/// | 429; `errorCode` 704 (request already processed or in progress) marked transient (`transient-error: true`, or HTTP 409) | retryable | unknown kind: the first request with this key is still in flight |
/// | `errorCode` 704 not transient (the key was first used with another body or endpoint) | conflict | unknown kind: a request with this key exists, its outcome is not this answer |
/// | 5xx, `errorType` `internal` | unknown | unknown kind |
/// | 404 (no such payment for a modification) | conflict | unknown kind: our view of the PSP's state is stale |
/// | 400 or 422 (`validation`) | declined | failed kind (`payment-failed`, `capture-failed`, `refund-failed`): Adyen refused the request and created nothing; for void and queries, unknown kind with conflict |
/// | any other answer, or an unreadable body | unknown | unknown kind |
///
/// "Unknown kind" is `refund-unknown` for refund operations and `result-unknown` otherwise.
pub fn classify_error(
    operation: Operation,
    status: u16,
    error: Option<&ServiceError>,
    transient: bool,
) -> Classification {
    let unknown = |category| Classification {
        kind: unknown_kind(operation),
        category,
    };
    let error_type = error.and_then(|e| e.error_type.as_deref()).unwrap_or("");
    let code = error.and_then(|e| e.error_code.as_deref()).unwrap_or("");
    if status == 401
        || status == 403
        || matches!(error_type, "security" | "configuration")
        || code == ERROR_CODE_INVALID_MERCHANT_ACCOUNT
    {
        return unknown(FailureCategory::Configuration);
    }
    if status == 429 || (code == ERROR_CODE_IN_PROGRESS && (transient || status == 409)) {
        return unknown(FailureCategory::Retryable);
    }
    if code == ERROR_CODE_IN_PROGRESS {
        return unknown(FailureCategory::Conflict);
    }
    if status >= 500 || error_type == "internal" {
        return unknown(FailureCategory::Unknown);
    }
    if status == 404 {
        return unknown(FailureCategory::Conflict);
    }
    if status == 400 || status == 422 {
        return match failed_kind(operation) {
            Some(kind) => Classification {
                kind,
                category: FailureCategory::Declined,
            },
            None => unknown(FailureCategory::Conflict),
        };
    }
    unknown(FailureCategory::Unknown)
}

fn error_event(ctx: &OperationContext, response: &HttpResponse) -> PaymentEvent {
    let error = body::<ServiceError>(&response.body)
        .filter(|e| e.error_code.is_some() || e.error_type.is_some() || e.message.is_some());
    let transient = response.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case(TRANSIENT_ERROR_HEADER)
            && h.value.trim().eq_ignore_ascii_case("true")
    });
    let class = classify_error(ctx.operation, response.status, error.as_ref(), transient);
    let http = format!("http_{}", response.status);
    let code = error
        .as_ref()
        .and_then(|e| e.error_code.clone())
        .unwrap_or_else(|| http.clone());
    let message = match (class.category, &error) {
        (FailureCategory::Configuration, _) => {
            "the PSP refused the connector account's credentials or configuration".to_string()
        }
        (
            _,
            Some(ServiceError {
                message: Some(m), ..
            }),
        ) => m.clone(),
        (_, Some(_)) => "the PSP answered with an error".to_string(),
        (_, None) => "the PSP's answer has no readable error".to_string(),
    };
    let mut ev = context_event(ctx, class.kind, &code);
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
            ev.psp_payment_reference = ctx.psp_payment_reference.clone();
        }
        _ => ev.psp_reference = ctx.psp_payment_reference.clone(),
    }
    ev
}

fn unreadable(ctx: &OperationContext, status: u16) -> PaymentEvent {
    let mut ev = context_event(ctx, unknown_kind(ctx.operation), &format!("http_{status}"));
    ev.failure = Some(failure(
        FailureCategory::Unknown,
        "unreadable_response",
        &format!("HTTP {status}: the body is not the Adyen message this operation returns"),
    ));
    ev
}

fn to_money(amount: &Amount) -> Option<Money> {
    money(Some(amount.value), Some(&amount.currency))
}

fn body<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    serde_json::from_slice(bytes).ok()
}
