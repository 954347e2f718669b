//! The Adyen-format subset: Checkout `/v71/payments` and its modifications, JSON,
//! `X-API-Key` auth. Modification outcomes arrive only as notifications.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::{notices_of, respond, Answer, App, Executed, Operation, Pending};
use crate::config::Format;
use crate::faults::{CardOutcome, Transport};
use crate::idempotency::{Claim, SlotKey};
use crate::model::{Happening, NewPayment, NewRefund, PayStatus, Payment, RefundStatus};
use crate::notices::notices_for;
use crate::util::lock;

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/v71/payments", post(create_payment))
        .route("/v71/payments/{psp}/captures", post(capture))
        .route("/v71/payments/{psp}/cancels", post(cancel))
        .route("/v71/payments/{psp}/refunds", post(refund))
        .fallback(unknown_url)
}

#[derive(Deserialize)]
struct AmountJson {
    value: Option<i64>,
    currency: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PaymentMethodJson {
    #[serde(rename = "type")]
    kind: Option<String>,
    stored_payment_method_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PaymentRequest {
    amount: Option<AmountJson>,
    reference: Option<String>,
    merchant_account: Option<String>,
    payment_method: Option<PaymentMethodJson>,
    return_url: Option<String>,
    additional_data: Option<BTreeMap<String, Value>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ModificationRequest {
    merchant_account: Option<String>,
    amount: Option<AmountJson>,
    reference: Option<String>,
}

// ---------------------------------------------------------------------------
// Handlers

async fn create_payment(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let idem = idempotency_key(&headers);
    let result = async {
        let api_key = authenticate(&app, &headers)?;
        let (value, request): (Value, PaymentRequest) = parse(&body)?;
        let new = payment_from_request(request, &api_key, idem.clone())?;
        let slot = claim(
            &app,
            &api_key,
            "POST /v71/payments",
            idem.as_deref(),
            &value,
        )?;
        let account = new
            .merchant_account
            .clone()
            .unwrap_or_else(|| api_key.clone());
        let (outcome, transport) = app.behaviour_at(&account, &new.payment_method);
        let op = Operation {
            transport,
            server_error: server_error(),
            execute: Box::new(move |app| execute_create(app, new, outcome)),
        };
        Ok(app.perform(slot, op).await)
    }
    .await;
    finish(result, idem)
}

fn payment_from_request(
    r: PaymentRequest,
    api_key: &str,
    idem: Option<String>,
) -> Result<NewPayment, Answer> {
    let merchant_account = required_merchant_account(r.merchant_account)?;
    let (amount, currency) = required_amount(r.amount)?;
    let reference = r
        .reference
        .filter(|s| !s.is_empty())
        .ok_or_else(|| validation("130", "Required field 'reference' is not provided."))?;
    let token = r
        .payment_method
        .filter(|m| m.kind.as_deref().is_none_or(|k| k == "scheme"))
        .and_then(|m| m.stored_payment_method_id)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            validation(
                "14_0",
                "The sandbox needs paymentMethod {\"type\": \"scheme\", \"storedPaymentMethodId\": <token>}.",
            )
        })?;
    let manual_capture = r
        .additional_data
        .as_ref()
        .and_then(|d| d.get("manualCapture"))
        .is_some_and(|v| v == "true" || v == &Value::Bool(true));
    Ok(NewPayment {
        format: Format::Adyen,
        api_key: api_key.to_owned(),
        reference,
        idempotency_key: idem,
        amount,
        currency,
        manual_capture,
        payment_method: token,
        metadata: BTreeMap::new(),
        merchant_account: Some(merchant_account),
        return_url: r.return_url,
    })
}

fn execute_create(app: &Arc<App>, new: NewPayment, outcome: CardOutcome) -> Executed {
    let changed = lock(&app.ledger).create_payment(&app.ids, new, outcome, |id| app.action_url(id));
    if outcome == CardOutcome::Pending {
        app.schedule_settle(Pending::Payment(changed.0.id.clone()));
    }
    Executed {
        answer: Answer::json(200, &payment_response(&changed.0)),
        notices: notices_of(app.config.clock.now_secs(), &changed),
    }
}

/// The `/payments` answer for a payment in its current state.
fn payment_response(p: &Payment) -> Value {
    let mut body = json!({
        "pspReference": p.id,
        "merchantReference": p.reference,
        "amount": { "currency": p.currency, "value": p.amount },
    });
    let Some(obj) = body.as_object_mut() else {
        return body;
    };
    let result_code = match p.status {
        PayStatus::RequiresCapture | PayStatus::Succeeded => {
            obj.insert("additionalData".into(), json!({ "authCode": "012345" }));
            obj.insert(
                "paymentMethod".into(),
                json!({ "brand": "visa", "type": "scheme" }),
            );
            "Authorised"
        }
        PayStatus::Failed => {
            if let Some(d) = p.decline {
                obj.insert("refusalReason".into(), json!(d.adyen_reason()));
                obj.insert("refusalReasonCode".into(), json!(d.adyen_reason_code()));
            }
            "Refused"
        }
        PayStatus::RequiresAction => {
            obj.insert(
                "action".into(),
                json!({
                    "paymentMethodType": "scheme",
                    "type": "redirect",
                    "method": "GET",
                    "url": p.next_action_url,
                }),
            );
            "RedirectShopper"
        }
        PayStatus::Processing => "Received",
        PayStatus::Canceled => "Cancelled",
    };
    obj.insert("resultCode".into(), json!(result_code));
    body
}

/// Which modification an endpoint performs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Modification {
    Capture,
    Cancel,
    Refund,
}

