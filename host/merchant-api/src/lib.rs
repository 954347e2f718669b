//! Sluice's merchant HTTP API (`/v1/...`), the PSP webhook route
//! (`/webhooks/{adapter}/{connector_account}`), merchant administration
//! (`/admin/merchants...`), operator review (`/admin/operators`,
//! `/admin/review/...`: two-person resolutions, see [`review`]) and the
//! OpenAPI document (`/openapi.json`).
//!
//! The binary (`sluice-server`) mounts [`router`] and [`admin_router`]; this
//! crate owns no listener, config file or background task.
//!
//! Layers of a `/v1` request, outermost first: a span carrying `merchant` and
//! `payment_id` → [`auth::require_merchant`] (Bearer API key) →
//! [`idempotency::idempotency`] (POST only) → the handler. Every error, from
//! any layer or extractor, is the one JSON shape of [`error::ErrorBody`].

pub mod admin;
pub mod auth;
pub mod error;
pub mod evidence;
pub mod extract;
pub mod fulfillment_admin;
pub mod health_admin;
pub mod idempotency;
pub mod limits;
pub mod openapi;
pub mod operations;
pub mod payments;
pub mod payments_admin;
pub mod reconciliation_admin;
pub mod requests;
pub mod review;
pub mod routing_admin;
pub mod secrets_admin;
pub mod views;
pub mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::Route;
use axum::Router;
use sluice_orchestrator::Orchestrator;
use sluice_store::{ApiKeyPepper, Store, StoreError};
use tower::{Layer, Service};
use tracing::Instrument;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::limits::{KeyedRateLimiter, RateLimit, RefusalHold, WebhookMetrics};

/// Largest request body of a `/v1` or `/admin` endpoint.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest webhook body accepted (an Adyen batch of 100 items fits easily).
pub const MAX_WEBHOOK_BODY_BYTES: usize = 256 * 1024;
/// How long idempotency keys live before [`prune_idempotency_keys`] removes them.
pub const IDEMPOTENCY_KEY_TTL: Duration = Duration::from_secs(24 * 3600);

/// Tunables of the API.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// How long a running request holds its idempotency key before a retry
    /// may take it over (a crashed instance must not block the key forever).
    /// Longer than any request can run.
    pub idempotency_lease_ms: i64,
    /// Per `adapter/connector_account` rate limit of the webhook route, for
    /// accounts without their own (config keys `webhook_burst`,
    /// `webhook_per_second`, see [`limits::RateLimit::for_account`]).
    pub webhook_rate_limit: RateLimit,
    /// How long the webhook route uses an account's limit before reading the
    /// account again: a change made through another gateway instance takes
    /// effect here within it (one made here does at once).
    pub webhook_limit_refresh: Duration,
    /// How long a webhook refused by its account's limit waits for its 429 (at
    /// most [`limits::MAX_HELD_REFUSALS`] at once; see [`limits::RefusalHold`]).
    pub webhook_refusal_hold: Duration,
    /// The recovery scanner's policy, so the timeline's `next` says what
    /// the scanner will do (the server passes the scanner's own).
    pub recovery_policy: sluice_core::RecoveryPolicy,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            idempotency_lease_ms: 5 * 60 * 1000,
            webhook_rate_limit: RateLimit::default(),
            webhook_limit_refresh: limits::WEBHOOK_LIMIT_REFRESH,
            webhook_refusal_hold: limits::REFUSAL_HOLD,
            recovery_policy: sluice_core::RecoveryPolicy::default(),
        }
    }
}

/// State shared by every handler. Cheap to clone.
#[derive(Clone)]
pub struct MerchantApiState {
    pub store: Store,
    pub orchestrator: Orchestrator,
    pub pepper: ApiKeyPepper,
    pub config: Arc<ApiConfig>,
    webhook_metrics: Arc<WebhookMetrics>,
    webhook_limiter: Arc<KeyedRateLimiter>,
    refusal_hold: Arc<RefusalHold>,
}

impl MerchantApiState {
    /// The API over the orchestrator's store.
    pub fn new(orchestrator: Orchestrator, pepper: ApiKeyPepper) -> Self {
        Self::with_config(orchestrator, pepper, ApiConfig::default())
    }

    pub fn with_config(
        orchestrator: Orchestrator,
        pepper: ApiKeyPepper,
        config: ApiConfig,
    ) -> Self {
        MerchantApiState {
            store: orchestrator.store().clone(),
            orchestrator,
            pepper,
            webhook_limiter: Arc::new(KeyedRateLimiter::new(
                config.webhook_rate_limit,
                config.webhook_limit_refresh,
            )),
            refusal_hold: Arc::new(RefusalHold::new(
                config.webhook_refusal_hold,
                limits::MAX_HELD_REFUSALS,
            )),
            config: Arc::new(config),
            webhook_metrics: Arc::new(WebhookMetrics::default()),
        }
    }

