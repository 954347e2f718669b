//! Test harness: a fresh database per test on SQLite and PostgreSQL, payments
//! created through the store's one door (so outbox rows are real), a real HTTP
//! merchant endpoint on 127.0.0.1, and a real JetStream stream per test.

use async_nats::jetstream;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use sluice_core::{CaptureMode, Currency, EventKind, EvidenceSource, Money, PaymentEvent};
use sluice_delivery::{
    create_endpoint, CreatedEndpoint, DeliveryMetrics, EndpointPolicy, NatsSinkConfig,
    NewWebhookEndpoint, Publisher, PublisherConfig, PublisherHooks,
};
pub use sluice_store::Clock as _;
use sluice_store::{
    ApplyEvent, Backend, Clock, ConnectorAccount, EventTarget, ManualClock, Merchant, NewAttempt,
    NewConnectorAccount, NewPayment, PaymentOrder, Provenance, RefundRequest, Store, StoreOptions,
    SystemClock,
};
use sqlx::Connection;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// A migrated store on a throwaway database, dropped afterwards.
pub struct TestDb {
    pub store: Store,
    pub backend: Backend,
    /// The store's clock (and so the publisher's): moves only when told.
    pub clock: ManualClock,
    sqlite_dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

/// Run one async test body against both backends (two `#[tokio::test]`s).
#[macro_export]
macro_rules! dual_test {
    ($(#[$meta:meta])* async fn $name:ident($db:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($db: &$crate::common::TestDb) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_sqlite() {
                let db = $crate::common::TestDb::sqlite().await;
                run(&db).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_postgres() {
                let db = $crate::common::TestDb::postgres().await;
                run(&db).await;
            }
        }
    };
}

impl TestDb {
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/sluice.db", dir.path().display());
        let clock = ManualClock::new(SystemClock.now_ms());
        let store = Store::connect_with(&url, options(&clock))
            .await
            .expect("open SQLite store");
        store.migrate().await.expect("migrate SQLite");
        TestDb {
            store,
            backend: Backend::Sqlite,
            clock,
            sqlite_dir: Some(dir),
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
                    "PostgreSQL is required by the delivery tests and is unreachable at {admin_url}: {e}. \
                     Start PostgreSQL or point SLUICE_TEST_DATABASE_URL at one."
                )
            });
        let name = format!("sluice_test_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create test database");
        admin.close().await.ok();
        let url = database_url(&admin_url, &name);
        let clock = ManualClock::new(SystemClock.now_ms());
        let store = Store::connect_with(&url, options(&clock))
            .await
            .expect("open PostgreSQL store");
        store.migrate().await.expect("migrate PostgreSQL");
        TestDb {
            store,
            backend: Backend::Postgres,
            clock,
            sqlite_dir: None,
            pg: Some((admin_url, name)),
        }
    }

    /// A second, independent store on the same database (another "instance").
    pub async fn second_store(&self) -> Store {
        let url = match (&self.pg, &self.sqlite_dir) {
            (Some((admin_url, name)), _) => database_url(admin_url, name),
            (None, Some(dir)) => format!("sqlite://{}/sluice.db", dir.path().display()),
            (None, None) => unreachable!("a test database is SQLite or PostgreSQL"),
        };
        Store::connect_with(&url, options(&self.clock))
            .await
            .expect("second store")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((admin_url, name)) = self.pg.take() else {
            return;
        };
        // No async drop: drop the database from a helper thread with its own runtime.
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

fn options(clock: &ManualClock) -> StoreOptions {
    StoreOptions {
        clock: Arc::new(clock.clone()),
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

pub fn eur(amount_minor: i64) -> Money {
    Money {
        amount_minor,
        currency: Currency::parse("EUR").expect("EUR"),
    }
}

pub fn sys() -> Provenance {
    Provenance::actor("system:test").with_trace("trace-delivery-test")
}

fn adapter_provenance() -> Provenance {
    Provenance::adapter("sandbox", "0.1.0", "sha256:abc").with_trace("trace-delivery-test")
}

fn event(kind: EventKind) -> PaymentEvent {
    let mut ev = PaymentEvent::new(kind, EvidenceSource::SyncResponse);
    ev.raw_status = kind.as_str().to_lowercase();
    ev
}

fn apply(target: EventTarget, event: PaymentEvent) -> ApplyEvent {
    ApplyEvent {
        target,
        event,
        provenance: adapter_provenance(),
        inbox_id: None,
        next_retry_time: None,
    }
}

/// A merchant with one connector account; payments made through the door.
pub struct Fixture {
    pub merchant: Merchant,
    pub account: ConnectorAccount,
}

impl Fixture {
    pub async fn new(store: &Store, name: &str) -> Fixture {
        let merchant = store.create_merchant(name).await.expect("merchant");
        let account = store
            .create_connector_account(&NewConnectorAccount {
                merchant_id: merchant.id.clone(),
                adapter: "sandbox".into(),
                label: "main".into(),
                config: serde_json::json!({"base_url": "http://127.0.0.1:9"}),
                secrets: serde_json::json!({"api_key": "sk_test_secret"}),
            })
            .await
            .expect("connector account");
        Fixture { merchant, account }
    }

    /// A succeeded payment: one outbox event, `payment.succeeded`.
    pub async fn succeeded(&self, store: &Store, order_no: &str, amount: i64) -> PaymentOrder {
        let payment = store
            .create_payment(
                &NewPayment {
                    merchant_id: self.merchant.id.clone(),
                    merchant_order_no: order_no.into(),
                    amount: eur(amount),
                    capture_mode: CaptureMode::Automatic,
                    payment_method_token: Some("pm_card_visa".into()),
                    return_url: None,
                    description: None,
                    metadata: serde_json::json!({}),
                    fulfillment: Default::default(),
                },
                &sys(),
            )
            .await
            .expect("payment");
        let attempt = store
            .create_attempt(
                &NewAttempt {
                    payment_id: payment.id.clone(),
                    connector_account_id: self.account.id.clone(),
                    ..NewAttempt::default()
                },
                &sys(),
            )
            .await
            .expect("attempt");
        let target = EventTarget::Attempt(attempt.reference.clone());
        store
            .apply_event(&apply(target.clone(), event(EventKind::AttemptSubmitted)))
            .await
            .expect("submitted");
        let mut ok = event(EventKind::PaymentSucceeded);
        ok.psp_reference = Some(format!("pi_{order_no}"));
        store
            .apply_event(&apply(target, ok))
            .await
            .expect("succeeded");
        payment
    }

    /// A succeeded payment refunded in part: three outbox events in version
    /// order, `payment.succeeded`, `refund.requested`, `refund.succeeded`.
    pub async fn refunded(&self, store: &Store, order_no: &str) -> PaymentOrder {
        let payment = self.succeeded(store, order_no, 100).await;
        let refund = store
            .reserve_refund(
                &RefundRequest {
                    payment_id: payment.id.clone(),
                    merchant_id: None,
                    amount: eur(30),
                    reason: Some("requested_by_customer".into()),
                    idempotency_key: None,
                },
                &sys(),
            )
            .await
            .expect("refund reserved");
        let mut ok = event(EventKind::RefundSucceeded);
        ok.psp_reference = Some(format!("re_{order_no}"));
        ok.amount = Some(eur(30));
        store
            .apply_event(&apply(EventTarget::Refund(refund.record.reference), ok))
            .await
            .expect("refund succeeded");
        payment
    }

    pub async fn endpoint(
        &self,
        store: &Store,
        url: &str,
        event_types: &[&str],
    ) -> CreatedEndpoint {
        create_endpoint(
            store,
            &self.merchant.id,
            &NewWebhookEndpoint {
                url: url.to_owned(),
                description: "test merchant".into(),
                event_types: event_types.iter().map(|s| (*s).to_owned()).collect(),
                enabled: true,
            },
            EndpointPolicy { allow_http: true },
        )
        .await
        .expect("endpoint")
    }
}

/// Count rows with a raw read-only query.
pub async fn count(store: &Store, sql: &str, arg: &str) -> i64 {
    use sqlx::Row;
    let row = sqlx::query(sql)
        .bind(arg)
        .fetch_one(store.pool())
        .await
        .expect("count query");
    row.try_get::<i64, _>(0).expect("count")
}

/// Every outbox event id, in write order.
pub async fn outbox_event_ids(store: &Store) -> Vec<String> {
    use sqlx::Row;
    sqlx::query("SELECT event_id FROM outbox ORDER BY seq")
        .fetch_all(store.pool())
        .await
        .expect("outbox ids")
        .iter()
        .map(|row| row.try_get::<String, _>(0).expect("event id"))
        .collect()
}

/// Publisher settings for tests: fast polling, real (short) timeouts, the
/// production retry schedule unless a test says otherwise.
pub fn test_config() -> PublisherConfig {
    PublisherConfig {
        poll_interval: Duration::from_millis(20),
        http_timeout: Duration::from_secs(2),
        delivery_lease: Duration::from_secs(10),
        ..PublisherConfig::default()
    }
}

pub const TEST_LEASE_MS: i64 = 10_000;

pub fn publisher(store: &Store, config: PublisherConfig) -> Publisher {
    publisher_with_hooks(store, config, PublisherHooks::default())
}

pub fn publisher_with_hooks(
    store: &Store,
    config: PublisherConfig,
    hooks: PublisherHooks,
) -> Publisher {
    let registry = prometheus::Registry::new();
    let metrics = DeliveryMetrics::register(&registry).expect("metrics");
    Publisher::with_hooks(store.clone(), config, metrics, hooks).expect("publisher")
}

/// One request the test merchant received.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub json: serde_json::Value,
}

impl Received {
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("header {name} missing"))
            .to_str()
            .expect("ascii header")
            .to_owned()
    }

    pub fn event_id(&self) -> String {
        self.header("Sluice-Event-Id")
    }
}

