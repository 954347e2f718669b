//! Reconciliation under `/admin` (issue 14): upload a connector account's
//! settlement report for a period, read the run and its differences.
//!
//! The report travels base64-encoded inside a JSON body (the one error shape
//! and the one body parser for every route; a CSV may hold any byte). The
//! same report for the same account and period answers the run recorded the
//! first time (200 instead of 201) and changes nothing.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sluice_orchestrator::reconcile::MAX_REPORT_BYTES;
use sluice_orchestrator::ReconcileRequest;
use sluice_store::reconciliation::MAX_DIFFERENCE_PAGE;
use sluice_store::{DifferenceFilter, ReconciliationRun, StoredDifference};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::payments::json;
use crate::requests as req;
use crate::review::AuthedOperator;
use crate::MerchantApiState;

/// The longest `report_base64` (the decoded cap, base64-inflated).
pub const MAX_REPORT_BASE64_CHARS: usize = MAX_REPORT_BYTES.div_ceil(3) * 4;
/// The body limit of the upload route: the report plus a little JSON.
pub const MAX_UPLOAD_BODY_BYTES: usize = MAX_REPORT_BASE64_CHARS + 4096;
const DEFAULT_PAGE: i64 = 100;
/// The largest page of differences one request reads.
pub const MAX_PAGE: i64 = MAX_DIFFERENCE_PAGE / 2;

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRunRequest {
    /// The connector account (id) whose report it is.
    #[schema(schema_with = crate::openapi::fields::recon_account)]
    pub connector_account: String,
    #[schema(schema_with = crate::openapi::fields::recon_period_start)]
    #[serde(deserialize_with = "req::integer")]
    pub period_start: i64,
    #[schema(schema_with = crate::openapi::fields::recon_period_end)]
    #[serde(deserialize_with = "req::integer")]
    pub period_end: i64,
    #[schema(schema_with = crate::openapi::fields::report_base64)]
    pub report_base64: String,
}

/// One class's share of a run.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClassTotal {
    pub count: i64,
    /// The money at stake, minor units.
    pub amount_minor: i64,
}

/// A reconciliation run.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunView {
    pub id: String,
    /// Always `reconciliation_run`.
    pub object: String,
    pub connector_account: String,
    pub adapter: String,
    pub period_start: i64,
    pub period_end: i64,
    /// `sha256:` and the hex digest of the report's bytes.
    pub report_digest: String,
    pub line_count: i64,
    /// Lines joined to a record of ours that agreed with it.
    pub matched_lines: i64,
    /// Fee, payout and other balance lines (no item of ours).
    pub ignored_lines: i64,
    pub difference_count: i64,
    /// Differences repaired through the door (evidence `reconciliation`).
    pub repaired_count: i64,
    /// Differences sent to the two-person review.
    pub review_count: i64,
    /// Per class: how many differences and the money at stake.
    pub classes: BTreeMap<String, ClassTotal>,
    /// `repairing` or `completed`.
    pub status: String,
    pub created_at: i64,
    pub completed_at: Option<i64>,
}

impl From<&ReconciliationRun> for RunView {
    fn from(run: &ReconciliationRun) -> Self {
        let classes = run
            .class_totals
            .as_object()
            .into_iter()
            .flatten()
            .map(|(class, total)| {
                let number = |key: &str| total.get(key).and_then(|v| v.as_i64()).unwrap_or(0);
                let total = ClassTotal {
                    count: number("count"),
                    amount_minor: number("amount_minor"),
                };
                (class.clone(), total)
            })
            .collect();
        RunView {
            id: run.id.clone(),
            object: "reconciliation_run".into(),
            connector_account: run.connector_account_id.clone(),
            adapter: run.adapter.clone(),
            period_start: run.period_start,
            period_end: run.period_end,
            report_digest: run.report_digest.clone(),
            line_count: run.line_count,
            matched_lines: run.matched_lines,
            ignored_lines: run.ignored_lines,
            difference_count: run.difference_count,
            repaired_count: run.repaired_count,
            review_count: run.review_count,
            classes,
            status: run.status.as_str().into(),
            created_at: run.created_at,
            completed_at: run.completed_at,
        }
    }
}

