//! The HTTP application: shared state and the router.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::{middleware, Router};
use sluice_store::Store;
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::adapters::AdapterManager;
use crate::auth::{require_admin, AdminAuth};
use crate::error::ApiError;
use crate::{admin, console, health, releases};

/// Largest adapter component the admin API accepts.
pub const MAX_ADAPTER_UPLOAD_BYTES: usize = 32 * 1024 * 1024;
/// Largest body of every other endpoint.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// State shared by every handler. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub auth: AdminAuth,
    pub adapters: Arc<AdapterManager>,
    pub store: Store,
    /// For what the payment path knows of adapter releases (shadow and canary tallies).
    pub orchestrator: sluice_orchestrator::Orchestrator,
    adapters_loaded: Arc<AtomicBool>,
}

impl AppState {
    pub fn new(
        auth: AdminAuth,
        adapters: Arc<AdapterManager>,
        store: Store,
        orchestrator: sluice_orchestrator::Orchestrator,
    ) -> Self {
        AppState {
            auth,
            adapters,
            store,
            orchestrator,
            adapters_loaded: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether start-up loading of adapters has finished.
    pub fn adapters_loaded(&self) -> bool {
        self.adapters_loaded.load(Ordering::Acquire)
    }

    pub fn mark_adapters_loaded(&self) {
        self.adapters_loaded.store(true, Ordering::Release);
    }

    pub fn active_adapter_count(&self) -> usize {
        self.adapters.active_count()
    }
}

/// The adapter admin API (`/admin/adapters...`), with its OpenAPI description.
fn adapter_admin_routes() -> OpenApiRouter<AppState> {
    let upload = OpenApiRouter::new()
        .routes(routes!(admin::show, admin::upload))
        .layer(DefaultBodyLimit::max(MAX_ADAPTER_UPLOAD_BYTES));
    OpenApiRouter::new()
        .routes(routes!(admin::list))
        .merge(upload)
        .routes(routes!(admin::activate))
        .routes(routes!(admin::rollback))
        .routes(routes!(
            releases::stage_shadow,
            releases::clear_shadow,
            releases::shadow_report
        ))
        .routes(routes!(
            releases::start_canary,
            releases::stop_canary,
            releases::canary_report
        ))
}

fn health_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
}

/// The operations console's files (no data in them: served without credentials).
fn console_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(console::page))
        .routes(routes!(console::script))
        .routes(routes!(console::stylesheet))
}

/// The OpenAPI description of [`router`]'s routes.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, doc) = OpenApiRouter::new()
        .merge(health_routes())
        .merge(console_routes())
        .merge(adapter_admin_routes())
        .split_for_parts();
    doc
}

/// The whole HTTP surface.
pub fn router(state: AppState) -> Router {
    let (admin, _) = adapter_admin_routes().split_for_parts();
    let admin = admin.route_layer(middleware::from_fn_with_state(
        state.auth.clone(),
        require_admin,
    ));
    let (health, _) = health_routes().split_for_parts();
    let (console, _) = console_routes().split_for_parts();

    Router::new()
        .merge(health)
        .merge(console)
        .merge(admin)
        .fallback(|| async { ApiError::route_not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
