//! The payment services behind the HTTP surface: the orchestrator, the
//! merchant API, outbox delivery, the recovery scanner and the inbox
//! processor, assembled once at start-up and stopped together.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::{middleware, Router};
use sluice_adapter_runtime::AdapterRuntime;
use sluice_delivery::{
    admin_router as delivery_admin_router, DeliveryAdmin, DeliveryMetrics, EndpointPolicy,
    NatsSinkConfig, Publisher, PublisherConfig,
};
use sluice_merchant_api::{ApiConfig, MerchantApiState, IDEMPOTENCY_KEY_TTL};
use sluice_orchestrator::{ConnectorRecovery, Orchestrator, OrchestratorConfig, ReqwestTransport};
use sluice_scanner::{Scanner, ScannerConfig};
use sluice_store::{ApiKeyPepper, Store, SystemClock};
use tokio::sync::watch;
use tokio::task::JoinSet;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{require_admin, AdminAuth};
use crate::config::{millis, AdapterRecoveryConfig, WorkerTimings};
use crate::pending_metrics::PendingMetrics;
use crate::supervise::{supervise_run, WorkerRestarts};

/// Why the payment services could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum PaymentServicesError {
    #[error("cannot build the PSP HTTP client: {0}")]
    Transport(String),
    #[error("cannot set up outbox delivery: {0}")]
    Delivery(String),
    #[error("cannot set up the recovery scanner: {0}")]
    Scanner(String),
    #[error("cannot register metrics: {0}")]
    Metrics(String),
}

/// What start-up needs to know beyond the store and the runtime.
#[derive(Debug, Clone, Default)]
pub struct PaymentSettings {
    /// Publish outbox events to NATS JetStream too (`SLUICE_NATS_URL`).
    pub nats_url: Option<String>,
    /// Accept plain-http merchant webhook endpoints (demo and tests only).
    pub allow_http_endpoints: bool,
    /// JetStream stream name (`SLUICE_NATS_STREAM`), else the sink's default.
    pub nats_stream: Option<String>,
    /// Subject prefix (`SLUICE_NATS_SUBJECT_PREFIX`), else the sink's default.
    pub nats_subject_prefix: Option<String>,
    /// Timings of the workers (`[workers]`); unset fields keep the defaults.
    pub workers: WorkerTimings,
    /// Recovery facts per adapter (`[adapters.<name>]`).
    pub adapter_recovery: BTreeMap<String, AdapterRecoveryConfig>,
    /// The webhook route's per-account rate limit (`[webhooks]`).
    pub webhooks: crate::config::WebhookIntake,
    /// Default PSP call slots per connector account (`[psp_calls]`).
    pub psp_calls: sluice_orchestrator::CallLimits,
}

/// The assembled services. Cheap to clone.
#[derive(Clone)]
pub struct PaymentServices {
    pub orchestrator: Orchestrator,
    pub merchant_api: MerchantApiState,
    pub publisher: Publisher,
    pub scanner: Scanner,
    pub registry: prometheus::Registry,
    pending_metrics: PendingMetrics,
    worker_restarts: WorkerRestarts,
    settings: PaymentSettings,
}

