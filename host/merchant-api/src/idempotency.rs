//! `Idempotency-Key` on every POST, with Stripe's semantics, as one
//! middleware instead of code in each handler.
//!
//! - The key is scoped to the merchant and the endpoint (method + route
//!   template, e.g. `POST /v1/payments/{id}/refunds`).
//! - The request's fingerprint is the sha256 of its path, query and canonical
//!   JSON body (object keys sorted, insignificant whitespace removed), so a
//!   retry that re-serialises the same JSON differently is still the same
//!   request, and the same body against another payment id is not.
//! - The first complete response (status and body, including errors raised
//!   once execution began) is stored and replayed byte for byte. A response
//!   produced before execution (validation, see [`NotExecuted`]) is not stored:
//!   the key is released, so a corrected retry runs.
//! - The same key with another fingerprint: 400 `idempotency_key_reused`.
//!   The same key while the first request runs: 409 `idempotency_key_in_use`.
//! - The request runs in its own task: a client that disconnects does not
//!   cancel a payment operation halfway, and its response is still stored.

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use sha2::{Digest, Sha256};
use sluice_store::IdempotencyBegin;
use tracing::Instrument;

use crate::auth::AuthedMerchant;
use crate::error::{store_error, ApiError, NotExecuted};
use crate::extract::body_too_large;
use crate::MerchantApiState;

pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on a response replayed from the idempotency store.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Longest `Idempotency-Key` accepted (after trimming), in bytes of visible ASCII.
pub const MAX_KEY_LEN: usize = 255;

/// The validated `Idempotency-Key` of the request being run, handed to the
/// handler as a request extension: operations that move money derive their
/// PSP references from it, so a re-run after a crash (the key taken over
/// once its lease ended) finds what the first run reserved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestKey(pub String);

/// Route layer for the authenticated `/v1` routes (inside `require_merchant`).
pub async fn idempotency(
    State(state): State<MerchantApiState>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let span = tracing::Span::current();
    let work = sluice_orchestrator::psp_wait::carried(run(state, request, next));
    let task = tokio::spawn(work.instrument(span));
    match task.await {
        Ok(response) => response,
        Err(join_error) => {
            tracing::error!(error = %join_error, "request task failed");
            ApiError::internal("an internal error occurred; it has been logged").into_response()
        }
    }
}

async fn run(state: MerchantApiState, request: Request, next: Next) -> Response {
    let key = match key_of(&request) {
        Ok(None) => return next.run(request).await,
        Ok(Some(key)) => key,
        Err(e) => return e.into_response(),
    };
    match keyed(&state, request, next, &key).await {
        Ok(response) | Err(response) => response,
    }
}

fn key_of(request: &Request) -> Result<Option<String>, ApiError> {
    let Some(value) = request.headers().get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|k| {
            !k.is_empty() && k.len() <= MAX_KEY_LEN && k.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ApiError::invalid(
                "idempotency_key_invalid",
                "Idempotency-Key",
                format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
            )
        })?;
    Ok(Some(key.to_owned()))
}

async fn keyed(
    state: &MerchantApiState,
    request: Request,
    next: Next,
    key: &str,
) -> Result<Response, Response> {
    let merchant = request
        .extensions()
        .get::<AuthedMerchant>()
        .cloned()
        .ok_or_else(|| {
            ApiError::internal("idempotency layer mounted outside authentication").into_response()
        })?;
    let endpoint = endpoint_of(&request);
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, crate::MAX_BODY_BYTES)
        .await
        .map_err(|_| body_too_large().into_response())?;
    let fingerprint = fingerprint(parts.uri.path(), parts.uri.query(), &bytes);
    let begun = state
        .store
        .idempotency_begin(
            &merchant.merchant_id,
            &endpoint,
            key,
            &fingerprint,
            state.config.idempotency_lease_ms,
        )
        .await
        .map_err(|e| store_error(e).into_response())?;
    match begun {
        IdempotencyBegin::Started => {}
        IdempotencyBegin::InProgress => {
            return Err(ApiError::idempotency(
                StatusCode::CONFLICT,
                "idempotency_key_in_use",
                "a request with this Idempotency-Key is still being processed; retry later",
            )
            .into_response())
        }
        IdempotencyBegin::FingerprintMismatch => {
            return Err(ApiError::idempotency(
                StatusCode::BAD_REQUEST,
                "idempotency_key_reused",
                "this Idempotency-Key was already used with different parameters",
            )
            .with_param("Idempotency-Key")
            .into_response())
        }
        IdempotencyBegin::Completed { status, body } => {
            tracing::info!(idempotency_key = key, %endpoint, "replaying stored response");
            return Ok(replay(status, body));
        }
    }
    let mut parts = parts;
    parts.extensions.insert(RequestKey(key.to_owned()));
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    Ok(finish(state, &merchant, &endpoint, key, response).await)
}

