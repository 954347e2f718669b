//! An in-process fake PSP over real HTTP (axum on 127.0.0.1:0) speaking the
//! JSON wire format of the `test-well-behaved` adapter, shared by the
//! orchestrator, merchant-api and scanner tests. Tests tell it how to
//! behave per route: succeed, decline, time out after committing, 5xx, answer
//! slowly, or answer garbage. It honours `Idempotency-Key` (the same key gives
//! the same object and never a second charge), counts what it committed and
//! the queries per reference (with overlaps, for the multi-instance tests).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// Which kind of request a behaviour applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Route {
    /// POST /v1/payments (authorize or sale)
    Payments,
    /// POST /v1/payments/{id}/capture
    Captures,
    /// POST /v1/payments/{id}/cancel
    Cancels,
    /// POST /v1/refunds
    Refunds,
    /// GET /v1/payments..., GET /v1/refunds...
    Queries,
}

/// How the fake answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Commit and answer at once.
    Succeed,
    /// A definitive decline (402 with a decline code); nothing committed.
    Decline,
    /// Commit, then hold the answer for this long (longer than the host's budget).
    TimeoutAfterCommit(Duration),
    /// 503 without committing anything.
    ServerError,
    /// Commit, then answer 502: the PSP did it but said "error".
    ServerErrorAfterCommit,
    /// Commit and answer normally after this delay.
    Slow(Duration),
    /// Commit, then answer 200 with a body that is not JSON.
    Garbage,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakePayment {
    pub id: String,
    pub reference: String,
    pub amount: i64,
    pub currency: String,
    /// `authorized`, `succeeded` or `canceled`.
    pub status: String,
    pub captured: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeRefund {
    pub id: String,
    pub payment: String,
    pub reference: String,
    pub amount: i64,
    pub currency: String,
}

#[derive(Default)]
struct Ledger {
    modes: BTreeMap<Route, Mode>,
    payments: Vec<FakePayment>,
    refunds: Vec<FakeRefund>,
    captures: Vec<(String, String, i64)>,
    /// Idempotency-Key → (status, body) of the first answer.
    replies: BTreeMap<String, (u16, Value)>,
    requests: BTreeMap<&'static str, u64>,
    /// Queries per reference (payment or refund reference).
    queries: BTreeMap<String, u64>,
    /// Queries per reference being answered right now.
    in_flight: BTreeMap<String, u64>,
    /// Times a query arrived while another of the same reference was in flight.
    overlaps: u64,
    next_id: u64,
}

impl Ledger {
    fn mode(&self, route: Route) -> Mode {
        self.modes.get(&route).copied().unwrap_or(Mode::Succeed)
    }

    fn mint(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}_{}", self.next_id)
    }
}

/// The ledger, even if a test thread panicked while holding it (the data is
/// still what the fake committed; a poisoned lock must not hide it).
fn lock(ledger: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    ledger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Clone)]
pub struct FakePsp {
    ledger: Arc<Mutex<Ledger>>,
    pub addr: SocketAddr,
}

pub const API_KEY: &str = "sk_test_fake";

impl FakePsp {
    pub async fn start() -> FakePsp {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let app = Router::new()
            .route("/psp/v1/payments", post(create_payment).get(find_payment))
            .route("/psp/v1/payments/{id}", get(get_payment))
            .route("/psp/v1/payments/{id}/capture", post(capture))
            .route("/psp/v1/payments/{id}/cancel", post(cancel))
            .route("/psp/v1/refunds", post(create_refund).get(find_refund))
            .route("/psp/v1/refunds/{id}", get(get_refund))
            .with_state(ledger.clone());
        // Test support: without a loopback port there is no test to run, so
        // failing loudly here is the right outcome.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake PSP");
        let addr = listener.local_addr().expect("fake PSP address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakePsp { ledger, addr }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/psp", self.addr)
    }

    pub fn set_mode(&self, route: Route, mode: Mode) {
        lock(&self.ledger).modes.insert(route, mode);
    }

