//! The Stripe-format subset: PaymentIntents and Refunds, form-encoded, Bearer auth.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::app::{notices_of, respond, Answer, App, Executed, Operation, Pending, QueryRecord};
use crate::config::Format;
use crate::faults::{CardOutcome, Transport};
use crate::idempotency::Claim;
use crate::model::{
    Happening, NewPayment, NewRefund, PayStatus, Payment, Refund, RefundStatus, Refusal,
};
use crate::notices::notices_for;
use crate::util::lock;

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/v1/payment_intents", post(create_payment_intent))
        .route("/v1/payment_intents/search", get(search_payment_intents))
        .route("/v1/payment_intents/{id}", get(retrieve_payment_intent))
        .route(
            "/v1/payment_intents/{id}/capture",
            post(capture_payment_intent),
        )
        .route(
            "/v1/payment_intents/{id}/cancel",
            post(cancel_payment_intent),
        )
        .route("/v1/refunds", post(create_refund).get(list_refunds))
        .route("/v1/refunds/{id}", get(retrieve_refund))
        .fallback(unknown_url)
}

const SEARCH_URL: &str = "/v1/payment_intents/search";

// ---------------------------------------------------------------------------
// Handlers

async fn create_payment_intent(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let idem = idempotency_key(&headers);
    let result = async {
        let api_key = authenticate(&app, &headers)?;
        let form = Form::parse(&body)?;
        form.only(&[
            "amount",
            "currency",
            "payment_method",
            "confirm",
            "capture_method",
            "return_url",
            "description",
        ])?;
        let new = payment_from_form(&form, &api_key, idem.clone())?;
        let slot = claim(
            &app,
            &api_key,
            "POST /v1/payment_intents",
            idem.as_deref(),
            &form,
        )?;
        let (outcome, transport) = app.behaviour_at(&api_key, &new.payment_method);
        let op = Operation {
            transport,
            server_error: api_error(),
            execute: Box::new(move |app| execute_create(app, new, outcome)),
        };
        Ok(app.perform(slot, op).await)
    }
    .await;
    finish(result, idem)
}

fn payment_from_form(
    form: &Form,
    api_key: &str,
    idem: Option<String>,
) -> Result<NewPayment, Answer> {
    let amount = form.required_amount("amount")?;
    let currency = form.required_currency()?;
    let payment_method = form.required("payment_method")?.to_owned();
    if form.get("confirm") != Some("true") {
        return Err(invalid_request(
            400,
            "parameter_invalid_empty",
            "The sandbox supports only confirm=true on creation.",
            Some("confirm"),
        ));
    }
    let manual_capture = match form.get("capture_method").unwrap_or("automatic") {
        "manual" => true,
        "automatic" | "automatic_async" => false,
        other => {
            return Err(invalid_request(
                400,
                "parameter_invalid_string",
                &format!("Invalid capture_method: must be one of automatic, automatic_async, or manual (got {other})"),
                Some("capture_method"),
            ))
        }
    };
    let reference = form
        .metadata
        .get("sluice_attempt_reference")
        .cloned()
        .or_else(|| idem.clone())
        .unwrap_or_default();
    Ok(NewPayment {
        format: Format::Stripe,
        api_key: api_key.to_owned(),
        reference,
        idempotency_key: idem,
        amount,
        currency: currency.to_ascii_uppercase(),
        manual_capture,
        payment_method,
        metadata: form.metadata.clone(),
        merchant_account: None,
        return_url: form.get("return_url").map(str::to_owned),
    })
}

fn execute_create(app: &Arc<App>, new: NewPayment, outcome: CardOutcome) -> Executed {
    let changed = lock(&app.ledger).create_payment(&app.ids, new, outcome, |id| app.action_url(id));
    if outcome == CardOutcome::Pending {
        app.schedule_settle(Pending::Payment(changed.0.id.clone()));
    }
    let answer = match changed.0.status {
        PayStatus::Failed => card_error(&changed.0),
        _ => Answer::json(200, &payment_intent_json(&changed.0)),
    };
    Executed {
        answer,
        notices: notices_of(app.config.clock.now_secs(), &changed),
    }
}

