//! Raw webhook bodies as evidence for operators (issue 11 §5): each verified body is
//! kept sealed (`webhook_bodies`, named by the inbox row); an operator reads it back,
//! opened through the store's secret box, with the admin token and their own key.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine as _;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiPath;
use crate::payments::json;
use crate::requests as req;
use crate::review::AuthedOperator;
use crate::MerchantApiState;

/// The raw body a verified webhook came in, exactly as the PSP sent it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WebhookRawBody {
    /// Always `webhook_raw_body`.
    pub object: String,
    pub inbox_id: String,
    pub connector_account_id: String,
    /// The body's bytes, base64 (standard alphabet, padded).
    pub body_base64: String,
    /// The body as text when it is UTF-8, else `null`.
    pub body_text: Option<String>,
}

/// The raw body of a verified webhook, by its inbox row. 404 when the row does not
/// exist or keeps no body (rejected webhooks, rows from before bodies were kept).
#[utoipa::path(
    get, path = "/admin/review/webhooks/{inbox_id}/raw_body", tag = "review",
    params(("inbox_id" = String, Path)),
    responses((status = 200, body = WebhookRawBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn webhook_raw_body(
    State(state): State<MerchantApiState>,
    AuthedOperator(operator): AuthedOperator,
    ApiPath(inbox_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let missing = || ApiError::not_found("resource_missing", "no such webhook body");
    if !req::looks_like_id(&inbox_id) {
        return Err(missing());
    }
    let entry = match state.store.inbox_get(&inbox_id).await {
        Ok(entry) => entry,
        Err(sluice_store::StoreError::NotFound { .. }) => return Err(missing()),
        Err(other) => return Err(other.into()),
    };
    let body = state
        .store
        .inbox_raw_body(&inbox_id)
        .await?
        .ok_or_else(missing)?;
    tracing::info!(inbox_id = %inbox_id, operator = %operator.id, "raw webhook body read");
    Ok(json(
        StatusCode::OK,
        &WebhookRawBody {
            object: "webhook_raw_body".into(),
            inbox_id,
            connector_account_id: entry.connector_account_id,
            body_base64: base64::engine::general_purpose::STANDARD.encode(&body),
            body_text: String::from_utf8(body).ok(),
        },
    ))
}