    /// Change what the fake reports about a payment (e.g. "processing").
    pub fn set_status(&self, payment_id: &str, status: &str) {
        let mut l = lock(&self.ledger);
        if let Some(p) = l.payments.iter_mut().find(|p| p.id == payment_id) {
            p.status = status.to_owned();
        }
    }

    /// Payments the fake committed (charges or authorizations), in order.
    pub fn payments(&self) -> Vec<FakePayment> {
        lock(&self.ledger).payments.clone()
    }

    pub fn payments_for(&self, reference: &str) -> Vec<FakePayment> {
        self.payments()
            .into_iter()
            .filter(|p| p.reference == reference)
            .collect()
    }

    pub fn refunds(&self) -> Vec<FakeRefund> {
        lock(&self.ledger).refunds.clone()
    }

    /// (payment id, capture reference, amount) of every committed capture.
    pub fn captures(&self) -> Vec<(String, String, i64)> {
        lock(&self.ledger).captures.clone()
    }

    /// Queries the fake answered (or is answering) for a reference.
    pub fn queries_for(&self, reference: &str) -> u64 {
        lock(&self.ledger)
            .queries
            .get(reference)
            .copied()
            .unwrap_or(0)
    }

    /// Every reference's query count.
    pub fn query_counts(&self) -> BTreeMap<String, u64> {
        lock(&self.ledger).queries.clone()
    }

    /// Queries that arrived while another query of the same reference was in flight.
    pub fn overlapping_queries(&self) -> u64 {
        lock(&self.ledger).overlaps
    }

    /// A payment the PSP committed from a request whose sender died before
    /// it could record the answer.
    pub fn seed_payment(
        &self,
        reference: &str,
        amount: i64,
        currency: &str,
        status: &str,
    ) -> String {
        let mut l = lock(&self.ledger);
        let id = l.mint("fp");
        let captured = if status == "succeeded" { amount } else { 0 };
        l.payments.push(FakePayment {
            id: id.clone(),
            reference: reference.to_owned(),
            amount,
            currency: currency.to_owned(),
            status: status.to_owned(),
            captured,
        });
        id
    }

    /// A refund the PSP committed from a request whose sender died before
    /// it could record anything but "sent".
    pub fn seed_refund(&self, payment_id: &str, reference: &str, amount: i64, currency: &str) {
        let mut l = lock(&self.ledger);
        let id = l.mint("fr");
        l.refunds.push(FakeRefund {
            id,
            payment: payment_id.to_owned(),
            reference: reference.to_owned(),
            amount,
            currency: currency.to_owned(),
        });
    }

    /// How many requests hit a route (`create_payment`, `query_payment`, ...).
    pub fn requests(&self, name: &str) -> u64 {
        lock(&self.ledger).requests.get(name).copied().unwrap_or(0)
    }
}

type Shared = Arc<Mutex<Ledger>>;

fn count(ledger: &Shared, name: &'static str) {
    *lock(ledger).requests.entry(name).or_default() += 1;
}

fn authorized(headers: &HeaderMap) -> bool {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {API_KEY}"))
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": {"code": "invalid_api_key", "message": "bad key"}})),
    )
        .into_response()
}

fn idempotency_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Runs a mutation under its route's mode: commit (via `commit`) when the mode
/// commits, remember the answer under the idempotency key, then answer as the
/// mode says. A replayed key returns the first committed answer and never
/// commits again.
async fn mutate(
    ledger: Shared,
    route: Route,
    headers: HeaderMap,
    commit: impl FnOnce(&mut Ledger) -> (u16, Value),
) -> Response {
    if !authorized(&headers) {
        return unauthorized();
    }
    let key = idempotency_key(&headers);
    let (mode, reply) = {
        let mut l = lock(&ledger);
        let mode = l.mode(route);
        if let Some(reply) = key.as_ref().and_then(|k| l.replies.get(k).cloned()) {
            // A replay answers like the first time, under today's mode for
            // delivery faults only.
            (replay_mode(mode), Some(reply))
        } else {
            let reply = match mode {
                Mode::Decline => Some((
                    402,
                    json!({"status": "failed", "decline_code": "card_declined"}),
                )),
                Mode::ServerError => None,
                _ => Some(commit(&mut l)),
            };
            if let (Some(key), Some(reply)) = (&key, &reply) {
                l.replies.insert(key.clone(), reply.clone());
            }
            (mode, reply)
        }
    };
    deliver(mode, reply).await
}