async fn capture_payment_intent(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let idem = idempotency_key(&headers);
    let result = async {
        let api_key = authenticate(&app, &headers)?;
        let form = Form::parse(&body)?;
        form.only(&["amount_to_capture"])?;
        let amount = form.optional_amount("amount_to_capture")?;
        let endpoint = format!("POST /v1/payment_intents/{id}/capture");
        let slot = claim(&app, &api_key, &endpoint, idem.as_deref(), &form)?;
        let metadata = form.metadata.clone();
        let op = Operation {
            transport: Transport::Normal,
            server_error: api_error(),
            execute: Box::new(move |app| {
                let result = lock(&app.ledger).capture(&api_key, &id, amount, &metadata);
                match result {
                    Ok(p) => {
                        let happening = Happening::Captured {
                            modification_psp: None,
                            amount: p.amount_received,
                            reference: metadata.get("sluice_capture_reference").cloned(),
                        };
                        Executed {
                            answer: Answer::json(200, &payment_intent_json(&p)),
                            notices: notices_for(
                                app.config.clock.now_secs(),
                                &p,
                                &[],
                                &[happening],
                            ),
                        }
                    }
                    Err(refusal) => refused(refusal, &id, "capture", "amount_to_capture"),
                }
            }),
        };
        Ok(app.perform(slot, op).await)
    }
    .await;
    finish(result, idem)
}

async fn cancel_payment_intent(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let idem = idempotency_key(&headers);
    let result = async {
        let api_key = authenticate(&app, &headers)?;
        let form = Form::parse(&body)?;
        form.only(&["cancellation_reason"])?;
        let reason = form.get("cancellation_reason").map(str::to_owned);
        let endpoint = format!("POST /v1/payment_intents/{id}/cancel");
        let slot = claim(&app, &api_key, &endpoint, idem.as_deref(), &form)?;
        let op = Operation {
            transport: Transport::Normal,
            server_error: api_error(),
            execute: Box::new(move |app| {
                let result = lock(&app.ledger).cancel(&api_key, &id, reason);
                match result {
                    Ok(p) => {
                        let happening = Happening::Canceled {
                            modification_psp: None,
                            reference: None,
                        };
                        Executed {
                            answer: Answer::json(200, &payment_intent_json(&p)),
                            notices: notices_for(
                                app.config.clock.now_secs(),
                                &p,
                                &[],
                                &[happening],
                            ),
                        }
                    }
                    Err(refusal) => refused(refusal, &id, "cancel", "intent"),
                }
            }),
        };
        Ok(app.perform(slot, op).await)
    }
    .await;
    finish(result, idem)
}

async fn create_refund(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let idem = idempotency_key(&headers);
    let result = async {
        let api_key = authenticate(&app, &headers)?;
        let form = Form::parse(&body)?;
        form.only(&["payment_intent", "amount", "reason"])?;
        let payment_id = form.required("payment_intent")?.to_owned();
        let new = NewRefund {
            api_key: api_key.clone(),
            payment_id: payment_id.clone(),
            amount: form.optional_amount("amount")?,
            currency: None,
            reference: form.metadata.get("sluice_refund_reference").cloned(),
            idempotency_key: idem.clone(),
            metadata: form.metadata.clone(),
        };
        let slot = claim(&app, &api_key, "POST /v1/refunds", idem.as_deref(), &form)?;
        let op = Operation {
            transport: Transport::Normal,
            server_error: api_error(),
            execute: Box::new(move |app| execute_refund(app, new, &payment_id)),
        };
        Ok(app.perform(slot, op).await)
    }
    .await;
    finish(result, idem)
}

fn execute_refund(app: &Arc<App>, new: NewRefund, payment_id: &str) -> Executed {
    let result = lock(&app.ledger).refund(&app.ids, new);
    match result {
        Ok((p, r, happenings)) => {
            if r.status == RefundStatus::Pending {
                app.schedule_settle(Pending::Refund(r.id.clone()));
            }
            Executed {
                answer: Answer::json(200, &refund_json(&r)),
                notices: notices_for(
                    app.config.clock.now_secs(),
                    &p,
                    std::slice::from_ref(&r),
                    &happenings,
                ),
            }
        }
        Err(Refusal::AmountTooLarge { available }) if available <= 0 => {
            let charge = lock(&app.ledger)
                .any_payment(payment_id)
                .and_then(|p| p.charge_id.clone())
                .unwrap_or_default();
            executed_error(invalid_request(
                400,
                "charge_already_refunded",
                &format!("Charge {charge} has already been refunded."),
                None,
            ))
        }
        Err(Refusal::UnexpectedState(_)) => executed_error(invalid_request(
            400,
            "charge_not_refundable",
            "This PaymentIntent does not have a successful charge to refund.",
            Some("payment_intent"),
        )),
        Err(refusal) => refused(refusal, payment_id, "refund", "amount"),
    }
}

