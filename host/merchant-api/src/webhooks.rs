//! `POST /webhooks/{adapter}/{connector_account}`: the PSP's door in.
//!
//! Body limit (router layer) → per-account rate limit (the account's own
//! `webhook_burst` / `webhook_per_second`, else the gateway's; see
//! [`crate::limits`]; a refusal waits out the refusal hold before its 429 and is
//! logged once per account and interval, not per request) → the orchestrator:
//! the adapter verifies the request with that account's secrets, and every
//! verified event is durably in the inbox before `ingest_webhook` returns
//! `Accepted`; only then does the PSP get the adapter's ack, byte for byte.
//! A redelivery gets the same ack and is applied once (inbox dedupe). A
//! refusal is 401 (signature, timestamp) or 400 (malformed, unsupported),
//! changes nothing, is counted, and is logged by kind only: never a header,
//! the body or a signature. A verification the adapter runtime's bulkhead
//! sheds (the account's share of instances or CPU is used up) is a 503
//! `adapter_call_shed` with `Retry-After`: nothing was recorded, the PSP
//! delivers again.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use sluice_adapter_runtime::{AdapterError, Header, HttpResponse, WebhookRequest};
use sluice_orchestrator::{OrchestratorError, RejectionKind, WebhookOutcome};
use sluice_store::StoreError;

use crate::admin::valid_adapter_name;
use crate::error::{adapter_call_shed, ApiError, ErrorBody, ErrorType};
use crate::extract::{bytes_rejection, ApiPath};
use crate::limits::{limit_key, RateLimit, WebhookOutcomeLabel};
use crate::requests::looks_like_id;
use crate::MerchantApiState;

/// Receive a PSP webhook.
#[utoipa::path(
    post, path = "/webhooks/{adapter}/{connector_account}", tag = "webhooks",
    params(
        ("adapter" = String, Path, description = "The adapter's name"),
        ("connector_account" = String, Path, description = "The connector account id"),
    ),
    request_body(content = String, description = "The PSP's raw notification; verified by the adapter with the account's webhook secret", content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Verified and durably recorded: the adapter's acknowledgement, exactly as the PSP expects it (status, headers and body are the adapter's)"),
        (status = 400, description = "Malformed or unsupported; nothing changed", body = ErrorBody),
        (status = 401, description = "Bad signature or stale timestamp; nothing changed", body = ErrorBody),
        (status = 404, description = "No such adapter or connector account", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 429, description = "Too many webhooks for this account; retry after Retry-After", body = ErrorBody),
        (status = 503, description = "Not recorded (adapter or store unavailable); the PSP should deliver again", body = ErrorBody),
    )
)]
pub async fn receive(
    State(state): State<MerchantApiState>,
    ApiPath((adapter, account)): ApiPath<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let metrics = state.webhook_metrics();
    if !valid_adapter_name(&adapter) || !looks_like_id(&account) {
        metrics.count(WebhookOutcomeLabel::NotFound);
        return not_found();
    }
    if let Some(refused) = rate_limited(&state, &adapter, &account).await {
        return refused;
    }
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return bytes_rejection(rejection).into_response(),
    };
    let request = WebhookRequest {
        method: method.to_string(),
        path: uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| uri.path().to_owned()),
        headers: wit_headers(&headers),
        body: body.to_vec(),
    };
    let outcome = state
        .orchestrator
        .ingest_webhook(&adapter, &account, request)
        .await;
    match outcome {
        Ok(WebhookOutcome::Accepted { ack, receipts }) => {
            let duplicate = !receipts.is_empty() && receipts.iter().all(|r| r.duplicate);
            metrics.count(if duplicate {
                WebhookOutcomeLabel::Duplicate
            } else {
                WebhookOutcomeLabel::Accepted
            });
            tracing::info!(adapter = %adapter, connector_account = %account,
                events = receipts.len(), duplicate, "webhook accepted");
            ack_response(ack)
        }
        Ok(WebhookOutcome::Rejected { kind, .. }) => {
            metrics.count(rejection_label(kind));
            tracing::warn!(adapter = %adapter, connector_account = %account,
                reason = kind.as_str(), "webhook refused");
            rejected(kind)
        }
        Ok(WebhookOutcome::NotFound) => {
            metrics.count(WebhookOutcomeLabel::NotFound);
            not_found()
        }
        // The bulkhead refused the verification: nothing reached the inbox, so
        // a 503 with Retry-After makes the PSP deliver it again, and nothing is lost.
        Err(OrchestratorError::Adapter(shed @ AdapterError::Shed { .. })) => {
            metrics.count(WebhookOutcomeLabel::Shed);
            tracing::warn!(adapter = %adapter, connector_account = %account,
                "webhook not recorded: adapter call shed");
            adapter_call_shed(&shed).into_response()
        }
        Err(error) => {
            metrics.count(WebhookOutcomeLabel::Error);
            tracing::error!(adapter = %adapter, connector_account = %account, error = %error,
                "webhook not recorded");
            // Never a 2xx here: the PSP must deliver again.
            ApiError::unavailable(
                "webhook_not_recorded",
                "the webhook could not be recorded; deliver it again later",
            )
            .into_response()
        }
    }
}

