//! `/_sandbox/...`: inspection and control for tests and demos (JSON, no auth:
//! the sandbox only listens on 127.0.0.1).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::app::App;
use crate::config::{DeliveryFaults, Format, RefundBehaviour, WebhookTarget};
use crate::reports::ReportRequest;
use crate::util::lock;

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/health", get(|| async { Json(json!({ "ok": true })) }))
        .route("/charges", get(all_counts))
        .route("/charges/{reference}", get(count_for))
        .route("/refund_counts/{reference}", get(refund_count_for))
        .route("/payments", get(payments))
        .route("/payments/{id}", get(payment))
        .route("/payments/{id}/complete_action", post(complete_action))
        .route("/3ds/{id}", get(three_ds))
        .route("/refunds", get(refunds))
        .route("/deliveries", get(deliveries))
        .route("/queries", get(queries))
        .route("/webhook_targets", get(targets))
        .route(
            "/webhook_targets/{connector}",
            put(set_target).delete(remove_target),
        )
        .route("/delivery_faults", get(faults).put(set_faults))
        .route(
            "/refund_behaviour",
            get(refund_behaviour).put(set_refund_behaviour),
        )
        .route("/account_declines", get(account_declines))
        .route(
            "/account_declines/{account}",
            put(set_account_decline).delete(clear_account_decline),
        )
        .route("/account_faults", get(account_faults))
        .route(
            "/account_faults/{account}",
            put(set_account_faults).delete(clear_account_faults),
        )
        .route("/settle_pending", post(settle_pending))
        .route("/settlement_reports/{format}", post(settlement_report))
        .route("/wait_idle", post(wait_idle))
}

fn not_found(what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": format!("no such {what}") })),
    )
        .into_response()
}

async fn all_counts(State(app): State<Arc<App>>) -> Response {
    Json(lock(&app.ledger).counts()).into_response()
}

async fn count_for(State(app): State<Arc<App>>, Path(reference): Path<String>) -> Response {
    let count = lock(&app.ledger).count_for(&reference);
    Json(json!({ "reference": reference, "payments": count.payments, "charges": count.charges }))
        .into_response()
}

async fn refund_count_for(State(app): State<Arc<App>>, Path(reference): Path<String>) -> Response {
    let refunds = lock(&app.ledger).refund_count_for(&reference);
    Json(json!({ "reference": reference, "refunds": refunds })).into_response()
}

async fn payments(State(app): State<Arc<App>>) -> Response {
    Json(lock(&app.ledger).all_payments()).into_response()
}

async fn payment(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.find_payment(&id) {
        Some(p) => Json(p).into_response(),
        None => not_found("payment"),
    }
}

#[derive(Deserialize)]
struct CompleteAction {
    authenticated: bool,
}

async fn complete_action(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(body): Json<CompleteAction>,
) -> Response {
    match app.complete_action(&id, body.authenticated) {
        Some(p) => Json(p).into_response(),
        None => not_found("payment waiting for customer action"),
    }
}

#[derive(Deserialize)]
struct ThreeDsQuery {
    outcome: Option<String>,
}

/// The page `next_action.redirect_to_url.url` / Adyen `action.url` points at:
/// visiting it authenticates (`?outcome=fail` fails) and returns the customer to
/// the merchant's return URL when there is one.
async fn three_ds(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(q): Query<ThreeDsQuery>,
) -> Response {
    let authenticated = q.outcome.as_deref() != Some("fail");
    let Some(p) = app.complete_action(&id, authenticated) else {
        return not_found("payment waiting for customer action");
    };
    match &p.return_url {
        Some(url) => {
            let sep = if url.contains('?') { '&' } else { '?' };
            let param = match p.format {
                crate::config::Format::Stripe => "payment_intent",
                crate::config::Format::Adyen => "pspReference",
            };
            Redirect::to(&format!("{url}{sep}{param}={}", p.id)).into_response()
        }
        None => Json(p).into_response(),
    }
}

async fn refunds(State(app): State<Arc<App>>) -> Response {
    Json(lock(&app.ledger).all_refunds()).into_response()
}

async fn queries(State(app): State<Arc<App>>) -> Response {
    Json(lock(&app.queries).clone()).into_response()
}

async fn deliveries(State(app): State<Arc<App>>) -> Response {
    Json(app.hub.records()).into_response()
}

/// A target as the control API shows it: never the secret.
#[derive(Serialize)]
struct TargetView {
    url: String,
    format: crate::config::Format,
    api_key: Option<String>,
    secret_set: bool,
}

