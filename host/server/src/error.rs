//! The one JSON error shape of every HTTP endpoint:
//! `{"error": {"type": "...", "code": "...", "message": "...", "param": null}}`.

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

/// The broad class of an error; clients branch on `type`, then on `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    /// The request is malformed or refers to something that does not exist.
    InvalidRequestError,
    /// Missing or wrong credentials.
    AuthenticationError,
    /// Something went wrong on our side; the request may be retried.
    ApiError,
}

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: ErrorType,
    /// A stable, machine-readable code, e.g. `adapter_rejected`.
    pub code: String,
    /// A human-readable explanation. Never contains secrets.
    pub message: String,
    /// The request parameter the error is about, when there is one.
    pub param: Option<String>,
}

/// An error that renders as the JSON error shape with its HTTP status.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub detail: ErrorDetail,
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
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.detail.param = Some(param.into());
        self
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

    pub fn unprocessable(code: &str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
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

    pub fn route_not_found() -> Self {
        Self::not_found("route_not_found", "no such endpoint")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorType::InvalidRequestError,
            "method_not_allowed",
            "this endpoint does not accept that HTTP method",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: self.detail };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorType::InvalidRequestError,
                "body_too_large",
                format!(
                    "the request body exceeds the limit of {} bytes",
                    crate::app::MAX_BODY_BYTES
                ),
            );
        }
        let code = match &rejection {
            JsonRejection::MissingJsonContentType(_) => "unsupported_media_type",
            JsonRejection::JsonSyntaxError(_) => "invalid_json",
            JsonRejection::JsonDataError(_) => "invalid_body",
            _ => "invalid_body",
        };
        let status = match code {
            "unsupported_media_type" => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(
            status,
            ErrorType::InvalidRequestError,
            code,
            rejection.body_text(),
        )
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorType::InvalidRequestError,
                "body_too_large",
                format!(
                    "the request body exceeds the limit of {} bytes",
                    crate::app::MAX_ADAPTER_UPLOAD_BYTES
                ),
            )
        } else {
            ApiError::bad_request("invalid_body", rejection.body_text())
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::bad_request("invalid_query", rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::bad_request("invalid_path", rejection.body_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_serialises_to_the_documented_shape() {
        let error = ApiError::unprocessable("adapter_rejected", "describe() trapped");
        let json = serde_json::to_value(ErrorBody {
            error: error.detail,
        })
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "error": {
                    "type": "invalid_request_error",
                    "code": "adapter_rejected",
                    "message": "describe() trapped",
                    "param": null
                }
            })
        );
    }

    #[test]
    fn unauthorized_responses_carry_a_bearer_challenge() {
        let response = ApiError::unauthorized("admin_token_missing", "no token").into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response.headers().get("www-authenticate").unwrap(),
            "Bearer"
        );
    }
}
