//! Rotation of a connector account's secrets under `/admin` (issue 11 §5): the new
//! version signs and verifies from now on, the versions valid now keep verifying for
//! the window the administrator gives, then only the new one does. Values go in, never
//! out, and never into a log.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use sluice_store::secrets::{MAX_ROTATION_WINDOW_MS, MAX_SECRET_LEN};
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath};
use crate::payments::json;
use crate::requests::{self as req};
use crate::MerchantApiState;

/// Secret names: what credential placeholders can name (`{{secret:NAME}}`).
pub const SECRET_NAME_PATTERN: &str = "^[a-z0-9_]+$";
pub const MAX_SECRET_NAME_CHARS: usize = 64;

/// The new version of a secret and how long the current versions stay valid.
#[derive(Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecretRequest {
    /// The new secret. Never returned or logged.
    #[schema(schema_with = value_schema)]
    pub value: String,
    /// How long the versions valid now keep verifying, in milliseconds (0: stop at once).
    #[schema(schema_with = window_schema)]
    #[serde(deserialize_with = "req::integer")]
    pub window_ms: i64,
}

impl std::fmt::Debug for RotateSecretRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotateSecretRequest")
            .field("value", &"<redacted>")
            .field("window_ms", &self.window_ms)
            .finish()
    }
}

/// One version of a rotated secret (never its value).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SecretVersionView {
    /// True for the version that signs and authenticates from now on.
    pub current: bool,
    /// Until when (unix ms, exclusive) the version verifies; `null` for the current one.
    pub valid_until: Option<i64>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SecretRotationView {
    /// Always `secret_rotation`.
    pub object: String,
    pub connector_account_id: String,
    pub name: String,
    /// Newest first.
    pub versions: Vec<SecretVersionView>,
}

fn value_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_SECRET_LEN))
        .pattern(Some(crate::openapi::fields::text_pattern()))
        .description(Some(
            "The new secret (no control characters). It must differ from every version valid \
             now (409 otherwise). Never returned or logged.",
        ))
        .build()
}

fn window_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::Int64,
        )))
        .minimum(Some(0))
        .maximum(Some(MAX_ROTATION_WINDOW_MS))
        .description(Some(
            "How long the versions valid now keep verifying, in milliseconds (0: only the new \
             version from now on; at most 30 days).",
        ))
        .build()
}

/// The schema of the `secret_name` path parameter.
pub fn secret_name_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_SECRET_NAME_CHARS))
        .pattern(Some(SECRET_NAME_PATTERN))
        .build()
}

fn valid_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SECRET_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn missing(what: &str) -> ApiError {
    ApiError::not_found("resource_missing", format!("no such {what}"))
}

/// Roll a connector account's secret (e.g. `webhook_secret`) to a new value. During
/// the window both the new and the previous versions verify webhooks; requests are
/// signed and authenticated with the new one at once.
#[utoipa::path(
    post,
    path = "/admin/merchants/{merchant_id}/connector_accounts/{account_id}/secrets/{secret_name}/rotate",
    tag = "admin",
    params(("merchant_id" = String, Path), ("account_id" = String, Path), ("secret_name" = String, Path)),
    request_body = RotateSecretRequest,
    responses((status = 200, body = SecretRotationView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn rotate_connector_secret(
    State(state): State<MerchantApiState>,
    ApiPath((merchant_id, account_id, secret_name)): ApiPath<(String, String, String)>,
    ApiJson(body): ApiJson<RotateSecretRequest>,
) -> Result<Response, ApiError> {
    if !req::looks_like_id(&merchant_id) || !req::looks_like_id(&account_id) {
        return Err(missing("connector account"));
    }
    if !valid_secret_name(&secret_name) {
        return Err(missing("connector account secret"));
    }
    let value = req::text(&body.value, "value", MAX_SECRET_LEN)?;
    if value.is_empty() {
        return Err(ApiError::invalid(
            "string_invalid",
            "value",
            "value must be non-empty",
        ));
    }
    if !(0..=MAX_ROTATION_WINDOW_MS).contains(&body.window_ms) {
        return Err(ApiError::invalid(
            "window_invalid",
            "window_ms",
            format!("window_ms must be between 0 and {MAX_ROTATION_WINDOW_MS}"),
        ));
    }
    // Scoped by the merchant: another merchant's account is a 404.
    state
        .store
        .get_connector_account(&account_id, Some(&merchant_id))
        .await?;
    let rotation = state
        .store
        .rotate_connector_secret(&account_id, &secret_name, &value, body.window_ms)
        .await?;
    let versions = rotation
        .versions
        .iter()
        .enumerate()
        .map(|(i, valid_until)| SecretVersionView {
            current: i == 0,
            valid_until: *valid_until,
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &SecretRotationView {
            object: "secret_rotation".into(),
            connector_account_id: rotation.account_id,
            name: rotation.name,
            versions,
        },
    ))
}