impl PaymentServices {
    pub fn new(
        store: Store,
        runtime: AdapterRuntime,
        pepper: ApiKeyPepper,
        settings: PaymentSettings,
    ) -> Result<Self, PaymentServicesError> {
        let transport =
            ReqwestTransport::new().map_err(|e| PaymentServicesError::Transport(e.to_string()))?;
        let timings = &settings.workers;
        let mut orchestrator_config = OrchestratorConfig::default();
        if let Some(grace) = millis(timings.in_flight_grace_ms) {
            orchestrator_config.in_flight_grace = grace;
        }
        if let Some(lease) = millis(timings.inbox_lease_ms) {
            orchestrator_config.inbox.lease = lease;
        }
        orchestrator_config.call_limits = settings.psp_calls;
        orchestrator_config.adapter_recovery = settings
            .adapter_recovery
            .iter()
            .map(|(name, recovery)| {
                let own = ConnectorRecovery {
                    resend_window: millis(recovery.resend_window_ms),
                    authorization_validity: millis(recovery.authorization_validity_ms),
                };
                (name.clone(), own)
            })
            .collect();
        let orchestrator = Orchestrator::new(
            store.clone(),
            runtime,
            Arc::new(transport),
            Arc::new(SystemClock),
            orchestrator_config,
        );
        let registry = prometheus::Registry::new_custom(None, None)
            .map_err(|e| PaymentServicesError::Metrics(e.to_string()))?;
        let delivery_metrics = DeliveryMetrics::register(&registry)
            .map_err(|e| PaymentServicesError::Metrics(e.to_string()))?;
        let publisher = Publisher::new(store, publisher_config(&settings), delivery_metrics)
            .map_err(|e| PaymentServicesError::Delivery(e.to_string()))?;
        let scanner =
            Scanner::with_metrics(orchestrator.clone(), scanner_config(timings), &registry)
                .map_err(|e| PaymentServicesError::Scanner(e.to_string()))?;
        let mut api_config = ApiConfig {
            // The timeline explains what this very scanner will do.
            recovery_policy: scanner.config().policy,
            ..ApiConfig::default()
        };
        if let Some(lease) = timings.idempotency_lease_ms {
            api_config.idempotency_lease_ms = i64::try_from(lease).unwrap_or(i64::MAX);
        }
        let limit = &mut api_config.webhook_rate_limit;
        limit.burst = settings.webhooks.burst.unwrap_or(limit.burst);
        limit.per_second = settings.webhooks.per_second.unwrap_or(limit.per_second);
        if let Some(ms) = settings.webhooks.refusal_hold_ms {
            api_config.webhook_refusal_hold = Duration::from_millis(ms);
        }
        let merchant_api = MerchantApiState::with_config(orchestrator.clone(), pepper, api_config);
        merchant_api
            .webhook_metrics()
            .register(&registry)
            .map_err(|e| PaymentServicesError::Metrics(e.to_string()))?;
        sluice_orchestrator::register_metrics(&registry)
            .map_err(|e| PaymentServicesError::Metrics(e.to_string()))?;
        sluice_adapter_runtime::register_metrics(&registry)
            .map_err(|e| PaymentServicesError::Metrics(e.to_string()))?;
        let pending_metrics = PendingMetrics::register(&registry)
            .map_err(|e| PaymentServicesError::Metrics(e.to_string()))?;
        let worker_restarts = WorkerRestarts::register(&registry)
            .map_err(|e| PaymentServicesError::Metrics(e.to_string()))?;
        Ok(PaymentServices {
            orchestrator,
            merchant_api,
            publisher,
            scanner,
            registry,
            pending_metrics,
            worker_restarts,
            settings,
        })
    }

    /// `/v1`, `/webhooks`, `/openapi.json`, `/metrics` and the admin routes
    /// for merchants, keys, connector accounts and webhook endpoints (behind
    /// the admin token).
    pub fn router(&self, auth: AdminAuth) -> Router {
        let admin_layer = middleware::from_fn_with_state(auth, require_admin);
        let delivery_admin = delivery_admin_router(DeliveryAdmin::new(
            self.orchestrator.store().clone(),
            EndpointPolicy {
                allow_http: self.settings.allow_http_endpoints,
            },
        ))
        .route_layer(admin_layer.clone());
        let metrics = MetricsState {
            registry: self.registry.clone(),
            pending: self.pending_metrics.clone(),
            store: self.orchestrator.store().clone(),
        };
        let (metrics_route, _) = metrics_routes().split_for_parts();
        Router::new()
            .merge(sluice_merchant_api::router_with_document(
                self.merchant_api.clone(),
                &crate::openapi::document(),
            ))
            .merge(sluice_merchant_api::admin_router(
                self.merchant_api.clone(),
                admin_layer,
            ))
            .merge(delivery_admin)
            .merge(metrics_route.with_state(metrics))
    }