/// Store the response (or release the key) and hand the same bytes back.
async fn finish(
    state: &MerchantApiState,
    merchant: &AuthedMerchant,
    endpoint: &str,
    key: &str,
    response: Response,
) -> Response {
    let (parts, body) = response.into_parts();
    let not_executed = parts.extensions.get::<NotExecuted>().is_some();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::error!(error = %e, "could not read the response body");
            release(state, merchant, endpoint, key).await;
            return ApiError::internal("an internal error occurred; it has been logged")
                .into_response();
        }
    };
    let text = std::str::from_utf8(&bytes).ok();
    match (not_executed, text) {
        (false, Some(text)) => {
            if let Err(e) = state
                .store
                .idempotency_complete(
                    &merchant.merchant_id,
                    endpoint,
                    key,
                    parts.status.as_u16(),
                    text,
                )
                .await
            {
                // The key stays in progress until its lease ends; a retry
                // after that re-runs the request, which is safe because every
                // operation behind it is itself idempotent by its references.
                tracing::error!(error = %e, idempotency_key = key, "could not store the response");
            }
        }
        _ => release(state, merchant, endpoint, key).await,
    }
    Response::from_parts(parts, Body::from(bytes))
}

async fn release(state: &MerchantApiState, merchant: &AuthedMerchant, endpoint: &str, key: &str) {
    if let Err(e) = state
        .store
        .idempotency_release(&merchant.merchant_id, endpoint, key)
        .await
    {
        tracing::error!(error = %e, idempotency_key = key, "could not release the key");
    }
}

fn replay(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Bytes::from(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// `POST /v1/payments/{id}/refunds`: the method and the route template.
fn endpoint_of(request: &Request) -> String {
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| request.uri().path().to_owned());
    format!("{} {}", request.method(), path)
}

/// sha256 over the concrete path (so path parameters count), the query and
/// the canonical body.
pub fn fingerprint(path: &str, query: Option<&str>, body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    for part in [path.as_bytes(), query.unwrap_or("").as_bytes()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.update(canonical_body(body));
    hex::encode(hasher.finalize())
}

/// An empty body and `{}` are the same request; JSON is re-serialised with
/// sorted keys; anything else (which the handler will refuse) is hashed raw.
fn canonical_body(body: &[u8]) -> Vec<u8> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return b"json:{}".to_vec();
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(value) => {
            let mut out = b"json:".to_vec();
            out.extend(canonical(&value).to_string().into_bytes());
            out
        }
        Err(_) => {
            let mut out = b"raw:".to_vec();
            out.extend_from_slice(body);
            out
        }
    }
}

/// Sorted object keys at every depth, whatever map type serde_json is built with.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, Value> =
                map.iter().map(|(k, v)| (k, canonical(v))).collect();
            let mut out = serde_json::Map::new();
            for (k, v) in sorted {
                out.insert(k.clone(), v);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_and_whitespace_do_not_change_the_fingerprint() {
        let a = fingerprint(
            "/v1/payments",
            None,
            br#"{"amount":100,"currency":"EUR","metadata":{"b":"1","a":"2"}}"#,
        );
        let b = fingerprint(
            "/v1/payments",
            None,
            br#"{ "metadata": {"a":"2","b":"1"}, "currency": "EUR", "amount": 100 }"#,
        );
        assert_eq!(a, b);
    }

    #[test]
    fn another_value_path_or_query_changes_the_fingerprint() {
        let base = fingerprint("/v1/payments/pay_1/refunds", None, br#"{"amount":70}"#);
        assert_ne!(
            base,
            fingerprint("/v1/payments/pay_1/refunds", None, br#"{"amount":71}"#)
        );
        assert_ne!(
            base,
            fingerprint("/v1/payments/pay_2/refunds", None, br#"{"amount":70}"#)
        );
        assert_ne!(
            base,
            fingerprint(
                "/v1/payments/pay_1/refunds",
                Some("x=1"),
                br#"{"amount":70}"#
            )
        );
    }

    #[test]
    fn an_empty_body_is_the_same_request_as_an_empty_object() {
        assert_eq!(
            fingerprint("/v1/payments/p/void", None, b""),
            fingerprint("/v1/payments/p/void", None, b"{ }")
        );
    }
}