impl Modification {
    fn path(self) -> &'static str {
        match self {
            Modification::Capture => "captures",
            Modification::Cancel => "cancels",
            Modification::Refund => "refunds",
        }
    }
}

async fn capture(
    state: State<Arc<App>>,
    psp: Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    modify(state, psp, headers, body, Modification::Capture).await
}

async fn cancel(
    state: State<Arc<App>>,
    psp: Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    modify(state, psp, headers, body, Modification::Cancel).await
}

async fn refund(
    state: State<Arc<App>>,
    psp: Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    modify(state, psp, headers, body, Modification::Refund).await
}

async fn modify(
    State(app): State<Arc<App>>,
    Path(psp): Path<String>,
    headers: HeaderMap,
    body: Bytes,
    kind: Modification,
) -> Response {
    let idem = idempotency_key(&headers);
    let result = async {
        let api_key = authenticate(&app, &headers)?;
        let (value, request): (Value, ModificationRequest) = parse(&body)?;
        let merchant_account = required_merchant_account(request.merchant_account)?;
        let amount = match kind {
            Modification::Cancel => None,
            _ => Some(required_amount(request.amount)?),
        };
        if lock(&app.ledger).payment(&api_key, &psp).is_none() {
            return Err(validation(
                "167",
                "Original pspReference required for this operation",
            ));
        }
        let endpoint = format!("POST /v71/payments/{psp}/{}", kind.path());
        let slot = claim(&app, &api_key, &endpoint, idem.as_deref(), &value)?;
        let m = ModificationCall {
            api_key,
            psp,
            merchant_account,
            amount,
            reference: request.reference,
            idempotency_key: idem.clone(),
        };
        let op = Operation {
            transport: Transport::Normal,
            server_error: server_error(),
            execute: Box::new(move |app| match kind {
                Modification::Capture => execute_capture(app, m),
                Modification::Cancel => execute_cancel(app, m),
                Modification::Refund => execute_refund(app, m),
            }),
        };
        Ok(app.perform(slot, op).await)
    }
    .await;
    finish(result, idem)
}

struct ModificationCall {
    api_key: String,
    psp: String,
    merchant_account: String,
    amount: Option<(i64, String)>,
    reference: Option<String>,
    idempotency_key: Option<String>,
}

impl ModificationCall {
    fn received(&self, modification_psp: &str) -> Answer {
        let mut body = json!({
            "merchantAccount": self.merchant_account,
            "paymentPspReference": self.psp,
            "pspReference": modification_psp,
            "reference": self.reference,
            "status": "received",
        });
        if let (Some((value, currency)), Some(obj)) = (&self.amount, body.as_object_mut()) {
            obj.insert(
                "amount".into(),
                json!({ "currency": currency, "value": value }),
            );
        }
        Answer::json(201, &body)
    }
}

