//! The OpenAPI 3 document, generated from the handlers' annotations and
//! served at `/openapi.json`. A copy is committed at `docs/openapi.json`; a
//! test fails when the two differ (`SLUICE_UPDATE_OPENAPI=1 cargo test -p
//! sluice-merchant-api --test openapi` rewrites the copy).

use std::sync::{Arc, OnceLock};

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{InfoBuilder, OpenApi, OpenApiBuilder};

/// Title, version and the two security schemes the paths refer to.
pub fn base() -> OpenApi {
    let mut doc = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("Sluice merchant API")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Payments, captures, voids and refunds through one API. Every POST accepts an \
                     Idempotency-Key. Every error has the shape \
                     {\"error\": {\"type\", \"code\", \"message\", \"param\"}}. Amounts are integer \
                     minor units; times are unix milliseconds.",
                ))
                .build(),
        )
        .build();
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "api_key",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("A merchant API key"))
                .build(),
        ),
    );
    components.add_security_scheme(
        "admin_token",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("The gateway's admin token"))
                .build(),
        ),
    );
    doc
}

/// The document as served (pretty JSON with a final newline), built once.
pub fn served_json() -> Arc<String> {
    static SPEC: OnceLock<Arc<String>> = OnceLock::new();
    SPEC.get_or_init(|| {
        let text = crate::openapi().to_pretty_json().unwrap_or_else(|e| {
            tracing::error!(error = %e, "OpenAPI document does not serialise");
            "{}".to_owned()
        });
        Arc::new(format!("{text}\n"))
    })
    .clone()
}

pub fn json_response(spec: &Arc<String>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        spec.as_str().to_owned(),
    )
        .into_response()
}
