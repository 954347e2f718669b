//! Test harness: a fresh database per test on SQLite and PostgreSQL, payments
//! created through the store's one door (so outbox rows are real), a real HTTP
//! merchant endpoint on 127.0.0.1, and a real JetStream stream per test.

use async_nats::jetstream;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use sluice_core::{EventKind, EvidenceSource};
use sluice_delivery::{
    create_endpoint, CreatedEndpoint, DeliveryMetrics, EndpointPolicy, NatsSinkConfig,
    NewWebhookEndpoint, Publisher, PublisherConfig, PublisherHooks,
};
pub use sluice_store::Clock as _;
use sluice_store::{Backend, ManualClock, PaymentOrder, RefundRequest, Store};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// The delivery tests' database: the store's clock (and so the publisher's)
/// moves only when told.
pub type TestDb = sluice_test_support::TestDb<ManualClock>;
/// What `dual_test!` hands each body.
pub type TestSubject = TestDb;

pub async fn test_subject(backend: Backend) -> TestDb {
    TestDb::open(backend).await
}

pub use sluice_test_support::door::{count, eur, event, on_refund, sys, Shop};

/// A merchant with one connector account; payments made through the door.
pub struct Fixture(Shop);

impl std::ops::Deref for Fixture {
    type Target = Shop;
    fn deref(&self) -> &Shop {
        &self.0
    }
}

impl Fixture {
    pub async fn new(store: &Store, name: &str) -> Fixture {
        Fixture(Shop::new(store, name).await)
    }

    /// A succeeded payment: one outbox event, `payment.succeeded`.
    pub async fn succeeded(&self, store: &Store, order_no: &str, amount: i64) -> PaymentOrder {
        self.0.succeeded(store, order_no, amount).await.0
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
        let mut ok = event(EventKind::RefundSucceeded, EvidenceSource::SyncResponse);
        ok.psp_reference = Some(format!("re_{order_no}"));
        ok.amount = Some(eur(30));
        store
            .apply_event(&on_refund(&refund.record.reference, ok))
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