fn execute_capture(app: &Arc<App>, m: ModificationCall) -> Executed {
    let modification_psp = app.ids.adyen_psp_reference();
    let (amount, currency) = m.amount.clone().unwrap_or_default();
    let mut ledger = lock(&app.ledger);
    let payment = ledger.payment(&m.api_key, &m.psp).cloned();
    let outcome = match &payment {
        Some(p) if !currency.eq_ignore_ascii_case(&p.currency) => {
            Err("Currency mismatch".to_owned())
        }
        _ => ledger
            .capture(&m.api_key, &m.psp, Some(amount), &BTreeMap::new())
            .map_err(|r| r.describe("capture")),
    };
    drop(ledger);
    let (p, happening) = match (outcome, payment) {
        (Ok(p), _) => (
            p,
            Happening::Captured {
                modification_psp: Some(modification_psp.clone()),
                amount,
                reference: m.reference.clone(),
            },
        ),
        (Err(reason), Some(p)) => (
            p,
            Happening::CaptureFailed {
                modification_psp: modification_psp.clone(),
                amount,
                reference: m.reference.clone(),
                reason,
            },
        ),
        (Err(_), None) => return gone(),
    };
    Executed {
        answer: m.received(&modification_psp),
        notices: notices_for(app.config.clock.now_secs(), &p, &[], &[happening]),
    }
}

fn execute_cancel(app: &Arc<App>, m: ModificationCall) -> Executed {
    let modification_psp = app.ids.adyen_psp_reference();
    let mut ledger = lock(&app.ledger);
    let payment = ledger.payment(&m.api_key, &m.psp).cloned();
    let outcome = ledger.cancel(&m.api_key, &m.psp, None);
    drop(ledger);
    let (p, happening) = match (outcome, payment) {
        (Ok(p), _) => (
            p,
            Happening::Canceled {
                modification_psp: Some(modification_psp.clone()),
                reference: m.reference.clone(),
            },
        ),
        (Err(refusal), Some(p)) => (
            p,
            Happening::CancelFailed {
                modification_psp: modification_psp.clone(),
                reference: m.reference.clone(),
                reason: refusal.describe("cancel"),
            },
        ),
        (Err(_), None) => return gone(),
    };
    Executed {
        answer: m.received(&modification_psp),
        notices: notices_for(app.config.clock.now_secs(), &p, &[], &[happening]),
    }
}

fn execute_refund(app: &Arc<App>, m: ModificationCall) -> Executed {
    let (amount, currency) = m.amount.clone().unwrap_or_default();
    let new = NewRefund {
        api_key: m.api_key.clone(),
        payment_id: m.psp.clone(),
        amount: Some(amount),
        currency: Some(currency),
        reference: m.reference.clone(),
        idempotency_key: m.idempotency_key.clone(),
        metadata: BTreeMap::new(),
    };
    let mut ledger = lock(&app.ledger);
    let payment = ledger.payment(&m.api_key, &m.psp).cloned();
    let outcome = ledger.refund(&app.ids, new);
    drop(ledger);
    match (outcome, payment) {
        (Ok((p, r, happenings)), _) => {
            if r.status == RefundStatus::Pending {
                app.schedule_settle(Pending::Refund(r.id.clone()));
            }
            Executed {
                answer: m.received(&r.id),
                notices: notices_for(
                    app.config.clock.now_secs(),
                    &p,
                    std::slice::from_ref(&r),
                    &happenings,
                ),
            }
        }
        (Err(refusal), Some(p)) => {
            let modification_psp = app.ids.adyen_psp_reference();
            let happening = Happening::RefundRefused {
                modification_psp: modification_psp.clone(),
                amount,
                reference: m.reference.clone(),
                reason: refusal.describe("refund"),
            };
            Executed {
                answer: m.received(&modification_psp),
                notices: notices_for(app.config.clock.now_secs(), &p, &[], &[happening]),
            }
        }
        (Err(_), None) => gone(),
    }
}

