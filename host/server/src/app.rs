//! The HTTP application: shared state and the router.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{middleware, Router};
use sluice_store::Store;
use tower_http::trace::TraceLayer;

use crate::adapters::AdapterManager;
use crate::auth::{require_admin, AdminAuth};
use crate::error::ApiError;
use crate::{admin, health};

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
    adapters_loaded: Arc<AtomicBool>,
}

impl AppState {
    pub fn new(auth: AdminAuth, adapters: Arc<AdapterManager>, store: Store) -> Self {
        AppState {
            auth,
            adapters,
            store,
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

/// The whole HTTP surface.
pub fn router(state: AppState) -> Router {
    let admin = Router::new()
        .route("/adapters", get(admin::list))
        .route(
            "/adapters/{name}",
            get(admin::show)
                .put(admin::upload)
                .layer(DefaultBodyLimit::max(MAX_ADAPTER_UPLOAD_BYTES)),
        )
        .route("/adapters/{name}/activate", post(admin::activate))
        .route("/adapters/{name}/rollback", post(admin::rollback))
        .route_layer(middleware::from_fn_with_state(
            state.auth.clone(),
            require_admin,
        ));

    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .nest("/admin", admin)
        .fallback(|| async { ApiError::route_not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
