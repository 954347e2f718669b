//! Staged adapter releases through the admin API (issue 15): a shadow version that
//! repeats the active one's work and is compared with it, and a canary version that
//! takes a share of the new attempts and is stopped automatically when it does worse.
//!
//! - `POST /admin/adapters/{name}/shadow` `{digest}` stages a loaded version as the
//!   shadow (`PUT /admin/adapters/{name}?shadow=true` uploads and stages in one call);
//!   `DELETE` ends it; `GET` reports agreement per operation and the stored diffs.
//! - `POST /admin/adapters/{name}/canary` `{digest, accounts, percent, min_sample,
//!   max_excess_pct}` starts a canary; `DELETE` stops it; `GET` shows it with the
//!   first-send tallies of both versions and the adapter's release history.
//!
//! Shadow and canary live in the running gateway only: a restart serves the active
//! version alone again (the release history says what was staged). Every change is
//! written to the adapter's append-only release history with the actor `admin`.

use std::collections::BTreeMap;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use sluice_adapter_runtime::{CanaryPolicy, CanaryStatus, Rollout};
use sluice_merchant_api::requests::{integer, optional_integer};
use sluice_orchestrator::{CanaryTally, ShadowTally};
use sluice_store::{AdapterEvent, AdapterEventKind, ShadowDiff};
use utoipa::{IntoParams, ToSchema};

use crate::adapters::ManageError;
use crate::api::{ActivateRequest, AdapterVersionView};
use crate::app::AppState;
use crate::error::ApiError;

/// The newest diffs a shadow report lists by default, and at most.
const DEFAULT_DIFFS: i64 = 20;

/// `POST /admin/adapters/{name}/canary`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CanaryRequest {
    /// The loaded version to canary (sha256 of its component).
    #[schema(pattern = "^[0-9a-f]{64}$", min_length = 64, max_length = 64)]
    pub digest: String,
    /// Connector accounts whose every new attempt the canary serves (at most 256).
    #[serde(default)]
    #[schema(max_items = 256)]
    pub accounts: Vec<String>,
    /// The percentage (0-100) of the other new attempts it serves, chosen by a hash of
    /// the attempt reference (the same attempt always gets the same version).
    // Integers are read as JSON Schema's `integer` (also `5.0`), then range-checked.
    #[serde(default, deserialize_with = "integer")]
    #[schema(minimum = 0, maximum = 100)]
    pub percent: i64,
    /// First sends the canary needs before it can be judged (5-100000, default 20).
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 5, maximum = 100000)]
    pub min_sample: Option<i64>,
    /// How many percentage points its UNKNOWN, error or decline rate may exceed the
    /// active version's before it is stopped (0-100, default 10).
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 100)]
    pub max_excess_pct: Option<i64>,
}

impl CanaryRequest {
    /// The rollout and policy asked for; a number out of its range is a 400 that names it.
    fn release(&self) -> Result<(Rollout, CanaryPolicy), ApiError> {
        let defaults = CanaryPolicy::default();
        let percent = bounded(self.percent, "percent")?;
        let min_sample = match self.min_sample {
            Some(n) => bounded(n, "min_sample")?,
            None => defaults.min_sample,
        };
        let max_excess_pct = match self.max_excess_pct {
            Some(n) => bounded(n, "max_excess_pct")?,
            None => defaults.max_excess_pct,
        };
        let rollout = Rollout {
            accounts: self.accounts.clone(),
            percent,
        };
        let policy = CanaryPolicy {
            min_sample,
            max_excess_pct,
        };
        rollout
            .validate()
            .map_err(|e| rollout_error(e, "percent"))?;
        policy
            .validate()
            .map_err(|e| rollout_error(e, "min_sample"))?;
        Ok((rollout, policy))
    }
}

fn bounded<T: TryFrom<i64>>(value: i64, param: &str) -> Result<T, ApiError> {
    T::try_from(value).map_err(|_| {
        ApiError::bad_request(
            "invalid_rollout",
            format!("{param} is out of range: {value}"),
        )
        .with_param(param)
    })
}

fn rollout_error(error: sluice_adapter_runtime::LoadError, param: &str) -> ApiError {
    ApiError::bad_request("invalid_rollout", error.to_string()).with_param(param)
}

/// First sends of one version since the canary started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TallyView {
    pub total: u32,
    pub unknown: u32,
    pub error: u32,
    pub declined: u32,
}

/// A running canary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CanaryView {
    pub digest: String,
    pub version: String,
    pub accounts: Vec<String>,
    pub percent: u8,
    pub min_sample: u32,
    pub max_excess_pct: u8,
    /// The canary's first sends in this gateway process.
    pub canary_sends: TallyView,
    /// The active version's first sends over the same time.
    pub active_sends: TallyView,
}