async fn retrieve_payment_intent(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let started = app.config.clock.now_ms();
    app.sleep_unless_shutdown(app.config.query_delay).await;
    let mut reference = id.clone();
    let result = authenticate(&app, &headers).map(|api_key| {
        match lock(&app.ledger).payment(&api_key, &id) {
            Some(p) => {
                reference = p.reference.clone();
                Answer::json(200, &payment_intent_json(p))
            }
            None => no_such("payment_intent", &id, "intent"),
        }
    });
    record_query(&app, reference, "retrieve", started);
    finish(result, None)
}

/// Logs one lookup for [`crate::QueryRecord`].
fn record_query(app: &App, reference: String, kind: &str, started_unix_ms: i64) {
    lock(&app.queries).push(QueryRecord {
        reference,
        kind: kind.to_owned(),
        started_unix_ms,
        ended_unix_ms: app.config.clock.now_ms(),
    });
}

async fn search_payment_intents(
    State(app): State<Arc<App>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let started = app.config.clock.now_ms();
    app.sleep_unless_shutdown(app.config.query_delay).await;
    let mut references = Vec::new();
    let result = (|| {
        let api_key = authenticate(&app, &headers)?;
        let params = query_params(query.as_deref())?;
        let Some(q) = params.get("query") else {
            return Err(invalid_request(
                400,
                "parameter_missing",
                "Missing required param: query.",
                Some("query"),
            ));
        };
        let Some(pairs) = parse_search_query(q) else {
            return Err(invalid_request(
                400,
                "parameter_invalid_string",
                "The sandbox supports only metadata['key']:'value' clauses joined by AND.",
                Some("query"),
            ));
        };
        references.extend(
            pairs
                .iter()
                .filter(|(key, _)| key == "sluice_attempt_reference")
                .map(|(_, value)| value.clone()),
        );
        let mut found = lock(&app.ledger).search_by_metadata(&api_key, &pairs);
        found.reverse();
        let data: Vec<Value> = found.iter().map(payment_intent_json).collect();
        Ok(Answer::json(
            200,
            &json!({
                "object": "search_result",
                "data": data,
                "has_more": false,
                "next_page": null,
                "url": SEARCH_URL,
            }),
        ))
    })();
    if references.is_empty() {
        references.push(query.unwrap_or_default());
    }
    for reference in references {
        record_query(&app, reference, "search", started);
    }
    finish(result, None)
}

async fn retrieve_refund(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let result = authenticate(&app, &headers).map(|api_key| {
        match lock(&app.ledger).refund_by_id(&api_key, &id) {
            Some(r) => Answer::json(200, &refund_json(r)),
            None => no_such("refund", &id, "id"),
        }
    });
    finish(result, None)
}

async fn list_refunds(
    State(app): State<Arc<App>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let result = (|| {
        let api_key = authenticate(&app, &headers)?;
        let params = query_params(query.as_deref())?;
        let Some(pi) = params.get("payment_intent") else {
            return Err(invalid_request(
                400,
                "parameter_missing",
                "The sandbox lists refunds only by payment_intent.",
                Some("payment_intent"),
            ));
        };
        let mut refunds = lock(&app.ledger).refunds_of(&api_key, pi);
        refunds.reverse();
        let data: Vec<Value> = refunds.iter().map(refund_json).collect();
        Ok(Answer::json(
            200,
            &json!({ "object": "list", "data": data, "has_more": false, "url": "/v1/refunds" }),
        ))
    })();
    finish(result, None)
}

async fn unknown_url(method: Method, uri: Uri) -> Response {
    let path = uri
        .path()
        .strip_prefix("/stripe")
        .unwrap_or(uri.path())
        .to_owned();
    respond(
        invalid_request(
            404,
            "",
            &format!("Unrecognized request URL ({method}: {path})."),
            None,
        ),
        &[],
    )
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
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    let Some(key) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
        return Err(auth_error(
            "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
        ));
    };
    if app.accepts_key(Format::Stripe, key) {
        Ok(key.to_owned())
    } else {
        Err(auth_error(&format!(
            "Invalid API Key provided: {}",
            mask(key)
        )))
    }
}

/// Shows only the last four characters of a key, as Stripe does.
fn mask(key: &str) -> String {
    let tail: String = key
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("sk_****{tail}")
}

