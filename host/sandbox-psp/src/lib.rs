//! Sluice's sandbox PSP: a stateful simulator that speaks the Stripe-format and
//! Adyen-format API subsets of `docs/psp-wire-subsets.md`, so demos and end-to-end
//! tests exercise the real adapters against a real HTTP peer.
//!
//! - Stripe subset under `/stripe` (`base_url` = [`SandboxHandle::base_url_stripe`]),
//!   Adyen subset under `/adyen` ([`SandboxHandle::base_url_adyen`]).
//! - `Idempotency-Key` semantics of both PSPs: a replay returns the saved answer and
//!   never charges twice.
//! - Fault modes chosen per request by the payment method token (see [`faults`]),
//!   and per account ([`account_faults`]: latency, every Nth call a 5xx, hang).
//! - Signed webhooks with configurable duplicates, delay, reordering and retries.
//! - A control API under `/_sandbox/` mirrored by methods on [`SandboxHandle`].

pub mod account_faults;
mod adyen;
mod app;
pub mod config;
mod control;
pub mod faults;
mod idempotency;
mod model;
mod notices;
pub mod reports;
pub mod signing;
mod stripe;
mod util;
mod webhooks;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use app::QueryRecord;
pub use config::{
    DeliveryFaults, Format, IdempotencyScope, RefundBehaviour, RetryPolicy, SandboxClock,
    SandboxConfig, WebhookTarget, DEFAULT_ADYEN_API_KEY, DEFAULT_STRIPE_API_KEY,
};
pub use model::{PayStatus, Payment, ReferenceCount, Refund, RefundStatus};
pub use signing::{
    adyen_hmac_signature, adyen_signing_payload, stripe_signature_header, stripe_v1_signature,
    AdyenSignedFields, SignError,
};
pub use webhooks::{
    CapturedWebhook, DeliveredEvent, DeliveryRecord, MAX_DELIVERY_RECORDS, MAX_SENDERS,
};

use app::App;
use idempotency::IdempotencyStore;
use model::Ledger;
use util::{lock, Ids};
use webhooks::{Hub, HubSetup};

/// Why the sandbox could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot listen on 127.0.0.1:{port}: {source}")]
    Bind { port: u16, source: std::io::Error },
    #[error("cannot build the webhook HTTP client: {0}")]
    HttpClient(#[from] reqwest::Error),
    #[error("invalid sandbox configuration: {0}")]
    Config(String),
    #[error("the sandbox server failed: {0}")]
    Server(String),
}

/// Starts the sandbox on 127.0.0.1 and returns once it accepts connections.
pub async fn start(config: SandboxConfig) -> Result<SandboxHandle, SandboxError> {
    validate(&config)?;
    let port = config.port;
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|source| SandboxError::Bind { port, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| SandboxError::Bind { port, source })?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (app, router) = build(config, format!("http://{addr}"), shutdown_rx.clone())?;
    let mut stop = shutdown_rx;
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                // Either a shutdown signal or a dropped handle stops the server.
                let _ = stop.wait_for(|stopping| *stopping).await;
            })
            .await
    });
    tracing::info!(%addr, "sandbox PSP listening");
    Ok(SandboxHandle {
        app,
        addr,
        shutdown: shutdown_tx,
        server: Some(server),
        router: None,
    })
}

/// The address an in-process sandbox claims in its URLs. Nothing listens
/// there: requests reach it through [`SandboxHandle::router`].
pub const IN_PROCESS_ADDR: &str = "127.0.0.1:9";

/// A sandbox without a listener, for the deterministic simulator: requests
/// go to [`SandboxHandle::router`] in process, and webhooks are best captured
/// ([`SandboxConfig::capture_webhooks`]) and delivered by the caller.
pub fn in_process(config: SandboxConfig) -> Result<SandboxHandle, SandboxError> {
    validate(&config)?;
    let addr: SocketAddr = IN_PROCESS_ADDR
        .parse()
        .map_err(|e| SandboxError::Config(format!("{IN_PROCESS_ADDR}: {e}")))?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (app, router) = build(config, format!("http://{addr}"), shutdown_rx)?;
    Ok(SandboxHandle {
        app,
        addr,
        shutdown: shutdown_tx,
        server: None,
        router: Some(router),
    })
}

