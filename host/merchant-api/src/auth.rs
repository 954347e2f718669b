//! Merchant authentication: `Authorization: Bearer <api key>`. The key is
//! looked up only by its keyed hash (the store never sees it in plain text at
//! rest) and is never logged.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;

use crate::error::ApiError;
use crate::MerchantApiState;

/// The authenticated caller, put in the request's extensions by [`require_merchant`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthedMerchant {
    pub merchant_id: String,
    /// The id (not the key) of the API key used.
    pub key_id: String,
}

impl AuthedMerchant {
    /// The actor recorded in the history for this merchant's commands.
    pub fn actor(&self) -> String {
        format!("merchant:{}", self.merchant_id)
    }
}

/// Longest key worth hashing; anything longer is not one of ours.
const MAX_KEY_LEN: usize = 256;

/// Middleware on every `/v1` route.
pub async fn require_merchant(
    State(state): State<MerchantApiState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let presented = bearer(request.headers())?;
    let found = state
        .store
        .authenticate_api_key_cached(presented, &state.pepper)
        .await
        .map_err(crate::error::store_error)?;
    let Some((merchant, key)) = found else {
        tracing::info!("request with an unknown or revoked API key refused");
        return Err(ApiError::unauthorized(
            "api_key_invalid",
            "the API key is not valid or has been revoked",
        ));
    };
    tracing::Span::current().record("merchant", merchant.id.as_str());
    request.extensions_mut().insert(AuthedMerchant {
        merchant_id: merchant.id,
        key_id: key.id,
    });
    Ok(next.run(request).await)
}

fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let header = headers.get(AUTHORIZATION).ok_or_else(|| {
        ApiError::unauthorized(
            "api_key_missing",
            "missing Authorization: Bearer <api key> header",
        )
    })?;
    let key = header
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            ApiError::unauthorized(
                "api_key_missing",
                "the Authorization header must be `Bearer <api key>`",
            )
        })?;
    if key.len() > MAX_KEY_LEN {
        return Err(ApiError::unauthorized(
            "api_key_invalid",
            "the API key is not valid or has been revoked",
        ));
    }
    Ok(key)
}

impl<S: Send + Sync> FromRequestParts<S> for AuthedMerchant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<AuthedMerchant>()
            .cloned()
            .ok_or_else(|| {
                // Only reachable if a route was mounted without `require_merchant`.
                tracing::error!("merchant route reached without authentication");
                ApiError::unauthorized("api_key_missing", "authentication required")
            })
    }
}
