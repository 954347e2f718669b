//! Test harness: the merchant API served on 127.0.0.1:0 over a real store,
//! once on SQLite (a temp file) and once on PostgreSQL (a fresh database per
//! test; unreachable is a failure, never a skip), with the real orchestrator,
//! the real compiled `test-well-behaved` adapter and a fake PSP over HTTP.
#![allow(dead_code)]

pub use sluice_system_tests::fake_psp;

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::{json, Value};
use sluice_adapter_runtime::{AdapterRuntime, RuntimeConfig};
use sluice_merchant_api::{admin_router, router, ApiConfig, MerchantApiState};
use sluice_orchestrator::{InboxConfig, Orchestrator, OrchestratorConfig, ReqwestTransport};
pub use sluice_store::Clock as _;
use sluice_store::{ApiKeyPepper, Backend, Clock, Store, StoreOptions, SystemClock};
use sqlx::Connection;

pub use fake_psp::{FakePsp, Mode, Route as PspRoute, API_KEY};

pub const ADAPTER: &str = "test-well-behaved";
pub const WEBHOOK_SECRET: &str = "whsec_do_not_leak";

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// Run one async test body against both backends (two `#[tokio::test]`s).
#[macro_export]
macro_rules! dual_test {
    ($(#[$meta:meta])* async fn $name:ident($gw:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($gw: &$crate::common::Gateway) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_sqlite() {
                let gw = $crate::common::Gateway::start($crate::common::TestDb::sqlite().await).await;
                run(&gw).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_postgres() {
                let gw = $crate::common::Gateway::start($crate::common::TestDb::postgres().await).await;
                run(&gw).await;
            }
        }
    };
}

/// Wall-clock time that a test can also jump forward (leases, key expiry),
/// so time-driven code keeps running normally in between.
#[derive(Debug, Clone, Default)]
pub struct SkewClock(Arc<AtomicI64>);

impl SkewClock {
    pub fn advance(&self, by_ms: i64) {
        self.0.fetch_add(by_ms, Ordering::SeqCst);
    }
}

impl Clock for SkewClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.0.load(Ordering::SeqCst)
    }
}

/// A migrated store on a throwaway database, dropped afterwards.
pub struct TestDb {
    pub store: Store,
    pub backend: Backend,
    pub clock: SkewClock,
    _sqlite_dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

impl TestDb {
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/sluice.db", dir.path().display());
        let clock = SkewClock::default();
        let store = Store::connect_with(&url, options(&clock))
            .await
            .expect("open SQLite store");
        store.migrate().await.expect("migrate SQLite");
        TestDb {
            store,
            backend: Backend::Sqlite,
            clock,
            _sqlite_dir: Some(dir),
            pg: None,
        }
    }

    pub async fn postgres() -> TestDb {
        sqlx::any::install_default_drivers();
        let admin_url =
            std::env::var("SLUICE_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
        let mut admin = sqlx::AnyConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is required by the merchant API tests and is unreachable at \
                     {admin_url}: {e}. Start PostgreSQL or point SLUICE_TEST_DATABASE_URL at one."
                )
            });
        let name = format!("sluice_api_test_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create test database");
        admin.close().await.ok();
        let url = database_url(&admin_url, &name);
        let clock = SkewClock::default();
        let store = Store::connect_with(&url, options(&clock))
            .await
            .expect("open PostgreSQL store");
        store.migrate().await.expect("migrate PostgreSQL");
        TestDb {
            store,
            backend: Backend::Postgres,
            clock,
            _sqlite_dir: None,
            pg: Some((admin_url, name)),
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((admin_url, name)) = self.pg.take() else {
            return;
        };
        let dropper = std::thread::spawn(move || {
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
        });
        let _ = dropper.join();
    }
}

fn options(clock: &SkewClock) -> StoreOptions {
    StoreOptions {
        clock: Arc::new(clock.clone()),
        first_query_delay: Duration::from_millis(200),
        ..StoreOptions::default()
    }
}

fn database_url(admin_url: &str, name: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (admin_url, None),
    };
    let prefix = match base.rsplit_once('/') {
        Some((prefix, _)) if prefix.contains("://") && prefix.len() > "postgres://".len() => prefix,
        _ => base,
    };
    match query {
        Some(q) => format!("{prefix}/{name}?{q}"),
        None => format!("{prefix}/{name}"),
    }
}

