//! Admin API authentication: `Authorization: Bearer <admin token>`.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// The admin token, kept only as its SHA-256 so that comparing is constant-time regardless
/// of the length of what a caller sends.
#[derive(Clone)]
pub struct AdminAuth {
    token_hash: Option<[u8; 32]>,
}

impl AdminAuth {
    /// `None` disables the admin API: every call is refused.
    pub fn new(token: Option<&str>) -> Self {
        AdminAuth {
            token_hash: token.map(hash),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.token_hash.is_some()
    }

    /// Checks the request headers; the error says what is wrong without echoing the token.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(expected) = &self.token_hash else {
            return Err(ApiError::unauthorized(
                "admin_api_disabled",
                "the admin API is disabled: no admin token is configured (SLUICE_ADMIN_TOKEN)",
            ));
        };
        let Some(header) = headers.get(AUTHORIZATION) else {
            return Err(ApiError::unauthorized(
                "admin_token_missing",
                "missing Authorization: Bearer <admin token> header",
            ));
        };
        let presented = header
            .to_str()
            .ok()
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                ApiError::unauthorized(
                    "admin_token_missing",
                    "the Authorization header must be `Bearer <admin token>`",
                )
            })?;
        if bool::from(hash(presented).ct_eq(expected)) {
            Ok(())
        } else {
            Err(ApiError::unauthorized(
                "admin_token_invalid",
                "the admin token is not valid",
            ))
        }
    }
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Middleware guarding every `/admin` route.
pub async fn require_admin(
    State(auth): State<AdminAuth>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    auth.check(request.headers())?;
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(authorization).unwrap());
        headers
    }

    fn code(result: Result<(), ApiError>) -> String {
        result.unwrap_err().detail.code
    }

    #[test]
    fn the_configured_token_is_accepted() {
        let auth = AdminAuth::new(Some("correct-horse-battery-staple"));
        assert!(auth
            .check(&headers("Bearer correct-horse-battery-staple"))
            .is_ok());
    }

    #[test]
    fn a_wrong_or_prefix_token_is_refused() {
        let auth = AdminAuth::new(Some("correct-horse-battery-staple"));
        assert_eq!(
            code(auth.check(&headers("Bearer correct-horse"))),
            "admin_token_invalid"
        );
        assert_eq!(
            code(auth.check(&headers("Bearer correct-horse-battery-staple-x"))),
            "admin_token_invalid"
        );
    }

    #[test]
    fn a_missing_header_or_other_scheme_is_refused() {
        let auth = AdminAuth::new(Some("correct-horse-battery-staple"));
        assert_eq!(code(auth.check(&HeaderMap::new())), "admin_token_missing");
        assert_eq!(
            code(auth.check(&headers("Basic correct-horse-battery-staple"))),
            "admin_token_missing"
        );
    }

    #[test]
    fn without_a_configured_token_everything_is_refused() {
        let auth = AdminAuth::new(None);
        assert_eq!(code(auth.check(&headers("Bearer "))), "admin_api_disabled");
        assert_eq!(
            code(auth.check(&headers("Bearer anything"))),
            "admin_api_disabled"
        );
    }
}
