//! Interop: the adapter's requests, sent over real HTTP to the sandbox PSP
//! (`host/sandbox-psp`), and the sandbox's answers and signed webhooks, read back by the
//! adapter. Both sides follow `docs/psp-wire-subsets.md`; this proves they agree.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use axum::Router;
use sluice_adapter_runtime::Keyring;
use sluice_adapter_stripe::bindings::sluice::psp::host::LogLevel;
use sluice_adapter_stripe::host::{HmacAlgorithm, KeyEncoding, KeyringError};
use sluice_adapter_stripe::request::build_request;
use sluice_adapter_stripe::response::parse_response;
use sluice_adapter_stripe::types::{
    CaptureMode, EventKind, FailureCategory, Header, HttpRequest, HttpResponse, Money, Operation,
    OperationContext, PaymentEvent, WebhookRequest,
};
use sluice_adapter_stripe::webhook::handle_webhook;
use sluice_adapter_stripe::Host;
use sluice_sandbox_psp::{
    start, Format, SandboxConfig, SandboxHandle, WebhookTarget, DEFAULT_STRIPE_API_KEY,
};

const WEBHOOK_SECRET: &str = "whsec_interop_9c1f4e2a";

/// A connector account pointing at the sandbox, with the real clock.
struct SandboxAccount {
    base_url: String,
}

impl Host for SandboxAccount {
    fn config(&self, key: &str) -> Option<String> {
        (key == "base_url").then(|| self.base_url.clone())
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
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    }

    fn log(&self, _level: LogLevel, _message: &str) {}
}

