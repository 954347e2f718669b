//! Test harness: the merchant API served on 127.0.0.1:0 over a real store,
//! once on SQLite (a temp file) and once on PostgreSQL (a fresh database per
//! test; unreachable is a failure, never a skip), with the real orchestrator,
//! the real compiled `test-well-behaved` adapter and a fake PSP over HTTP.
#![allow(dead_code)]

pub use sluice_test_support::fake_psp;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::{json, Value};
use sluice_adapter_runtime::AdapterRuntime;
use sluice_merchant_api::{admin_router, router, ApiConfig, MerchantApiState};
use sluice_orchestrator::{Orchestrator, ReqwestTransport};
pub use sluice_store::Clock as _;
use sluice_store::{ApiKeyPepper, Store};
pub use sluice_store::{Backend, SystemClock};
pub use sluice_test_support::adapters::{
    adapter_bytes, adapters_dir, cache_dir, runtime_with, well_behaved_signature,
};
pub use sluice_test_support::orchestrator::{store_options, test_config as orchestrator_config};
pub use sluice_test_support::{eventually, SkewClock};

pub use fake_psp::{FakePsp, Mode, Route as PspRoute, API_KEY};

pub const ADAPTER: &str = sluice_test_support::adapters::WELL_BEHAVED;
pub const WEBHOOK_SECRET: &str = "whsec_do_not_leak";

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The merchant API tests' database: the wall clock, which a test can jump forward.
pub type TestDb = sluice_test_support::TestDb<SkewClock>;
/// What `dual_test!` hands each body: the API served over a fresh database.
pub type TestSubject = Gateway;

pub async fn test_subject(backend: Backend) -> Gateway {
    Gateway::start(test_db(backend).await).await
}

/// A fresh database on `backend` with the API tests' store options.
pub async fn test_db(backend: Backend) -> TestDb {
    TestDb::open_with(backend, store_options()).await
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

fn runtime() -> AdapterRuntime {
    runtime_with(&[ADAPTER])
}

impl Gateway {
    pub async fn start(db: TestDb) -> Gateway {
        Gateway::start_with(db, ApiConfig::default()).await
    }

    pub async fn start_with(db: TestDb, config: ApiConfig) -> Gateway {
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

    pub async fn admin_put(&self, path: &str, body: &Value) -> Reply {
        self.send(
            self.http
                .put(self.url(path))
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

    /// Another connector account of merchant `merchant_id` on `test-well-behaved` at
    /// the fake PSP, with the same secrets as its first; its id.
    pub async fn another_account(&self, merchant_id: &str, label: &str) -> String {
        self.admin_post(
            &format!("/admin/merchants/{merchant_id}/connector_accounts"),
            &json!({"adapter": ADAPTER, "label": label,
                    "config": {"base_url": self.psp.base_url()},
                    "secrets": {"api_key": API_KEY, "webhook_secret": WEBHOOK_SECRET}}),
        )
        .await
        .expect(201)
        .json()["id"]
            .as_str()
            .expect("account id")
            .to_owned()
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
    well_behaved_signature(secret, timestamp, body)
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
