//! A connector account's health under `/admin` (issue 13): its breakers,
//! an operator's pause for new attempts, and the account's history. Pausing
//! needs an operator's own key besides the admin token, so the history
//! names who paused and why. A pause never stops queries or webhooks: the
//! account's open attempts keep converging.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use sluice_orchestrator::{AccountHealth, AdapterHealth, BreakerHealth};
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath};
use crate::payments::json;
use crate::requests as req;
use crate::review::AuthedOperator;
use crate::MerchantApiState;

const MAX_REASON_CHARS: usize = 500;

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseAccountRequest {
    /// Why, for the account's history (e.g. the PSP's incident number).
    #[schema(schema_with = reason_schema)]
    pub reason: String,
}

fn reason_schema() -> utoipa::openapi::Object {
    crate::openapi::fields::required_text(MAX_REASON_CHARS, false)
}

/// One breaker as the admin API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BreakerView {
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// Why it opened (absent while closed).
    pub reason: Option<String>,
    /// When it opened or became half-open.
    pub since_ms: Option<i64>,
    /// An open breaker lets a probe through from then on.
    pub until_ms: Option<i64>,
    /// PSP calls and unanswered calls in the rolling window.
    pub window_calls: usize,
    pub window_unanswered: usize,
}

impl From<&BreakerHealth> for BreakerView {
    fn from(h: &BreakerHealth) -> Self {
        use sluice_core::BreakerState as S;
        let (reason, since_ms, until_ms) = match &h.state {
            S::Closed => (None, None, None),
            S::Open {
                since_ms,
                until_ms,
                reason,
            } => (Some(reason.clone()), Some(*since_ms), Some(*until_ms)),
            S::HalfOpen {
                since_ms, reason, ..
            } => (Some(reason.clone()), Some(*since_ms), None),
        };
        BreakerView {
            state: h.state.name().to_owned(),
            reason,
            since_ms,
            until_ms,
            window_calls: h.window_calls,
            window_unanswered: h.window_unanswered,
        }
    }
}

/// The adapter across its connector accounts (those this gateway process
/// has called): failing when at least 3 of them, and at least half, have
/// their breakers open for lack of answers (refused credentials are an
/// account's own problem and do not count).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AdapterHealthView {
    pub accounts: usize,
    pub open_accounts: usize,
    /// Why the adapter takes no new attempts on any account, if it does not.
    pub refusal: Option<String>,
}

impl From<&AdapterHealth> for AdapterHealthView {
    fn from(h: &AdapterHealth) -> Self {
        AdapterHealthView {
            accounts: h.accounts,
            open_accounts: h.open_accounts,
            refusal: h.refusal.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PauseView {
    pub reason: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AccountEventView {
    /// `paused`, `resumed` or `breaker`.
    pub kind: String,
    pub detail: String,
    /// `operator:<name>`, or `breaker`.
    pub actor: String,
    pub at_ms: i64,
}

/// A connector account's health.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AccountHealthView {
    /// Always `connector_account_health`.
    pub object: String,
    pub connector_account: String,
    pub merchant_id: String,
    pub adapter: String,
    /// Whether routing gives the account new attempts now.
    pub takes_new_attempts: bool,
    /// Why not, when it does not (paused, a breaker open).
    pub skipped_because: Option<String>,
    pub paused: Option<PauseView>,
    pub breaker: BreakerView,
    pub adapter_health: AdapterHealthView,
    /// Newest first, at most 100.
    pub history: Vec<AccountEventView>,
}

impl From<&AccountHealth> for AccountHealthView {
    fn from(h: &AccountHealth) -> Self {
        AccountHealthView {
            object: "connector_account_health".into(),
            connector_account: h.account.id.clone(),
            merchant_id: h.account.merchant_id.clone(),
            adapter: h.account.adapter.clone(),
            takes_new_attempts: h.refusal.is_none() && h.account.status == "active",
            skipped_because: h.refusal.clone(),
            paused: h.account.paused.as_ref().map(|p| PauseView {
                reason: p.reason.clone(),
                at_ms: p.at_ms,
            }),
            breaker: BreakerView::from(&h.breaker),
            adapter_health: AdapterHealthView::from(&h.adapter),
            history: h
                .history
                .iter()
                .map(|e| AccountEventView {
                    kind: e.kind.clone(),
                    detail: e.detail.clone(),
                    actor: e.actor.clone(),
                    at_ms: e.at_ms,
                })
                .collect(),
        }
    }
}

/// Both path ids, or a 404: anything else cannot exist.
fn ids<'a>(merchant_id: &'a str, account_id: &'a str) -> Result<(&'a str, &'a str), ApiError> {
    if req::looks_like_id(merchant_id) && req::looks_like_id(account_id) {
        Ok((merchant_id, account_id))
    } else {
        Err(ApiError::not_found(
            "resource_missing",
            "no such connector account",
        ))
    }
}

fn actor(operator: &AuthedOperator) -> String {
    format!("operator:{}", operator.0.name)
}

/// A connector account's breakers, pause and history.
#[utoipa::path(
    get, path = "/admin/merchants/{merchant_id}/connector_accounts/{account_id}/health", tag = "admin",
    params(("merchant_id" = String, Path), ("account_id" = String, Path)),
    responses((status = 200, body = AccountHealthView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn account_health(
    State(state): State<MerchantApiState>,
    ApiPath((merchant_id, account_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let (merchant_id, account_id) = ids(&merchant_id, &account_id)?;
    let health = state
        .orchestrator
        .account_health(merchant_id, account_id)
        .await?;
    Ok(json(StatusCode::OK, &AccountHealthView::from(&health)))
}

/// Pause the account for new attempts (again: with the new reason). Its
/// open attempts keep converging through queries and webhooks.
#[utoipa::path(
    post, path = "/admin/merchants/{merchant_id}/connector_accounts/{account_id}/pause", tag = "admin",
    params(("merchant_id" = String, Path), ("account_id" = String, Path)),
    request_body = PauseAccountRequest,
    responses((status = 200, body = AccountHealthView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn pause_account(
    State(state): State<MerchantApiState>,
    operator: AuthedOperator,
    ApiPath((merchant_id, account_id)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<PauseAccountRequest>,
) -> Result<Response, ApiError> {
    let (merchant_id, account_id) = ids(&merchant_id, &account_id)?;
    let reason = req::required_text(&body.reason, "reason", MAX_REASON_CHARS)?;
    let health = state
        .orchestrator
        .pause_account(merchant_id, account_id, &reason, &actor(&operator))
        .await?;
    Ok(json(StatusCode::OK, &AccountHealthView::from(&health)))
}

/// Take new attempts on the account again (nothing changes if it was not paused).
#[utoipa::path(
    post, path = "/admin/merchants/{merchant_id}/connector_accounts/{account_id}/resume", tag = "admin",
    params(("merchant_id" = String, Path), ("account_id" = String, Path)),
    responses((status = 200, body = AccountHealthView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn resume_account(
    State(state): State<MerchantApiState>,
    operator: AuthedOperator,
    ApiPath((merchant_id, account_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let (merchant_id, account_id) = ids(&merchant_id, &account_id)?;
    let health = state
        .orchestrator
        .resume_account(merchant_id, account_id, &actor(&operator))
        .await?;
    Ok(json(StatusCode::OK, &AccountHealthView::from(&health)))
}