/// The sandbox's state and routes.
fn build(
    config: SandboxConfig,
    root_url: String,
    shutdown: watch::Receiver<bool>,
) -> Result<(Arc<App>, Router), SandboxError> {
    let ids = Arc::new(Ids::new(config.seed));
    let hub = Hub::start(
        HubSetup {
            faults: config.delivery.clone(),
            retry: config.retry.clone(),
            targets: config.webhook_targets.clone(),
            ids: ids.clone(),
            clock: config.clock.clone(),
            capture: config.capture_webhooks,
            senders: config.webhook_senders,
        },
        shutdown.clone(),
    )?;
    let app = Arc::new(App {
        ledger: Mutex::new(Ledger::new(config.refund_behaviour, config.clock.clone())),
        idempotency: Mutex::new(IdempotencyStore::default()),
        root_url,
        config,
        ids,
        hub,
        shutdown,
        queries: Mutex::new(Vec::new()),
        account_declines: Mutex::new(Default::default()),
        account_faults: Mutex::new(Default::default()),
    });
    use axum::middleware::from_fn_with_state;
    let router = Router::new()
        .nest(
            "/stripe",
            stripe::routes().layer(from_fn_with_state(
                app.clone(),
                account_faults::stripe_layer,
            )),
        )
        .nest(
            "/adyen",
            adyen::routes().layer(from_fn_with_state(app.clone(), account_faults::adyen_layer)),
        )
        .nest("/_sandbox", control::routes())
        .with_state(app.clone());
    Ok((app, router))
}

fn validate(config: &SandboxConfig) -> Result<(), SandboxError> {
    if config
        .stripe_api_keys
        .iter()
        .chain(&config.adyen_api_keys)
        .any(String::is_empty)
    {
        return Err(SandboxError::Config("API keys must not be empty".into()));
    }
    if config.retry.max_attempts == 0 {
        return Err(SandboxError::Config(
            "retry.max_attempts must be at least 1".into(),
        ));
    }
    Ok(())
}

/// A running sandbox. Dropping it stops the server; `shutdown` also waits for it.
pub struct SandboxHandle {
    app: Arc<App>,
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    server: Option<JoinHandle<std::io::Result<()>>>,
    /// In process: the routes, called without a socket.
    router: Option<Router>,
}

