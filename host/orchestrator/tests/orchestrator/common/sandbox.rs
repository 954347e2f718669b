//! End-to-end harness: the real Stripe-format or Adyen-format adapter, the
//! stateful sandbox PSP, a minimal webhook route over real HTTP (what the
//! HTTP layer does with each `WebhookOutcome`), and the inbox processor
//! running in the background.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use sluice_adapter_runtime::{Header, HttpResponse, WebhookRequest};
use sluice_core::CaptureMode;
use sluice_orchestrator::transport::{CallBudget, CheckedRequest, PspTransport, TransportError};
use sluice_orchestrator::{
    ConfirmOptions, CreatePayment, Orchestrator, OrchestratorConfig, PaymentView, ReqwestTransport,
    WebhookOutcome,
};
use sluice_sandbox_psp::{
    DeliveryFaults, Format, RetryPolicy, SandboxConfig, SandboxHandle, WebhookTarget,
    DEFAULT_ADYEN_API_KEY, DEFAULT_STRIPE_API_KEY,
};
use sluice_store::{Clock, ConnectorAccount, Merchant, NewConnectorAccount};
use sluice_test_support::clock::SkewClock;
use tokio::sync::watch;

use super::{eur, runtime_with, test_config, TestDb};

/// Which PSP format an end-to-end test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Psp {
    Stripe,
    Adyen,
}

impl Psp {
    pub fn adapter(self) -> &'static str {
        match self {
            Psp::Stripe => "stripe",
            Psp::Adyen => "adyen",
        }
    }

    fn format(self) -> Format {
        match self {
            Psp::Stripe => Format::Stripe,
            Psp::Adyen => Format::Adyen,
        }
    }

    pub fn api_key(self) -> &'static str {
        match self {
            Psp::Stripe => DEFAULT_STRIPE_API_KEY,
            Psp::Adyen => DEFAULT_ADYEN_API_KEY,
        }
    }

    fn webhook_secret(self) -> &'static str {
        match self {
            Psp::Stripe => "whsec_sluice_orchestrator_e2e",
            // Adyen's HMAC key is hex.
            Psp::Adyen => "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
        }
    }
}

/// The sandbox's second Stripe-format account (an Adyen-format second account
/// is a second merchant account under the same key).
pub const SECOND_STRIPE_API_KEY: &str = "sk_test_sluice_second_account";

