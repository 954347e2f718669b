//! Shared helpers: a sandbox with short delays, a recording stand-in for the
//! gateway's webhook route, HTTP helpers for both formats, and signature checks
//! computed independently of the crate under test.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;
use tokio::sync::Semaphore;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use sluice_sandbox_psp::{
    DeliveryFaults, Format, RetryPolicy, SandboxConfig, SandboxHandle, WebhookTarget,
    DEFAULT_ADYEN_API_KEY, DEFAULT_STRIPE_API_KEY,
};

pub const STRIPE_KEY: &str = DEFAULT_STRIPE_API_KEY;
pub const ADYEN_KEY: &str = DEFAULT_ADYEN_API_KEY;
pub const WHSEC: &str = "whsec_sandbox_test_secret";
pub const ADYEN_HMAC_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
pub const MERCHANT: &str = "SluiceTestMerchant";

/// A config with delays short enough for a fast suite.
pub fn fast_config() -> SandboxConfig {
    SandboxConfig {
        timeout_hold: Duration::from_secs(3),
        slow_delay: Duration::from_millis(400),
        late_webhook_delay: None,
        seed: Some(42),
        retry: RetryPolicy {
            max_attempts: 4,
            backoff: Duration::from_millis(30),
            request_timeout: Duration::from_secs(2),
        },
        ..SandboxConfig::default()
    }
}

pub async fn sandbox() -> SandboxHandle {
    sandbox_with(fast_config()).await
}

pub async fn sandbox_with(config: SandboxConfig) -> SandboxHandle {
    match sluice_sandbox_psp::start(config).await {
        Ok(handle) => handle,
        Err(e) => panic!("sandbox did not start: {e}"),
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"))
}

/// One HTTP answer: status, headers, raw body and the body as JSON (Null if not JSON).
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
    pub json: Value,
}

pub async fn reply(r: reqwest::Response) -> Reply {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        text,
        json,
    }
}

// ---------------------------------------------------------------------------
// Stripe helpers

pub async fn stripe_post(
    sb: &SandboxHandle,
    path: &str,
    idempotency_key: Option<&str>,
    form: &[(&str, &str)],
) -> Reply {
    let mut req = client()
        .post(format!("{}{path}", sb.base_url_stripe()))
        .bearer_auth(STRIPE_KEY)
        .form(form);
    if let Some(k) = idempotency_key {
        req = req.header("Idempotency-Key", k);
    }
    reply(
        req.send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}")),
    )
    .await
}

pub async fn stripe_get(sb: &SandboxHandle, path_and_query: &str) -> Reply {
    let r = client()
        .get(format!("{}{path_and_query}", sb.base_url_stripe()))
        .bearer_auth(STRIPE_KEY)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path_and_query}: {e}"));
    reply(r).await
}

/// The form the Stripe adapter sends for authorize (`manual`) or sale (`automatic`).
pub fn pi_form<'a>(
    attempt: &'a str,
    token: &'a str,
    amount: &'a str,
    capture: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("amount", amount),
        ("currency", "eur"),
        ("payment_method", token),
        ("confirm", "true"),
        ("capture_method", capture),
        ("metadata[sluice_attempt_reference]", attempt),
        ("metadata[merchant_order_no]", "order-1"),
    ]
}

pub async fn stripe_create(
    sb: &SandboxHandle,
    attempt: &str,
    token: &str,
    amount: &str,
    capture: &str,
) -> Reply {
    stripe_post(
        sb,
        "/v1/payment_intents",
        Some(attempt),
        &pi_form(attempt, token, amount, capture),
    )
    .await
}

pub fn search_path(attempt: &str) -> String {
    let query = format!("metadata['sluice_attempt_reference']:'{attempt}'");
    format!(
        "/v1/payment_intents/search?{}",
        [("query", query.as_str())]
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect::<Vec<_>>()
            .join("&")
    )
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Adyen helpers

pub async fn adyen_post(
    sb: &SandboxHandle,
    path: &str,
    idempotency_key: Option<&str>,
    body: &Value,
) -> Reply {
    let mut req = client()
        .post(format!("{}{path}", sb.base_url_adyen()))
        .header("X-API-Key", ADYEN_KEY)
        .json(body);
    if let Some(k) = idempotency_key {
        req = req.header("Idempotency-Key", k);
    }
    reply(
        req.send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}")),
    )
    .await
}

/// The body the Adyen adapter sends for authorize (`manual`) or sale.
pub fn adyen_payment(reference: &str, token: &str, value: i64, manual: bool) -> Value {
    let mut body = serde_json::json!({
        "amount": { "value": value, "currency": "EUR" },
        "reference": reference,
        "merchantAccount": MERCHANT,
        "paymentMethod": { "type": "scheme", "storedPaymentMethodId": token },
        "returnUrl": "https://merchant.example/return",
    });
    if manual {
        body["additionalData"] = serde_json::json!({ "manualCapture": "true" });
    }
    body
}

// ---------------------------------------------------------------------------
// A stand-in for the gateway's webhook route

#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: String,
}

#[derive(Clone, Default)]
struct ReceiverState {
    received: Arc<Mutex<Vec<Received>>>,
    fail_next: Arc<AtomicUsize>,
    /// Some: each request waits for a permit the test hands out before it is answered.
    gate: Option<Arc<Semaphore>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

/// Records every webhook it gets; answers 500 to the next `fail_next` ones, then 200.
pub struct Receiver {
    pub url: String,
    state: ReceiverState,
}

impl Receiver {
    pub async fn start() -> Self {
        Self::serve(ReceiverState::default()).await
    }