fn replay_mode(mode: Mode) -> Mode {
    match mode {
        Mode::Decline | Mode::ServerError => Mode::Succeed,
        other => other,
    }
}

async fn deliver(mode: Mode, reply: Option<(u16, Value)>) -> Response {
    match (mode, reply) {
        (Mode::ServerError, _) | (_, None) => {
            (StatusCode::SERVICE_UNAVAILABLE, "upstream unavailable").into_response()
        }
        (Mode::ServerErrorAfterCommit, _) => {
            (StatusCode::BAD_GATEWAY, "bad gateway").into_response()
        }
        (Mode::TimeoutAfterCommit(hold), Some(reply)) | (Mode::Slow(hold), Some(reply)) => {
            tokio::time::sleep(hold).await;
            json_reply(reply)
        }
        (Mode::Garbage, _) => (StatusCode::OK, "<html>upstream proxy error</html>").into_response(),
        (Mode::Succeed | Mode::Decline, Some(reply)) => json_reply(reply),
    }
}

fn json_reply((status, body): (u16, Value)) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(body)).into_response()
}

fn payment_json(p: &FakePayment) -> Value {
    json!({
        "id": p.id, "status": p.status, "amount": p.amount, "currency": p.currency,
        "reference": p.reference,
    })
}

fn refund_json(r: &FakeRefund) -> Value {
    json!({
        "id": r.id, "status": "succeeded", "amount": r.amount, "currency": r.currency,
        "payment": r.payment, "reference": r.reference,
    })
}

fn not_found() -> (u16, Value) {
    (
        404,
        json!({"error": {"code": "not_found", "message": "no such object"}}),
    )
}

async fn create_payment(
    State(ledger): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    count(&ledger, "create_payment");
    let reference = body["reference"].as_str().unwrap_or_default().to_owned();
    let amount = body["amount"].as_i64().unwrap_or_default();
    let currency = body["currency"].as_str().unwrap_or_default().to_owned();
    let manual = body["capture"].as_str() == Some("manual");
    mutate(ledger, Route::Payments, headers, move |l| {
        let id = l.mint("fp");
        let payment = FakePayment {
            id,
            reference,
            amount,
            currency,
            status: if manual { "authorized" } else { "succeeded" }.into(),
            captured: if manual { 0 } else { amount },
        };
        let reply = (200, payment_json(&payment));
        l.payments.push(payment);
        reply
    })
    .await
}

async fn capture(
    State(ledger): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    count(&ledger, "capture");
    let reference = body["reference"].as_str().unwrap_or_default().to_owned();
    let amount = body["amount"].as_i64().unwrap_or_default();
    mutate(ledger, Route::Captures, headers, move |l| {
        let capture_id = l.mint("fc");
        let Some(payment) = l.payments.iter_mut().find(|p| p.id == id) else {
            return not_found();
        };
        if payment.status != "authorized" && payment.status != "succeeded"
            || payment.captured + amount > payment.amount
        {
            return (
                402,
                json!({"status": "failed", "decline_code": "capture_refused"}),
            );
        }
        payment.captured += amount;
        payment.status = "succeeded".into();
        let currency = payment.currency.clone();
        l.captures.push((id.clone(), reference.clone(), amount));
        (
            200,
            json!({"id": capture_id, "status": "succeeded", "amount": amount,
                   "currency": currency, "payment": id, "reference": reference}),
        )
    })
    .await
}

async fn cancel(
    State(ledger): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    count(&ledger, "cancel");
    mutate(ledger, Route::Cancels, headers, move |l| {
        let Some(payment) = l.payments.iter_mut().find(|p| p.id == id) else {
            return not_found();
        };
        // Like Stripe: held funds, or a customer step not completed yet.
        if payment.status != "authorized" && payment.status != "requires_action" {
            return (
                402,
                json!({"status": "failed", "decline_code": "not_cancelable"}),
            );
        }
        payment.status = "canceled".into();
        (200, payment_json(payment))
    })
    .await
}

