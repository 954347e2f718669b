//! Interop: the adapter's requests, sent over real HTTP to the sandbox PSP
//! (`host/sandbox-psp`), and the sandbox's answers and signed notifications, read back by
//! the adapter. Both sides follow `docs/psp-wire-subsets.md`; this proves they agree.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use axum::Router;
use sluice_adapter_adyen::bindings::sluice::psp::host::LogLevel;
use sluice_adapter_adyen::host::{HmacAlgorithm, KeyEncoding, KeyringError};
use sluice_adapter_adyen::notification::handle_webhook;
use sluice_adapter_adyen::request::build_request;
use sluice_adapter_adyen::response::parse_response;
use sluice_adapter_adyen::types::{
    CaptureMode, EventKind, FailureCategory, Header, HttpRequest, HttpResponse, Money, Operation,
    OperationContext, PaymentEvent, WebhookRequest,
};
use sluice_adapter_adyen::Host;
use sluice_adapter_runtime::Keyring;
use sluice_sandbox_psp::{
    start, Format, SandboxConfig, SandboxHandle, WebhookTarget, DEFAULT_ADYEN_API_KEY,
};

const HMAC_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

/// A connector account pointing at the sandbox.
struct SandboxAccount {
    base_url: String,
}

impl Host for SandboxAccount {
    fn config(&self, key: &str) -> Option<String> {
        match key {
            "base_url" => Some(self.base_url.clone()),
            "merchant_account" => Some("SluiceInteropECOM".into()),
            _ => None,
        }
    }

    fn hmac(
        &self,
        key: &str,
        algorithm: HmacAlgorithm,
        encoding: KeyEncoding,
        data: &[u8],
    ) -> Result<Vec<Vec<u8>>, KeyringError> {
        common::keyring_hmac(&keyring(), key, algorithm, encoding, data)
    }

    fn now_unix_millis(&self) -> i64 {
        0
    }

    fn log(&self, _level: LogLevel, _message: &str) {}
}

/// The sandbox account's secrets, in the host's keyring.
fn keyring() -> Keyring {
    let mut keyring = Keyring::default();
    for (name, value) in [
        ("api_key", DEFAULT_ADYEN_API_KEY),
        ("webhook_secret", HMAC_KEY),
    ] {
        keyring.insert(name, value);
    }
    keyring
}

/// What the host does between build-request and parse-response: substitute the
/// credential placeholders, send, read the answer.
async fn perform(request: &HttpRequest) -> HttpResponse {
    let request = &common::substituted(&keyring(), request);
    let client = reqwest::Client::new();
    let method = reqwest::Method::from_bytes(request.method.as_bytes()).unwrap();
    let mut builder = client
        .request(method, &request.url)
        .body(request.body.clone());
    for h in &request.headers {
        builder = builder.header(&h.name, &h.value);
    }
    let response = builder.send().await.expect("the sandbox answers");
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| Header {
            name: n.to_string(),
            value: v.to_str().unwrap_or("").to_string(),
        })
        .collect();
    let body = response.bytes().await.unwrap().to_vec();
    HttpResponse {
        status,
        headers,
        body,
    }
}

async fn call(account: &SandboxAccount, context: &OperationContext) -> PaymentEvent {
    let request = build_request(account, context).expect("request builds");
    let response = perform(&request).await;
    let events = parse_response(context, &response).unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    events.into_iter().next().unwrap()
}

/// The context of `op`; an authorization is a manual-capture attempt, everything else
/// automatic (see [`manual`]).
fn context(op: Operation, attempt: &str, token: &str, amount: i64) -> OperationContext {
    OperationContext {
        operation: op,
        capture_mode: if op == Operation::Authorize {
            CaptureMode::Manual
        } else {
            CaptureMode::Automatic
        },
        attempt_reference: attempt.into(),
        action_reference: None,
        psp_payment_reference: None,
        psp_refund_reference: None,
        amount: Money {
            amount_minor: amount,
            currency: "EUR".into(),
        },
        payment_method_token: Some(token.into()),
        return_url: Some("https://shop.example/return".into()),
        merchant_order_no: format!("order-{attempt}"),
        metadata: vec![],
    }
}

/// The same context for a manual-capture attempt.
fn manual(mut ctx: OperationContext) -> OperationContext {
    ctx.capture_mode = CaptureMode::Manual;
    ctx
}

