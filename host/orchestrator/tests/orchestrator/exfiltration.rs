//! Issue 11 §5: adapters never see a secret. The `test-exfiltrate` adapter tries to
//! leak the connector account's secrets through every export (describe, the request,
//! parse-response, handle-webhook and its ack, parse-settlement, the log), with a PSP
//! that echoes every request back. Nothing the guest saw or produced, and nothing the
//! host logged, may contain a secret, raw or hex or base64; the request on the wire
//! must carry the substituted credentials.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use async_trait::async_trait;
use base64::Engine as _;
use sluice_adapter_runtime::{ConnectorAccountScope, Header, HttpResponse, WebhookRequest};
use sluice_core::CaptureMode;
use sluice_orchestrator::transport::{CallBudget, CheckedRequest, PspTransport, TransportError};
use sluice_orchestrator::{ConfirmOptions, CreatePayment, Orchestrator, WebhookOutcome};
use sluice_store::{Clock, NewConnectorAccount, SystemClock};

use crate::common::{eur, runtime_with, test_config, TestDb};

const ADAPTER: &str = "test-exfiltrate";
const API_KEY: &str = "sk_live_exfil_9f8e7d6c5b4a";
const WEBHOOK_SECRET: &str = "whsec_exfil_0a1b2c3d4e5f";
const HMAC_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

/// A PSP that answers every request with the request itself, headers and body: what a
/// PSP does that stores and echoes a field a hostile adapter filled with a credential.
#[derive(Debug, Default)]
struct EchoPsp {
    wire: Mutex<Vec<CheckedRequest>>,
}

#[async_trait]
impl PspTransport for EchoPsp {
    async fn send(
        &self,
        request: &CheckedRequest,
        _budget: &CallBudget,
    ) -> Result<HttpResponse, TransportError> {
        self.wire
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(request.clone());
        let mut body = Vec::new();
        for header in &request.headers {
            body.extend_from_slice(format!("{}: {}\n", header.name, header.value).as_bytes());
        }
        body.extend_from_slice(&request.body);
        Ok(HttpResponse {
            status: 200,
            headers: request.headers.clone(),
            body,
        })
    }
}

/// Everything written through tracing in this test process.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        tracing_subscriber::fmt()
            .with_env_filter("info,sluice=trace,sluice_orchestrator=trace")
            .with_writer(move || LogSink(Arc::clone(&sink)))
            .with_ansi(false)
            .try_init()
            .expect("the exfiltration test installs the process's log subscriber first");
        logs
    })
    .clone()
}

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every form in which a secret could be smuggled out: raw, hex, base64.
fn forms() -> Vec<(String, String)> {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let url = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut forms = Vec::new();
    for secret in [API_KEY, WEBHOOK_SECRET, HMAC_KEY] {
        let mut bytes = vec![secret.as_bytes().to_vec()];
        bytes.extend(hex::decode(secret).ok());
        for raw in bytes {
            forms.push((format!("{secret} as hex"), hex::encode(&raw)));
            forms.push((format!("{secret} as HEX"), hex::encode_upper(&raw)));
            forms.push((
                format!("{secret} as base64"),
                b64.encode(&raw).trim_end_matches('=').to_string(),
            ));
            forms.push((format!("{secret} as base64url"), url.encode(&raw)));
        }
        forms.push((secret.to_string(), secret.to_string()));
        forms.push((format!("{secret} lower"), secret.to_lowercase()));
    }
    forms.push((
        "basic credentials".into(),
        b64.encode(format!("{API_KEY}:{WEBHOOK_SECRET}"))
            .trim_end_matches('=')
            .to_string(),
    ));
    forms
}

fn assert_no_secret(what: &str, text: &str) {
    for (name, form) in forms() {
        assert!(
            !text.contains(&form),
            "{what} leaks {name}: ...{}...",
            context_of(text, &form)
        );
    }
}

fn context_of<'a>(text: &'a str, form: &str) -> &'a str {
    let at = text.find(form).unwrap_or(0);
    let start = text[..at]
        .char_indices()
        .rev()
        .nth(60)
        .map_or(0, |(i, _)| i);
    &text[start..(at + form.len()).min(text.len())]
}

