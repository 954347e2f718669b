//! `parse-response`: the PSP's answer to a request → the events it proves.

use crate::types::{
    EventKind, EvidenceSource, Failure, FailureCategory, HttpResponse, Money, Operation,
    OperationContext, PaymentEvent,
};
use serde_json::Value;

/// Interprets `response` to the request built for `ctx`.
///
/// A 5xx proves nothing: it becomes `result-unknown` / `refund-unknown`. A 402 is a
/// definitive decline. Other non-2xx answers and bodies that are not the expected JSON
/// are `Err`, which the host treats as unknown (it queries; it never charges again).
pub fn parse_response(
    ctx: &OperationContext,
    response: &HttpResponse,
) -> Result<Vec<PaymentEvent>, Failure> {
    let refund_op = matches!(ctx.operation, Operation::Refund | Operation::QueryRefund);
    if response.status >= 500 {
        let kind = if refund_op {
            EventKind::RefundUnknown
        } else {
            EventKind::ResultUnknown
        };
        let failure = Failure {
            category: FailureCategory::Unknown,
            code: format!("http_{}", response.status),
            message: "the PSP answered with a server error".into(),
        };
        return Ok(vec![base_event(
            ctx,
            kind,
            format!("http_{}", response.status),
        )
        .with_failure(failure)]);
    }
    let body: Value = serde_json::from_slice(&response.body).map_err(|e| Failure {
        category: FailureCategory::Unknown,
        code: "malformed_response".into(),
        message: format!("response body is not JSON: {e}"),
    })?;
    match response.status {
        200..=299 => parse_object(ctx, &body).map(|e| vec![e]),
        402 => Ok(vec![declined(ctx, &body)?]),
        401 | 403 => Err(error_failure(
            FailureCategory::Configuration,
            response.status,
            &body,
        )),
        409 => Err(error_failure(
            FailureCategory::Conflict,
            response.status,
            &body,
        )),
        429 => Err(error_failure(
            FailureCategory::Retryable,
            response.status,
            &body,
        )),
        _ => Err(error_failure(
            FailureCategory::Unknown,
            response.status,
            &body,
        )),
    }
}

fn parse_object(ctx: &OperationContext, body: &Value) -> Result<PaymentEvent, Failure> {
    let status = str_field(body, "status").ok_or_else(|| malformed("missing status"))?;
    let kind = kind_for(ctx.operation, status)
        .ok_or_else(|| malformed(&format!("unknown status {status:?}")))?;
    let mut event = base_event(ctx, kind, status.to_string());
    event.psp_reference = str_field(body, "id").map(String::from);
    event.amount = amount(body)?;
    if matches!(ctx.operation, Operation::Refund | Operation::QueryRefund) {
        event.psp_payment_reference = str_field(body, "payment")
            .map(String::from)
            .or_else(|| ctx.psp_payment_reference.clone());
    }
    match kind {
        EventKind::PaymentFailed | EventKind::RefundFailed | EventKind::CaptureFailed => {
            let code = str_field(body, "decline_code").unwrap_or("declined");
            event.failure = Some(Failure {
                category: FailureCategory::Declined,
                code: code.to_string(),
                message: format!("the PSP reported status {status}"),
            });
        }
        EventKind::CustomerActionRequired => {
            event.next_action_url = str_field(body, "next_action_url").map(String::from);
        }
        _ => {}
    }
    Ok(event)
}

/// Which event a status proves depends on the operation that asked.
fn kind_for(operation: Operation, status: &str) -> Option<EventKind> {
    use EventKind as K;
    use Operation as O;
    let kind = match (operation, status) {
        (O::Refund | O::QueryRefund, "succeeded") => K::RefundSucceeded,
        (O::Refund | O::QueryRefund, "processing" | "pending") => K::RefundProcessing,
        (O::Refund | O::QueryRefund, "failed") => K::RefundFailed,
        (O::Refund | O::QueryRefund, _) => return None,
        (O::Capture, "succeeded" | "captured") => K::PaymentCaptured,
        (O::Capture, "failed") => K::CaptureFailed,
        (O::Authorize, "succeeded" | "authorized" | "requires_capture") => K::PaymentAuthorized,
        (_, "authorized" | "requires_capture") => K::PaymentAuthorized,
        (_, "succeeded") => K::PaymentSucceeded,
        (_, "captured") => K::PaymentCaptured,
        (_, "processing") => K::PaymentProcessing,
        (_, "requires_action") => K::CustomerActionRequired,
        (_, "failed") => K::PaymentFailed,
        (_, "canceled") => K::PaymentCanceled,
        _ => return None,
    };
    Some(kind)
}

fn declined(ctx: &OperationContext, body: &Value) -> Result<PaymentEvent, Failure> {
    let kind = match ctx.operation {
        Operation::Refund | Operation::QueryRefund => EventKind::RefundFailed,
        Operation::Capture => EventKind::CaptureFailed,
        _ => EventKind::PaymentFailed,
    };
    let code = str_field(body, "decline_code")
        .or_else(|| body.get("error").and_then(|e| str_field(e, "code")))
        .unwrap_or("declined")
        .to_string();
    let mut event = base_event(ctx, kind, "declined".into());
    event.psp_reference = str_field(body, "id").map(String::from);
    event.amount = amount(body)?;
    Ok(event.with_failure(Failure {
        category: FailureCategory::Declined,
        message: format!("the PSP declined: {code}"),
        code,
    }))
}

