//! The one JSON error shape of every HTTP endpoint:
//! `{"error": {"type": "...", "code": "...", "message": "...", "param": null}}`.
//!
//! The same shape (and the same type names) as `sluice-server`'s admin API, so a
//! client parses every error of the gateway the same way.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sluice_adapter_runtime::AdapterError;
use sluice_orchestrator::OrchestratorError;
use sluice_store::StoreError;
use utoipa::ToSchema;

/// The broad class of an error; clients branch on `type`, then on `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    /// The request is malformed, refers to something that does not exist, or
    /// is not allowed in the resource's current state.
    InvalidRequestError,
    /// Missing, wrong or revoked credentials.
    AuthenticationError,
    /// An `Idempotency-Key` was reused with other parameters, or is in use.
    IdempotencyError,
    /// Too many requests; retry after the time in `Retry-After`.
    RateLimitError,
    /// Something went wrong on our side; the request may be retried.
    ApiError,
}

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: ErrorType,
    /// A stable, machine-readable code, e.g. `amount_exceeds_refundable`.
    pub code: String,
    /// A human-readable explanation. Never contains secrets.
    pub message: String,
    /// The request parameter the error is about, when there is one.
    pub param: Option<String>,
}

/// Marks a response produced before the endpoint started executing (input
/// validation, authentication): the idempotency layer does not store it, so a
/// corrected retry with the same key is not refused (Stripe semantics).
#[derive(Debug, Clone, Copy)]
pub struct NotExecuted;

