//! Pull-mode fulfillment (issue 7): the merchant's fulfillment endpoint,
//! configured per merchant by an administrator. Sluice calls it with the
//! attempt reference as `Idempotency-Key` to run the business action, then
//! asks it for the business fact; every call is signed with the endpoint's
//! own secret exactly like an outgoing webhook (`Sluice-Signature`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use sluice_store::FulfillmentEndpoint;
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath};
use crate::payments::json;
use crate::requests::{self as req};
use crate::MerchantApiState;

/// Default budget of one call to the fulfillment endpoint.
pub const DEFAULT_TIMEOUT_MS: i64 = 5_000;
/// The longest budget an endpoint may ask for.
pub const MAX_TIMEOUT_MS: i64 = 30_000;
const MIN_SECRET_CHARS: usize = 16;
const MAX_SECRET_CHARS: usize = 500;
const MAX_URL_CHARS: usize = 2_000;

/// The URLs [`put_fulfillment_endpoint`] accepts: `http(s)://`, a host without `@`,
/// then anything, all of it visible ASCII.
const URL_PATTERN: &str = r"^https?://[\x21\x22\x24-\x2e\x30-\x3e\x41-\x7e]+([/?#][\x21-\x7e]*)?$";

fn url_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .max_length(Some(MAX_URL_CHARS))
        .pattern(Some(URL_PATTERN))
        .description(Some(
            "`https://...` (or `http://` for a local test endpoint). Receives `POST` JSON bodies \
             of `type` `fulfillment.execute` and `fulfillment.query`.",
        ))
        .build()
}

fn secret_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .min_length(Some(MIN_SECRET_CHARS))
        .max_length(Some(MAX_SECRET_CHARS))
        .description(Some(
            "Signs every call (`Sluice-Signature: t=<unix>,v1=<hex HMAC-SHA256>` over \
             `\"{t}.{body}\"`, as for webhooks).",
        ))
        .build()
}

fn timeout_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            utoipa::openapi::Type::Integer,
            utoipa::openapi::Type::Null,
        ]))
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::Int64,
        )))
        .minimum(Some(1))
        .maximum(Some(MAX_TIMEOUT_MS))
        .description(Some(format!(
            "Budget of one call in milliseconds (default {DEFAULT_TIMEOUT_MS}); Sluice also \
             never waits longer than its policy's action timeout."
        )))
        .build()
}

#[derive(Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FulfillmentEndpointRequest {
    /// `https://...` (or `http://` for a local test endpoint). Receives
    /// `POST` JSON bodies of `type` `fulfillment.execute` and `fulfillment.query`.
    #[schema(schema_with = url_schema)]
    pub url: String,
    /// Signs every call (`Sluice-Signature: t=<unix>,v1=<hex HMAC-SHA256>`
    /// over `"{t}.{body}"`, as for webhooks); 16 to 500 characters.
    #[schema(schema_with = secret_schema)]
    pub secret: String,
    /// Budget of one call in milliseconds (default 5000, at most 30000);
    /// Sluice also never waits longer than its policy's action timeout.
    #[schema(schema_with = timeout_schema)]
    #[serde(default, deserialize_with = "req::optional_integer")]
    pub timeout_ms: Option<i64>,
}

/// `Debug` never shows the secret.
impl std::fmt::Debug for FulfillmentEndpointRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FulfillmentEndpointRequest")
            .field("url", &self.url)
            .field("secret", &"<redacted>")
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

/// A configured endpoint (the secret is never shown again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FulfillmentEndpointView {
    pub merchant_id: String,
    pub url: String,
    pub timeout_ms: i64,
    pub secret_set: bool,
}

/// Configure (or replace) a merchant's pull-mode fulfillment endpoint.
#[utoipa::path(
    put, path = "/admin/merchants/{merchant_id}/fulfillment_endpoint", tag = "admin",
    params(("merchant_id" = String, Path)),
    request_body = FulfillmentEndpointRequest,
    responses((status = 200, body = FulfillmentEndpointView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn put_fulfillment_endpoint(
    State(state): State<MerchantApiState>,
    ApiPath(merchant_id): ApiPath<String>,
    ApiJson(body): ApiJson<FulfillmentEndpointRequest>,
) -> Result<Response, ApiError> {
    if !req::looks_like_id(&merchant_id) {
        return Err(ApiError::not_found("resource_missing", "no such merchant"));
    }
    let url = req::required_text(&body.url, "url", MAX_URL_CHARS)?;
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let host = rest.and_then(|r| r.split(['/', '?', '#']).next());
    let valid = host.is_some_and(|h| !h.is_empty() && !h.contains('@'))
        && url.bytes().all(|b| b.is_ascii_graphic());
    if !valid {
        return Err(ApiError::invalid(
            "url_invalid",
            "url",
            "url must be an absolute http(s) URL",
        ));
    }
    let secret_chars = body.secret.chars().count();
    if !(MIN_SECRET_CHARS..=MAX_SECRET_CHARS).contains(&secret_chars) {
        return Err(ApiError::invalid(
            "secret_invalid",
            "secret",
            "secret must have 16 to 500 characters",
        ));
    }
    let timeout_ms = body.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    if !(1..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
        return Err(ApiError::invalid(
            "timeout_invalid",
            "timeout_ms",
            "timeout_ms must be between 1 and 30000",
        ));
    }
    state.store.get_merchant(&merchant_id).await?;
    let endpoint = FulfillmentEndpoint {
        merchant_id: merchant_id.clone(),
        url,
        secret: body.secret,
        timeout_ms,
    };
    state.store.set_fulfillment_endpoint(&endpoint).await?;
    tracing::info!(merchant = %merchant_id, "fulfillment endpoint configured");
    Ok(json(
        StatusCode::OK,
        &FulfillmentEndpointView {
            merchant_id,
            url: endpoint.url,
            timeout_ms,
            secret_set: true,
        },
    ))
}