fn base_event(ctx: &OperationContext, kind: EventKind, raw_status: String) -> PaymentEvent {
    let evidence = match ctx.operation {
        Operation::QueryPayment | Operation::QueryRefund => EvidenceSource::Query,
        _ => EvidenceSource::SyncResponse,
    };
    PaymentEvent {
        kind,
        attempt_reference: Some(ctx.attempt_reference.clone()),
        action_reference: ctx.action_reference.clone(),
        psp_reference: None,
        psp_payment_reference: None,
        amount: None,
        provider_event_id: None,
        evidence,
        raw_status,
        failure: None,
        next_action_url: None,
    }
}

trait WithFailure {
    fn with_failure(self, failure: Failure) -> Self;
}

impl WithFailure for PaymentEvent {
    fn with_failure(mut self, failure: Failure) -> Self {
        self.failure = Some(failure);
        self
    }
}

/// `amount` must be an integer number of minor units and come with its currency;
/// a float or a lone amount is refused rather than guessed.
pub(crate) fn amount(body: &Value) -> Result<Option<Money>, Failure> {
    match (body.get("amount"), str_field(body, "currency")) {
        (None | Some(Value::Null), _) => Ok(None),
        (Some(v), Some(currency)) => {
            let amount_minor = v
                .as_i64()
                .ok_or_else(|| malformed("amount is not an integer number of minor units"))?;
            Ok(Some(Money {
                amount_minor,
                currency: currency.to_ascii_uppercase(),
            }))
        }
        (Some(_), None) => Err(malformed("amount without currency")),
    }
}

pub(crate) fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn error_failure(category: FailureCategory, status: u16, body: &Value) -> Failure {
    let error = body.get("error");
    let code = error
        .and_then(|e| str_field(e, "code"))
        .map(String::from)
        .unwrap_or_else(|| format!("http_{status}"));
    let message = error
        .and_then(|e| str_field(e, "message"))
        .unwrap_or("the PSP refused the request")
        .to_string();
    Failure {
        category,
        code,
        message,
    }
}

fn malformed(message: &str) -> Failure {
    Failure {
        category: FailureCategory::Unknown,
        code: "malformed_response".into(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(operation: Operation) -> OperationContext {
        OperationContext {
            operation,
            capture_mode: crate::types::CaptureMode::Automatic,
            attempt_reference: "att_1".into(),
            action_reference: None,
            psp_payment_reference: None,
            psp_refund_reference: None,
            amount: Money {
                amount_minor: 500,
                currency: "USD".into(),
            },
            payment_method_token: None,
            return_url: None,
            merchant_order_no: "o".into(),
            metadata: vec![],
        }
    }

    fn response(status: u16, body: &str) -> HttpResponse {
        HttpResponse {
            status,
            headers: vec![],
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn succeeded_sale_is_payment_succeeded_with_amount() {
        let events = parse_response(
            &ctx(Operation::Sale),
            &response(
                200,
                r#"{"id":"pay_1","status":"succeeded","amount":500,"currency":"usd"}"#,
            ),
        )
        .unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::PaymentSucceeded);
        assert_eq!(events[0].psp_reference.as_deref(), Some("pay_1"));
        let amount = events[0].amount.as_ref().unwrap();
        assert_eq!(
            (amount.amount_minor, amount.currency.as_str()),
            (500, "USD")
        );
        assert_eq!(events[0].evidence, EvidenceSource::SyncResponse);
    }

    #[test]
    fn failed_payment_carries_a_declined_failure() {
        let events = parse_response(
            &ctx(Operation::Sale),
            &response(
                200,
                r#"{"id":"p","status":"failed","decline_code":"insufficient_funds"}"#,
            ),
        )
        .unwrap();
        assert_eq!(events[0].kind, EventKind::PaymentFailed);
        let failure = events[0].failure.as_ref().unwrap();
        assert_eq!(failure.category, FailureCategory::Declined);
        assert_eq!(failure.code, "insufficient_funds");
    }

    #[test]
    fn server_errors_are_unknown_never_failed() {
        let events = parse_response(&ctx(Operation::Sale), &response(503, "oops")).unwrap();
        assert_eq!(events[0].kind, EventKind::ResultUnknown);
        let events = parse_response(&ctx(Operation::Refund), &response(500, "")).unwrap();
        assert_eq!(events[0].kind, EventKind::RefundUnknown);
    }

    #[test]
    fn non_json_and_float_amounts_are_errors() {
        assert!(parse_response(&ctx(Operation::Sale), &response(200, "<html>")).is_err());
        let float = r#"{"id":"p","status":"succeeded","amount":5.5,"currency":"USD"}"#;
        assert!(parse_response(&ctx(Operation::Sale), &response(200, float)).is_err());
    }

    #[test]
    fn query_answers_are_query_evidence() {
        let events = parse_response(
            &ctx(Operation::QueryPayment),
            &response(200, r#"{"id":"p","status":"processing"}"#),
        )
        .unwrap();
        assert_eq!(events[0].kind, EventKind::PaymentProcessing);
        assert_eq!(events[0].evidence, EvidenceSource::Query);
    }
}