fn claim(
    app: &App,
    api_key: &str,
    endpoint: &str,
    key: Option<&str>,
    form: &Form,
) -> Result<Option<crate::idempotency::SlotKey>, Answer> {
    app.claim(
        Format::Stripe,
        api_key,
        endpoint,
        key,
        form.canonical.clone(),
    )
    .map_err(|claim| claim_answer(claim, endpoint, key.unwrap_or_default()))
}

fn claim_answer(claim: Claim, endpoint: &str, key: &str) -> Answer {
    match claim {
        Claim::Replay(saved) => Answer::replay(saved),
        Claim::InUse => invalid_request(
            409,
            "idempotency_key_in_use",
            &format!("There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): {key}. Please try again later."),
            None,
        ),
        Claim::OtherEndpoint { first_endpoint } => idempotency_error(&format!(
            "Keys for idempotent requests can only be used for the same endpoint they were first used for ('{}' vs '{}'). Try using a key other than '{key}' if you meant to execute a different request.",
            path_of(&first_endpoint),
            path_of(endpoint)
        )),
        Claim::OtherParams => idempotency_error(&format!(
            "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{key}' if you meant to execute a different request."
        )),
        Claim::Proceed => invalid_request(500, "", "unreachable idempotency state", None),
    }
}

fn path_of(endpoint: &str) -> &str {
    endpoint.split_once(' ').map_or(endpoint, |(_, path)| path)
}

fn finish(result: Result<Answer, Answer>, idem: Option<String>) -> Response {
    let answer = result.unwrap_or_else(|e| e);
    let mut headers = vec![("stripe-version", "2024-06-20".to_owned())];
    if let Some(key) = idem {
        headers.push(("idempotency-key", key));
    }
    if answer.replayed {
        headers.push(("idempotent-replayed", "true".to_owned()));
    }
    respond(answer, &headers)
}

fn query_params(query: Option<&str>) -> Result<BTreeMap<String, String>, Answer> {
    serde_urlencoded::from_str::<Vec<(String, String)>>(query.unwrap_or(""))
        .map(|pairs| pairs.into_iter().collect())
        .map_err(|_| invalid_request(400, "", "Invalid query string.", None))
}

/// `metadata['k']:'v' AND metadata["k2"]:"v2"` → `[(k, v), (k2, v2)]`.
pub fn parse_search_query(query: &str) -> Option<Vec<(String, String)>> {
    query
        .split(" AND ")
        .map(|clause| {
            let rest = clause.trim().strip_prefix("metadata[")?;
            let (key, rest) = quoted(rest)?;
            let rest = rest.strip_prefix("]:")?;
            let (value, rest) = quoted(rest)?;
            rest.is_empty().then_some((key, value))
        })
        .collect()
}

/// A `'...'` or `"..."` string at the start of `s` (backslash escapes the quote).
fn quoted(s: &str) -> Option<(String, &str)> {
    let quote = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let mut out = String::new();
    let mut chars = s[1..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?.1),
            c if c == quote => return Some((out, &s[1 + i + 1..])),
            c => out.push(c),
        }
    }
    None
}

/// A parsed form body: plain fields, `metadata[...]`, and a canonical form for idempotency.
struct Form {
    fields: BTreeMap<String, String>,
    metadata: BTreeMap<String, String>,
    canonical: String,
}