async fn targets(State(app): State<Arc<App>>) -> Response {
    let views: BTreeMap<String, TargetView> = app
        .hub
        .targets()
        .into_iter()
        .map(|(name, t)| {
            (
                name,
                TargetView {
                    url: t.url,
                    format: t.format,
                    api_key: t.api_key,
                    secret_set: !t.secret.is_empty(),
                },
            )
        })
        .collect();
    Json(views).into_response()
}

async fn set_target(
    State(app): State<Arc<App>>,
    Path(connector): Path<String>,
    Json(target): Json<WebhookTarget>,
) -> Response {
    app.hub.set_target(connector, target);
    StatusCode::NO_CONTENT.into_response()
}

async fn remove_target(State(app): State<Arc<App>>, Path(connector): Path<String>) -> Response {
    if app.hub.remove_target(&connector) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        not_found("webhook target")
    }
}

async fn faults(State(app): State<Arc<App>>) -> Response {
    Json(app.hub.faults()).into_response()
}

async fn set_faults(State(app): State<Arc<App>>, Json(faults): Json<DeliveryFaults>) -> Response {
    app.hub.set_faults(faults);
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Serialize, Deserialize)]
struct DeclineBody {
    decline: crate::faults::Decline,
}

async fn account_declines(State(app): State<Arc<App>>) -> Response {
    Json(lock(&app.account_declines).clone()).into_response()
}

/// Every otherwise approved new payment at this account (Stripe-format API
/// key, Adyen-format merchant account) is declined with this decline.
async fn set_account_decline(
    State(app): State<Arc<App>>,
    Path(account): Path<String>,
    Json(body): Json<DeclineBody>,
) -> Response {
    lock(&app.account_declines).insert(account, body.decline);
    StatusCode::NO_CONTENT.into_response()
}

async fn clear_account_decline(
    State(app): State<Arc<App>>,
    Path(account): Path<String>,
) -> Response {
    lock(&app.account_declines).remove(&account);
    StatusCode::NO_CONTENT.into_response()
}

async fn account_faults(State(app): State<Arc<App>>) -> Response {
    Json(lock(&app.account_faults).clone()).into_response()
}

/// Latency, every Nth call a 500, or a hang for every call at this account
/// (`crate::account_faults`); the account's call count starts again.
async fn set_account_faults(
    State(app): State<Arc<App>>,
    Path(account): Path<String>,
    Json(faults): Json<crate::account_faults::AccountFaults>,
) -> Response {
    let state = crate::account_faults::AccountFaultState {
        faults,
        ..Default::default()
    };
    lock(&app.account_faults).insert(account, state);
    StatusCode::NO_CONTENT.into_response()
}

async fn clear_account_faults(
    State(app): State<Arc<App>>,
    Path(account): Path<String>,
) -> Response {
    lock(&app.account_faults).remove(&account);
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Serialize, Deserialize)]
struct BehaviourBody {
    behaviour: RefundBehaviour,
}

async fn refund_behaviour(State(app): State<Arc<App>>) -> Response {
    let behaviour = lock(&app.ledger).refund_behaviour;
    Json(BehaviourBody { behaviour }).into_response()
}

async fn set_refund_behaviour(
    State(app): State<Arc<App>>,
    Json(body): Json<BehaviourBody>,
) -> Response {
    lock(&app.ledger).refund_behaviour = body.behaviour;
    StatusCode::NO_CONTENT.into_response()
}

/// The report as `text/csv`; the body is a [`ReportRequest`].
async fn settlement_report(
    State(app): State<Arc<App>>,
    Path(format): Path<Format>,
    Json(request): Json<ReportRequest>,
) -> Response {
    let csv = app.settlement_report(format, &request);
    ([(axum::http::header::CONTENT_TYPE, "text/csv")], csv).into_response()
}

async fn settle_pending(State(app): State<Arc<App>>) -> Response {
    Json(json!({ "settled": app.settle_all_pending() })).into_response()
}

#[derive(Deserialize)]
struct WaitIdle {
    timeout_ms: Option<u64>,
}

async fn wait_idle(State(app): State<Arc<App>>, Query(q): Query<WaitIdle>) -> Response {
    let timeout = Duration::from_millis(q.timeout_ms.unwrap_or(5_000).min(60_000));
    Json(json!({ "idle": app.hub.wait_idle(timeout).await })).into_response()
}