impl SandboxHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// An in-process sandbox's routes (None when it listens on a socket).
    pub fn router(&self) -> Option<Router> {
        self.router.clone()
    }

    /// Capture mode: the signed webhook requests the sandbox would have sent
    /// since the last call, oldest first.
    pub fn take_webhooks(&self) -> Vec<CapturedWebhook> {
        self.app.hub.take_captured()
    }

    /// `http://127.0.0.1:<port>`; the control API lives under `/_sandbox/`.
    pub fn base_url(&self) -> String {
        self.app.root_url.clone()
    }

    /// The connector `base_url` for the Stripe-format adapter.
    pub fn base_url_stripe(&self) -> String {
        format!("{}/stripe", self.app.root_url)
    }

    /// The connector `base_url` for the Adyen-format adapter.
    pub fn base_url_adyen(&self) -> String {
        format!("{}/adyen", self.app.root_url)
    }

    /// Money-moving charges (authorisations or captures that happened) for one
    /// attempt reference. Tests assert this is exactly one.
    pub fn charge_count(&self, reference: &str) -> u32 {
        lock(&self.app.ledger).count_for(reference).charges
    }

    /// Payment objects created for one attempt reference, whatever their outcome.
    pub fn payment_count(&self, reference: &str) -> u32 {
        lock(&self.app.ledger).count_for(reference).payments
    }

    /// Every attempt reference with its payment and charge counts.
    pub fn charge_counts(&self) -> BTreeMap<String, ReferenceCount> {
        lock(&self.app.ledger).counts()
    }

    /// Refunds created for one refund reference.
    pub fn refund_count(&self, reference: &str) -> u32 {
        lock(&self.app.ledger).refund_count_for(reference)
    }

    pub fn payments(&self) -> Vec<Payment> {
        lock(&self.app.ledger).all_payments()
    }

    pub fn payment(&self, id: &str) -> Option<Payment> {
        self.app.find_payment(id)
    }

    pub fn refunds(&self) -> Vec<Refund> {
        lock(&self.app.ledger).all_refunds()
    }

    /// A settlement report of one account and period from the ledger, in the
    /// format's CSV layout, with the request's discrepancies
    /// (`POST /_sandbox/settlement_reports/{format}` does the same).
    pub fn settlement_report(&self, format: Format, request: &reports::ReportRequest) -> String {
        self.app.settlement_report(format, request)
    }

    pub fn refund(&self, id: &str) -> Option<Refund> {
        self.app.find_refund(id)
    }

    /// Every payment lookup so far (Stripe retrieve and search), with its
    /// start and end times, in the order they ended.
    pub fn queries(&self) -> Vec<QueryRecord> {
        lock(&self.app.queries).clone()
    }

    /// Every webhook delivery attempt so far, with the gateway's answer.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.app.hub.records()
    }

    pub fn set_webhook_target(&self, connector: impl Into<String>, target: WebhookTarget) {
        self.app.hub.set_target(connector.into(), target);
    }

    pub fn remove_webhook_target(&self, connector: &str) -> bool {
        self.app.hub.remove_target(connector)
    }

    pub fn webhook_targets(&self) -> BTreeMap<String, WebhookTarget> {
        self.app.hub.targets()
    }

    /// Decline every otherwise approved new payment at this account (a
    /// Stripe-format API key or an Adyen-format merchant account); None
    /// clears it.
    pub fn set_account_decline(&self, account: &str, decline: Option<faults::Decline>) {
        let mut declines = lock(&self.app.account_declines);
        match decline {
            Some(decline) => declines.insert(account.to_owned(), decline),
            None => declines.remove(account),
        };
    }

    /// Latency, every Nth call a 500, or a hang for every call at this
    /// account (a Stripe-format API key or an Adyen-format merchant
    /// account), before anything executes; None clears them. Setting them
    /// restarts the account's call count.
    pub fn set_account_faults(&self, account: &str, faults: Option<account_faults::AccountFaults>) {
        let mut all = lock(&self.app.account_faults);
        match faults {
            Some(faults) => all.insert(
                account.to_owned(),
                account_faults::AccountFaultState {
                    faults,
                    ..Default::default()
                },
            ),
            None => all.remove(account),
        };
    }

    /// Every account's faults with its call and 500 counts so far.
    pub fn account_faults(&self) -> BTreeMap<String, account_faults::AccountFaultState> {
        lock(&self.app.account_faults).clone()
    }

    pub fn set_delivery_faults(&self, faults: DeliveryFaults) {
        self.app.hub.set_faults(faults);
    }

    pub fn delivery_faults(&self) -> DeliveryFaults {
        self.app.hub.faults()
    }

    pub fn set_refund_behaviour(&self, behaviour: RefundBehaviour) {
        lock(&self.app.ledger).refund_behaviour = behaviour;
    }

    /// Settles every `processing` payment (late webhook) and pending refund now.
    pub fn settle_pending(&self) -> usize {
        self.app.settle_all_pending()
    }

    /// Finishes a payment's 3-D Secure step as the customer would.
    pub fn complete_action(&self, payment_id: &str, authenticated: bool) -> Option<Payment> {
        self.app.complete_action(payment_id, authenticated)
    }

    /// Waits until no webhook is queued, in flight or waiting for a retry.
    pub async fn wait_webhooks_idle(&self, timeout: Duration) -> bool {
        self.app.hub.wait_idle(timeout).await
    }

    /// Stops accepting requests, cuts held answers short and waits for the server.
    pub async fn shutdown(mut self) -> Result<(), SandboxError> {
        let _ = self.shutdown.send(true);
        match self.server.take() {
            Some(server) => match server.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(SandboxError::Server(e.to_string())),
                Err(e) => Err(SandboxError::Server(e.to_string())),
            },
            None => Ok(()),
        }
    }
}

impl Drop for SandboxHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}