/// One entry of an adapter's release history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReleaseEventView {
    pub digest: String,
    /// `shadow_staged`, `shadow_cleared`, `canary_started`, `canary_stopped`,
    /// `canary_rolled_back`.
    pub kind: String,
    pub detail: String,
    /// `admin`, or `gateway` for an automatic rollback.
    pub actor: String,
    pub at_ms: i64,
}

/// `GET /admin/adapters/{name}/canary`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CanaryReport {
    pub adapter: String,
    pub active_digest: Option<String>,
    pub canary: Option<CanaryView>,
    /// Newest first, at most 200.
    pub history: Vec<ReleaseEventView>,
}

/// How one operation's shadow runs went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ShadowOperationView {
    pub operation: String,
    pub agreed: u64,
    pub differed: u64,
    pub failed: u64,
    pub shed: u64,
    /// agreed / (agreed + differed + failed); null before any comparison.
    pub agreement_rate: Option<f64>,
}

/// One stored difference between the shadow and the serving version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ShadowDiffView {
    pub operation: String,
    pub connector_account: String,
    /// The version that served the call.
    pub serving_digest: String,
    /// sha256 of the input both versions got (the input itself is not kept).
    pub input_digest: String,
    /// `[{path, serving, shadow}]`: redacted excerpts, secrets and card numbers masked.
    #[schema(value_type = Vec<Object>)]
    pub fields: serde_json::Value,
    pub at_ms: i64,
}

/// `GET /admin/adapters/{name}/shadow`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ShadowReport {
    pub adapter: String,
    pub active_digest: Option<String>,
    /// The staged shadow version, if any.
    pub shadow: Option<AdapterVersionView>,
    /// Comparisons in this gateway process, per operation.
    pub operations: Vec<ShadowOperationView>,
    /// How often each field path differed among the listed diffs.
    pub diffs_by_field: BTreeMap<String, u64>,
    /// The newest stored diffs, newest first.
    pub diffs: Vec<ShadowDiffView>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ShadowReportParams {
    /// How many of the newest diffs to list (1-200, default 20).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
}

/// The `{name}` of every release route.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // Only its OpenAPI description is used; handlers take `Path<String>`.
struct AdapterName {
    /// The adapter's name: 1 to 64 of `a-z`, `0-9`, `-` and `_`.
    #[param(min_length = 1, max_length = 64, pattern = "^[a-z0-9_-]+$")]
    name: String,
}

/// `POST /admin/adapters/{name}/shadow`: stage a loaded version as the shadow.
#[utoipa::path(
    post, path = "/admin/adapters/{name}/shadow", tag = "adapters",
    params(AdapterName),
    request_body = ActivateRequest,
    responses(
        (status = 200, description = "The shadow version, now repeating the active one's calls", body = AdapterVersionView),
        (status = 400, description = "Invalid name or digest"),
        (status = 404, description = "No such adapter or version"),
        (status = 409, description = "The version is the active one"),
    ),
    security(("admin_token" = []))
)]
pub async fn stage_shadow(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Json<ActivateRequest>, JsonRejection>,
) -> Result<Json<AdapterVersionView>, ApiError> {
    let Path(name) = name?;
    let Json(request) = body?;
    let info = state
        .adapters
        .stage_shadow(&name, &request.digest)
        .await
        .map_err(|e| crate::admin::manage_error(&name, e))?;
    record(
        &state,
        &name,
        &info.digest,
        AdapterEventKind::ShadowStaged,
        &format!("version {}", info.version),
    )
    .await?;
    Ok(Json(AdapterVersionView::from_info(&info, false)))
}

