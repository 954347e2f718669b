//! Request extractors that turn every malformed input into the JSON error
//! shape (never axum's plain-text rejections), with the offending parameter
//! named where serde can tell.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, ErrorType};

/// A JSON body that must be present.
pub struct ApiJson<T>(pub T);

/// A JSON body that may be absent (an empty body means `T::default()`), for
/// endpoints whose parameters are all optional (`/confirm`, `/refunds`, ...).
pub struct OptionalJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (headers, bytes) = body_bytes(req, state).await?;
        if bytes.is_empty() {
            return Err(ApiError::invalid(
                "body_missing",
                "body",
                "this endpoint needs a JSON object body",
            ));
        }
        require_json_content_type(&headers)?;
        parse_json(&bytes).map(ApiJson)
    }
}

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Default,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (headers, bytes) = body_bytes(req, state).await?;
        if bytes.is_empty() {
            return Ok(OptionalJson(T::default()));
        }
        require_json_content_type(&headers)?;
        parse_json(&bytes).map(OptionalJson)
    }
}

async fn body_bytes<S: Send + Sync>(
    req: Request,
    state: &S,
) -> Result<(HeaderMap, Bytes), ApiError> {
    let headers = req.headers().clone();
    let bytes = Bytes::from_request(req, state)
        .await
        .map_err(bytes_rejection)?;
    Ok((headers, bytes))
}

/// Only `application/json` (with optional parameters such as charset).
pub fn require_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let is_json = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
        .unwrap_or(false);
    if is_json {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorType::InvalidRequestError,
            "unsupported_media_type",
            "the request body must be JSON with Content-Type: application/json",
        )
        .before_execution())
    }
}

/// Parse a JSON body, naming the field that is wrong. Only an object is a
/// body: serde would otherwise fill a struct from an array, by position.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return Err(
            ApiError::bad_request("invalid_body", "the body must be a JSON object")
                .before_execution(),
        );
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        json_error(&inner, &path)
    })?;
    de.end().map_err(|e| json_error(&e, "."))?;
    Ok(value)
}

fn json_error(error: &serde_json::Error, path: &str) -> ApiError {
    use serde_json::error::Category;
    let message = error.to_string();
    match error.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::bad_request(
            "invalid_json",
            format!("the body is not valid JSON: {message}"),
        )
        .before_execution(),
        Category::Data => {
            let param = unknown_field(&message)
                .map(|field| join_path(path, &field))
                .or_else(|| (path != ".").then(|| path.to_owned()));
            let code = if message.starts_with("unknown field") {
                "unknown_parameter"
            } else if message.starts_with("missing field") {
                "parameter_missing"
            } else {
                "parameter_invalid"
            };
            let mut err = ApiError::bad_request(code, message).before_execution();
            err.detail.param = param;
            err
        }
    }
}

/// serde reports "unknown field `name`, expected ...", "missing field `name`"
/// and "duplicate field `name`" with the parent's path only.
fn unknown_field(message: &str) -> Option<String> {
    let rest = ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))?;
    rest.split_once('`').map(|(field, _)| field.to_owned())
}

/// The path serde_path_to_error reports ends at the field for unknown fields
/// and at the parent for missing ones.
fn join_path(parent: &str, field: &str) -> String {
    if parent == field || parent.ends_with(&format!(".{field}")) {
        parent.to_owned()
    } else if parent == "." || parent.is_empty() {
        field.to_owned()
    } else {
        format!("{parent}.{field}")
    }
}

pub fn bytes_rejection(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        body_too_large()
    } else {
        ApiError::bad_request("invalid_body", rejection.body_text()).before_execution()
    }
}

pub fn body_too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorType::InvalidRequestError,
        "body_too_large",
        format!(
            "the request body exceeds the limit of {} bytes",
            crate::MAX_BODY_BYTES
        ),
    )
    .before_execution()
}

/// Path parameters; a malformed path is a 400 in the JSON shape.
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| ApiPath(v))
            .map_err(|e: PathRejection| {
                ApiError::bad_request("invalid_path", e.body_text()).before_execution()
            })
    }
}

/// Query parameters; unknown or malformed ones are a 400 in the JSON shape.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(|e: QueryRejection| {
                let message = e.body_text();
                let param = message
                    .split_once("unknown field `")
                    .and_then(|(_, rest)| rest.split_once('`'))
                    .map(|(field, _)| field.to_owned());
                let mut err = ApiError::bad_request("invalid_query", message).before_execution();
                err.detail.param = param;
                err
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        amount: i64,
        inner: Option<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        mode: String,
    }

    fn err(body: &str) -> ApiError {
        parse_json::<Body>(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn unknown_fields_are_named_with_their_path() {
        let e = err(r#"{"amount": 1, "amont": 2}"#);
        assert_eq!(e.detail.code, "unknown_parameter");
        assert_eq!(e.detail.param.as_deref(), Some("amont"));
        let e = err(r#"{"amount": 1, "inner": {"mode": "x", "extra": 1}}"#);
        assert_eq!(e.detail.param.as_deref(), Some("inner.extra"));
    }

    #[test]
    fn overflowing_and_fractional_amounts_name_the_amount() {
        for body in [
            r#"{"amount": 99999999999999999999}"#,
            r#"{"amount": 10.5}"#,
            r#"{"amount": "10"}"#,
        ] {
            let e = err(body);
            assert_eq!(e.detail.code, "parameter_invalid", "{body}");
            assert_eq!(e.detail.param.as_deref(), Some("amount"), "{body}");
        }
    }

    #[test]
    fn an_array_is_not_taken_for_a_struct() {
        assert_eq!(err("[1, null]").detail.code, "invalid_body");
        assert_eq!(err(" 1").detail.code, "invalid_body");
    }

    #[test]
    fn syntax_errors_and_trailing_garbage_are_invalid_json() {
        assert_eq!(err(r#"{"amount": 1"#).detail.code, "invalid_json");
        assert_eq!(err(r#"{"amount": 1} x"#).detail.code, "invalid_json");
        assert_eq!(err("").detail.code, "invalid_json");
    }
}