    /// Counters of the webhook route.
    pub fn webhook_metrics(&self) -> &WebhookMetrics {
        &self.webhook_metrics
    }

    /// Register this API's counters (`sluice_webhooks_total{outcome}`) in the
    /// server's registry, for `/metrics`.
    pub fn register_metrics(
        &self,
        registry: &prometheus::Registry,
    ) -> Result<(), prometheus::Error> {
        self.webhook_metrics.register(registry)
    }

    pub(crate) fn refusal_hold(&self) -> &RefusalHold {
        &self.refusal_hold
    }

    pub(crate) fn webhook_limiter(&self) -> &KeyedRateLimiter {
        &self.webhook_limiter
    }
}

/// The authenticated merchant API's handlers, with their OpenAPI description.
fn v1_handlers() -> OpenApiRouter<MerchantApiState> {
    OpenApiRouter::new()
        .routes(routes!(payments::create_payment, payments::list_payments))
        .routes(routes!(payments::get_payment))
        .routes(routes!(payments::timeline))
        .routes(routes!(payments::get_refund))
        .routes(routes!(operations::confirm))
        .routes(routes!(operations::capture))
        .routes(routes!(operations::void))
        .routes(routes!(operations::refund))
        .routes(routes!(operations::confirm_fulfillment))
}

/// The handlers behind their layers (see the crate doc for the order).
fn v1_routes(state: &MerchantApiState) -> OpenApiRouter<MerchantApiState> {
    v1_handlers()
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            idempotency::idempotency,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_merchant,
        ))
        .route_layer(middleware::from_fn(request_span))
        .route_layer(middleware::from_fn(server_timing))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// `Server-Timing: psp;dur=…, app;dur=…` on every `/v1` answer: the
/// milliseconds the request waited for PSPs (0 when it made no call, as for a
/// replay), so a merchant can tell the gateway's share of a latency from the
/// PSP's; and the milliseconds from the request reaching the `/v1` routes to
/// its answer, so the time the request spent outside them (the network, the
/// connection's queue, the caller's own machine) can be told apart too.
async fn server_timing(request: Request, next: Next) -> Response {
    // Observability only, never a decision: the process's monotonic clock.
    let started = std::time::Instant::now();
    let wait = sluice_orchestrator::psp_wait::PspWait::new();
    let mut response = wait.clone().scope(next.run(request)).await;
    let millis = wait.total().as_secs_f64() * 1000.0;
    let app = started.elapsed().as_secs_f64() * 1000.0;
    let value =
        format!("psp;dur={millis:.3};desc=\"PSP calls\", app;dur={app:.3};desc=\"whole answer\"");
    if let Ok(value) = axum::http::HeaderValue::from_str(&value) {
        response.headers_mut().insert(SERVER_TIMING, value);
    }
    response
}

/// The W3C Server Timing header (not among `http`'s constants).
pub const SERVER_TIMING: axum::http::HeaderName =
    axum::http::HeaderName::from_static("server-timing");

fn webhook_handlers() -> OpenApiRouter<MerchantApiState> {
    OpenApiRouter::new().routes(routes!(webhooks::receive))
}

/// No authentication (the adapter verifies the PSP's signature), a body
/// limit of its own and a span without any header or body.
fn webhook_routes() -> OpenApiRouter<MerchantApiState> {
    webhook_handlers()
        .route_layer(middleware::from_fn(request_span))
        .layer(DefaultBodyLimit::max(MAX_WEBHOOK_BODY_BYTES))
}

