//! The gateway's one OpenAPI document, served at `/openapi.json`: the
//! merchant API's routes (`sluice-merchant-api`) with the descriptions of
//! every other route the server mounts: health (`/healthz`, `/readyz`,
//! `/metrics`), the adapter admin API (`/admin/adapters...`) and the delivery
//! admin routes (`/admin/merchants/{id}/webhook-endpoints`,
//! `/admin/deliveries/...`). Every route is registered through a
//! `utoipa_axum` router, so a handler and its description are registered
//! together; `tests/server/openapi.rs` checks that every documented
//! operation is routed, that no route is registered any other way, and that
//! `docs/openapi.json` is this document.

use utoipa::openapi::OpenApi;

/// The document of every route [`crate::server::start`] serves.
pub fn document() -> OpenApi {
    sluice_merchant_api::openapi_with(vec![
        crate::app::openapi(),
        crate::payment_services::metrics_openapi(),
        sluice_delivery::admin_openapi(),
    ])
}
