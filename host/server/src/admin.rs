//! Admin API for adapters (`/admin/adapters...`), behind the admin token.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use sluice_adapter_runtime::LoadError;
use tracing::Instrument;
use utoipa::IntoParams;

use crate::adapters::ManageError;
use crate::api::{ActivateRequest, AdapterList, AdapterVersionView, AdapterView};
use crate::app::AppState;
use crate::error::ApiError;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UploadParams {
    /// Activate the new version once validated (default unless `shadow`); `false` only
    /// loads it.
    pub activate: Option<bool>,
    /// Stage the new version as the shadow of the active one: it repeats the active
    /// version's calls off the request path and is compared with it, never affecting
    /// state (`GET /admin/adapters/{name}/shadow`). Excludes `activate=true`.
    pub shadow: Option<bool>,
}

/// The `{name}` of every adapter route, as [`crate::adapters::check_name`] accepts it.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // Only its OpenAPI description is used; handlers take `Path<String>`.
struct AdapterName {
    /// The adapter's name: 1 to 64 of `a-z`, `0-9`, `-` and `_`.
    #[param(min_length = 1, max_length = 64, pattern = "^[a-z0-9_-]+$")]
    name: String,
}

/// The body of an upload: the component's bytes.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // Only its OpenAPI description is used; the handler takes `Bytes`.
struct ComponentBytes(Vec<u8>);

/// `PUT /admin/adapters/{name}`: the body is the component's bytes.
///
/// Nothing is written before the bytes compile as a component of the
/// contract the host serves and `describe()` names this adapter: anything
/// else (random bytes, a core module, another world) is a 422 and leaves the
/// serving version alone.
#[utoipa::path(
    put, path = "/admin/adapters/{name}", tag = "adapters",
    params(AdapterName, UploadParams),
    request_body(
        content = ComponentBytes, content_type = "application/octet-stream",
        description = "A WebAssembly component of world `sluice:psp/psp-adapter@0.2.x`, at most 32 MiB"
    ),
    responses(
        (status = 200, description = "The version, loaded (and active unless `activate=false` or `shadow=true`; the shadow with `shadow=true`)", body = AdapterVersionView),
        (status = 400, description = "Invalid name or query"),
        (status = 409, description = "With `shadow=true`: the version is the active one"),
        (status = 413, description = "The body is over the 32 MiB limit"),
        (status = 422, description = "Not a component of the served contract, or it names another adapter; nothing was written"),
    ),
    security(("admin_token" = []))
)]
pub async fn upload(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    params: Result<Query<UploadParams>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AdapterVersionView>, ApiError> {
    let Path(name) = name?;
    let Query(params) = params?;
    let body = body?;
    let shadow = params.shadow.unwrap_or(false);
    if shadow && params.activate == Some(true) {
        return Err(ApiError::bad_request(
            "conflicting_parameters",
            "a version is either activated or staged as the shadow, not both",
        )
        .with_param("shadow"));
    }
    let activate = !shadow && params.activate.unwrap_or(true);
    let span = tracing::info_span!("admin_upload", adapter = %name, bytes = body.len(), activate);
    let info = state
        .adapters
        .upload(&name, body, activate)
        .instrument(span)
        .await
        .map_err(|e| manage_error(&name, e))?;
    tracing::info!(adapter = %name, version = %info.version, digest = %info.digest, activate,
        shadow, "adapter version uploaded");
    if shadow {
        crate::releases::stage_uploaded(&state, &name, &info).await?;
    }
    let active = state
        .adapters
        .runtime()
        .active(&name)
        .map(|h| h.identity().digest.clone())
        == Some(info.digest.clone());
    Ok(Json(AdapterVersionView::from_info(&info, active)))
}

/// `GET /admin/adapters`.
#[utoipa::path(
    get, path = "/admin/adapters", tag = "adapters",
    responses((status = 200, description = "Every adapter and its versions", body = AdapterList)),
    security(("admin_token" = []))
)]
pub async fn list(State(state): State<AppState>) -> Json<AdapterList> {
    Json(AdapterList {
        adapters: state
            .adapters
            .list()
            .iter()
            .map(AdapterView::from_status)
            .collect(),
    })
}

