//! Harness of the process-level system tests: `sluice serve` as child
//! processes on a throw-away PostgreSQL database, the sandbox PSP in-process,
//! a merchant webhook receiver (axum) and a JetStream consumer (async-nats).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use axum::body::Bytes;
use axum::http::HeaderMap;
use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sluice_sandbox_psp::{
    Format, SandboxHandle, WebhookTarget, DEFAULT_ADYEN_API_KEY, DEFAULT_STRIPE_API_KEY,
};
use tokio::time::Instant;

use crate::common::{adapter_bytes, ADMIN_TOKEN, TEST_MASTER_KEY};

pub const STRIPE_WEBHOOK_SECRET: &str = "whsec_system_test";
pub const ADYEN_HMAC_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

/// A free port on 127.0.0.1 (the tiny window before `sluice` binds it is
/// acceptable here); kept across restarts so the sandbox's webhook URLs stay valid.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free loopback port")
        .port()
}

/// A directory with the compiled Stripe and Adyen adapters.
pub fn real_adapters() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for name in ["stripe", "adyen"] {
        std::fs::write(dir.path().join(format!("{name}.wasm")), adapter_bytes(name))
            .expect("write adapter copy");
    }
    dir
}

/// One `sluice serve` process that can be killed and started again on the
/// same data directory, port and database.
pub struct Gateway {
    pub name: String,
    pub listen: String,
    pub url: String,
    data_dir: PathBuf,
    config_path: PathBuf,
    log_path: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
    pub starts: u32,
}