impl Form {
    fn parse(body: &[u8]) -> Result<Self, Answer> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body).map_err(|_| {
            invalid_request(
                400,
                "",
                "Invalid request body: expected application/x-www-form-urlencoded.",
                None,
            )
        })?;
        let mut sorted = pairs.clone();
        sorted.sort();
        let canonical = serde_urlencoded::to_string(&sorted).unwrap_or_default();
        let mut fields = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for (k, v) in pairs {
            if let Some(key) = k
                .strip_prefix("metadata[")
                .and_then(|r| r.strip_suffix(']'))
            {
                check_metadata(key, &v)?;
                metadata.insert(key.to_owned(), v);
            } else if k == "expand[]" || (k.starts_with("expand[") && k.ends_with(']')) {
                // Accepted and ignored: the sandbox never expands.
            } else {
                fields.insert(k, v);
            }
        }
        Ok(Self {
            fields,
            metadata,
            canonical,
        })
    }

    /// Refuses parameters outside `allowed` (besides metadata and expand), as Stripe does.
    fn only(&self, allowed: &[&str]) -> Result<(), Answer> {
        match self.fields.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(unknown) => Err(invalid_request(
                400,
                "parameter_unknown",
                &format!("Received unknown parameter: {unknown}"),
                Some(unknown),
            )),
            None => Ok(()),
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    fn required(&self, name: &str) -> Result<&str, Answer> {
        self.get(name).filter(|v| !v.is_empty()).ok_or_else(|| {
            invalid_request(
                400,
                "parameter_missing",
                &format!("Missing required param: {name}."),
                Some(name),
            )
        })
    }

    fn optional_amount(&self, name: &str) -> Result<Option<i64>, Answer> {
        match self.get(name) {
            None => Ok(None),
            Some(raw) => match raw.parse::<i64>() {
                Ok(v) if (1..=99_999_999).contains(&v) => Ok(Some(v)),
                _ => Err(invalid_request(
                    400,
                    "parameter_invalid_integer",
                    &format!("Invalid integer: {raw}"),
                    Some(name),
                )),
            },
        }
    }

    fn required_amount(&self, name: &str) -> Result<i64, Answer> {
        self.required(name)?;
        self.optional_amount(name)?.ok_or_else(|| {
            invalid_request(
                400,
                "parameter_missing",
                "Missing required param: amount.",
                Some(name),
            )
        })
    }

    fn required_currency(&self) -> Result<String, Answer> {
        let raw = self.required("currency")?;
        if raw.len() == 3 && raw.chars().all(|c| c.is_ascii_alphabetic()) {
            Ok(raw.to_ascii_lowercase())
        } else {
            Err(invalid_request(
                400,
                "parameter_invalid_string",
                &format!("Invalid currency: {raw}."),
                Some("currency"),
            ))
        }
    }
}