/// Take a token from the account's bucket, under the account's own limit:
/// read from the account only when the bucket has none read within the
/// refresh interval, so a flood costs no read per webhook. None: go on.
async fn rate_limited(state: &MerchantApiState, adapter: &str, account: &str) -> Option<Response> {
    let limiter = state.webhook_limiter();
    let key = limit_key(adapter, account);
    let verdict = if limiter.has_fresh_limit(&key, Instant::now()) {
        limiter.check(&key, Instant::now())
    } else {
        match account_limit(state, adapter, account).await {
            Some(limit) => limiter.check_read(&key, limit, Instant::now()),
            None => limiter.check(&key, Instant::now()),
        }
    };
    let wait = verdict.err()?;
    state
        .webhook_metrics()
        .count(WebhookOutcomeLabel::RateLimited);
    if let Some(refused) = limiter.note_refusal(&key, Instant::now()) {
        tracing::warn!(adapter = %adapter, connector_account = %account, refused,
            "webhooks rate limited (count since the last line of this account)");
    }
    // A sender that comes straight back pays with its time, not our CPU.
    state.refusal_hold().wait().await;
    Some(
        ApiError::rate_limited(
            "too many webhooks for this connector account",
            wait.as_secs().max(1),
        )
        .into_response(),
    )
}

/// The webhook limit of `account` as its config sets it; the default for a
/// route that names no account of a loaded adapter (it is a 404 after the
/// check). None: the account could not be read now (the bucket keeps what it
/// has and the next webhook reads again).
async fn account_limit(
    state: &MerchantApiState,
    adapter: &str,
    account: &str,
) -> Option<RateLimit> {
    let default = state.webhook_limiter().default_limit();
    if state.orchestrator.runtime().active(adapter).is_none() {
        return Some(default);
    }
    match state.store.get_connector_account(account, None).await {
        Ok(found) if found.adapter == adapter => {
            Some(RateLimit::for_account(default, &found.config))
        }
        Ok(_) | Err(StoreError::NotFound { .. }) => Some(default),
        Err(error) => {
            tracing::warn!(adapter = %adapter, connector_account = %account, error = %error,
                "webhook limit of the account not read; the bucket keeps its limit");
            None
        }
    }
}

fn not_found() -> Response {
    ApiError::not_found("resource_missing", "no such adapter or connector account").into_response()
}

fn rejection_label(kind: RejectionKind) -> WebhookOutcomeLabel {
    match kind {
        RejectionKind::BadSignature => WebhookOutcomeLabel::RejectedBadSignature,
        RejectionKind::StaleTimestamp => WebhookOutcomeLabel::RejectedStaleTimestamp,
        RejectionKind::Malformed => WebhookOutcomeLabel::RejectedMalformed,
        RejectionKind::Unsupported => WebhookOutcomeLabel::RejectedUnsupported,
    }
}

/// The refusal says which check failed, not how: no detail that helps a forger.
fn rejected(kind: RejectionKind) -> Response {
    let status = StatusCode::from_u16(kind.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    let error_type = if status == StatusCode::UNAUTHORIZED {
        ErrorType::AuthenticationError
    } else {
        ErrorType::InvalidRequestError
    };
    let mut error = ApiError::new(
        status,
        error_type,
        format!("webhook_{}", kind.as_str()),
        format!(
            "the webhook was refused: {}",
            kind.as_str().replace('_', " ")
        ),
    );
    // A PSP is not a Bearer client: no WWW-Authenticate challenge.
    error.before_execution = true;
    let mut response = error.into_response();
    response
        .headers_mut()
        .remove(axum::http::header::WWW_AUTHENTICATE);
    response
}

/// Every header as the adapter contract carries them; a value that is not
/// UTF-8 cannot be part of a signature scheme we verify, so it is dropped.
fn wit_headers(headers: &HeaderMap) -> Vec<Header> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            value.to_str().ok().map(|value| Header {
                name: name.as_str().to_owned(),
                value: value.to_owned(),
            })
        })
        .collect()
}

/// The adapter's ack exactly: status, headers, body. A header the adapter
/// got wrong is dropped and logged (the events are already recorded, so the
/// PSP must still get its 2xx).
fn ack_response(ack: HttpResponse) -> Response {
    let status = StatusCode::from_u16(ack.status).unwrap_or_else(|_| {
        tracing::error!(
            status = ack.status,
            "adapter ack has an invalid status; sending 200"
        );
        StatusCode::OK
    });
    let mut response = (status, ack.body).into_response();
    let out = response.headers_mut();
    out.remove(axum::http::header::CONTENT_TYPE);
    for Header { name, value } in ack.headers {
        match (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            (Ok(name), Ok(value)) => {
                out.append(name, value);
            }
            _ => tracing::error!(header = %name, "adapter ack header is invalid; dropped"),
        }
    }
    response
}