impl Gateway {
    /// `workers_toml` is the body of the `[workers]` section.
    pub fn new(
        name: &str,
        root: &Path,
        database_url: &str,
        adapters_dir: &Path,
        workers_toml: &str,
        extra_env: &[(&str, &str)],
    ) -> Gateway {
        let data_dir = root.join(name);
        std::fs::create_dir_all(&data_dir).expect("gateway data dir");
        let config_path = data_dir.join("sluice.toml");
        std::fs::write(&config_path, format!("[workers]\n{workers_toml}\n")).expect("config");
        let listen = format!("127.0.0.1:{}", free_port());
        let mut env: Vec<(String, String)> = vec![
            ("SLUICE_LISTEN".into(), listen.clone()),
            ("SLUICE_DATA_DIR".into(), data_dir.display().to_string()),
            ("SLUICE_DATABASE_URL".into(), database_url.into()),
            ("SLUICE_ADMIN_TOKEN".into(), ADMIN_TOKEN.into()),
            (
                "SLUICE_ADAPTERS_DIR".into(),
                adapters_dir.display().to_string(),
            ),
            // Every instance shares API keys with the others.
            (
                "SLUICE_API_KEY_PEPPER".into(),
                "system-test-pepper-0123456789abcdef".into(),
            ),
            // Every instance opens the others' sealed secrets.
            ("SLUICE_MASTER_KEY".into(), TEST_MASTER_KEY.into()),
            ("SLUICE_LOG".into(), "info".into()),
        ];
        env.extend(
            extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        Gateway {
            name: name.into(),
            url: format!("http://{listen}"),
            listen,
            log_path: data_dir.join("sluice.log"),
            data_dir,
            config_path,
            env,
            child: None,
            starts: 0,
        }
    }

    /// Spawns the process and waits until `/readyz` answers 200.
    pub async fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("gateway log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("serve")
            .arg("--config")
            .arg(&self.config_path)
            .current_dir(&self.data_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log);
        for var in [
            "SLUICE_NATS_URL",
            "SLUICE_NATS_STREAM",
            "SLUICE_NATS_SUBJECT_PREFIX",
        ] {
            command.env_remove(var);
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
        self.child = Some(command.spawn().expect("spawn sluice serve"));
        self.starts += 1;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("client");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(response) = client.get(format!("{}/readyz", self.url)).send().await {
                if response.status() == StatusCode::OK {
                    return;
                }
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "{} exited during start-up with {status}:\n{}",
                        self.name,
                        self.log_tail(40)
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready within 120 s:\n{}",
                self.name,
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL (`Child::kill`), then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The last `lines` lines the process logged (all its lives).
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Log lines that contain `needle`.
    pub fn log_lines_with(&self, needle: &str) -> Vec<String> {
        std::fs::read_to_string(&self.log_path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// The value of a Prometheus sample line starting with `prefix`, summed.
    pub async fn metric_sum(&self, prefix: &str) -> f64 {
        let Ok(response) = reqwest::get(format!("{}/metrics", self.url)).await else {
            return 0.0;
        };
        let text = response.text().await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The merchant the tests pay for, created through the admin API.
#[derive(Debug, Clone)]
pub struct Merchant {
    pub id: String,
    pub api_key: String,
    pub stripe_account: String,
    pub adyen_account: String,
}

/// An admin or merchant call that must succeed.
pub async fn call_ok(
    client: &reqwest::Client,
    method: Method,
    url: &str,
    token: &str,
    body: Option<Value>,
) -> Value {
    let mut request = client.request(method, url).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request to the gateway");
    let status = response.status();
    let json: Value = response.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{url}: {status} {json}");
    json
}

/// Creates a merchant, an API key, a Stripe and an Adyen connector account on
/// the sandbox (PSP call budget `timeout_ms`) and, when given, a webhook
/// endpoint for every event type; points the sandbox's webhooks at `gateway_url`.
pub async fn set_up_merchant(
    gateway_url: &str,
    sandbox: &SandboxHandle,
    timeout_ms: u64,
    endpoint_url: Option<&str>,
    sandbox_webhooks: bool,
) -> Merchant {
    let client = reqwest::Client::new();
    let admin = |path: &str| format!("{gateway_url}{path}");
    let merchant = call_ok(
        &client,
        Method::POST,
        &admin("/admin/merchants"),
        ADMIN_TOKEN,
        Some(json!({ "name": "system test merchant" })),
    )
    .await;
    let id = merchant["id"].as_str().expect("merchant id").to_owned();
    let key = call_ok(
        &client,
        Method::POST,
        &admin(&format!("/admin/merchants/{id}/api_keys")),
        ADMIN_TOKEN,
        Some(json!({ "label": "system test" })),
    )
    .await;
    let api_key = key["key"].as_str().expect("api key").to_owned();
    let mut accounts = BTreeMap::new();
    for (adapter, base_url, psp_key, secret, format) in [
        (
            "stripe",
            sandbox.base_url_stripe(),
            DEFAULT_STRIPE_API_KEY,
            STRIPE_WEBHOOK_SECRET,
            Format::Stripe,
        ),
        (
            "adyen",
            sandbox.base_url_adyen(),
            DEFAULT_ADYEN_API_KEY,
            ADYEN_HMAC_KEY,
            Format::Adyen,
        ),
    ] {
        let mut config = json!({ "base_url": base_url, "timeout_ms": timeout_ms.to_string() });
        if adapter == "adyen" {
            config["merchant_account"] = json!("SluiceSystemTest");
        }
        let account = call_ok(
            &client,
            Method::POST,
            &admin(&format!("/admin/merchants/{id}/connector_accounts")),
            ADMIN_TOKEN,
            Some(json!({
                "adapter": adapter,
                "label": format!("{adapter} sandbox"),
                "config": config,
                "secrets": { "api_key": psp_key, "webhook_secret": secret },
            })),
        )
        .await;
        let account_id = account["id"].as_str().expect("account id").to_owned();
        if sandbox_webhooks {
            sandbox.set_webhook_target(
                adapter,
                WebhookTarget {
                    url: format!("{gateway_url}/webhooks/{adapter}/{account_id}"),
                    secret: secret.into(),
                    format,
                    api_key: Some(psp_key.into()),
                },
            );
        }
        accounts.insert(adapter, account_id);
    }
    if let Some(url) = endpoint_url {
        call_ok(
            &client,
            Method::POST,
            &admin(&format!("/admin/merchants/{id}/webhook-endpoints")),
            ADMIN_TOKEN,
            Some(json!({ "url": url, "event_types": ["*"] })),
        )
        .await;
    }
    Merchant {
        id,
        api_key,
        stripe_account: accounts["stripe"].clone(),
        adyen_account: accounts["adyen"].clone(),
    }
}

/// The test's merchant webhook endpoint: records every delivery, answers 200.
pub struct Receiver {
    pub url: String,
    /// (event id, event type, payment id) per delivery, duplicates included.
    pub seen: Arc<Mutex<Vec<(String, String, String)>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let seen: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
        let record = seen.clone();
        let app = axum::Router::new().route(
            "/hooks",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let record = record.clone();
                async move {
                    let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    // The header and the body name the same event; a
                    // mismatch is recorded under a name no outbox row has.
                    let header = headers
                        .get("sluice-event-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let body_id = event["id"].as_str().unwrap_or_default().to_owned();
                    let id = if header == body_id {
                        body_id
                    } else {
                        format!("mismatch:{header}:{body_id}")
                    };
                    let kind = event["type"].as_str().unwrap_or_default().to_owned();
                    let payment = event["payment_id"].as_str().unwrap_or_default().to_owned();
                    record
                        .lock()
                        .expect("receiver lock")
                        .push((id, kind, payment));
                    StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let url = format!("http://{}/hooks", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { url, seen, server }
    }

    pub fn event_ids(&self) -> BTreeSet<String> {
        let seen = self.seen.lock().expect("receiver lock");
        seen.iter().map(|(id, _, _)| id.clone()).collect()
    }

    pub fn deliveries(&self) -> usize {
        self.seen.lock().expect("receiver lock").len()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A JetStream stream of the run's own (unique name and subjects) and a pull
/// consumer that reads it from the start, acking every message.
pub struct JetStreamConsumer {
    pub stream: String,
    pub subject_prefix: String,
    /// Nats-Msg-Id per message received, duplicates included.
    pub seen: Arc<Mutex<Vec<String>>>,
    js: jetstream::Context,
    task: tokio::task::JoinHandle<()>,
}

impl JetStreamConsumer {
    pub async fn start() -> JetStreamConsumer {
        let url = std::env::var("SLUICE_TEST_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(3))
            .connect(url.as_str())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "NATS JetStream is required by this test and is unreachable at {url}: {e}. \
                     Start nats-server -js or point SLUICE_TEST_NATS_URL at one."
                )
            });
        let js = jetstream::new(client);
        let id = uuid::Uuid::new_v4().simple().to_string();
        let stream_name = format!("SLUICE_SYSTEM_{id}");
        let subject_prefix = format!("sluice_system_{id}.events");
        let stream = js
            .create_stream(jetstream::stream::Config {
                name: stream_name.clone(),
                subjects: vec![format!("{subject_prefix}.>")],
                duplicate_window: Duration::from_secs(600),
                // A leaked stream of a failed run empties itself.
                max_age: Duration::from_secs(1800),
                ..Default::default()
            })
            .await
            .expect("create the run's JetStream stream");
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::Config {
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .expect("create the pull consumer");
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let Ok(mut messages) = consumer.messages().await else {
                return;
            };
            while let Some(Ok(message)) = messages.next().await {
                let id = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                record.lock().expect("consumer lock").push(id);
                let _ = message.ack().await;
            }
        });
        JetStreamConsumer {
            stream: stream_name,
            subject_prefix,
            seen,
            js,
            task,
        }
    }

    pub fn event_ids(&self) -> BTreeSet<String> {
        self.seen
            .lock()
            .expect("consumer lock")
            .iter()
            .cloned()
            .collect()
    }

    pub fn received(&self) -> usize {
        self.seen.lock().expect("consumer lock").len()
    }

    pub async fn delete(&self) {
        self.task.abort();
        let _ = self.js.delete_stream(&self.stream).await;
    }
}

/// A merchant API client that retries through a gateway's restarts with the
/// same `Idempotency-Key`, as a merchant's backend would.
#[derive(Clone)]
pub struct MerchantClient {
    client: reqwest::Client,
    base: String,
    api_key: String,
}

impl MerchantClient {
    pub fn new(base: &str, api_key: &str) -> MerchantClient {
        MerchantClient {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(15))
                .build()
                .expect("client"),
            base: base.to_owned(),
            api_key: api_key.to_owned(),
        }
    }

    /// Sends until the gateway answers something other than a connection
    /// error, a 5xx or a 409 (key in use), or `deadline` passes (`None`).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        idempotency_key: Option<&str>,
        body: Option<&Value>,
        deadline: Instant,
    ) -> Option<(StatusCode, Value)> {
        loop {
            let mut request = self
                .client
                .request(method.clone(), format!("{}{path}", self.base))
                .bearer_auth(&self.api_key);
            if let Some(key) = idempotency_key {
                request = request.header("Idempotency-Key", key);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            if let Ok(response) = request.send().await {
                let status = response.status();
                if let Ok(bytes) = response.bytes().await {
                    let retry = status.is_server_error() || status == StatusCode::CONFLICT;
                    if !retry {
                        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                        return Some((status, json));
                    }
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    pub async fn get_payment(&self, id: &str, deadline: Instant) -> Option<Value> {
        match self
            .call(
                Method::GET,
                &format!("/v1/payments/{id}"),
                None,
                None,
                deadline,
            )
            .await
        {
            Some((status, json)) if status.is_success() => Some(json),
            _ => None,
        }
    }

    /// Polls the payment until `done` holds for it, or `deadline` passes.
    pub async fn wait_payment(
        &self,
        id: &str,
        deadline: Instant,
        done: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        loop {
            if let Some(payment) = self.get_payment(id, deadline).await {
                if done(&payment) {
                    return Some(payment);
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