/// One difference, with both sides' records.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DifferenceView {
    pub id: String,
    /// Always `reconciliation_difference`.
    pub object: String,
    /// Its place in the run; the paging cursor.
    pub seq: i64,
    pub class: String,
    pub attempt_reference: Option<String>,
    pub action_reference: Option<String>,
    pub psp_reference: Option<String>,
    /// The payment of ours it is about, if there is one.
    pub payment_id: Option<String>,
    pub amount_minor: i64,
    pub currency: String,
    /// Our record (states, references, amounts), `null` when we have none.
    #[schema(value_type = Object)]
    pub ours: serde_json::Value,
    /// The report's lines, as the adapter normalised them.
    #[schema(value_type = Vec<Object>)]
    pub psp: serde_json::Value,
    /// The one safe repair, if the difference has one.
    #[schema(value_type = Option<Object>)]
    pub repair: Option<serde_json::Value>,
    /// `open`, `repaired` or `in_review`.
    pub resolution: String,
    pub resolution_detail: Option<String>,
    /// The history row of the door's decision (the repair or the review flag).
    pub history_id: Option<i64>,
    pub created_at: i64,
    pub resolved_at: Option<i64>,
}

impl From<&StoredDifference> for DifferenceView {
    fn from(d: &StoredDifference) -> Self {
        DifferenceView {
            id: d.id.clone(),
            object: "reconciliation_difference".into(),
            seq: d.seq,
            class: d.class.clone(),
            attempt_reference: d.attempt_reference.clone(),
            action_reference: d.action_reference.clone(),
            psp_reference: d.psp_reference.clone(),
            payment_id: d.payment_id.clone(),
            amount_minor: d.amount_minor,
            currency: d.currency.clone(),
            ours: d.ours.clone(),
            psp: d.psp.clone(),
            repair: d.repair.clone(),
            resolution: d.resolution.as_str().into(),
            resolution_detail: d.resolution_detail.clone(),
            history_id: d.history_id,
            created_at: d.created_at,
            resolved_at: d.resolved_at,
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DifferenceList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<DifferenceView>,
    pub has_more: bool,
    /// Pass as `starting_after` for the next page.
    pub next_cursor: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DifferenceQuery {
    #[param(schema_with = crate::openapi::fields::recon_class)]
    pub class: Option<String>,
    #[param(schema_with = crate::openapi::fields::recon_resolved)]
    pub resolved: Option<bool>,
    #[param(schema_with = crate::openapi::fields::recon_cursor)]
    pub starting_after: Option<i64>,
    #[param(schema_with = crate::openapi::fields::recon_limit)]
    pub limit: Option<i64>,
}

/// Reconcile a connector account's settlement report for a period: repair
/// what the report proves and our records hold as open, send the rest to
/// review. 201 with the new run; 200 with the run already recorded for the
/// same account, period and report (nothing changes then).
#[utoipa::path(
    post, path = "/admin/reconciliation/runs", tag = "admin",
    request_body = CreateRunRequest,
    responses(
        (status = 201, body = RunView, description = "A new run"),
        (status = 200, body = RunView, description = "The run recorded for the same report; nothing changed"),
        (status = 400, body = ErrorBody, description = "Bad period or report (not base64, too large, unreadable by the adapter); nothing changed"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("admin_token" = []))
)]
pub async fn create_run(
    State(state): State<MerchantApiState>,
    ApiJson(body): ApiJson<CreateRunRequest>,
) -> Result<Response, ApiError> {
    // The account first: a report for no account of ours is a 404, whatever
    // else is wrong with the request.
    let missing = || {
        ApiError::missing(
            "resource_missing",
            "connector_account",
            "no such connector account",
        )
    };
    if !req::looks_like_id(&body.connector_account) {
        return Err(missing());
    }
    match state
        .store
        .get_connector_account(&body.connector_account, None)
        .await
    {
        Ok(_) => {}
        Err(sluice_store::StoreError::NotFound { .. }) => return Err(missing()),
        Err(error) => return Err(error.into()),
    }
    if body.report_base64.len() > MAX_REPORT_BASE64_CHARS {
        return Err(ApiError::invalid(
            "parameter_invalid",
            "report_base64",
            "the report is too large",
        ));
    }
    let report = base64::engine::general_purpose::STANDARD
        .decode(body.report_base64.as_bytes())
        .map_err(|_| {
            ApiError::invalid("parameter_invalid", "report_base64", "not standard base64")
        })?;
    let request = ReconcileRequest {
        connector_account_id: body.connector_account,
        period_start: body.period_start,
        period_end: body.period_end,
        report,
        actor: "admin".into(),
    };
    let done = state.orchestrator.reconcile(request).await?;
    let status = if done.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json(status, &RunView::from(&done.run)))
}

/// A run: its inputs, counts and totals per class.
#[utoipa::path(
    get, path = "/admin/reconciliation/runs/{run_id}", tag = "admin",
    params(("run_id" = String, Path)),
    responses((status = 200, body = RunView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn get_run(
    State(state): State<MerchantApiState>,
    ApiPath(run_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let run = find_run(&state, &run_id).await?;
    Ok(json(StatusCode::OK, &RunView::from(&run)))
}

/// A run's differences in their recorded order, one bounded page at a time.
#[utoipa::path(
    get, path = "/admin/reconciliation/runs/{run_id}/differences", tag = "admin",
    params(("run_id" = String, Path), DifferenceQuery),
    responses(
        (status = 200, body = DifferenceList),
        (status = 400, body = ErrorBody, description = "Invalid filter or page; nothing was read"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("admin_token" = []))
)]
pub async fn list_differences(
    State(state): State<MerchantApiState>,
    ApiPath(run_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<DifferenceQuery>,
) -> Result<Response, ApiError> {
    let filter = filter_of(&query)?;
    let run = find_run(&state, &run_id).await?;
    // One more than asked, to know whether another page follows.
    let wanted = filter.limit;
    let probe = DifferenceFilter {
        limit: wanted + 1,
        ..filter
    };
    let mut rows = state
        .store
        .reconciliation_differences(&run.id, &probe)
        .await?;
    let has_more = rows.len() as i64 > wanted;
    rows.truncate(wanted as usize);
    let next_cursor = rows.last().map(|d| d.seq).filter(|_| has_more);
    let list = DifferenceList {
        object: "list".into(),
        data: rows.iter().map(DifferenceView::from).collect(),
        has_more,
        next_cursor,
    };
    Ok(json(StatusCode::OK, &list))
}

/// The longest note an operator closes a difference with.
pub const MAX_NOTE_CHARS: usize = 1000;

/// `POST /admin/reconciliation/differences/{difference_id}/close`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseDifferenceRequest {
    /// What the operator found and did (1 to 1000 characters), recorded with their
    /// name. A repair the operator decided goes through the two-person review.
    #[schema(min_length = 1, max_length = 1000)]
    pub note: String,
}

/// An operator closes a difference that went to review: it stops counting as
/// unresolved. No payment changes here.
#[utoipa::path(
    post, path = "/admin/reconciliation/differences/{difference_id}/close", tag = "admin",
    params(("difference_id" = String, Path)),
    request_body = CloseDifferenceRequest,
    responses(
        (status = 200, body = DifferenceView),
        (status = 400, body = ErrorBody, description = "No note, or one over 1000 characters"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "The difference is not in review (repaired, open, or closed already)"),
    ),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn close_difference(
    State(state): State<MerchantApiState>,
    AuthedOperator(operator): AuthedOperator,
    ApiPath(difference_id): ApiPath<String>,
    ApiJson(body): ApiJson<CloseDifferenceRequest>,
) -> Result<Response, ApiError> {
    let chars = body.note.chars().count();
    if !(1..=MAX_NOTE_CHARS).contains(&chars) {
        let message = format!("note must be 1 to {MAX_NOTE_CHARS} characters");
        return Err(ApiError::invalid("parameter_invalid", "note", message));
    }
    if !req::looks_like_id(&difference_id) {
        return Err(ApiError::not_found(
            "resource_missing",
            "no such reconciliation difference",
        ));
    }
    let closed = state
        .store
        .close_reconciliation_difference(&difference_id, &operator.name, &body.note)
        .await?;
    tracing::info!(difference_id = %closed.id, operator = %operator.name,
        "reconciliation difference closed by an operator");
    Ok(json(StatusCode::OK, &DifferenceView::from(&closed)))
}

fn filter_of(query: &DifferenceQuery) -> Result<DifferenceFilter, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        let message = format!("limit must be between 1 and {MAX_PAGE}");
        return Err(ApiError::invalid("parameter_invalid", "limit", message));
    }
    if query.starting_after.is_some_and(|after| after < 0) {
        return Err(ApiError::invalid(
            "parameter_invalid",
            "starting_after",
            "not a cursor",
        ));
    }
    if let Some(class) = &query.class {
        if sluice_core::DifferenceClass::parse(class).is_none() {
            return Err(ApiError::invalid(
                "parameter_invalid",
                "class",
                "not a difference class",
            ));
        }
    }
    Ok(DifferenceFilter {
        class: query.class.clone(),
        resolved: query.resolved,
        after_seq: query.starting_after,
        limit,
    })
}

async fn find_run(state: &MerchantApiState, run_id: &str) -> Result<ReconciliationRun, ApiError> {
    let missing = || ApiError::not_found("resource_missing", "no such reconciliation run");
    if !req::looks_like_id(run_id) {
        return Err(missing());
    }
    state
        .store
        .reconciliation_run(run_id)
        .await?
        .ok_or_else(missing)
}