    /// Start the inbox processor, the outbox publisher, the recovery scanner
    /// and idempotency-key pruning, each supervised (started again after a panic,
    /// see [`crate::supervise`]); they stop when `shutdown` turns true.
    pub fn spawn_workers(&self, shutdown: watch::Receiver<bool>) -> JoinSet<()> {
        let mut workers = JoinSet::new();
        let restarts = &self.worker_restarts;
        let stop = || shutdown.clone();
        let inbox = |orchestrator: Orchestrator, stop| async move {
            orchestrator.run_inbox_processor(stop).await;
            Ok(())
        };
        let orchestrator = self.orchestrator.clone();
        workers.spawn(supervise_run(
            "inbox_processor",
            orchestrator,
            stop(),
            restarts.clone(),
            inbox,
        ));
        let scan = |scanner: Scanner, stop| async move {
            scanner.run(stop).await;
            Ok(())
        };
        workers.spawn(supervise_run(
            "scanner",
            self.scanner.clone(),
            stop(),
            restarts.clone(),
            scan,
        ));
        let publish = |publisher: Publisher, stop| async move {
            let ended = publisher.run(wait_for_true(stop)).await;
            ended.map_err(|error| error.to_string())
        };
        workers.spawn(supervise_run(
            "publisher",
            self.publisher.clone(),
            stop(),
            restarts.clone(),
            publish,
        ));
        let prune = |store: Store, stop| async move {
            prune_idempotency_keys(store, stop).await;
            Ok(())
        };
        let store = self.orchestrator.store().clone();
        workers.spawn(supervise_run(
            "idempotency_pruning",
            store,
            stop(),
            restarts.clone(),
            prune,
        ));
        workers
    }
}

/// What `/metrics` reads.
#[derive(Clone)]
struct MetricsState {
    registry: prometheus::Registry,
    pending: PendingMetrics,
    store: Store,
}

fn metrics_routes() -> OpenApiRouter<MetricsState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// The OpenAPI description of `/metrics`.
pub fn metrics_openapi() -> utoipa::openapi::OpenApi {
    metrics_routes().split_for_parts().1
}

/// `GET /metrics`: the Prometheus text exposition of every counter and gauge,
/// the pending-set gauges refreshed first.
#[utoipa::path(
    get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain", body = String))
)]
async fn metrics(State(metrics): State<MetricsState>) -> axum::response::Response {
    metrics.pending.refresh(&metrics.store).await;
    render_metrics(&metrics.registry)
}

/// The publisher's settings: defaults, the NATS sink when configured, and
/// the `[workers]` timings.
fn publisher_config(settings: &PaymentSettings) -> PublisherConfig {
    let timings = &settings.workers;
    let mut config = PublisherConfig {
        nats: settings.nats_url.clone().map(|url| {
            let mut nats = NatsSinkConfig {
                url,
                ..NatsSinkConfig::default()
            };
            if let Some(stream) = &settings.nats_stream {
                nats.stream = stream.clone();
            }
            if let Some(prefix) = &settings.nats_subject_prefix {
                nats.subject_prefix = prefix.clone();
            }
            if let Some(timeout) = millis(timings.nats_ack_timeout_ms) {
                nats.ack_timeout = timeout;
            }
            nats
        }),
        ..PublisherConfig::default()
    };
    if let Some(lease) = millis(timings.outbox_lease_ms) {
        config.outbox_lease = lease;
    }
    if let Some(lease) = millis(timings.delivery_lease_ms) {
        config.delivery_lease = lease;
    }
    if let Some(timeout) = millis(timings.delivery_timeout_ms) {
        config.http_timeout = timeout;
    }
    if let Some(poll) = millis(timings.publisher_poll_ms) {
        config.poll_interval = poll;
    }
    config
}