/// The API served on an ephemeral local port.
pub struct Gateway {
    pub db: TestDb,
    pub psp: FakePsp,
    pub orch: Orchestrator,
    pub state: MerchantApiState,
    pub base: String,
    pub http: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// What the admin-token check of the server does, for these tests.
async fn test_admin_auth(request: Request, next: Next) -> Response {
    let expected = format!("Bearer {ADMIN_TOKEN}");
    let ok = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(expected.as_str());
    if ok {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, "admin token required").into_response()
    }
}

pub fn pepper() -> ApiKeyPepper {
    ApiKeyPepper::new(b"merchant-api-test-pepper-32-bytes".to_vec()).expect("pepper")
}

/// Directory holding `<adapter>.wasm`: `SLUICE_TEST_ADAPTERS_DIR`, else the
/// workspace's `target/adapters` (where `cargo xtask build-adapters` puts them).
pub fn adapters_dir() -> PathBuf {
    std::env::var_os("SLUICE_TEST_ADAPTERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/adapters"))
}

fn adapter_bytes(name: &str) -> Vec<u8> {
    let path = adapters_dir().join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the compiled adapter {} ({e}). Build the adapters first: \
             `cargo xtask build-adapters` (or set SLUICE_TEST_ADAPTERS_DIR)",
            path.display()
        )
    })
}

/// One compile cache per test binary, so the component compiles once.
fn cache_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("compile cache dir"))
        .path()
        .to_path_buf()
}

fn runtime() -> AdapterRuntime {
    let runtime = AdapterRuntime::new(RuntimeConfig {
        cache_dir: Some(cache_dir()),
        max_concurrent_instances: 16,
        ..RuntimeConfig::default()
    })
    .expect("adapter runtime");
    runtime
        .load(ADAPTER, &adapter_bytes(ADAPTER), None, true)
        .unwrap_or_else(|e| panic!("loading {ADAPTER}: {e:?}"));
    runtime
}