async fn run(db: TestDb) {
    let logs = captured_logs();
    let runtime = tokio::task::spawn_blocking(|| runtime_with(&[ADAPTER]))
        .await
        .expect("runtime task");
    let psp = Arc::new(EchoPsp::default());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let orch = Orchestrator::new(db.store.clone(), runtime, psp.clone(), clock, test_config());
    let merchant = db.store.create_merchant("Exfil Shop").await.unwrap();
    let account = db
        .store
        .create_connector_account(&NewConnectorAccount {
            merchant_id: merchant.id.clone(),
            adapter: ADAPTER.into(),
            label: "hostile".into(),
            // A secret copied into the settings by mistake must not be served either.
            config: serde_json::json!({
                "base_url": "http://127.0.0.1:9/psp",
                "api_key": API_KEY,
            }),
            secrets: serde_json::json!({
                "api_key": API_KEY,
                "webhook_secret": WEBHOOK_SECRET,
                "hmac_key": HMAC_KEY,
            }),
        })
        .await
        .unwrap();

    // build-request and parse-response, through the real call path.
    let created = orch
        .create_payment(
            &merchant.id,
            CreatePayment {
                merchant_order_no: "exfil-1".into(),
                amount: eur(1000),
                capture_mode: CaptureMode::Automatic,
                payment_method_token: Some("tok_exfil".into()),
                return_url: None,
                description: None,
                metadata: serde_json::json!({ "cart": "c-1" }),
                fulfillment: Default::default(),
                confirm: Some(ConfirmOptions::default()),
            },
        )
        .await
        .expect("create and confirm");
    let payment_id = created.view.details.order.id.clone();

    // The wire copy, and only the wire copy, carries the credentials.
    let wire = psp
        .wire
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert!(!wire.is_empty(), "the payment was sent");
    let sent = &wire[0];
    let header = |name: &str| {
        sent.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.clone())
    };
    assert_eq!(header("Authorization"), Some(format!("Bearer {API_KEY}")));
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("{API_KEY}:{WEBHOOK_SECRET}"));
    assert_eq!(header("X-Echo"), Some(basic));
    let body = String::from_utf8_lossy(&sent.body);
    assert!(body.contains(&format!("echo={API_KEY}")), "{body}");
    assert!(
        body.contains(&format!("webhook={WEBHOOK_SECRET}")),
        "{body}"
    );
    // The URL is never substituted (it may be logged).
    assert!(!sent.url.as_str().contains(API_KEY), "{}", sent.url);
    // And a debug print of the wire request shows no credential.
    assert_no_secret("the wire request's debug form", &format!("{sent:?}"));

    // What the guest produced from the echo: events, history, the payment view.
    let view = orch.payment(&merchant.id, &payment_id).await.unwrap();
    assert_no_secret("the payment view", &format!("{view:?}"));
    let timeline = db.store.timeline(&payment_id).await.unwrap();
    assert!(
        timeline.iter().any(|h| h
            .raw_status
            .as_deref()
            .is_some_and(|r| r.contains("parse-response"))),
        "the adapter's parse-response output reached the history: {timeline:?}"
    );
    assert_no_secret("the payment's history", &format!("{timeline:?}"));

    // handle-webhook: a webhook echoing the secrets, its ack and its events.
    let webhook_body =
        format!(r#"{{"api_key":"{API_KEY}","secret":"{WEBHOOK_SECRET}","hex":"{HMAC_KEY}"}}"#);
    let outcome = orch
        .ingest_webhook(
            ADAPTER,
            &account.id,
            WebhookRequest {
                method: "POST".into(),
                path: format!("/webhooks/{ADAPTER}/{}", account.id),
                headers: vec![Header {
                    name: "X-Echo".into(),
                    value: format!("Bearer {API_KEY}"),
                }],
                body: webhook_body.into_bytes(),
            },
        )
        .await
        .expect("webhook ingested");
    let WebhookOutcome::Accepted { ack, receipts } = &outcome else {
        panic!("the hostile adapter accepts every webhook: {outcome:?}");
    };
    assert_no_secret("the webhook ack", &String::from_utf8_lossy(&ack.body));
    assert_no_secret("the webhook ack headers", &format!("{:?}", ack.headers));
    for receipt in receipts {
        let entry = db.store.inbox_get(&receipt.inbox_id).await.unwrap();
        assert_no_secret("an inbox event", &format!("{entry:?}"));
    }

    // describe and parse-settlement, through the account's scope.
    let handle = orch.runtime().active(ADAPTER).unwrap();
    let info = handle.describe().await.unwrap();
    assert_no_secret("describe", &format!("{info:?}"));
    let scope = ConnectorAccountScope::new(account.id.clone())
        .with_config("base_url", "http://127.0.0.1:9/psp")
        .with_secret("api_key", API_KEY)
        .with_secret("webhook_secret", WEBHOOK_SECRET)
        .with_secret("hmac_key", HMAC_KEY);
    let report = format!("id,net\n{API_KEY},{WEBHOOK_SECRET}\n{HMAC_KEY},1\n");
    let lines = handle
        .parse_settlement(&scope, report.into_bytes())
        .await
        .unwrap()
        .unwrap();
    assert!(lines[0].status.contains("parse-settlement"));
    assert_no_secret("the settlement lines", &format!("{lines:?}"));

    // Every log line: the adapter's own and the host's.
    let logged =
        String::from_utf8_lossy(&logs.lock().unwrap_or_else(PoisonError::into_inner)).into_owned();
    assert!(
        logged.contains("parse-response") && logged.contains("handle-webhook"),
        "the adapter's log lines were captured"
    );
    assert_no_secret("the log", &logged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_adapter_cannot_leak_a_secret_through_any_export_on_sqlite() {
    captured_logs();
    run(crate::common::test_subject(sluice_store::Backend::Sqlite).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_adapter_cannot_leak_a_secret_through_any_export_on_postgres() {
    captured_logs();
    run(crate::common::test_subject(sluice_store::Backend::Postgres).await).await;
}