/// The sandbox account's secrets, in the host's keyring.
fn keyring() -> Keyring {
    let mut keyring = Keyring::default();
    for (name, value) in [
        ("api_key", DEFAULT_STRIPE_API_KEY),
        ("webhook_secret", WEBHOOK_SECRET),
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

async fn call(account: &SandboxAccount, context: &OperationContext) -> Vec<PaymentEvent> {
    let request = build_request(account, context).expect("request builds");
    let response = perform(&request).await;
    parse_response(context, &response).unwrap()
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

type Received = Arc<Mutex<Vec<WebhookRequest>>>;

/// A webhook endpoint that records what the sandbox posts and acknowledges it.
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
                r#"{"received":true}"#
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/webhooks/stripe/acct_interop",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

async fn sandbox() -> (SandboxHandle, SandboxAccount) {
    let config = SandboxConfig {
        late_webhook_delay: None,
        seed: Some(7),
        ..SandboxConfig::default()
    };
    let handle = start(config).await.expect("sandbox starts");
    let account = SandboxAccount {
        base_url: handle.base_url_stripe(),
    };
    (handle, account)
}

fn only(events: Vec<PaymentEvent>) -> PaymentEvent {
    assert_eq!(events.len(), 1, "{events:?}");
    events.into_iter().next().unwrap()
}

#[tokio::test]
async fn authorize_capture_refund_and_queries_agree_with_the_sandbox() {
    let (sandbox, account) = sandbox().await;
    let authorized = only(
        call(
            &account,
            &context(Operation::Authorize, "att_interop_1", "pm_card_visa", 2000),
        )
        .await,
    );
    assert_eq!(authorized.kind, EventKind::PaymentAuthorized);
    assert_eq!(
        authorized.attempt_reference.as_deref(),
        Some("att_interop_1")
    );
    assert_eq!(
        authorized.amount.as_ref().map(|m| m.amount_minor),
        Some(2000)
    );
    let pi = authorized
        .psp_reference
        .clone()
        .expect("the PaymentIntent id");

    // The same request again is an idempotent replay: same answer, one charge.
    let replay = only(
        call(
            &account,
            &context(Operation::Authorize, "att_interop_1", "pm_card_visa", 2000),
        )
        .await,
    );
    assert_eq!(replay, authorized);
    assert_eq!(sandbox.charge_count("att_interop_1"), 1);

    let mut search = context(
        Operation::QueryPayment,
        "att_interop_1",
        "pm_card_visa",
        2000,
    );
    let found = only(call(&account, &search).await);
    assert_eq!(found.kind, EventKind::PaymentAuthorized);
    assert_eq!(found.psp_reference.as_deref(), Some(pi.as_str()));
    search.psp_payment_reference = Some(pi.clone());
    assert_eq!(
        only(call(&account, &search).await).kind,
        EventKind::PaymentAuthorized
    );

    let mut capture = context(Operation::Capture, "att_interop_1", "pm_card_visa", 1500);
    capture.action_reference = Some("cap_interop_1".into());
    capture.psp_payment_reference = Some(pi.clone());
    let captured = only(call(&account, &capture).await);
    assert_eq!(captured.kind, EventKind::PaymentCaptured);
    assert_eq!(captured.action_reference.as_deref(), Some("cap_interop_1"));
    assert_eq!(captured.amount.as_ref().map(|m| m.amount_minor), Some(1500));

    let mut refund = context(Operation::Refund, "att_interop_1", "pm_card_visa", 500);
    refund.action_reference = Some("rf_interop_1".into());
    refund.psp_payment_reference = Some(pi.clone());
    let refunded = only(call(&account, &refund).await);
    assert_eq!(refunded.kind, EventKind::RefundSucceeded);
    assert_eq!(refunded.action_reference.as_deref(), Some("rf_interop_1"));
    assert_eq!(refunded.psp_payment_reference.as_deref(), Some(pi.as_str()));

    let mut query_refund = refund.clone();
    query_refund.operation = Operation::QueryRefund;
    let listed = only(call(&account, &query_refund).await);
    assert_eq!(listed.kind, EventKind::RefundSucceeded);
    query_refund.psp_refund_reference = listed.psp_reference.clone();
    assert_eq!(only(call(&account, &query_refund).await), listed);

    // A second capture is refused as a state conflict, to be resolved by query.
    let mut again = capture.clone();
    again.action_reference = Some("cap_interop_2".into());
    let refused = only(call(&account, &again).await);
    assert_eq!(refused.kind, EventKind::ResultUnknown);
    assert_eq!(refused.failure.unwrap().category, FailureCategory::Conflict);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn declines_actions_and_faults_are_classified_by_meaning() {
    let (sandbox, account) = sandbox().await;
    let declined = only(
        call(
            &account,
            &context(
                Operation::Sale,
                "att_interop_d",
                "pm_card_chargeDeclined",
                2000,
            ),
        )
        .await,
    );
    assert_eq!(declined.kind, EventKind::PaymentFailed);
    let failure = declined.failure.unwrap();
    assert_eq!(
        (failure.category, failure.code.as_str()),
        (FailureCategory::Declined, "generic_decline")
    );

    let poor = only(
        call(
            &account,
            &context(
                Operation::Sale,
                "att_interop_f",
                "pm_card_insufficient_funds",
                2000,
            ),
        )
        .await,
    );
    assert_eq!(poor.failure.unwrap().code, "insufficient_funds");

    let action = only(
        call(
            &account,
            &context(
                Operation::Sale,
                "att_interop_3ds",
                "pm_card_threeDSecureRequired",
                2000,
            ),
        )
        .await,
    );
    assert_eq!(action.kind, EventKind::CustomerActionRequired);
    assert!(action.next_action_url.is_some());

    let down = only(
        call(
            &account,
            &context(
                Operation::Sale,
                "att_interop_500",
                "pm_sluice_server_error",
                2000,
            ),
        )
        .await,
    );
    assert_eq!(down.kind, EventKind::ResultUnknown);
    assert_eq!(down.failure.unwrap().category, FailureCategory::Unknown);
    let nothing = only(
        call(
            &account,
            &context(
                Operation::QueryPayment,
                "att_interop_500",
                "pm_sluice_server_error",
                2000,
            ),
        )
        .await,
    );
    assert_eq!(nothing.raw_status, "not_found");

    // Garbage commits the charge: the answer is unknown, the query finds the truth.
    let garbage = only(
        call(
            &account,
            &context(Operation::Sale, "att_interop_g", "pm_sluice_garbage", 2000),
        )
        .await,
    );
    assert_eq!(garbage.kind, EventKind::ResultUnknown);
    let truth = only(
        call(
            &account,
            &context(
                Operation::QueryPayment,
                "att_interop_g",
                "pm_sluice_garbage",
                2000,
            ),
        )
        .await,
    );
    assert_eq!(truth.kind, EventKind::PaymentSucceeded);
    assert_eq!(sandbox.charge_count("att_interop_g"), 1);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_sandboxs_signed_webhooks_verify_and_normalise() {
    let (sandbox, account) = sandbox().await;
    let (url, received) = webhook_receiver().await;
    sandbox.set_webhook_target(
        "acct_interop",
        WebhookTarget {
            url,
            secret: WEBHOOK_SECRET.into(),
            format: Format::Stripe,
            api_key: None,
        },
    );
    let sale = only(
        call(
            &account,
            &context(Operation::Sale, "att_interop_w", "pm_card_visa", 2000),
        )
        .await,
    );
    assert_eq!(sale.kind, EventKind::PaymentSucceeded);
    let mut refund = context(Operation::Refund, "att_interop_w", "pm_card_visa", 700);
    refund.action_reference = Some("rf_interop_w".into());
    refund.psp_payment_reference = sale.psp_reference.clone();
    call(&account, &refund).await;
    assert!(sandbox.wait_webhooks_idle(Duration::from_secs(10)).await);

    let requests = received.lock().unwrap().clone();
    assert!(!requests.is_empty());
    let mut kinds: Vec<EventKind> = Vec::new();
    for request in &requests {
        let acceptance = handle_webhook(&account, request).expect("a sandbox webhook verifies");
        assert_eq!(acceptance.ack.status, 200);
        for event in acceptance.events {
            assert!(event
                .provider_event_id
                .as_deref()
                .unwrap_or("")
                .starts_with("evt_"));
            kinds.push(event.kind);
        }
        // Any change to the body breaks the signature.
        let mut tampered = request.clone();
        tampered.body.extend_from_slice(b" ");
        assert!(handle_webhook(&account, &tampered).is_err());
    }
    let count = |kind: EventKind| kinds.iter().filter(|k| **k == kind).count();
    assert_eq!(count(EventKind::PaymentSucceeded), 1, "{kinds:?}");
    assert!(count(EventKind::RefundSucceeded) >= 1, "{kinds:?}");
    sandbox.shutdown().await.unwrap();
}