/// `DELETE /admin/adapters/{name}/shadow`: end the shadow.
#[utoipa::path(
    delete, path = "/admin/adapters/{name}/shadow", tag = "adapters",
    params(AdapterName),
    responses(
        (status = 200, description = "The shadow report as it stood when the shadow ended", body = ShadowReport),
        (status = 404, description = "No such adapter"),
    ),
    security(("admin_token" = []))
)]
pub async fn clear_shadow(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<ShadowReport>, ApiError> {
    let Path(name) = name?;
    let report = shadow_report_of(&state, &name, DEFAULT_DIFFS).await?;
    let cleared = state
        .adapters
        .clear_shadow(&name)
        .await
        .map_err(|e| crate::admin::manage_error(&name, e))?;
    if let Some(info) = cleared {
        record(
            &state,
            &name,
            &info.digest,
            AdapterEventKind::ShadowCleared,
            "ended by an operator",
        )
        .await?;
    }
    Ok(Json(report))
}

/// `GET /admin/adapters/{name}/shadow`: agreement and diffs of the shadow version.
#[utoipa::path(
    get, path = "/admin/adapters/{name}/shadow", tag = "adapters",
    params(AdapterName, ShadowReportParams),
    responses(
        (status = 200, description = "The shadow version's agreement per operation and its newest diffs", body = ShadowReport),
        (status = 400, description = "Invalid name or limit"),
        (status = 404, description = "No such adapter"),
    ),
    security(("admin_token" = []))
)]
pub async fn shadow_report(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    params: Result<Query<ShadowReportParams>, QueryRejection>,
) -> Result<Json<ShadowReport>, ApiError> {
    let Path(name) = name?;
    let Query(params) = params?;
    let limit = params.limit.unwrap_or(DEFAULT_DIFFS);
    if !(1..=sluice_store::MAX_ADAPTER_EVENTS).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid_limit",
            format!(
                "limit is {limit}; it must be 1 to {}",
                sluice_store::MAX_ADAPTER_EVENTS
            ),
        )
        .with_param("limit"));
    }
    Ok(Json(shadow_report_of(&state, &name, limit).await?))
}

/// `POST /admin/adapters/{name}/canary`: start a canary.
#[utoipa::path(
    post, path = "/admin/adapters/{name}/canary", tag = "adapters",
    params(AdapterName),
    request_body = CanaryRequest,
    responses(
        (status = 200, description = "The canary, taking its share of new attempts", body = CanaryReport),
        (status = 400, description = "Invalid name, digest or rollout"),
        (status = 404, description = "No such adapter or version"),
        (status = 409, description = "The version is the active one"),
    ),
    security(("admin_token" = []))
)]
pub async fn start_canary(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Json<CanaryRequest>, JsonRejection>,
) -> Result<Json<CanaryReport>, ApiError> {
    let Path(name) = name?;
    let Json(request) = body?;
    let (rollout, policy) = request.release()?;
    let started = state
        .adapters
        .start_canary(&name, &request.digest, rollout, policy)
        .await
        .map_err(|e| crate::admin::manage_error(&name, e))?;
    record(
        &state,
        &name,
        &started.digest,
        AdapterEventKind::CanaryStarted,
        &describe(&started),
    )
    .await?;
    Ok(Json(canary_report_of(&state, &name).await?))
}