fn admin_routes() -> OpenApiRouter<MerchantApiState> {
    OpenApiRouter::new()
        .routes(routes!(admin::create_merchant, admin::list_merchants))
        .routes(routes!(admin::get_merchant))
        .routes(routes!(admin::issue_api_key, admin::list_api_keys))
        .routes(routes!(admin::revoke_api_key))
        .routes(routes!(
            admin::create_connector_account,
            admin::list_connector_accounts
        ))
        .routes(routes!(admin::put_connector_account_config))
        .routes(routes!(secrets_admin::rotate_connector_secret))
        .routes(routes!(review::create_operator, review::list_operators))
        .routes(routes!(review::disable_operator))
        .routes(routes!(review::review_queue))
        .routes(routes!(review::review_payment))
        .routes(routes!(review::create_proposal))
        .routes(routes!(review::approve_proposal))
        .routes(routes!(review::reject_proposal))
        .routes(routes!(evidence::webhook_raw_body))
        .routes(routes!(payments_admin::search_payments))
        .routes(routes!(payments_admin::payment_stats))
        .routes(routes!(payments_admin::admin_payment))
        .routes(routes!(payments_admin::admin_timeline))
        .routes(routes!(fulfillment_admin::put_fulfillment_endpoint))
        .routes(routes!(
            routing_admin::put_routing_config,
            routing_admin::get_routing_config
        ))
        .routes(routes!(health_admin::account_health))
        .routes(routes!(health_admin::pause_account))
        .routes(routes!(health_admin::resume_account))
        .routes(routes!(reconciliation_admin::get_run))
        .routes(routes!(reconciliation_admin::list_differences))
        .routes(routes!(reconciliation_admin::close_difference))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .merge(reconciliation_upload())
}

/// The report upload: the one admin route with a larger body (a settlement
/// report, base64), so it carries its own limit.
fn reconciliation_upload() -> OpenApiRouter<MerchantApiState> {
    OpenApiRouter::new()
        .routes(routes!(reconciliation_admin::create_run))
        .layer(DefaultBodyLimit::max(
            reconciliation_admin::MAX_UPLOAD_BODY_BYTES,
        ))
}

fn document_routes() -> OpenApiRouter {
    OpenApiRouter::new().routes(routes!(openapi::document))
}

/// The OpenAPI 3 document of every route of this crate.
pub fn openapi() -> utoipa::openapi::OpenApi {
    openapi_with(Vec::new())
}

/// The document of this crate's routes and of `others` (the descriptions of
/// the routes other crates mount next to these), with the rules of the shared
/// layers added to every operation ([`openapi::complete`]).
pub fn openapi_with(others: Vec<utoipa::openapi::OpenApi>) -> utoipa::openapi::OpenApi {
    let (_, mut doc) = OpenApiRouter::<MerchantApiState>::with_openapi(openapi::base())
        .merge(v1_handlers())
        .merge(webhook_handlers())
        .merge(admin_routes())
        .split_for_parts();
    doc.merge(document_routes().split_for_parts().1);
    for other in others {
        doc.merge(other);
    }
    openapi::complete(doc)
}

/// `/v1/...`, `/webhooks/{adapter}/{connector_account}` and `/openapi.json`
/// serving this crate's document ([`openapi`]).
///
/// Sets no fallback, so it merges into the server's router.
pub fn router(state: MerchantApiState) -> Router {
    router_with_document(state, &openapi())
}

/// [`router`], with `/openapi.json` serving `doc` (the gateway's whole
/// document, [`openapi_with`]).
pub fn router_with_document(state: MerchantApiState, doc: &utoipa::openapi::OpenApi) -> Router {
    let (v1, _) = v1_routes(&state).split_for_parts();
    let (webhooks, _) = webhook_routes().split_for_parts();
    let (document, _) = document_routes()
        .layer(axum::Extension(openapi::ServedDocument(openapi::render(
            doc,
        ))))
        .split_for_parts();
    Router::new()
        .merge(v1)
        .merge(webhooks)
        .with_state(state)
        .merge(document)
}

/// `/admin/merchants...`, guarded by `auth_layer` (the server's admin-token
/// check), which is applied to every route: the router cannot be mounted
/// without one.
pub fn admin_router<L>(state: MerchantApiState, auth_layer: L) -> Router
where
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as Service<Request>>::Error: Into<std::convert::Infallible> + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    let (admin, _) = admin_routes().split_for_parts();
    admin
        .route_layer(auth_layer)
        .route_layer(middleware::from_fn(request_span))
        .with_state(state)
}

/// Delete idempotency keys older than `ttl` (24 h: [`IDEMPOTENCY_KEY_TTL`]);
/// run periodically by the server. Returns how many were deleted.
pub async fn prune_idempotency_keys(store: &Store, ttl: Duration) -> Result<u64, StoreError> {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    store
        .idempotency_prune(store.now_ms().saturating_sub(ttl_ms))
        .await
}

/// One span per request with the fields handlers and layers fill in.
/// Never records headers (they carry the API key).
async fn request_span(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let span = tracing::info_span!(
        "http",
        method = %request.method(),
        route = %route,
        merchant = tracing::field::Empty,
        payment_id = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    async move {
        let response = next.run(request).await;
        tracing::Span::current().record("status", response.status().as_u16());
        tracing::info!("request done");
        response
    }
    .instrument(span)
    .await
}