async fn create_refund(
    State(ledger): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    count(&ledger, "create_refund");
    let payment_id = body["payment"].as_str().unwrap_or_default().to_owned();
    let reference = body["reference"].as_str().unwrap_or_default().to_owned();
    let amount = body["amount"].as_i64().unwrap_or_default();
    mutate(ledger, Route::Refunds, headers, move |l| {
        let refunded: i64 = l
            .refunds
            .iter()
            .filter(|r| r.payment == payment_id)
            .map(|r| r.amount)
            .sum();
        let Some(payment) = l.payments.iter().find(|p| p.id == payment_id) else {
            return not_found();
        };
        if refunded + amount > payment.captured {
            return (
                402,
                json!({"status": "failed", "decline_code": "amount_too_large"}),
            );
        }
        let currency = payment.currency.clone();
        let refund = FakeRefund {
            id: l.mint("fr"),
            payment: payment_id.clone(),
            reference,
            amount,
            currency,
        };
        let reply = (200, refund_json(&refund));
        l.refunds.push(refund);
        reply
    })
    .await
}

/// Queries run under the `Queries` mode, but never commit anything.
/// `reference` names what is queried, for the per-reference counts.
async fn query(
    ledger: Shared,
    reference: impl FnOnce(&Ledger) -> String,
    answer: impl FnOnce(&Ledger) -> (u16, Value),
) -> Response {
    let (mode, reply, key) = {
        let mut l = lock(&ledger);
        let key = reference(&l);
        *l.queries.entry(key.clone()).or_default() += 1;
        let in_flight = l.in_flight.entry(key.clone()).or_default();
        *in_flight += 1;
        if *in_flight > 1 {
            l.overlaps += 1;
        }
        (l.mode(Route::Queries), answer(&l), key)
    };
    let mode = match mode {
        Mode::Decline => Mode::Succeed,
        other => other,
    };
    let response = deliver(mode, Some(reply)).await;
    if let Some(n) = lock(&ledger).in_flight.get_mut(&key) {
        *n -= 1;
    }
    response
}

async fn get_payment(State(ledger): State<Shared>, Path(id): Path<String>) -> Response {
    count(&ledger, "query_payment");
    let by_id = id.clone();
    let reference = move |l: &Ledger| {
        l.payments
            .iter()
            .find(|p| p.id == by_id)
            .map(|p| p.reference.clone())
            .unwrap_or(by_id)
    };
    query(ledger, reference, move |l| {
        l.payments
            .iter()
            .find(|p| p.id == id)
            .map(|p| (200, payment_json(p)))
            .unwrap_or_else(not_found)
    })
    .await
}

async fn find_payment(
    State(ledger): State<Shared>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Response {
    count(&ledger, "query_payment");
    let reference = params.get("reference").cloned().unwrap_or_default();
    let key = reference.clone();
    query(
        ledger,
        move |_| key,
        move |l| {
            l.payments
                .iter()
                .find(|p| p.reference == reference)
                .map(|p| (200, payment_json(p)))
                .unwrap_or_else(not_found)
        },
    )
    .await
}

async fn get_refund(State(ledger): State<Shared>, Path(id): Path<String>) -> Response {
    count(&ledger, "query_refund");
    let by_id = id.clone();
    let reference = move |l: &Ledger| {
        l.refunds
            .iter()
            .find(|r| r.id == by_id)
            .map(|r| r.reference.clone())
            .unwrap_or(by_id)
    };
    query(ledger, reference, move |l| {
        l.refunds
            .iter()
            .find(|r| r.id == id)
            .map(|r| (200, refund_json(r)))
            .unwrap_or_else(not_found)
    })
    .await
}

async fn find_refund(
    State(ledger): State<Shared>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Response {
    count(&ledger, "query_refund");
    let reference = params.get("reference").cloned().unwrap_or_default();
    let key = reference.clone();
    query(
        ledger,
        move |_| key,
        move |l| {
            l.refunds
                .iter()
                .find(|r| r.reference == reference)
                .map(|r| (200, refund_json(r)))
                .unwrap_or_else(not_found)
        },
    )
    .await
}