/// Run one async end-to-end body for each PSP format on each database.
#[macro_export]
macro_rules! e2e_test {
    ($(#[$meta:meta])* async fn $name:ident($e2e:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::sandbox::{E2e, Psp};

            async fn run($e2e: E2e) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn stripe_on_sqlite() {
                run(E2e::start($crate::common::test_subject(sluice_store::Backend::Sqlite).await, Psp::Stripe).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn stripe_on_postgres() {
                run(E2e::start($crate::common::test_subject(sluice_store::Backend::Postgres).await, Psp::Stripe).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn adyen_on_sqlite() {
                run(E2e::start($crate::common::test_subject(sluice_store::Backend::Sqlite).await, Psp::Adyen).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn adyen_on_postgres() {
                run(E2e::start($crate::common::test_subject(sluice_store::Backend::Postgres).await, Psp::Adyen).await).await;
            }
        }
    };
}

/// The real transport, which can lose the next payment creation before it leaves
/// the host (a network that never delivered it): the host learns nothing, the PSP
/// never saw the request.
#[derive(Debug)]
pub struct LosableTransport {
    inner: ReqwestTransport,
    lose_next_creation: AtomicBool,
}

impl LosableTransport {
    pub fn lose_next_creation(&self) {
        self.lose_next_creation.store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl PspTransport for LosableTransport {
    async fn send(
        &self,
        request: &CheckedRequest,
        budget: &CallBudget,
    ) -> Result<HttpResponse, TransportError> {
        let path = request.url.path();
        let creation = request.method == reqwest::Method::POST
            && (path.ends_with("/payments") || path.ends_with("/v1/payment_intents"));
        if creation && self.lose_next_creation.swap(false, Ordering::SeqCst) {
            return Err(TransportError::Connect(
                "lost by the test before it left the host".into(),
            ));
        }
        self.inner.send(request, budget).await
    }
}

pub struct E2e {
    pub db: TestDb,
    pub psp: Psp,
    pub sandbox: SandboxHandle,
    pub transport: Arc<LosableTransport>,
    pub orch: Orchestrator,
    pub merchant: Merchant,
    pub account: ConnectorAccount,
    pub gateway_url: String,
    /// The orchestrator's clock (the system's, until a test jumps it ahead,
    /// e.g. past a breaker's open time).
    pub clock: SkewClock,
    stop: watch::Sender<bool>,
}

impl Drop for E2e {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

pub fn e2e_config() -> OrchestratorConfig {
    OrchestratorConfig {
        psp_timeout: Duration::from_millis(1500),
        ..test_config()
    }
}

impl E2e {
    pub async fn start(db: TestDb, psp: Psp) -> E2e {
        let sandbox = sluice_sandbox_psp::start(SandboxConfig {
            timeout_hold: Duration::from_secs(4),
            slow_delay: Duration::from_millis(500),
            late_webhook_delay: Some(Duration::from_millis(500)),
            seed: Some(7),
            stripe_api_keys: vec![DEFAULT_STRIPE_API_KEY.into(), SECOND_STRIPE_API_KEY.into()],
            retry: RetryPolicy {
                max_attempts: 20,
                backoff: Duration::from_millis(100),
                request_timeout: Duration::from_secs(10),
            },
            ..SandboxConfig::default()
        })
        .await
        .expect("sandbox PSP");
        let adapter = psp.adapter();
        let runtime = tokio::task::spawn_blocking(move || runtime_with(&[adapter]))
            .await
            .expect("runtime task");
        let merchant = db
            .store
            .create_merchant("E2E Shop")
            .await
            .expect("merchant");
        let (base_url, mut config) = match psp {
            Psp::Stripe => (sandbox.base_url_stripe(), serde_json::json!({})),
            Psp::Adyen => (
                sandbox.base_url_adyen(),
                serde_json::json!({ "merchant_account": "SluiceE2E" }),
            ),
        };
        config["base_url"] = serde_json::json!(base_url);
        let account = db
            .store
            .create_connector_account(&NewConnectorAccount {
                merchant_id: merchant.id.clone(),
                adapter: adapter.into(),
                label: adapter.into(),
                config,
                secrets: serde_json::json!({
                    "api_key": psp.api_key(),
                    "webhook_secret": psp.webhook_secret(),
                }),
            })
            .await
            .expect("connector account");
        let transport = Arc::new(LosableTransport {
            inner: ReqwestTransport::new().expect("transport"),
            lose_next_creation: AtomicBool::new(false),
        });
        let skew = SkewClock::default();
        let clock: Arc<dyn Clock> = Arc::new(skew.clone());
        let orch = Orchestrator::new(
            db.store.clone(),
            runtime,
            transport.clone(),
            clock,
            e2e_config(),
        );
        let gateway_url = serve_webhooks(orch.clone()).await;
        let (stop, stopped) = watch::channel(false);
        let processor = orch.clone();
        tokio::spawn(async move { processor.run_inbox_processor(stopped).await });
        let e2e = E2e {
            db,
            psp,
            sandbox,
            transport,
            orch,
            merchant,
            account,
            gateway_url,
            clock: skew,
            stop,
        };
        e2e.webhooks_on();
        e2e
    }

    /// Another connector account of the merchant at the same sandbox: its own
    /// PSP account (`secret_key` None), or one whose credentials the PSP
    /// refuses (`Some(wrong key)`). Returns it with the name the sandbox
    /// knows the PSP account by (for `set_account_decline`).
    pub async fn another_account(
        &self,
        label: &str,
        wrong_key: Option<&str>,
    ) -> (ConnectorAccount, String) {
        let (base_url, mut config, key, psp_account) = match self.psp {
            Psp::Stripe => (
                self.sandbox.base_url_stripe(),
                serde_json::json!({}),
                SECOND_STRIPE_API_KEY,
                SECOND_STRIPE_API_KEY.to_owned(),
            ),
            Psp::Adyen => {
                let merchant_account = format!("SluiceE2E{label}");
                (
                    self.sandbox.base_url_adyen(),
                    serde_json::json!({ "merchant_account": merchant_account }),
                    DEFAULT_ADYEN_API_KEY,
                    merchant_account,
                )
            }
        };
        config["base_url"] = serde_json::json!(base_url);
        let account = self
            .db
            .store
            .create_connector_account(&NewConnectorAccount {
                merchant_id: self.merchant.id.clone(),
                adapter: self.psp.adapter().into(),
                label: label.into(),
                config,
                secrets: serde_json::json!({
                    "api_key": wrong_key.unwrap_or(key),
                    "webhook_secret": self.psp.webhook_secret(),
                }),
            })
            .await
            .expect("connector account");
        (account, psp_account)
    }

    /// The name the sandbox knows the first account's PSP account by.
    pub fn psp_account(&self) -> String {
        match self.psp {
            Psp::Stripe => DEFAULT_STRIPE_API_KEY.to_owned(),
            Psp::Adyen => "SluiceE2E".to_owned(),
        }
    }

    /// Route every payment of the merchant to these accounts, in this order
    /// (the first takes all first attempts).
    pub async fn route_in_order(&self, accounts: &[&ConnectorAccount]) {
        let config = sluice_core::RoutingConfig {
            rules: vec![sluice_core::RouteRule {
                id: "all".into(),
                when: Default::default(),
                accounts: accounts
                    .iter()
                    .enumerate()
                    .map(|(i, a)| sluice_core::WeightedAccount {
                        connector_account: a.id.clone(),
                        weight: u32::from(i == 0),
                    })
                    .collect(),
            }],
            ..Default::default()
        };
        self.db
            .store
            .put_routing_config(&self.merchant.id, &config)
            .await
            .expect("routing config");
    }

    /// Let the sandbox deliver its webhooks to the gateway's route.
    pub fn webhooks_on(&self) {
        self.sandbox.set_webhook_target(
            self.psp.adapter(),
            WebhookTarget {
                url: format!(
                    "{}/webhooks/{}/{}",
                    self.gateway_url,
                    self.psp.adapter(),
                    self.account.id
                ),
                secret: self.psp.webhook_secret().into(),
                format: self.psp.format(),
                api_key: Some(self.psp.api_key().into()),
            },
        );
    }

    /// Stop webhooks, so only the host's own calls can move anything.
    pub fn webhooks_off(&self) {
        self.sandbox.remove_webhook_target(self.psp.adapter());
    }

    pub fn storm(&self) {
        self.sandbox.set_delivery_faults(DeliveryFaults {
            duplicates: 3,
            delay: Duration::from_millis(50),
            reorder_window: 4,
            reorder_flush: Duration::from_millis(150),
            adyen_batch: true,
        });
    }

    pub async fn create(
        &self,
        order_no: &str,
        amount: i64,
        mode: CaptureMode,
        token: &str,
    ) -> PaymentView {
        create_payment(&self.orch, &self.merchant.id, order_no, amount, mode, token).await
    }

    pub async fn view(&self, payment_id: &str) -> PaymentView {
        self.orch
            .payment(&self.merchant.id, payment_id)
            .await
            .expect("payment view")
    }

    /// Let every webhook reach the gateway and the inbox drain.
    pub async fn settle_webhooks(&self) {
        assert!(
            self.sandbox
                .wait_webhooks_idle(Duration::from_secs(20))
                .await,
            "the sandbox's webhooks never went idle"
        );
        for _ in 0..200 {
            if self
                .orch
                .process_inbox_once()
                .await
                .expect("inbox round")
                .claimed
                == 0
            {
                return;
            }
        }
        panic!("the inbox never drained");
    }
}

/// Create and confirm a payment of `merchant` (routed by its configuration)
/// and return the view the merchant gets.
pub async fn create_payment(
    orch: &Orchestrator,
    merchant_id: &str,
    order_no: &str,
    amount: i64,
    mode: CaptureMode,
    token: &str,
) -> PaymentView {
    orch.create_payment(
        merchant_id,
        CreatePayment {
            merchant_order_no: order_no.into(),
            amount: eur(amount),
            capture_mode: mode,
            payment_method_token: Some(token.into()),
            return_url: Some("https://shop.example/return".into()),
            description: None,
            metadata: serde_json::json!({}),
            fulfillment: Default::default(),
            confirm: Some(ConfirmOptions::default()),
        },
    )
    .await
    .expect("create and confirm")
    .view
}

/// What the HTTP layer does with a webhook: hand the raw request to the
/// orchestrator, answer with the adapter's ack only once the events are in
/// the inbox, 401/400 for a refusal, 404 for an unknown route, 5xx (so the
/// PSP retries) when the host failed.
async fn serve_webhooks(orch: Orchestrator) -> String {
    let app = Router::new()
        .route("/webhooks/{adapter}/{account}", post(webhook))
        .with_state(orch);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind gateway");
    let addr = listener.local_addr().expect("gateway address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

async fn webhook(
    State(orch): State<Orchestrator>,
    Path((adapter, account)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = WebhookRequest {
        method: method.to_string(),
        path: uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default(),
        headers: headers
            .iter()
            .map(|(name, value)| Header {
                name: name.as_str().to_owned(),
                value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            })
            .collect(),
        body: body.to_vec(),
    };
    match orch.ingest_webhook(&adapter, &account, request).await {
        Ok(WebhookOutcome::Accepted { ack, .. }) => {
            let mut response = Response::builder()
                .status(StatusCode::from_u16(ack.status).unwrap_or(StatusCode::OK));
            for header in &ack.headers {
                response = response.header(header.name.as_str(), header.value.as_str());
            }
            response
                .body(axum::body::Body::from(ack.body))
                .unwrap_or_else(|_| StatusCode::OK.into_response())
        }
        Ok(WebhookOutcome::Rejected { kind, .. }) => (
            StatusCode::from_u16(kind.http_status()).unwrap_or(StatusCode::BAD_REQUEST),
            kind.as_str(),
        )
            .into_response(),
        Ok(WebhookOutcome::NotFound) => StatusCode::NOT_FOUND.into_response(),
        Err(error) => (
            StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "try again",
        )
            .into_response(),
    }
}