/// Budgets small enough for tests, large enough for 2 shared cores.
pub fn orchestrator_config() -> OrchestratorConfig {
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

impl Gateway {
    pub async fn start(db: TestDb) -> Gateway {
        Gateway::start_with(db, ApiConfig::default()).await
    }

    pub async fn start_with(db: TestDb, config: ApiConfig) -> Gateway {
        init_tracing();
        let psp = FakePsp::start().await;
        let runtime = tokio::task::spawn_blocking(runtime)
            .await
            .expect("runtime task");
        let transport = Arc::new(ReqwestTransport::new().expect("transport"));
        let orch = Orchestrator::new(
            db.store.clone(),
            runtime,
            transport,
            Arc::new(db.clock.clone()),
            orchestrator_config(),
        );
        let state = MerchantApiState::with_config(orch.clone(), pepper(), config);
        let app = router(state.clone()).merge(admin_router(
            state.clone(),
            middleware::from_fn(test_admin_auth),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        Gateway {
            db,
            psp,
            orch,
            state,
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            server,
        }
    }

    pub fn store(&self) -> &Store {
        &self.db.store
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POST a JSON body as a merchant.
    pub async fn post(&self, key: &str, path: &str, body: &Value) -> Reply {
        self.send(
            self.http
                .post(self.url(path))
                .header(AUTHORIZATION, format!("Bearer {key}"))
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string()),
        )
        .await
    }

    /// POST with an Idempotency-Key.
    pub async fn post_idem(&self, key: &str, idem: &str, path: &str, body: &Value) -> Reply {
        self.send(
            self.http
                .post(self.url(path))
                .header(AUTHORIZATION, format!("Bearer {key}"))
                .header(CONTENT_TYPE, "application/json")
                .header("Idempotency-Key", idem)
                .body(body.to_string()),
        )
        .await
    }

    pub async fn get(&self, key: &str, path: &str) -> Reply {
        self.send(
            self.http
                .get(self.url(path))
                .header(AUTHORIZATION, format!("Bearer {key}")),
        )
        .await
    }

    pub async fn admin_post(&self, path: &str, body: &Value) -> Reply {
        self.send(
            self.http
                .post(self.url(path))
                .header(AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"))
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string()),
        )
        .await
    }

    pub async fn admin_get(&self, path: &str) -> Reply {
        self.send(
            self.http
                .get(self.url(path))
                .header(AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}")),
        )
        .await
    }

    pub async fn admin_delete(&self, path: &str) -> Reply {
        self.send(
            self.http
                .delete(self.url(path))
                .header(AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}")),
        )
        .await
    }

    pub async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = request.send().await.expect("HTTP request");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("body").to_vec();
        Reply {
            status,
            headers,
            bytes,
        }
    }

    /// A merchant created through the admin API, with an API key and one
    /// connector account on adapter `test-well-behaved` at the fake PSP.
    pub async fn merchant(&self, name: &str) -> TestMerchant {
        let merchant = self
            .admin_post("/admin/merchants", &json!({"name": name}))
            .await
            .expect(201);
        let id = merchant.json()["id"]
            .as_str()
            .expect("merchant id")
            .to_owned();
        let key = self
            .admin_post(
                &format!("/admin/merchants/{id}/api_keys"),
                &json!({"label": "tests"}),
            )
            .await
            .expect(201);
        let account = self
            .admin_post(
                &format!("/admin/merchants/{id}/connector_accounts"),
                &json!({
                    "adapter": "test-well-behaved",
                    "label": "main",
                    "config": {"base_url": self.psp.base_url()},
                    "secrets": {"api_key": API_KEY, "webhook_secret": WEBHOOK_SECRET}
                }),
            )
            .await
            .expect(201);
        TestMerchant {
            id,
            key: key.json()["key"].as_str().expect("key").to_owned(),
            key_id: key.json()["id"].as_str().expect("key id").to_owned(),
            account: account.json()["id"]
                .as_str()
                .expect("account id")
                .to_owned(),
        }
    }

    /// Rows in a table (tests read raw; they never write raw).
    pub async fn count(&self, table: &str) -> i64 {
        use sqlx::Row;
        let row = sqlx::query(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(self.store().pool())
            .await
            .expect("count");
        row.try_get::<i64, _>(0).expect("count value")
    }
}

/// `X-Test-Signature: t=<unix>,v1=<hex hmac>` over `"{t}.{body}"`, the
/// `test-well-behaved` adapter's scheme.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

impl Gateway {
    /// POST a webhook to `/webhooks/{adapter}/{account}` with this signature header.
    pub async fn webhook_signed(
        &self,
        adapter: &str,
        account: &str,
        signature: &str,
        body: &[u8],
    ) -> Reply {
        self.send(
            self.http
                .post(self.url(&format!("/webhooks/{adapter}/{account}")))
                .header(CONTENT_TYPE, "application/json")
                .header("X-Test-Signature", signature)
                .body(body.to_vec()),
        )
        .await
    }

    /// A correctly signed `test-well-behaved` webhook for `account`.
    pub async fn webhook(&self, account: &str, body: &Value) -> Reply {
        let bytes = serde_json::to_vec(body).expect("webhook body");
        let signature = sign(WEBHOOK_SECRET, SystemClock.now_ms() / 1000, &bytes);
        self.webhook_signed(ADAPTER, account, &signature, &bytes)
            .await
    }
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

pub struct TestMerchant {
    pub id: String,
    pub key: String,
    pub key_id: String,
    pub account: String,
}

/// A response, read completely.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub bytes: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or_else(|e| {
            panic!(
                "response is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.bytes)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// Assert the status and return self.
    #[track_caller]
    pub fn expect(self, status: u16) -> Reply {
        assert_eq!(
            self.status,
            status,
            "unexpected status; body: {}",
            self.text()
        );
        self
    }

    /// Assert the one error shape, the status and the code; returns the error object.
    #[track_caller]
    pub fn expect_error(&self, status: u16, code: &str) -> Value {
        assert_eq!(
            self.status,
            status,
            "unexpected status; body: {}",
            self.text()
        );
        assert_eq!(
            self.headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "errors are JSON: {}",
            self.text()
        );
        let body = self.json();
        let object = body.as_object().expect("object");
        assert_eq!(object.len(), 1, "only `error` at the top: {body}");
        let error = body["error"].as_object().expect("error object");
        let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["code", "message", "param", "type"], "{body}");
        assert!(
            error["type"].is_string() && error["message"].is_string(),
            "{body}"
        );
        assert!(
            error["param"].is_string() || error["param"].is_null(),
            "{body}"
        );
        assert_eq!(error["code"], code, "{body}");
        body["error"].clone()
    }
}

/// A valid create-payment body.
pub fn payment_body(order_no: &str, amount: i64) -> Value {
    json!({
        "amount": amount,
        "currency": "EUR",
        "merchant_order_no": order_no,
        "capture_mode": "automatic",
        "payment_method": "pm_card_visa",
        "return_url": "https://shop.example/return",
        "metadata": {"cart": "42"}
    })
}