/// An error that renders as the JSON error shape with its HTTP status.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub detail: ErrorDetail,
    /// True when raised before the endpoint did anything (see [`NotExecuted`]).
    pub before_execution: bool,
    /// Seconds for a `Retry-After` header (rate limits).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        kind: ErrorType,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            detail: ErrorDetail {
                kind,
                code: code.into(),
                message: message.into(),
                param: None,
            },
            before_execution: false,
            retry_after: None,
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.detail.param = Some(param.into());
        self
    }

    /// See [`NotExecuted`].
    pub fn before_execution(mut self) -> Self {
        self.before_execution = true;
        self
    }

    /// A 400 for input that fails validation; never stored for idempotent replay.
    pub fn invalid(code: &str, param: &str, message: impl Into<String>) -> Self {
        Self::bad_request(code, message)
            .with_param(param)
            .before_execution()
    }

    /// A 404 for something a well-formed request names that does not exist
    /// (e.g. no connector account can serve it); nothing was written.
    pub fn missing(code: &str, param: &str, message: impl Into<String>) -> Self {
        Self::not_found(code, message)
            .with_param(param)
            .before_execution()
    }

    /// A 409 for a well-formed request that the current state (of the
    /// resource, or of the merchant's configuration) does not allow;
    /// nothing was written.
    pub fn state_conflict(code: &str, param: &str, message: impl Into<String>) -> Self {
        Self::conflict(code, message)
            .with_param(param)
            .before_execution()
    }

    pub fn bad_request(code: &str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequestError,
            code,
            message,
        )
    }

    pub fn not_found(code: &str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorType::InvalidRequestError,
            code,
            message,
        )
    }

    pub fn conflict(code: &str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            ErrorType::InvalidRequestError,
            code,
            message,
        )
    }

    pub fn unauthorized(code: &str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            ErrorType::AuthenticationError,
            code,
            message,
        )
        .before_execution()
    }

    pub fn idempotency(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self::new(status, ErrorType::IdempotencyError, code, message).before_execution()
    }

    pub fn rate_limited(message: impl Into<String>, retry_after_secs: u64) -> Self {
        let mut error = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorType::RateLimitError,
            "rate_limited",
            message,
        )
        .before_execution();
        error.retry_after = Some(retry_after_secs.max(1));
        error
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorType::ApiError,
            "internal_error",
            message,
        )
    }

    pub fn unavailable(code: &str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::ApiError,
            code,
            message,
        )
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.detail.clone(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status, self.detail.code, self.detail.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = crate::views::json_bytes(&self.body());
        let mut response = (
            self.status,
            [(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
        }
        if let Some(secs) = self.retry_after {
            headers.insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.before_execution {
            response.extensions_mut().insert(NotExecuted);
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        store_error(error)
    }
}

/// How a store error is shown to a merchant. Conditions the merchant can act
/// on are 4xx with a clear message; anything else is a 5xx whose details stay
/// in the log. A 400 means the request itself is malformed (the OpenAPI
/// document says so); a request the document allows but the resource's
/// current state does not (more than is refundable, another currency) is a
/// 409.
pub fn store_error(error: StoreError) -> ApiError {
    let message = error.to_string();
    match error {
        StoreError::NotFound { entity, key } => {
            ApiError::not_found("resource_missing", format!("no such {entity}: {key}"))
        }
        StoreError::Conflict(_) => ApiError::conflict("conflict", message),
        StoreError::InsufficientRefundable { .. } => {
            ApiError::conflict("amount_exceeds_refundable", message).with_param("amount")
        }
        StoreError::InsufficientCapturable { .. } => {
            ApiError::conflict("amount_exceeds_capturable", message).with_param("amount")
        }
        StoreError::AttemptInFlight { .. } => ApiError::conflict("attempt_in_flight", message),
        StoreError::InvalidState { .. } => ApiError::conflict("payment_state_invalid", message),
        StoreError::CasExhausted { .. } => ApiError::conflict(
            "lock_timeout",
            "the payment is being changed by another request; retry shortly",
        ),
        StoreError::IdempotencyMismatch => {
            ApiError::idempotency(StatusCode::BAD_REQUEST, "idempotency_key_reused", message)
        }
        StoreError::InvalidRequest(_) => ApiError::bad_request("invalid_request", message),
        StoreError::Database(sqlx_error) if is_overload(&sqlx_error) => {
            tracing::warn!(error = %sqlx_error, "database overloaded");
            ApiError::unavailable("service_unavailable", "the database is busy; retry shortly")
        }
        other => {
            tracing::error!(error = %other, "store error");
            ApiError::internal("an internal error occurred; it has been logged")
        }
    }
}

impl From<OrchestratorError> for ApiError {
    fn from(error: OrchestratorError) -> Self {
        orchestrator_error(error)
    }
}

/// How an orchestrator refusal or failure is shown. The same codes and
/// messages as [`store_error`] for the same condition, so a client sees one
/// vocabulary whichever layer noticed.
pub fn orchestrator_error(error: OrchestratorError) -> ApiError {
    let message = error.to_string();
    match error {
        OrchestratorError::NotFound { entity, id } => {
            ApiError::not_found("resource_missing", format!("no such {entity}: {id}"))
        }
        // Another tenant's aggregate: indistinguishable from a missing one,
        // so references cannot be probed across accounts.
        OrchestratorError::OutOfScope(_) => {
            ApiError::not_found("resource_missing", "no such resource in this account")
        }
        OrchestratorError::Conflict(_) => ApiError::conflict("conflict", message),
        OrchestratorError::AttemptInFlight { .. } => {
            ApiError::conflict("attempt_in_flight", message)
        }
        OrchestratorError::InvalidState(_) => ApiError::conflict("payment_state_invalid", message),
        OrchestratorError::InsufficientRefundable { .. } => {
            ApiError::conflict("amount_exceeds_refundable", message).with_param("amount")
        }
        OrchestratorError::InsufficientCapturable { .. } => {
            ApiError::conflict("amount_exceeds_capturable", message).with_param("amount")
        }
        OrchestratorError::InvalidRequest(_) => ApiError::bad_request("invalid_request", message),
        OrchestratorError::Route(refusal) => route_refusal(&refusal),
        OrchestratorError::OrderNoConflict { .. } => {
            ApiError::conflict("merchant_order_no_conflict", message)
                .with_param("merchant_order_no")
        }
        OrchestratorError::Busy(_) => ApiError::conflict(
            "lock_timeout",
            "the payment is being changed by another request; retry shortly",
        ),
        OrchestratorError::AdapterNotLoaded(_) => {
            tracing::error!(error = %message, "adapter not loaded");
            ApiError::unavailable("adapter_unavailable", message)
        }
        OrchestratorError::Adapter(shed @ AdapterError::Shed { .. }) => adapter_call_shed(&shed),
        OrchestratorError::Adapter(_) => {
            tracing::error!(error = %message, "adapter call failed");
            ApiError::unavailable(
                "adapter_unavailable",
                "the PSP adapter failed for this call; retry later",
            )
        }
        OrchestratorError::FulfillmentRefused(refusal) => fulfillment_refusal(&refusal),
        OrchestratorError::Store(store) => store_error(store),
    }
}

/// The adapter runtime's bulkhead refused a call before it ran (the connector
/// account's share of the adapter instances is taken, or its CPU budget is used
/// up): nothing happened, at the PSP or here. 503 with `Retry-After`; a PSP
/// delivers its webhook again, a merchant retries its request (a payment whose
/// request was never built stays as it was, and recovery takes it up again).
pub fn adapter_call_shed(error: &AdapterError) -> ApiError {
    tracing::warn!(error = %error, "adapter call shed");
    let mut api = ApiError::unavailable(
        "adapter_call_shed",
        format!("{error}; nothing was done, retry after the time in Retry-After"),
    );
    api.retry_after = error.retry_after_secs();
    api
}

/// No connector account of the merchant can serve the payment; nothing was
/// written, so the answer is never stored for an idempotent replay.
pub fn route_refusal(refusal: &sluice_orchestrator::RouteRefusal) -> ApiError {
    use sluice_orchestrator::RouteRefusal as R;
    let message = refusal.to_string();
    let param = refusal.param();
    match refusal {
        R::UnknownAccount => ApiError::not_found("resource_missing", message)
            .with_param(param)
            .before_execution(),
        R::Disabled(_) => ApiError::state_conflict("connector_account_disabled", param, message),
        // The payment exists; the merchant's configuration cannot serve it.
        R::NoMatch { .. } => ApiError::state_conflict("no_route", param, message),
        R::Ambiguous { .. } => ApiError::state_conflict("route_ambiguous", param, message),
        // Paused or breaker open: the message names each account and why.
        R::AllSkipped(_) => ApiError::state_conflict("no_eligible_route", param, message),
    }
}

/// A refused fulfillment confirmation. The message always says what
/// happened to the money (returned, being returned, or not moved).
pub fn fulfillment_refusal(refusal: &sluice_core::FulfillmentRefusal) -> ApiError {
    use sluice_core::FulfillmentRefusal as R;
    let message = refusal.to_string();
    match refusal {
        R::UnknownAttempt { .. } => {
            ApiError::state_conflict("fulfillment_attempt_unknown", "attempt_reference", message)
        }
        R::RefundInProgress { .. } => {
            ApiError::conflict("fulfillment_compensation_in_progress", message)
        }
        R::Refunded { .. } => ApiError::conflict("fulfillment_refunded", message),
        R::UnderReview(_) => ApiError::conflict("fulfillment_under_review", message),
        R::AlreadyFulfilled { .. } => ApiError::conflict("fulfillment_already_fulfilled", message),
        R::PaymentNotSucceeded => ApiError::conflict(
            "payment_not_succeeded",
            format!("{message}; no money was taken, so nothing can be fulfilled"),
        ),
        _ => ApiError::conflict("fulfillment_state_invalid", message),
    }
}

fn is_overload(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_serialises_to_the_documented_shape() {
        let error =
            ApiError::bad_request("amount_invalid", "amount must be positive").with_param("amount");
        let json = serde_json::to_value(error.body()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "error": {
                    "type": "invalid_request_error",
                    "code": "amount_invalid",
                    "message": "amount must be positive",
                    "param": "amount"
                }
            })
        );
    }

    #[test]
    fn a_missing_and_a_foreign_payment_read_exactly_alike() {
        let missing = store_error(StoreError::NotFound {
            entity: "payment",
            key: "pay_1".into(),
        });
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        assert_eq!(missing.detail.message, "no such payment: pay_1");
    }

    #[test]
    fn a_shed_adapter_call_is_a_503_with_retry_after_in_the_one_error_shape() {
        let shed = AdapterError::Shed {
            reason: sluice_adapter_runtime::ShedReason::CpuBudget,
            retry_after_ms: 1_500,
        };
        let error = orchestrator_error(OrchestratorError::Adapter(shed));
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error.detail.code, "adapter_call_shed");
        assert_eq!(error.detail.kind, ErrorType::ApiError);
        let response = error.into_response();
        assert_eq!(response.headers()[axum::http::header::RETRY_AFTER], "2");
        let other = orchestrator_error(OrchestratorError::Adapter(AdapterError::Timeout));
        assert_eq!(other.detail.code, "adapter_unavailable");
        assert_eq!(other.retry_after, None);
    }

    #[test]
    fn validation_errors_are_marked_as_not_executed() {
        let response = ApiError::invalid("amount_invalid", "amount", "no").into_response();
        assert!(response.extensions().get::<NotExecuted>().is_some());
        let response = ApiError::conflict("conflict", "taken").into_response();
        assert!(response.extensions().get::<NotExecuted>().is_none());
    }
}