fn modification(
    op: Operation,
    of: &PaymentEvent,
    reference: Option<&str>,
    amount: i64,
) -> OperationContext {
    let mut ctx = context(
        op,
        of.attempt_reference.as_deref().unwrap(),
        "pm_card_visa",
        amount,
    );
    ctx.action_reference = reference.map(String::from);
    ctx.psp_payment_reference = of.psp_reference.clone();
    ctx
}

type Received = Arc<Mutex<Vec<WebhookRequest>>>;

/// A notification endpoint that records what the sandbox posts and acknowledges it.
async fn webhook_receiver() -> (String, Received) {
    let received: Received = Arc::new(Mutex::new(Vec::new()));
    let sink = received.clone();
    let app = Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push(WebhookRequest {
                    method: method.to_string(),
                    path: uri.to_string(),
                    headers: headers
                        .iter()
                        .map(|(n, v)| Header {
                            name: n.to_string(),
                            value: v.to_str().unwrap_or("").to_string(),
                        })
                        .collect(),
                    body: body.to_vec(),
                });
                "[accepted]"
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/webhooks/adyen/acct_interop",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

async fn sandbox() -> (SandboxHandle, SandboxAccount, Received) {
    let config = SandboxConfig {
        late_webhook_delay: None,
        seed: Some(11),
        ..SandboxConfig::default()
    };
    let handle = start(config).await.expect("sandbox starts");
    let (url, received) = webhook_receiver().await;
    handle.set_webhook_target(
        "acct_interop",
        WebhookTarget {
            url,
            secret: HMAC_KEY.into(),
            format: Format::Adyen,
            api_key: None,
        },
    );
    let account = SandboxAccount {
        base_url: handle.base_url_adyen(),
    };
    (handle, account, received)
}

/// Every notification received so far, verified and normalised, in order.
async fn notified(
    sandbox: &SandboxHandle,
    account: &SandboxAccount,
    received: &Received,
) -> Vec<PaymentEvent> {
    assert!(sandbox.wait_webhooks_idle(Duration::from_secs(10)).await);
    let requests = received.lock().unwrap().clone();
    let mut events = Vec::new();
    for request in &requests {
        let acceptance = handle_webhook(account, request).expect("a sandbox notification verifies");
        assert_eq!(acceptance.ack.body, b"[accepted]".to_vec());
        let mut tampered = request.clone();
        let text = String::from_utf8(tampered.body.clone()).unwrap();
        tampered.body = text.replacen("\"value\":", "\"value\":1", 1).into_bytes();
        assert!(
            handle_webhook(account, &tampered).is_err(),
            "tampering is detected"
        );
        events.extend(acceptance.events);
    }
    events
}

#[tokio::test]
async fn authorize_capture_and_refund_agree_with_the_sandbox_and_its_notifications() {
    let (sandbox, account, received) = sandbox().await;
    let authorized = call(
        &account,
        &context(Operation::Authorize, "att_adyen_1", "pm_card_visa", 2000),
    )
    .await;
    assert_eq!(authorized.kind, EventKind::PaymentAuthorized);
    assert_eq!(
        authorized.amount.as_ref().map(|m| m.amount_minor),
        Some(2000)
    );
    let psp = authorized.psp_reference.clone().expect("the pspReference");

    // The query replays the creation and gets the stored answer; nothing is charged twice.
    let query = call(
        &account,
        &manual(context(
            Operation::QueryPayment,
            "att_adyen_1",
            "pm_card_visa",
            2000,
        )),
    )
    .await;
    assert_eq!(query.kind, EventKind::PaymentAuthorized);
    assert_eq!(query.psp_reference.as_deref(), Some(psp.as_str()));
    assert_eq!(sandbox.charge_count("att_adyen_1"), 1);

    let capture = call(
        &account,
        &modification(Operation::Capture, &authorized, Some("cap_adyen_1"), 2000),
    )
    .await;
    assert_eq!(capture.kind, EventKind::PaymentProcessing);
    assert_eq!(capture.action_reference.as_deref(), Some("cap_adyen_1"));
    assert_eq!(capture.psp_payment_reference.as_deref(), Some(psp.as_str()));

    let refund = call(
        &account,
        &modification(Operation::Refund, &authorized, Some("rf_adyen_1"), 500),
    )
    .await;
    assert_eq!(refund.kind, EventKind::RefundProcessing);
    let replayed = call(
        &account,
        &modification(Operation::QueryRefund, &authorized, Some("rf_adyen_1"), 500),
    )
    .await;
    assert_eq!(replayed.psp_reference, refund.psp_reference);
    assert_eq!(sandbox.refund_count("rf_adyen_1"), 1);

    let events = notified(&sandbox, &account, &received).await;
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![
            EventKind::PaymentAuthorized,
            EventKind::PaymentCaptured,
            EventKind::RefundSucceeded
        ]
    );
    assert_eq!(events[0].attempt_reference.as_deref(), Some("att_adyen_1"));
    assert_eq!(events[1].action_reference.as_deref(), Some("cap_adyen_1"));
    assert_eq!(
        events[1].psp_payment_reference.as_deref(),
        Some(psp.as_str())
    );
    assert_eq!(events[2].action_reference.as_deref(), Some("rf_adyen_1"));
    assert_eq!(events[2].psp_reference, refund.psp_reference);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_sale_succeeds_and_is_confirmed_by_authorisation_then_capture() {
    let (sandbox, account, received) = sandbox().await;
    let sale = call(
        &account,
        &context(Operation::Sale, "att_adyen_s", "pm_card_visa", 2000),
    )
    .await;
    assert_eq!(sale.kind, EventKind::PaymentSucceeded);
    let events = notified(&sandbox, &account, &received).await;
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![EventKind::PaymentAuthorized, EventKind::PaymentCaptured]
    );
    assert_eq!(events[1].psp_payment_reference, sale.psp_reference);

    // The query replays the sale exactly (the context carries the capture mode), so the
    // sandbox answers with the stored answer: the sale succeeded, charged once.
    let query = call(
        &account,
        &context(Operation::QueryPayment, "att_adyen_s", "pm_card_visa", 2000),
    )
    .await;
    assert_eq!(query.kind, EventKind::PaymentSucceeded, "{query:?}");
    assert_eq!(query.psp_reference, sale.psp_reference);
    assert_eq!(sandbox.charge_count("att_adyen_s"), 1);
    assert_eq!(sandbox.payment_count("att_adyen_s"), 1);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn declines_actions_voids_and_faults_are_classified_by_meaning() {
    let (sandbox, account, received) = sandbox().await;
    let declined = call(
        &account,
        &context(
            Operation::Sale,
            "att_adyen_d",
            "pm_card_chargeDeclined",
            2000,
        ),
    )
    .await;
    assert_eq!(declined.kind, EventKind::PaymentFailed);
    assert_eq!(
        declined.failure.unwrap().category,
        FailureCategory::Declined
    );

    let action = call(
        &account,
        &context(
            Operation::Authorize,
            "att_adyen_3ds",
            "pm_card_threeDSecureRequired",
            2000,
        ),
    )
    .await;
    assert_eq!(action.kind, EventKind::CustomerActionRequired);
    assert!(action.next_action_url.is_some());

    let down = call(
        &account,
        &context(
            Operation::Sale,
            "att_adyen_500",
            "pm_sluice_server_error",
            2000,
        ),
    )
    .await;
    assert_eq!(down.kind, EventKind::ResultUnknown);
    assert_eq!(down.failure.unwrap().category, FailureCategory::Unknown);

    let garbage = call(
        &account,
        &context(
            Operation::Authorize,
            "att_adyen_g",
            "pm_sluice_garbage",
            2000,
        ),
    )
    .await;
    assert_eq!(garbage.kind, EventKind::ResultUnknown);
    let truth = call(
        &account,
        &manual(context(
            Operation::QueryPayment,
            "att_adyen_g",
            "pm_sluice_garbage",
            2000,
        )),
    )
    .await;
    assert_eq!(truth.kind, EventKind::PaymentAuthorized);

    let void = call(&account, &modification(Operation::Void, &truth, None, 2000)).await;
    assert_eq!(void.kind, EventKind::PaymentProcessing);
    let events = notified(&sandbox, &account, &received).await;
    let canceled: Vec<&PaymentEvent> = events
        .iter()
        .filter(|e| e.kind == EventKind::PaymentCanceled)
        .collect();
    assert_eq!(canceled.len(), 1, "{events:?}");
    assert_eq!(
        canceled[0].attempt_reference.as_deref(),
        Some("att_adyen_g")
    );
    assert_eq!(canceled[0].psp_reference, truth.psp_reference);
    assert!(events.iter().any(|e| e.kind == EventKind::PaymentFailed));
    sandbox.shutdown().await.unwrap();
}
