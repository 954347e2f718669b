//! `/healthz` (the process is alive) and `/readyz` (it can serve traffic).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::app::AppState;

/// How long a readiness probe waits for the database.
const DATABASE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Health {
    pub status: String,
}

/// `GET /healthz`: the process is alive.
#[utoipa::path(
    get, path = "/healthz", tag = "health",
    responses((status = 200, description = "The process is alive", body = Health))
)]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Readiness, with what is not ready yet.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: String,
    /// Whether start-up loading of adapters has finished.
    pub adapters_loaded: bool,
    /// Number of adapters with an active version.
    pub active_adapters: usize,
    /// Whether the database answered a round trip.
    pub database: bool,
}

/// `GET /readyz`: 200 when adapters are loaded and the database answers, 503 otherwise.
#[utoipa::path(
    get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready to serve traffic", body = Readiness),
        (status = 503, description = "Not ready yet (adapters loading, or the database does not answer)", body = Readiness),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let adapters_loaded = state.adapters_loaded();
    let database = matches!(
        tokio::time::timeout(DATABASE_PROBE_TIMEOUT, state.store.ping()).await,
        Ok(Ok(()))
    );
    let ready = adapters_loaded && database;
    let readiness = Readiness {
        status: if ready { "ready" } else { "not_ready" }.into(),
        adapters_loaded,
        active_adapters: state.active_adapter_count(),
        database,
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness))
}