    /// A receiver that answers a request only once [`Receiver::release`] lets it.
    pub async fn start_gated() -> Self {
        Self::serve(ReceiverState {
            gate: Some(Arc::new(Semaphore::new(0))),
            ..ReceiverState::default()
        })
        .await
    }

    /// Lets `n` more held requests (or later ones) be answered.
    pub fn release(&self, n: usize) {
        if let Some(gate) = &self.state.gate {
            gate.add_permits(n);
        }
    }

    /// Requests arrived and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    /// The most requests that were ever in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests are in flight at once (or panics after 5 s).
    pub async fn wait_in_flight(&self, n: usize) {
        for _ in 0..500 {
            if self.in_flight() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("expected {n} webhooks in flight, got {}", self.in_flight());
    }

    async fn serve(state: ReceiverState) -> Self {
        let app = Router::new()
            .route("/webhooks/{adapter}/{account}", post(receive))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind receiver: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("addr: {e}"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url: format!("http://{addr}"),
            state,
        }
    }

    pub fn fail_next(&self, n: usize) {
        self.state.fail_next.store(n, Ordering::SeqCst);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state
            .received
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    pub fn stripe_target(&self) -> WebhookTarget {
        WebhookTarget {
            url: format!("{}/webhooks/stripe/acct_test", self.url),
            secret: WHSEC.to_owned(),
            format: Format::Stripe,
            api_key: None,
        }
    }

    pub fn adyen_target(&self) -> WebhookTarget {
        WebhookTarget {
            url: format!("{}/webhooks/adyen/acct_test", self.url),
            secret: ADYEN_HMAC_KEY.to_owned(),
            format: Format::Adyen,
            api_key: None,
        }
    }

    /// Waits until at least `n` webhooks arrived (or panics after 5 s).
    pub async fn wait_for(&self, n: usize) -> Vec<Received> {
        for _ in 0..500 {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("expected {n} webhooks, got {}", self.received().len());
    }
}

async fn receive(
    State(state): State<ReceiverState>,
    Path((adapter, account)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    let record = Received {
        path: format!("/webhooks/{adapter}/{account}"),
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    if let Ok(mut v) = state.received.lock() {
        v.push(record);
    }
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    if let Some(gate) = &state.gate {
        // Never closed: a permit always comes once the test releases one.
        if let Ok(permit) = gate.acquire().await {
            permit.forget();
        }
    }
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    let failing = state
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        (StatusCode::INTERNAL_SERVER_ERROR, "busy")
    } else {
        (StatusCode::OK, "[accepted]")
    }
}

/// A sandbox whose webhooks go to a fresh receiver, with the given delivery faults.
pub async fn sandbox_and_receiver(faults: DeliveryFaults) -> (SandboxHandle, Receiver) {
    let mut config = fast_config();
    config.delivery = faults;
    sandbox_sending_to(Receiver::start().await, config).await
}

/// A sandbox with `senders` webhook senders whose webhooks go to a gated receiver.
pub async fn sandbox_and_gated_receiver(senders: usize) -> (SandboxHandle, Receiver) {
    let mut config = fast_config();
    config.webhook_senders = senders;
    sandbox_sending_to(Receiver::start_gated().await, config).await
}

/// A sandbox set up as `config` says whose webhooks of both formats go to `receiver`.
async fn sandbox_sending_to(
    receiver: Receiver,
    mut config: SandboxConfig,
) -> (SandboxHandle, Receiver) {
    config
        .webhook_targets
        .insert("stripe_test".into(), receiver.stripe_target());
    config
        .webhook_targets
        .insert("adyen_test".into(), receiver.adyen_target());
    (sandbox_with(config).await, receiver)
}

// ---------------------------------------------------------------------------
// Signature checks written from the PSPs' documentation, not from the crate

type HmacSha256 = Hmac<Sha256>;

/// Verifies `Stripe-Signature: t=..,v1=..` over `"{t}.{body}"` with the whsec string as key.
pub fn stripe_signature_is_valid(header: &str, body: &str, secret: &str) -> bool {
    let mut t = None;
    let mut v1s = Vec::new();
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", v)) => t = Some(v.to_owned()),
            Some(("v1", v)) => v1s.push(v.to_owned()),
            _ => {}
        }
    }
    let Some(t) = t else { return false };
    let Ok(mut mac) = HmacSha256::new_from_slice(secret.as_bytes()) else {
        return false;
    };
    mac.update(format!("{t}.{body}").as_bytes());
    let expected = hex::encode(mac.finalize().into_bytes());
    v1s.contains(&expected)
}

/// Recomputes an Adyen item's `additionalData.hmacSignature`.
pub fn adyen_item_signature(item: &Value, hex_key: &str) -> String {
    let s = |k: &str| item[k].as_str().unwrap_or("").to_owned();
    let payload = format!(
        "{}:{}:{}:{}:{}:{}:{}:{}",
        s("pspReference"),
        s("originalReference"),
        s("merchantAccountCode"),
        s("merchantReference"),
        item["amount"]["value"].as_i64().unwrap_or(-1),
        item["amount"]["currency"].as_str().unwrap_or(""),
        s("eventCode"),
        s("success"),
    );
    adyen_hmac(hex_key, &payload)
}

pub fn adyen_hmac(hex_key: &str, payload: &str) -> String {
    let key = hex::decode(hex_key).unwrap_or_default();
    let Ok(mut mac) = HmacSha256::new_from_slice(&key) else {
        return String::new();
    };
    mac.update(payload.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// The `NotificationRequestItem`s of one Adyen notification body.
pub fn adyen_items(body: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    v["notificationItems"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| i["NotificationRequestItem"].clone())
                .collect()
        })
        .unwrap_or_default()
}

/// `type` of a Stripe event body.
pub fn stripe_event_type(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    v["type"].as_str().unwrap_or("").to_owned()
}
