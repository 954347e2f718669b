//! The operations console (issue 16): a page, a script and a stylesheet under
//! `/console`, compiled into the binary (no front-end build step).
//!
//! The files hold no data, so they are served without credentials; the
//! script fetches everything from the admin API with the admin token and the
//! operator's key the person types in (kept in the tab's sessionStorage, sent
//! as headers, never in a URL). Every action is a call of an existing admin
//! route: the console has no door of its own. The headers make the page
//! strict: a Content-Security-Policy that allows only these same-origin files
//! and same-origin API calls (no inline script or style, no framing), no
//! MIME sniffing, no referrer, no caching.

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../console/index.html");
const CONSOLE_JS: &str = include_str!("../console/console.js");
const CONSOLE_CSS: &str = include_str!("../console/console.css");

/// Same-origin files and API calls only; nothing inline, nothing framed.
pub const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
            ),
            (X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
            (CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

/// `GET /console`: the console's page. It holds no data; sign in on it.
#[utoipa::path(
    get, path = "/console", tag = "console",
    responses((status = 200, description = "The operations console (HTML)", content_type = "text/html; charset=utf-8", body = String))
)]
pub async fn page() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /console/console.js`: the console's script.
#[utoipa::path(
    get, path = "/console/console.js", tag = "console",
    responses((status = 200, description = "The console's script", content_type = "text/javascript; charset=utf-8", body = String))
)]
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", CONSOLE_JS)
}

/// `GET /console/console.css`: the console's stylesheet.
#[utoipa::path(
    get, path = "/console/console.css", tag = "console",
    responses((status = 200, description = "The console's stylesheet", content_type = "text/css; charset=utf-8", body = String))
)]
pub async fn stylesheet() -> Response {
    asset("text/css; charset=utf-8", CONSOLE_CSS)
}
