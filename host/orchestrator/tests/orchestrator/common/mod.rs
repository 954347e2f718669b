//! Test harness: real databases (a SQLite temp file and a fresh PostgreSQL
//! database per test; PostgreSQL unreachable is a failure, never a skip), the
//! real compiled `test-well-behaved` adapter, and an in-process fake PSP
//! over real HTTP.
#![allow(dead_code)]

pub use sluice_test_support::fake_psp;
pub mod sandbox;

use std::sync::Arc;

use sluice_adapter_runtime::{Header, WebhookRequest};
use sluice_core::{CaptureMode, Currency, Money};
use sluice_orchestrator::{
    ConfirmOptions, CreatePayment, Orchestrator, OrchestratorConfig, ReqwestTransport,
};
use sluice_store::{
    Backend, Clock, ConnectorAccount, Merchant, NewConnectorAccount, Store, SystemClock,
};
pub use sluice_test_support::adapters::{runtime_with, well_behaved_signature, WELL_BEHAVED};
pub use sluice_test_support::eventually;
pub use sluice_test_support::orchestrator::{store_options, test_config};

pub use fake_psp::{FakePsp, Mode, Route as PspRoute, API_KEY};

pub const WEBHOOK_SECRET: &str = "whsec_orchestrator_test";
pub const ADAPTER: &str = WELL_BEHAVED;

/// The orchestrator tests' database: the store runs on the wall clock.
pub type TestDb = sluice_test_support::TestDb<SystemClock>;
/// What `dual_test!` hands each body.
pub type TestSubject = TestDb;

pub async fn test_subject(backend: Backend) -> TestDb {
    TestDb::open_with(backend, store_options()).await
}

/// A store, the fake PSP, a merchant with one connector account for it, and
/// the orchestrator over all of that.
pub struct Harness {
    pub db: TestDb,
    pub psp: FakePsp,
    pub orch: Orchestrator,
    pub merchant: Merchant,
    pub account: ConnectorAccount,
}

impl Harness {
    pub async fn new(db: TestDb) -> Harness {
        Harness::with_config(db, test_config()).await
    }

    pub async fn with_config(db: TestDb, config: OrchestratorConfig) -> Harness {
        let psp = FakePsp::start().await;
        let runtime = tokio::task::spawn_blocking(|| runtime_with(&[ADAPTER]))
            .await
            .expect("runtime task");
        let merchant = db
            .store
            .create_merchant("Orchestrator Test Shop")
            .await
            .expect("merchant");
        let account = db
            .store
            .create_connector_account(&NewConnectorAccount {
                merchant_id: merchant.id.clone(),
                adapter: ADAPTER.into(),
                label: "main".into(),
                config: serde_json::json!({ "base_url": psp.base_url() }),
                secrets: serde_json::json!({ "api_key": API_KEY, "webhook_secret": WEBHOOK_SECRET }),
            })
            .await
            .expect("connector account");
        let transport = Arc::new(ReqwestTransport::new().expect("transport"));
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let orch = Orchestrator::new(db.store.clone(), runtime, transport, clock, config);
        Harness {
            db,
            psp,
            orch,
            merchant,
            account,
        }
    }

    pub fn store(&self) -> &Store {
        &self.db.store
    }

    pub fn payment(
        &self,
        order_no: &str,
        amount: i64,
        mode: CaptureMode,
        confirm: bool,
    ) -> CreatePayment {
        CreatePayment {
            merchant_order_no: order_no.into(),
            amount: eur(amount),
            capture_mode: mode,
            payment_method_token: Some("tok_test".into()),
            return_url: None,
            description: None,
            metadata: serde_json::json!({ "cart": "c-1" }),
            fulfillment: Default::default(),
            confirm: confirm.then(ConfirmOptions::default),
        }
    }

    /// Create and confirm a payment; returns its id.
    pub async fn paid(&self, order_no: &str, amount: i64, mode: CaptureMode) -> String {
        let created = self
            .orch
            .create_payment(
                &self.merchant.id,
                self.payment(order_no, amount, mode, true),
            )
            .await
            .expect("create and confirm");
        created.view.details.order.id
    }

    /// A signed `test-well-behaved` webhook.
    pub fn webhook(&self, body: &serde_json::Value) -> WebhookRequest {
        signed_webhook(&self.account.id, WEBHOOK_SECRET, body)
    }
}

pub fn eur(amount: i64) -> Money {
    Money::positive(amount, Currency::parse("EUR").unwrap()).unwrap()
}

pub fn signed_webhook(account_id: &str, secret: &str, body: &serde_json::Value) -> WebhookRequest {
    let body = serde_json::to_vec(body).unwrap();
    let signature = well_behaved_signature(secret, SystemClock.now_ms() / 1000, &body);
    WebhookRequest {
        method: "POST".into(),
        path: format!("/webhooks/{ADAPTER}/{account_id}"),
        headers: vec![
            Header {
                name: "Content-Type".into(),
                value: "application/json".into(),
            },
            Header {
                name: "X-Test-Signature".into(),
                value: signature,
            },
        ],
        body,
    }
}
