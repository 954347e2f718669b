//! Starting and stopping the gateway.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use sluice_adapter_runtime::{
    AdapterRuntime, BulkheadConfig, RuntimeConfig, SandboxLimits, WarmConfig,
};
use sluice_store::{ApiKeyPepper, SecretBox, Store, StoreError, StoreOptions};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::adapters::{sandbox_limits, AdapterManager, StartupReport};
use crate::app::{router, AppState};
use crate::auth::AdminAuth;
use crate::config::Config;
use crate::payment_services::{load_or_create_pepper, PaymentServices, PaymentSettings};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the database: {0}")]
    Database(#[source] StoreError),
    #[error("cannot migrate the database: {0}")]
    Migrate(#[source] StoreError),
    #[error("cannot seal secrets at rest: {0}")]
    MasterKey(#[from] crate::master_key::MasterKeyError),
    #[error("cannot seal the secrets at rest under the master key: {0}")]
    Reseal(#[source] StoreError),
    #[error("cannot start the adapter runtime: {0}")]
    Runtime(#[from] sluice_adapter_runtime::RuntimeError),
    #[error("cannot load the API key pepper: {0}")]
    Pepper(#[from] crate::payment_services::PepperError),
    #[error("cannot start the payment services: {0}")]
    PaymentServices(#[from] crate::payment_services::PaymentServicesError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A gateway serving HTTP. Adapters load in the background; see [`RunningServer::ready`].
pub struct RunningServer {
    local_addr: SocketAddr,
    state: AppState,
    shutdown: Option<oneshot::Sender<()>>,
    serve: JoinHandle<std::io::Result<()>>,
    startup: watch::Receiver<Option<Arc<StartupReport>>>,
    services: PaymentServices,
    stop_workers: watch::Sender<bool>,
    workers: tokio::task::JoinSet<()>,
}

impl RunningServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `http://<local addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.local_addr)
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The orchestrator, merchant API state, publisher and scanner.
    pub fn services(&self) -> &PaymentServices {
        &self.services
    }

    /// Waits until start-up loading of adapters has finished and returns what it did.
    pub async fn ready(&self) -> Arc<StartupReport> {
        let mut startup = self.startup.clone();
        loop {
            if let Some(report) = startup.borrow_and_update().clone() {
                return report;
            }
            if startup.changed().await.is_err() {
                // The loader is gone without a report (it panicked); report nothing loaded.
                return Arc::new(StartupReport::default());
            }
        }
    }

    /// Resolves when the HTTP server stops on its own (it only does on an IO error).
    pub async fn stopped(&mut self) -> std::io::Result<()> {
        match (&mut self.serve).await {
            Ok(result) => result,
            Err(join) => Err(std::io::Error::other(join.to_string())),
        }
    }

    /// Stops accepting connections, lets requests in flight finish, closes the database.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let result = self.stopped().await;
        let _ = self.stop_workers.send(true);
        let workers = async { while self.workers.join_next().await.is_some() {} };
        if tokio::time::timeout(std::time::Duration::from_secs(10), workers)
            .await
            .is_err()
        {
            tracing::warn!("background workers did not stop within 10 s; aborting them");
            self.workers.abort_all();
        }
        self.state.store.close().await;
        result
    }
}

/// Connects to the database and migrates it; `secret_box` seals and opens the
/// secrets at rest (`crate::master_key::secret_box`).
pub async fn open_store(
    config: &Config,
    secret_box: Arc<dyn SecretBox>,
) -> Result<Store, StartError> {
    let mut options = StoreOptions {
        secret_box,
        ..StoreOptions::default()
    };
    if let Some(delay) = crate::config::millis(config.workers.first_query_delay_ms) {
        options.first_query_delay = delay;
    }
    options.fulfillment_policy = config.fulfillment.policy();
    config.database.apply(&mut options);
    let store = Store::connect_with(config.database_url.expose(), options)
        .await
        .map_err(StartError::Database)?;
    store.migrate().await.map_err(StartError::Migrate)?;
    Ok(store)
}

/// Starts the gateway on `listener` (or on `config.listen` when `None`).
pub async fn start(
    config: &Config,
    listener: Option<TcpListener>,
) -> Result<RunningServer, StartError> {
    std::fs::create_dir_all(&config.data_dir).map_err(|source| StartError::DataDir {
        path: config.data_dir.clone(),
        source,
    })?;
    let store = open_store(config, crate::master_key::secret_box(config)?).await?;
    // From here on the database holds no secret in clear (legacy plaintext rows and
    // rows of a previous master key are sealed under the current one); a wrong key
    // stops the start here.
    let resealed = store.reseal_secrets().await.map_err(StartError::Reseal)?;
    if resealed.total() > 0 {
        tracing::info!(
            rows = resealed.total(),
            "secrets at rest sealed under the current master key"
        );
    }
    let runtime = adapter_runtime(config)?;
    let adapters = Arc::new(AdapterManager::new(runtime, config));
    let auth = AdminAuth::new(config.admin_token.as_ref().map(|t| t.expose()));
    if !auth.is_enabled() {
        tracing::warn!("no admin token configured (SLUICE_ADMIN_TOKEN): the admin API is disabled");
    }
    let pepper = load_or_create_pepper(&config.data_dir)?;
    let services = payment_services(config, store.clone(), &adapters, pepper)?;
    let payment_routes = services.router(auth.clone());
    let state = AppState::new(
        auth,
        Arc::clone(&adapters),
        store,
        services.orchestrator.clone(),
    );

    let (listener, local_addr) = bind(config, listener).await?;

    let (report_tx, report_rx) = watch::channel(None);
    let loader_state = state.clone();
    let adapters_dir = config.adapters_dir.clone();
    tokio::spawn(async move {
        let report = adapters.load_startup(adapters_dir.as_deref()).await;
        loader_state.mark_adapters_loaded();
        let _ = report_tx.send(Some(Arc::new(report)));
    });

    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let app = router(state.clone()).merge(payment_routes);
    let (stop_workers, workers_stopped) = watch::channel(false);
    let workers = services.spawn_workers(workers_stopped);
    let serve = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = shutdown_rx.await;
            })
            .await
    });
    tracing::info!(addr = %local_addr, data_dir = %config.data_dir.display(), "sluice is listening");

    Ok(RunningServer {
        local_addr,
        state,
        shutdown: Some(shutdown_tx),
        serve,
        startup: report_rx,
        services,
        stop_workers,
        workers,
    })
}

/// The adapter runtime, with the configured sandbox limits and bulkheads.
fn adapter_runtime(config: &Config) -> Result<AdapterRuntime, StartError> {
    Ok(AdapterRuntime::new(RuntimeConfig {
        cache_dir: Some(config.adapter_cache_dir()),
        default_limits: sandbox_limits(&config.default_limits, SandboxLimits::default()),
        max_concurrent_instances: config
            .bulkhead
            .slots
            .unwrap_or(RuntimeConfig::default().max_concurrent_instances),
        bulkhead: config.bulkhead.over(BulkheadConfig::default()),
        warm: config.bulkhead.warm_over(WarmConfig::default()),
        ..RuntimeConfig::default()
    })?)
}

fn payment_services(
    config: &Config,
    store: Store,
    adapters: &AdapterManager,
    pepper: ApiKeyPepper,
) -> Result<PaymentServices, StartError> {
    Ok(PaymentServices::new(
        store,
        adapters.runtime().clone(),
        pepper,
        PaymentSettings {
            nats_url: non_empty_env("SLUICE_NATS_URL"),
            // Plain-http merchant endpoints only for a gateway that is itself
            // only reachable from this machine (demo, tests).
            allow_http_endpoints: config.listen.ip().is_loopback(),
            nats_stream: non_empty_env("SLUICE_NATS_STREAM"),
            nats_subject_prefix: non_empty_env("SLUICE_NATS_SUBJECT_PREFIX"),
            workers: config.workers.clone(),
            adapter_recovery: config.adapter_recovery.clone(),
            webhooks: config.webhooks,
            psp_calls: config.psp_calls,
        },
    )?)
}

/// The given listener, or one bound to `config.listen`, with its address.
async fn bind(
    config: &Config,
    listener: Option<TcpListener>,
) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = match listener {
        Some(listener) => listener,
        None => TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Bind {
                addr: config.listen,
                source,
            })?,
    };
    let local_addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: config.listen,
        source,
    })?;
    Ok((listener, local_addr))
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Listeners for ctrl-c and SIGTERM, registered when created: a signal that
/// arrives before anyone waits on them (e.g. while `sluice demo` prints its
/// banner) is kept, instead of killing the process with the default action.
pub struct ShutdownSignal {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignal {
    pub fn install() -> ShutdownSignal {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(listener) => Some(listener),
                Err(error) => {
                    tracing::error!(%error, signal = name, "cannot listen for the signal");
                    None
                }
            };
            ShutdownSignal {
                interrupt: listen(SignalKind::interrupt(), "SIGINT"),
                terminate: listen(SignalKind::terminate(), "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        ShutdownSignal {}
    }

    /// Resolves on ctrl-c or SIGTERM.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn on(listener: &mut Option<tokio::signal::unix::Signal>) {
                match listener {
                    Some(listener) => {
                        listener.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                _ = on(&mut self.interrupt) => {}
                _ = on(&mut self.terminate) => {}
            }
        }
        #[cfg(not(unix))]
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    }
}