/// `DELETE /admin/adapters/{name}/canary`: stop the canary.
#[utoipa::path(
    delete, path = "/admin/adapters/{name}/canary", tag = "adapters",
    params(AdapterName),
    responses(
        (status = 200, description = "The adapter without a canary; its attempts keep converging on it", body = CanaryReport),
        (status = 404, description = "No such adapter"),
    ),
    security(("admin_token" = []))
)]
pub async fn stop_canary(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<CanaryReport>, ApiError> {
    let Path(name) = name?;
    let stopped = state
        .adapters
        .stop_canary(&name)
        .await
        .map_err(|e| crate::admin::manage_error(&name, e))?;
    if let Some(canary) = stopped {
        record(
            &state,
            &name,
            &canary.digest,
            AdapterEventKind::CanaryStopped,
            "stopped by an operator",
        )
        .await?;
    }
    Ok(Json(canary_report_of(&state, &name).await?))
}

/// `GET /admin/adapters/{name}/canary`: the canary, its tallies and the history.
#[utoipa::path(
    get, path = "/admin/adapters/{name}/canary", tag = "adapters",
    params(AdapterName),
    responses(
        (status = 200, description = "The canary if one runs, and the adapter's release history", body = CanaryReport),
        (status = 404, description = "No such adapter"),
    ),
    security(("admin_token" = []))
)]
pub async fn canary_report(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<CanaryReport>, ApiError> {
    let Path(name) = name?;
    Ok(Json(canary_report_of(&state, &name).await?))
}

/// Stages a version just uploaded with `?shadow=true`.
pub(crate) async fn stage_uploaded(
    state: &AppState,
    name: &str,
    info: &sluice_adapter_runtime::AdapterVersionInfo,
) -> Result<(), ApiError> {
    state
        .adapters
        .stage_shadow(name, &info.digest)
        .await
        .map_err(|e| crate::admin::manage_error(name, e))?;
    let detail = format!("version {}, uploaded as the shadow", info.version);
    record(
        state,
        name,
        &info.digest,
        AdapterEventKind::ShadowStaged,
        &detail,
    )
    .await
}

fn describe(canary: &CanaryStatus) -> String {
    format!(
        "version {}: {}% of new attempts and every new attempt of {} account(s); \
         stopped when a rate exceeds the active version's by {} points over {} first sends",
        canary.version,
        canary.rollout.percent,
        canary.rollout.accounts.len(),
        canary.policy.max_excess_pct,
        canary.policy.min_sample
    )
}

async fn record(
    state: &AppState,
    adapter: &str,
    digest: &str,
    kind: AdapterEventKind,
    detail: &str,
) -> Result<(), ApiError> {
    tracing::info!(
        adapter,
        digest,
        kind = kind.as_str(),
        detail,
        "adapter release changed"
    );
    state
        .store
        .record_adapter_event(adapter, digest, kind, detail, "admin")
        .await
        .map_err(|e| {
            ApiError::internal(format!(
                "the change applied but its history row was not written: {e}"
            ))
        })
}

fn known(state: &AppState, name: &str) -> Result<sluice_adapter_runtime::AdapterStatus, ApiError> {
    crate::adapters::check_name(name).map_err(|e| crate::admin::manage_error(name, e))?;
    state.adapters.status(name).ok_or_else(|| {
        crate::admin::manage_error(
            name,
            ManageError::Load(sluice_adapter_runtime::LoadError::UnknownAdapter(
                name.into(),
            )),
        )
    })
}

async fn canary_report_of(state: &AppState, name: &str) -> Result<CanaryReport, ApiError> {
    let status = known(state, name)?;
    let canary = state
        .orchestrator
        .canary_report(name)
        .map(|(c, canary, active)| CanaryView {
            digest: c.digest,
            version: c.version,
            accounts: c.rollout.accounts,
            percent: c.rollout.percent,
            min_sample: c.policy.min_sample,
            max_excess_pct: c.policy.max_excess_pct,
            canary_sends: tally(canary),
            active_sends: tally(active),
        });
    let history = state
        .store
        .adapter_events(name)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(CanaryReport {
        adapter: name.to_owned(),
        active_digest: status.active.map(|a| a.digest),
        canary,
        history: history.into_iter().map(event_view).collect(),
    })
}

async fn shadow_report_of(
    state: &AppState,
    name: &str,
    limit: i64,
) -> Result<ShadowReport, ApiError> {
    let status = known(state, name)?;
    let Some(shadow) = status.shadow else {
        return Ok(ShadowReport {
            adapter: name.to_owned(),
            active_digest: status.active.map(|a| a.digest),
            shadow: None,
            operations: vec![],
            diffs_by_field: BTreeMap::new(),
            diffs: vec![],
        });
    };
    let diffs = state
        .store
        .shadow_diffs(name, &shadow.digest, limit)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let operations = state
        .orchestrator
        .shadow_tallies(name, &shadow.digest)
        .into_iter()
        .map(|(operation, t)| operation_view(operation, t))
        .collect();
    Ok(ShadowReport {
        adapter: name.to_owned(),
        active_digest: status.active.map(|a| a.digest),
        shadow: Some(AdapterVersionView::from_info(&shadow, false)),
        operations,
        diffs_by_field: by_field(&diffs),
        diffs: diffs.into_iter().map(diff_view).collect(),
    })
}

fn tally(t: CanaryTally) -> TallyView {
    TallyView {
        total: t.total,
        unknown: t.unknown,
        error: t.error,
        declined: t.declined,
    }
}

fn operation_view(operation: &str, t: ShadowTally) -> ShadowOperationView {
    let compared = t.agreed + t.differed + t.failed;
    ShadowOperationView {
        operation: operation.to_owned(),
        agreed: t.agreed,
        differed: t.differed,
        failed: t.failed,
        shed: t.shed,
        agreement_rate: (compared > 0).then(|| t.agreed as f64 / compared as f64),
    }
}

fn by_field(diffs: &[ShadowDiff]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    let paths = diffs
        .iter()
        .filter_map(|d| d.diff.fields.as_array())
        .flatten()
        .filter_map(|f| f.get("path").and_then(|p| p.as_str()));
    for path in paths {
        *counts.entry(path.to_owned()).or_insert(0) += 1;
    }
    counts
}

fn diff_view(d: ShadowDiff) -> ShadowDiffView {
    ShadowDiffView {
        operation: d.diff.operation,
        connector_account: d.diff.account_id,
        serving_digest: d.diff.active_digest,
        input_digest: d.diff.input_digest,
        fields: d.diff.fields,
        at_ms: d.at_ms,
    }
}

fn event_view(e: AdapterEvent) -> ReleaseEventView {
    ReleaseEventView {
        digest: e.digest,
        kind: e.kind,
        detail: e.detail,
        actor: e.actor,
        at_ms: e.at_ms,
    }
}