/// The scanner's settings: defaults with the `[workers]` timings on top.
fn scanner_config(timings: &WorkerTimings) -> ScannerConfig {
    let mut config = ScannerConfig::default();
    if let Some(interval) = millis(timings.scanner_interval_ms) {
        config.round_interval = interval;
    }
    if let Some(lease) = millis(timings.scanner_lease_ms) {
        config.lease = lease;
    }
    let budget = &mut config.retry_budget;
    budget.burst = timings.scanner_retry_burst.unwrap_or(budget.burst).max(1);
    budget.per_second = timings
        .scanner_retry_per_second
        .unwrap_or(budget.per_second)
        .max(1);
    let policy = &mut config.policy;
    let ms = |value: Option<u64>, default: i64| {
        value.map_or(default, |v| i64::try_from(v).unwrap_or(i64::MAX))
    };
    policy.submitted_timeout_ms = ms(timings.submitted_timeout_ms, policy.submitted_timeout_ms);
    policy.processing_timeout_ms = ms(timings.processing_timeout_ms, policy.processing_timeout_ms);
    policy.base_backoff_ms = ms(timings.query_backoff_ms, policy.base_backoff_ms);
    policy.max_backoff_ms = ms(timings.max_query_backoff_ms, policy.max_backoff_ms);
    policy.max_unknown_age_ms = ms(timings.max_unknown_age_ms, policy.max_unknown_age_ms);
    config
}

async fn wait_for_true(mut flag: watch::Receiver<bool>) {
    while !*flag.borrow() {
        if flag.changed().await.is_err() {
            return;
        }
    }
}

async fn prune_idempotency_keys(store: Store, mut shutdown: watch::Receiver<bool>) {
    loop {
        match sluice_merchant_api::prune_idempotency_keys(&store, IDEMPOTENCY_KEY_TTL).await {
            Ok(0) => {}
            Ok(pruned) => tracing::info!(pruned, "idempotency keys pruned"),
            Err(error) => tracing::warn!(%error, "idempotency key pruning failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(600)) => {}
            changed = shutdown.changed() => if changed.is_err() || *shutdown.borrow() { return },
        }
    }
}

fn render_metrics(registry: &prometheus::Registry) -> axum::response::Response {
    use prometheus::Encoder;
    let encoder = prometheus::TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => (
            [(
                axum::http::header::CONTENT_TYPE,
                encoder.format_type().to_owned(),
            )],
            body,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot encode metrics");
            axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// The pepper of API key hashes: `SLUICE_API_KEY_PEPPER`, else a random one
/// created once in the data directory, so that keys survive a restart.
pub fn load_or_create_pepper(data_dir: &std::path::Path) -> Result<ApiKeyPepper, PepperError> {
    if let Ok(value) = std::env::var("SLUICE_API_KEY_PEPPER") {
        return ApiKeyPepper::new(value.into_bytes())
            .map_err(|e| PepperError::Invalid(e.to_string()));
    }
    let path = data_dir.join("api-key-pepper");
    let secret = match std::fs::read_to_string(&path) {
        Ok(existing) => existing.trim().to_owned(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
            let fresh = hex::encode(bytes);
            let temp = data_dir.join("api-key-pepper.tmp");
            std::fs::write(&temp, &fresh)
                .and_then(|()| std::fs::rename(&temp, &path))
                .map_err(|source| PepperError::Io {
                    path: path.clone(),
                    source,
                })?;
            fresh
        }
        Err(source) => return Err(PepperError::Io { path, source }),
    };
    ApiKeyPepper::new(secret.into_bytes()).map_err(|e| PepperError::Invalid(e.to_string()))
}

/// Why the API key pepper could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PepperError {
    #[error("cannot read or create {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("invalid API key pepper: {0}")]
    Invalid(String),
}
