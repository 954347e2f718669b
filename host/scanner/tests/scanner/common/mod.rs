//! Test harness: real databases (a SQLite temp file and a fresh PostgreSQL
//! database per test; PostgreSQL unreachable is a failure, never a skip), the
//! real compiled `test-well-behaved` adapter, an in-process fake PSP over
//! real HTTP, the real orchestrator, and the scanner under test. Adapted from
//! the orchestrator's tests.
#![allow(dead_code)]

pub use sluice_test_support::fake_psp;

use std::sync::Arc;
use std::time::Duration;

use sluice_adapter_runtime::AdapterRuntime;
use sluice_core::{CaptureMode, Currency, Money, RecoveryPolicy};
use sluice_orchestrator::{ConfirmOptions, CreatePayment, Orchestrator, ReqwestTransport};
use sluice_scanner::{Scanner, ScannerConfig};
use sluice_store::{Backend, Clock, ConnectorAccount, Merchant, NewConnectorAccount, Store};
pub use sluice_test_support::adapters::{runtime_with, WELL_BEHAVED};
pub use sluice_test_support::orchestrator::{store_options, test_config};
use sluice_test_support::SkewClock;

pub use fake_psp::{FakePsp, Mode, Route as PspRoute, API_KEY};

pub const WEBHOOK_SECRET: &str = "whsec_scanner_test";
pub const ADAPTER: &str = WELL_BEHAVED;

/// The test clock of the store, the orchestrator and the scanner: the wall
/// clock plus an offset a test moves forward (days pass without a sleep;
/// leases and call budgets still see time move).
pub type TestClock = SkewClock;
pub type TestDb = sluice_test_support::TestDb<SkewClock>;
/// What `dual_test!` hands each body.
pub type TestSubject = TestDb;

pub async fn test_subject(backend: Backend) -> TestDb {
    TestDb::open_with(backend, store_options()).await
}

pub fn fast_policy(base_backoff_ms: i64) -> RecoveryPolicy {
    RecoveryPolicy {
        submitted_timeout_ms: 50,
        processing_timeout_ms: 50,
        base_backoff_ms,
        max_backoff_ms: 600_000,
        max_unknown_age_ms: 3_600_000,
        requires_action_ttl_ms: 3_600_000,
        ..RecoveryPolicy::default()
    }
}

pub fn scanner_config(policy: RecoveryPolicy) -> ScannerConfig {
    ScannerConfig {
        batch_size: 3,
        per_adapter_concurrency: 4,
        round_budget: 100,
        per_adapter_round_budget: 100,
        round_interval: Duration::from_millis(50),
        lease: Duration::from_secs(10),
        policy,
        retry_budget: sluice_core::RetryBudgetPolicy::default(),
    }
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
        let psp = FakePsp::start().await;
        let runtime = tokio::task::spawn_blocking(|| runtime_with(&[ADAPTER]))
            .await
            .expect("runtime task");
        let merchant = db
            .store
            .create_merchant("Scan Shop")
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
        let orch = orchestrator(db.store.clone(), runtime, &db.clock);
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

    pub fn scanner(&self, policy: RecoveryPolicy) -> Scanner {
        Scanner::new(self.orch.clone(), scanner_config(policy)).expect("scanner")
    }

    /// Another gateway instance: its own pool and orchestrator on the same database.
    pub async fn another_instance(&self) -> Orchestrator {
        let store = self.db.second_store().await;
        let runtime = tokio::task::spawn_blocking(|| runtime_with(&[ADAPTER]))
            .await
            .expect("runtime task");
        orchestrator(store, runtime, &self.db.clock)
    }

    pub fn payment(&self, order_no: &str, amount: i64, confirm: bool) -> CreatePayment {
        CreatePayment {
            merchant_order_no: order_no.into(),
            amount: eur(amount),
            capture_mode: CaptureMode::Automatic,
            payment_method_token: Some("tok_test".into()),
            return_url: None,
            description: None,
            metadata: serde_json::json!({ "cart": "c-1" }),
            fulfillment: Default::default(),
            confirm: confirm.then(ConfirmOptions::default),
        }
    }
}

fn orchestrator(store: Store, runtime: AdapterRuntime, clock: &TestClock) -> Orchestrator {
    let transport = Arc::new(ReqwestTransport::new().expect("transport"));
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    Orchestrator::new(store, runtime, transport, clock, test_config())
}

pub fn eur(amount: i64) -> Money {
    Money::positive(amount, Currency::parse("EUR").unwrap()).unwrap()
}
