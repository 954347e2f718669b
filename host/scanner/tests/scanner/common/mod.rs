//! Test harness: real databases (a SQLite temp file and a fresh PostgreSQL
//! database per test; PostgreSQL unreachable is a failure, never a skip), the
//! real compiled `test-well-behaved` adapter, an in-process fake PSP over
//! real HTTP, the real orchestrator, and the scanner under test. Adapted from
//! the orchestrator's tests.
#![allow(dead_code)]

pub use sluice_system_tests::fake_psp;

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sluice_adapter_runtime::{AdapterRuntime, RuntimeConfig};
use sluice_core::{CaptureMode, Currency, Money, RecoveryPolicy};
use sluice_orchestrator::{
    ConfirmOptions, CreatePayment, InboxConfig, Orchestrator, OrchestratorConfig, ReqwestTransport,
};
use sluice_scanner::{Scanner, ScannerConfig};
use sluice_store::{
    Backend, Clock, ConnectorAccount, Merchant, NewConnectorAccount, Store, StoreOptions,
    SystemClock,
};
use sqlx::Connection;

pub use fake_psp::{FakePsp, Mode, Route as PspRoute, API_KEY};

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const WEBHOOK_SECRET: &str = "whsec_scanner_test";
pub const ADAPTER: &str = "test-well-behaved";

/// Run one async test body against both backends (two `#[tokio::test]`s).
#[macro_export]
macro_rules! dual_test {
    ($(#[$meta:meta])* async fn $name:ident($db:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($db: $crate::common::TestDb) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_sqlite() {
                run($crate::common::TestDb::sqlite().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_postgres() {
                run($crate::common::TestDb::postgres().await).await;
            }
        }
    };
}

/// The test clock of the store, the orchestrator and the scanner: the wall
/// clock plus an offset a test moves forward (days pass without a sleep;
/// leases and call budgets still see time move).
#[derive(Debug, Clone, Default)]
pub struct TestClock(Arc<AtomicI64>);

impl TestClock {
    /// Jump `by_ms` into the future.
    pub fn advance(&self, by_ms: i64) {
        self.0.fetch_add(by_ms, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.0.load(Ordering::SeqCst)
    }
}

/// A migrated store on a throwaway database, dropped afterwards.
pub struct TestDb {
    pub store: Store,
    pub clock: TestClock,
    pub backend: Backend,
    pub url: String,
    _sqlite_dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

fn options(clock: &TestClock) -> StoreOptions {
    StoreOptions {
        clock: Arc::new(clock.clone()),
        first_query_delay: Duration::from_millis(200),
        ..StoreOptions::default()
    }
}

impl TestDb {
    pub async fn sqlite() -> TestDb {
        init_tracing();
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/sluice.db", dir.path().display());
        let clock = TestClock::default();
        let store = Store::connect_with(&url, options(&clock))
            .await
            .expect("open SQLite store");
        store.migrate().await.expect("migrate SQLite");
        TestDb {
            store,
            clock,
            backend: Backend::Sqlite,
            url,
            _sqlite_dir: Some(dir),
            pg: None,
        }
    }

    pub async fn postgres() -> TestDb {
        init_tracing();
        sqlx::any::install_default_drivers();
        let admin_url =
            std::env::var("SLUICE_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
        let mut admin = sqlx::AnyConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is required by the scanner tests and is unreachable at \
                     {admin_url}: {e}. Start PostgreSQL or point SLUICE_TEST_DATABASE_URL at one."
                )
            });
        let name = format!("sluice_scan_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create test database");
        admin.close().await.ok();
        let url = database_url(&admin_url, &name);
        let clock = TestClock::default();
        let store = Store::connect_with(&url, options(&clock))
            .await
            .expect("open PostgreSQL store");
        store.migrate().await.expect("migrate PostgreSQL");
        TestDb {
            store,
            clock,
            backend: Backend::Postgres,
            url,
            _sqlite_dir: None,
            pg: Some((admin_url, name)),
        }
    }

    /// A second, independent pool on the same database (another instance).
    pub async fn another_store(&self) -> Store {
        Store::connect_with(&self.url, options(&self.clock))
            .await
            .expect("open a second store")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((admin_url, name)) = self.pg.take() else {
            return;
        };
        // Best effort, on a thread of its own: Drop cannot await.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(mut admin) = sqlx::AnyConnection::connect(&admin_url).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut admin)
                        .await;
                }
            });
        })
        .join();
    }
}

fn database_url(admin_url: &str, name: &str) -> String {
    match admin_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => format!("{admin_url}/{name}"),
    }
}

fn init_tracing() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

/// Directory holding `<adapter>.wasm`: `SLUICE_TEST_ADAPTERS_DIR`, else
/// `$CARGO_TARGET_DIR/adapters`, else the workspace's `target/adapters`
/// (where `cargo xtask build-adapters` puts them).
pub fn adapters_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_TEST_ADAPTERS_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        let dir = PathBuf::from(target).join("adapters");
        if dir.is_dir() {
            return dir;
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/adapters")
}

pub fn adapter_bytes(name: &str) -> Vec<u8> {
    let path = adapters_dir().join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the compiled adapter {} ({e}). Build the adapters first: \
             `cargo xtask build-adapters` (or set SLUICE_TEST_ADAPTERS_DIR)",
            path.display()
        )
    })
}

/// One compile cache per test binary, so each component compiles once.
fn cache_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("compile cache dir"))
        .path()
        .to_path_buf()
}

pub fn runtime_with(names: &[&str]) -> AdapterRuntime {
    let runtime = AdapterRuntime::new(RuntimeConfig {
        cache_dir: Some(cache_dir()),
        max_concurrent_instances: 16,
        ..RuntimeConfig::default()
    })
    .expect("adapter runtime");
    for name in names {
        runtime
            .load(name, &adapter_bytes(name), None, true)
            .unwrap_or_else(|e| panic!("loading {name}: {e:?}"));
    }
    runtime
}

pub fn test_config() -> OrchestratorConfig {
    OrchestratorConfig {
        sync_wait: Duration::from_secs(3),
        psp_timeout: Duration::from_millis(800),
        in_flight_grace: Duration::from_millis(100),
        inbox: InboxConfig {
            max_tries: 3,
            retry_base: Duration::ZERO,
            retry_cap: Duration::ZERO,
            idle_poll: Duration::from_millis(20),
            ..InboxConfig::default()
        },
        ..OrchestratorConfig::default()
    }
}

/// A policy on a test's time scale: everything is due within ~100 ms, and
/// a query pushes the next one out by at least `base_backoff_ms`.
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
        let store = self.db.another_store().await;
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

/// Poll `check` until it returns Some, or fail after `within`.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