/// The payment vanished between validation and execution (it cannot: payments
/// are never deleted), answered as Adyen answers an unknown reference.
fn gone() -> Executed {
    Executed {
        answer: validation("167", "Original pspReference required for this operation"),
        notices: Vec::new(),
    }
}

async fn unknown_url(method: Method, uri: Uri) -> Response {
    let answer = Answer::json(
        404,
        &json!({
            "status": 404,
            "errorCode": "000",
            "message": format!("The sandbox does not serve {method} {}", uri.path()),
            "errorType": "validation",
        }),
    );
    respond(answer, &[])
}

// ---------------------------------------------------------------------------
// Request plumbing

fn idempotency_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn authenticate(app: &App, headers: &HeaderMap) -> Result<String, Answer> {
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    match key {
        Some(key) if app.accepts_key(Format::Adyen, key) => Ok(key.to_owned()),
        _ => Err(Answer::json(
            401,
            &json!({
                "status": 401,
                "errorCode": "000",
                "message": "HTTP Status Response - Unauthorized",
                "errorType": "security",
            }),
        )),
    }
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<(Value, T), Answer> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        Answer::json(
            400,
            &error_json(400, "702", &format!("Unexpected input: {e}"), "validation"),
        )
    })?;
    let typed = T::deserialize(&value)
        .map_err(|e| validation("702", &format!("Structure of the request is invalid: {e}")))?;
    Ok((value, typed))
}

fn required_merchant_account(account: Option<String>) -> Result<String, Answer> {
    account
        .filter(|s| !s.is_empty())
        .ok_or_else(|| validation("901", "Invalid Merchant Account"))
}

fn required_amount(amount: Option<AmountJson>) -> Result<(i64, String), Answer> {
    let amount = amount.ok_or_else(|| validation("100", "No amount specified"))?;
    let value = amount
        .value
        .filter(|v| *v > 0)
        .ok_or_else(|| validation("137", "Invalid amount specified"))?;
    let currency = amount
        .currency
        .filter(|c| c.len() == 3 && c.chars().all(|c| c.is_ascii_uppercase()))
        .ok_or_else(|| validation("138", "Invalid currency specified"))?;
    Ok((value, currency))
}

fn claim(
    app: &App,
    api_key: &str,
    endpoint: &str,
    key: Option<&str>,
    body: &Value,
) -> Result<Option<SlotKey>, Answer> {
    app.claim(Format::Adyen, api_key, endpoint, key, canonical_json(body))
        .map_err(|claim| match claim {
            Claim::Replay(saved) => Answer::replay(saved),
            Claim::InUse => Answer::json(
                409,
                &error_json(
                    409,
                    "704",
                    "request already processed or in progress",
                    "validation",
                ),
            ),
            _ => validation("704", "request already processed or in progress"),
        })
}

/// JSON with object keys sorted at every level, so key order never matters.
fn canonical_json(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let ordered: BTreeMap<&String, Value> =
                    map.iter().map(|(k, v)| (k, sorted(v))).collect();
                json!(ordered)
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

fn finish(result: Result<Answer, Answer>, idem: Option<String>) -> Response {
    let answer = result.unwrap_or_else(|e| e);
    let mut headers = Vec::new();
    if answer.status == 409 {
        // Adyen marks the in-progress conflict as transient: retry later with the same key.
        headers.push(("transient-error", "true".to_owned()));
    }
    if let Some(key) = idem {
        headers.push(("idempotency-key", key));
    }
    respond(answer, &headers)
}

fn error_json(status: u16, code: &str, message: &str, kind: &str) -> Value {
    json!({ "status": status, "errorCode": code, "message": message, "errorType": kind })
}

fn validation(code: &str, message: &str) -> Answer {
    Answer::json(422, &error_json(422, code, message, "validation"))
}

pub(crate) fn server_error() -> Answer {
    Answer::json(500, &error_json(500, "000", "Internal error", "internal"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_ignores_key_order() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":2,"x":[{"q":1,"p":2}]}}"#).unwrap_or_default();
        let b: Value =
            serde_json::from_str(r#"{"a":{"x":[{"p":2,"q":1}],"y":2},"b":1}"#).unwrap_or_default();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":[{"p":2,"q":1}],"y":2},"b":1}"#
        );
    }
}