#[derive(Default)]
struct MerchantState {
    received: Mutex<Vec<Received>>,
    /// Event types answered with 500 regardless of `status`.
    failing_types: Mutex<HashSet<String>>,
    status: AtomicU16,
}

/// A real HTTP merchant endpoint on 127.0.0.1 that records every request.
pub struct TestMerchant {
    pub url: String,
    state: Arc<MerchantState>,
    server: tokio::task::JoinHandle<()>,
}

impl TestMerchant {
    pub async fn start() -> TestMerchant {
        let state = Arc::new(MerchantState {
            status: AtomicU16::new(200),
            ..MerchantState::default()
        });
        let handler_state = Arc::clone(&state);
        let app = axum::Router::new().route(
            "/hooks",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let state = Arc::clone(&handler_state);
                async move {
                    let json: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                    let event_type = json["type"].as_str().unwrap_or_default().to_owned();
                    state.received.lock().unwrap().push(Received {
                        headers,
                        body,
                        json,
                    });
                    if state.failing_types.lock().unwrap().contains(&event_type) {
                        return StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    StatusCode::from_u16(state.status.load(Ordering::SeqCst))
                        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind test merchant");
        let url = format!("http://{}/hooks", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        TestMerchant { url, state, server }
    }

    pub fn respond_with(&self, status: u16) {
        self.state.status.store(status, Ordering::SeqCst);
    }

    pub fn fail_event_type(&self, event_type: &str, failing: bool) {
        let mut types = self.state.failing_types.lock().unwrap();
        if failing {
            types.insert(event_type.to_owned());
        } else {
            types.remove(event_type);
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn event_ids(&self) -> Vec<String> {
        self.received().iter().map(Received::event_id).collect()
    }
}

impl Drop for TestMerchant {
    fn drop(&mut self) {
        self.server.abort();
    }
}

pub fn nats_url() -> String {
    std::env::var("SLUICE_TEST_NATS_URL").unwrap_or_else(|_| DEFAULT_NATS_URL.into())
}

/// A JetStream stream of its own for one test (unique name and subjects).
pub struct TestStream {
    pub config: NatsSinkConfig,
    js: jetstream::Context,
}

impl TestStream {
    pub async fn new() -> TestStream {
        let url = nats_url();
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(3))
            .connect(url.as_str())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "NATS JetStream is required by the delivery tests and is unreachable at {url}: {e}. \
                     Start nats-server with -js or point SLUICE_TEST_NATS_URL at one."
                )
            });
        let js = jetstream::new(client);
        let id = uuid::Uuid::new_v4().simple().to_string();
        let config = NatsSinkConfig {
            url,
            stream: format!("SLUICE_TEST_{id}"),
            subject_prefix: format!("sluice_test_{id}.events"),
            // Leaked streams of failed tests empty themselves.
            max_age: Duration::from_secs(600),
            // Within the tests' 10 s delivery lease.
            ack_timeout: Duration::from_secs(3),
            ..NatsSinkConfig::default()
        };
        TestStream { config, js }
    }

    /// Messages in the stream (0 while it does not exist).
    pub async fn message_count(&self) -> u64 {
        match self.js.get_stream(&self.config.stream).await {
            Ok(mut stream) => stream.info().await.expect("stream info").state.messages,
            Err(_) => 0,
        }
    }

    /// Every message, in stream order: (subject, Nats-Msg-Id, payload JSON).
    pub async fn messages(&self) -> Vec<(String, String, serde_json::Value)> {
        let mut stream = self
            .js
            .get_stream(&self.config.stream)
            .await
            .expect("stream");
        let state = stream.info().await.expect("info").state.clone();
        let mut out = Vec::new();
        if state.messages == 0 {
            return out;
        }
        for seq in state.first_sequence..=state.last_sequence {
            let Ok(message) = stream.get_raw_message(seq).await else {
                continue;
            };
            let msg_id = message
                .headers
                .get("Nats-Msg-Id")
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default();
            let json = serde_json::from_slice(&message.payload).expect("payload JSON");
            out.push((message.subject.to_string(), msg_id, json));
        }
        out
    }

    pub async fn delete(&self) {
        let _ = self.js.delete_stream(&self.config.stream).await;
    }
}

/// A TCP port with nothing listening on it.
pub async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    port
}