fn check_metadata(key: &str, value: &str) -> Result<(), Answer> {
    if key.is_empty() || key.chars().count() > 40 || value.chars().count() > 500 {
        return Err(invalid_request(
            400,
            "parameter_invalid_string",
            "Metadata keys must be 1 to 40 characters and values at most 500.",
            Some("metadata"),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Errors

fn error_body(
    kind: &str,
    code: &str,
    message: &str,
    param: Option<&str>,
) -> serde_json::Map<String, Value> {
    let mut error = serde_json::Map::new();
    if !code.is_empty() {
        error.insert("code".into(), json!(code));
        error.insert(
            "doc_url".into(),
            json!(format!(
                "https://stripe.com/docs/error-codes/{}",
                code.replace('_', "-")
            )),
        );
    }
    error.insert("message".into(), json!(message));
    if let Some(param) = param {
        error.insert("param".into(), json!(param));
    }
    error.insert("type".into(), json!(kind));
    error
}

fn invalid_request(status: u16, code: &str, message: &str, param: Option<&str>) -> Answer {
    Answer::json(
        status,
        &json!({ "error": error_body("invalid_request_error", code, message, param) }),
    )
}

fn idempotency_error(message: &str) -> Answer {
    Answer::json(
        400,
        &json!({ "error": error_body("idempotency_error", "", message, None) }),
    )
}

fn auth_error(message: &str) -> Answer {
    Answer::json(
        401,
        &json!({ "error": error_body("invalid_request_error", "", message, None) }),
    )
}

pub(crate) fn api_error() -> Answer {
    Answer::json(
        500,
        &json!({ "error": error_body("api_error", "", "An unknown error occurred.", None) }),
    )
}

fn no_such(object: &str, id: &str, param: &str) -> Answer {
    invalid_request(
        404,
        "resource_missing",
        &format!("No such {object}: '{id}'"),
        Some(param),
    )
}

fn executed_error(answer: Answer) -> Executed {
    Executed {
        answer,
        notices: Vec::new(),
    }
}

/// A refused capture, cancel or refund as Stripe words it.
fn refused(refusal: Refusal, id: &str, operation: &str, amount_param: &str) -> Executed {
    let answer = match refusal {
        Refusal::NotFound => no_such(
            "payment_intent",
            id,
            if operation == "refund" {
                "payment_intent"
            } else {
                "intent"
            },
        ),
        Refusal::UnexpectedState(status) => invalid_request(
            400,
            "payment_intent_unexpected_state",
            &format!(
                "This PaymentIntent could not be {operation}{} because it has a status of {}.",
                if operation == "cancel" { "ed" } else { "d" },
                stripe_status(status)
            ),
            None,
        ),
        Refusal::AmountTooLarge { available } => invalid_request(
            400,
            "amount_too_large",
            &format!("The {operation} amount exceeds the amount available ({available})."),
            Some(amount_param),
        ),
        other => invalid_request(
            400,
            "parameter_invalid_integer",
            &other.describe(operation),
            Some(amount_param),
        ),
    };
    executed_error(answer)
}

/// The 402 a confirm with a declined card answers.
fn card_error(p: &Payment) -> Answer {
    let mut error = last_payment_error(p).unwrap_or_default();
    error.insert("payment_intent".into(), payment_intent_json(p));
    Answer::json(402, &json!({ "error": error }))
}

fn last_payment_error(p: &Payment) -> Option<serde_json::Map<String, Value>> {
    let d = p.decline?;
    let kind = if d.stripe_decline_code().is_some() {
        "card_error"
    } else {
        "invalid_request_error"
    };
    let mut error = error_body(kind, d.stripe_code(), d.stripe_message(), None);
    if let Some(decline_code) = d.stripe_decline_code() {
        error.insert("decline_code".into(), json!(decline_code));
    }
    if let Some(charge) = &p.charge_id {
        error.insert("charge".into(), json!(charge));
    }
    error.insert("payment_method".into(), payment_method_json(p));
    Some(error)
}

// ---------------------------------------------------------------------------
// Objects

fn stripe_status(s: PayStatus) -> &'static str {
    match s {
        PayStatus::RequiresAction => "requires_action",
        PayStatus::Processing => "processing",
        PayStatus::RequiresCapture => "requires_capture",
        PayStatus::Succeeded => "succeeded",
        PayStatus::Canceled => "canceled",
        PayStatus::Failed => "requires_payment_method",
    }
}

fn payment_method_json(p: &Payment) -> Value {
    json!({ "id": p.payment_method, "object": "payment_method", "type": "card" })
}

/// A PaymentIntent object.
pub fn payment_intent_json(p: &Payment) -> Value {
    let next_action = p.next_action_url.as_ref().map(|url| {
        json!({
            "type": "redirect_to_url",
            "redirect_to_url": { "url": url, "return_url": p.return_url },
        })
    });
    json!({
        "id": p.id,
        "object": "payment_intent",
        "amount": p.amount,
        "amount_capturable": p.amount_capturable,
        "amount_received": p.amount_received,
        "canceled_at": p.canceled_at,
        "cancellation_reason": p.cancellation_reason,
        "capture_method": if p.manual_capture { "manual" } else { "automatic" },
        "client_secret": format!("{}_secret_sandbox", p.id),
        "confirmation_method": "automatic",
        "created": p.created,
        "currency": p.currency.to_ascii_lowercase(),
        "description": null,
        "last_payment_error": last_payment_error(p),
        "latest_charge": p.charge_id,
        "livemode": false,
        "metadata": p.metadata,
        "next_action": next_action,
        "payment_method": p.payment_method,
        "payment_method_types": ["card"],
        "return_url": p.return_url,
        "status": stripe_status(p.status),
    })
}

/// The Charge object `charge.refunded` carries.
pub fn charge_json(p: &Payment) -> Value {
    json!({
        "id": p.charge_id,
        "object": "charge",
        "amount": p.amount,
        "amount_captured": p.amount_received,
        "amount_refunded": p.amount_refunded,
        "captured": p.amount_received > 0,
        "created": p.created,
        "currency": p.currency.to_ascii_lowercase(),
        "livemode": false,
        "metadata": p.metadata,
        "paid": p.committed,
        "payment_intent": p.id,
        "refunded": p.amount_received > 0 && p.amount_refunded >= p.amount_received,
        "status": "succeeded",
    })
}

/// A Refund object.
pub fn refund_json(r: &Refund) -> Value {
    json!({
        "id": r.id,
        "object": "refund",
        "amount": r.amount,
        "charge": r.charge_id,
        "created": r.created,
        "currency": r.currency.to_ascii_lowercase(),
        "failure_reason": r.failure_reason,
        "metadata": r.metadata,
        "payment_intent": r.payment_id,
        "reason": null,
        "status": match r.status {
            RefundStatus::Pending => "pending",
            RefundStatus::Succeeded => "succeeded",
            RefundStatus::Failed => "failed",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_queries_with_either_quote_and_and_are_parsed() {
        assert_eq!(
            parse_search_query("metadata['sluice_attempt_reference']:'att_1'"),
            Some(vec![("sluice_attempt_reference".into(), "att_1".into())])
        );
        assert_eq!(
            parse_search_query(r#"metadata["a"]:"x\"y" AND metadata['b']:'2'"#),
            Some(vec![("a".into(), "x\"y".into()), ("b".into(), "2".into())])
        );
        assert_eq!(parse_search_query("status:'succeeded'"), None);
        assert_eq!(parse_search_query("metadata['a']:'x' trailing"), None);
    }
}