/// `GET /admin/adapters/{name}`.
#[utoipa::path(
    get, path = "/admin/adapters/{name}", tag = "adapters",
    params(AdapterName),
    responses(
        (status = 200, description = "The adapter and its versions", body = AdapterView),
        (status = 404, description = "No such adapter"),
    ),
    security(("admin_token" = []))
)]
pub async fn show(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<AdapterView>, ApiError> {
    let Path(name) = name?;
    state
        .adapters
        .status(&name)
        .map(|status| Json(AdapterView::from_status(&status)))
        .ok_or_else(|| manage_error(&name, LoadError::UnknownAdapter(name.clone()).into()))
}

/// `POST /admin/adapters/{name}/activate` with `{"digest": "..."}`.
#[utoipa::path(
    post, path = "/admin/adapters/{name}/activate", tag = "adapters",
    params(AdapterName),
    request_body = ActivateRequest,
    responses(
        (status = 200, description = "The version now serving", body = AdapterVersionView),
        (status = 404, description = "No such adapter or version"),
    ),
    security(("admin_token" = []))
)]
pub async fn activate(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Json<ActivateRequest>, JsonRejection>,
) -> Result<Json<AdapterVersionView>, ApiError> {
    let Path(name) = name?;
    let Json(request) = body?;
    let info = state
        .adapters
        .activate(&name, &request.digest)
        .await
        .map_err(|e| manage_error(&name, e))?;
    tracing::info!(adapter = %name, version = %info.version, digest = %info.digest,
        "adapter version activated through the admin API");
    Ok(Json(AdapterVersionView::from_info(&info, true)))
}

/// `POST /admin/adapters/{name}/rollback`.
#[utoipa::path(
    post, path = "/admin/adapters/{name}/rollback", tag = "adapters",
    params(AdapterName),
    responses(
        (status = 200, description = "The version serving again", body = AdapterVersionView),
        (status = 404, description = "No such adapter"),
        (status = 409, description = "No previous version to roll back to"),
    ),
    security(("admin_token" = []))
)]
pub async fn rollback(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<AdapterVersionView>, ApiError> {
    let Path(name) = name?;
    let info = state
        .adapters
        .rollback(&name)
        .await
        .map_err(|e| manage_error(&name, e))?;
    tracing::info!(adapter = %name, version = %info.version, digest = %info.digest,
        "adapter rolled back through the admin API");
    Ok(Json(AdapterVersionView::from_info(&info, true)))
}

/// Maps control-plane errors to the API error shape: validation failures are 422 and say
/// why; lookups are 404; server-side failures are 500 without internals beyond the cause.
pub(crate) fn manage_error(name: &str, error: ManageError) -> ApiError {
    let message = error.to_string();
    match error {
        ManageError::InvalidName(_) => {
            ApiError::bad_request("invalid_adapter_name", message).with_param("name")
        }
        ManageError::InvalidDigest(_) => {
            ApiError::bad_request("invalid_digest", message).with_param("digest")
        }
        ManageError::Load(load) => load_error(load, message),
        ManageError::Persist { .. } | ManageError::Task(_) => {
            tracing::error!(adapter = name, error = %message, "adapter change failed");
            ApiError::internal(message)
        }
    }
}

fn load_error(error: LoadError, message: String) -> ApiError {
    match error {
        LoadError::InvalidName(_) => {
            ApiError::bad_request("invalid_adapter_name", message).with_param("name")
        }
        LoadError::InvalidComponent(_) => ApiError::unprocessable("invalid_component", message),
        LoadError::WrongWorld(_) => ApiError::unprocessable("wrong_world", message),
        LoadError::UnsupportedContractVersion(_) => {
            ApiError::unprocessable("unsupported_contract_version", message)
        }
        LoadError::NameMismatch { .. } => {
            ApiError::unprocessable("name_mismatch", message).with_param("name")
        }
        LoadError::DescribeFailed(_) => ApiError::unprocessable("describe_failed", message),
        LoadError::UnknownAdapter(_) => {
            ApiError::not_found("adapter_not_found", message).with_param("name")
        }
        LoadError::UnknownVersion { .. } => {
            ApiError::not_found("version_not_found", message).with_param("digest")
        }
        LoadError::NothingToRollBackTo(_) => ApiError::conflict("nothing_to_roll_back_to", message),
        LoadError::InvalidRollout(_) => ApiError::bad_request("invalid_rollout", message),
        LoadError::AlreadyActive { .. } => {
            ApiError::conflict("version_is_active", message).with_param("digest")
        }
        // The configured limits are the operator's, not the uploader's, mistake.
        LoadError::InvalidLimits(_) | LoadError::Io { .. } => {
            tracing::error!(error = %message, "adapter load failed on the server side");
            ApiError::internal(message)
        }
    }
}
