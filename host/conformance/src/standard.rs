//! The standard suite: what every adapter must do, whatever its PSP.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_adapter_runtime::{
    AdapterError, AdapterInfo, Capability, CaptureMode, ConnectorAccountScope, EventKind, Failure,
    FailureCategory, Header, HttpRequest, HttpResponse, Money, Operation, OperationContext,
    PaymentEvent, SettlementLine, WebhookAcceptance, WebhookRejection, WebhookRequest,
};

use crate::fixtures::{ExpectedRequest, Fixture, FixtureKind};
use crate::scan;
use crate::{Kit, DEFAULT_NOW_MS};

pub(crate) type Parsed = Result<Vec<PaymentEvent>, Failure>;
pub(crate) type WebhookAnswer = Result<WebhookAcceptance, WebhookRejection>;

const SUITE: &str = "standard";

/// `describe` runs on every load and every admin listing: it must be far
/// cheaper than a call's CPU deadline.
const DESCRIBE_BUDGET: Duration = Duration::from_millis(500);

pub(crate) async fn run(kit: &mut Kit) {
    let Some(info) = describe(kit).await else {
        return;
    };
    let operations = operations(&info.capabilities);
    let currency = info
        .currencies
        .first()
        .cloned()
        .unwrap_or_else(|| "EUR".into());
    for &operation in &operations {
        let started = Instant::now();
        let result = builds_under_base_url(kit, context(operation, &currency)).await;
        let name = format!("{operation:?}: builds a request under base_url keyed by its reference");
        kit.record(SUITE, name, started, result);
    }
    let started = Instant::now();
    let result = same_input_same_output(kit, &operations, &currency).await;
    kit.record(
        SUITE,
        "the same input gives the same output",
        started,
        result,
    );
    for &operation in &operations {
        let started = Instant::now();
        let result = no_answer_is_unknown(kit, context(operation, &currency)).await;
        let name = format!("{operation:?}: a 5xx, an empty answer and garbage parse to unknown");
        kit.record(SUITE, name, started, result);
    }
    let started = Instant::now();
    let result = refuses_an_unsigned_webhook(kit).await;
    kit.record(SUITE, "an unsigned webhook is refused", started, result);
    webhooks(kit, &info).await;
}

/// Every adapter, webhooks declared or not, refuses a webhook nobody signed:
/// its route is public, so anyone can post to it.
async fn refuses_an_unsigned_webhook(kit: &mut Kit) -> Result<(), String> {
    let name = kit.adapter().identity().name.clone();
    let request = WebhookRequest {
        method: "POST".into(),
        path: format!("/webhooks/{name}/{}", kit.scope.account_id),
        headers: vec![Header {
            name: "Content-Type".into(),
            value: "application/json".into(),
        }],
        body: br#"{"id":"evt_forged","type":"payment_intent.succeeded","data":{"object":{"id":"pi_forged"}}}"#.to_vec(),
    };
    let scope = kit.scope.clone();
    match webhook(kit, &scope, request).await? {
        Ok(acceptance) => Err(format!(
            "accepted with {} events and ack {}",
            acceptance.events.len(),
            acceptance.ack.status
        )),
        Err(_) => Ok(()),
    }
}

async fn describe(kit: &mut Kit) -> Option<AdapterInfo> {
    let started = Instant::now();
    let described = kit.adapter().describe().await;
    let elapsed = started.elapsed();
    let result = match &described {
        Ok(info) => {
            kit.witness("describe", info);
            sane(info).and_then(|()| match elapsed <= DESCRIBE_BUDGET {
                true => Ok(()),
                false => Err(format!(
                    "describe took {elapsed:?}, over {DESCRIBE_BUDGET:?}"
                )),
            })
        }
        Err(e) => Err(limits(e)),
    };
    kit.record(SUITE, "describe is sane and cheap", started, result);
    described.ok()
}

fn sane(info: &AdapterInfo) -> Result<(), String> {
    let name_ok = !info.name.is_empty()
        && info.name.len() <= 64
        && info
            .name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !name_ok {
        return Err(format!(
            "name {} is not 1-64 of a-z, 0-9, '-', '_'",
            clip(&format!("{:?}", info.name))
        ));
    }
    let numbers: Vec<&str> = info
        .version
        .split(['-', '+'])
        .next()
        .unwrap_or("")
        .split('.')
        .collect();
    if numbers.len() != 3
        || numbers
            .iter()
            .any(|n| n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "version {} is not semver",
            clip(&format!("{:?}", info.version))
        ));
    }
    if info.capabilities.is_empty() {
        return Err("no capabilities declared".into());
    }
    match info
        .currencies
        .iter()
        .find(|c| c.len() != 3 || !c.bytes().all(|b| b.is_ascii_uppercase()))
    {
        Some(bad) => Err(format!(
            "currency {} is not an upper-case ISO 4217 code",
            clip(&format!("{bad:?}"))
        )),
        None if info.currencies.is_empty() => Err("no currencies declared".into()),
        None => Ok(()),
    }
}

/// The operations the declared capabilities ask for, in contract order.
fn operations(capabilities: &[Capability]) -> Vec<Operation> {
    let has = |c: Capability| capabilities.contains(&c);
    let mut ops = Vec::new();
    for (capability, operation) in [
        (Capability::Authorize, Operation::Authorize),
        (Capability::Sale, Operation::Sale),
        (Capability::Capture, Operation::Capture),
        (Capability::Void, Operation::Void),
        (Capability::Refund, Operation::Refund),
        (Capability::QueryPayment, Operation::QueryPayment),
        (Capability::QueryRefund, Operation::QueryRefund),
    ] {
        if has(capability) {
            ops.push(operation);
        }
    }
    ops
}

/// A synthetic context for `operation`, as the host would hand it over.
fn context(operation: Operation, currency: &str) -> OperationContext {
    let manual = matches!(
        operation,
        Operation::Authorize | Operation::Capture | Operation::Void
    );
    OperationContext {
        operation,
        capture_mode: if manual {
            CaptureMode::Manual
        } else {
            CaptureMode::Automatic
        },
        attempt_reference: "pay_conformance01_a1".into(),
        action_reference: match operation {
            Operation::Capture => Some("capref_conformance01".into()),
            Operation::Refund | Operation::QueryRefund => Some("rfdref_conformance01".into()),
            _ => None,
        },
        psp_payment_reference: match operation {
            Operation::Authorize | Operation::Sale => None,
            _ => Some("psp_conformance_01".into()),
        },
        psp_refund_reference: None,
        amount: Money {
            amount_minor: 2000,
            currency: currency.into(),
        },
        payment_method_token: Some("pm_conformance_visa".into()),
        return_url: Some("https://shop.example/return".into()),
        merchant_order_no: "order-conformance-01".into(),
        metadata: vec![("cart".into(), "c-1".into())],
    }
}

/// The reference a money-moving request must carry as its idempotency key.
fn key_reference(ctx: &OperationContext) -> Option<&str> {
    match ctx.operation {
        Operation::Authorize | Operation::Sale | Operation::Void => {
            Some(ctx.attempt_reference.as_str())
        }
        Operation::Capture | Operation::Refund => ctx.action_reference.as_deref(),
        Operation::QueryPayment | Operation::QueryRefund => None,
    }
}

async fn builds_under_base_url(kit: &mut Kit, ctx: OperationContext) -> Result<(), String> {
    let request = build(kit, ctx.clone()).await?;
    let base = kit.scope.visible_config("base_url").unwrap_or_default();
    if base.is_empty() || !request.url.starts_with(base) {
        return Err(format!(
            "{} {} is not under base_url {base:?}",
            clip(&request.method),
            clip(&request.url)
        ));
    }
    if request.url.contains("{{") {
        return Err("a credential placeholder in the URL (the host may log URLs)".into());
    }
    let Some(reference) = key_reference(&ctx) else {
        return Ok(());
    };
    let keyed = request.headers.iter().any(|h| {
        h.name.to_ascii_lowercase().contains("idempotency") && h.value.contains(reference)
    });
    match keyed {
        true => Ok(()),
        false => Err(format!(
            "no idempotency key header carries the reference {reference}: a retry could charge twice"
        )),
    }
}

async fn same_input_same_output(
    kit: &mut Kit,
    operations: &[Operation],
    currency: &str,
) -> Result<(), String> {
    for &operation in operations {
        let ctx = context(operation, currency);
        let first = build(kit, ctx.clone()).await?;
        let second = build(kit, ctx.clone()).await?;
        if first != second {
            return Err(format!("{operation:?}: two builds of one context differ"));
        }
        let answer = HttpResponse {
            status: 503,
            headers: Vec::new(),
            body: b"upstream unavailable".to_vec(),
        };
        let first = parse(kit, ctx.clone(), answer.clone()).await?;
        let second = parse(kit, ctx, answer).await?;
        if first != second {
            return Err(format!("{operation:?}: two parses of one answer differ"));
        }
    }
    Ok(())
}

/// The answers that carry no outcome: a server error, a gateway's HTML page,
/// an empty body, bytes that are not the PSP's format.
fn no_answers() -> Vec<(&'static str, HttpResponse)> {
    let answer = |status, body: &[u8]| HttpResponse {
        status,
        headers: vec![Header {
            name: "Content-Type".into(),
            value: "application/json".into(),
        }],
        body: body.to_vec(),
    };
    vec![
        (
            "HTTP 500",
            answer(
                500,
                br#"{"error":{"type":"api_error","message":"internal"}}"#,
            ),
        ),
        (
            "HTTP 502 HTML",
            answer(502, b"<html><body>Bad gateway</body></html>"),
        ),
        ("HTTP 503 empty", answer(503, b"")),
        ("HTTP 200 empty (a timeout's shape)", answer(200, b"")),
        ("HTTP 200 garbage", answer(200, b"\xff\xfe{\"id\": tru")),
    ]
}

async fn no_answer_is_unknown(kit: &mut Kit, ctx: OperationContext) -> Result<(), String> {
    for (what, answer) in no_answers() {
        match parse(kit, ctx.clone(), answer).await? {
            Ok(events) if events.is_empty() => {
                return Err(format!(
                    "{what}: no event, so the host cannot record an unknown"
                ))
            }
            Ok(events) => {
                if let Some(e) = events.iter().find(|e| !unknown_kind(e.kind)) {
                    return Err(format!("{what}: parsed to {:?}, not an unknown", e.kind));
                }
            }
            Err(f)
                if matches!(
                    f.category,
                    FailureCategory::Unknown | FailureCategory::Retryable
                ) => {}
            Err(f) => {
                return Err(format!(
                    "{what}: parsed to a {:?} failure ({})",
                    f.category, f.code
                ))
            }
        }
    }
    Ok(())
}

fn unknown_kind(kind: EventKind) -> bool {
    matches!(kind, EventKind::ResultUnknown | EventKind::RefundUnknown)
}

/// A webhook signed with another account's secret, or without its signature,
/// is refused; a stale one too when its fixture states the replay window.
async fn webhooks(kit: &mut Kit, info: &AdapterInfo) {
    let accepted: Vec<Fixture> = kit
        .fixtures
        .iter()
        .filter(|f| matches!(f.kind, FixtureKind::Webhook { accepted: true, .. }))
        .cloned()
        .collect();
    let name = "webhooks: another secret, no signature or a stale one is refused";
    if !info.capabilities.contains(&Capability::Webhooks) {
        kit.skip(SUITE, name, "the adapter declares no webhooks");
        return;
    }
    let started = Instant::now();
    if accepted.is_empty() {
        let reason = "the adapter declares webhooks, but no fixture holds an accepted webhook to check signatures with";
        kit.record(SUITE, name, started, Err(reason.into()));
        return;
    }
    let mut result = Ok(());
    for fixture in &accepted {
        result = refuses_forgeries(kit, fixture)
            .await
            .map_err(|e| format!("{}: {e}", fixture.name));
        if result.is_err() {
            break;
        }
    }
    kit.record(SUITE, name, started, result);
}

async fn refuses_forgeries(kit: &mut Kit, fixture: &Fixture) -> Result<(), String> {
    let FixtureKind::Webhook {
        now_unix_millis,
        replay_window_ms,
        webhook,
        ..
    } = &fixture.kind
    else {
        return Ok(());
    };
    let now = now_unix_millis.unwrap_or(DEFAULT_NOW_MS);
    let genuine = WebhookRequest {
        method: webhook.method.clone(),
        path: webhook.path.clone(),
        headers: Fixture::headers(&webhook.headers),
        body: fixture.body.clone(),
    };
    kit.clock.store(now, Ordering::Relaxed);
    let other = kit.account.with_other_secrets().scope();
    if webhook_answer(kit, &other, genuine.clone()).await?.is_ok() {
        return Err("accepted a webhook signed with another account's secret".into());
    }
    let scope = kit.scope.clone();
    if let Some(unsigned) = without_signature(&genuine) {
        if webhook_answer(kit, &scope, unsigned).await?.is_ok() {
            return Err("accepted a webhook without its signature".into());
        }
    }
    if let Some(window) = replay_window_ms {
        kit.clock.store(now + window + 60_000, Ordering::Relaxed);
        let stale = webhook_answer(kit, &scope, genuine).await;
        kit.clock.store(now, Ordering::Relaxed);
        if stale?.is_ok() {
            return Err(format!(
                "accepted a webhook {} s past its replay window",
                60
            ));
        }
    }
    Ok(())
}

async fn webhook_answer(
    kit: &mut Kit,
    scope: &ConnectorAccountScope,
    request: WebhookRequest,
) -> Result<WebhookAnswer, String> {
    webhook(kit, scope, request).await
}

/// The webhook without any header or JSON field named like a signature or an
/// HMAC; None when it has none (nothing to remove).
fn without_signature(request: &WebhookRequest) -> Option<WebhookRequest> {
    let signature = |name: &str| {
        let name = name.to_ascii_lowercase();
        name.contains("signature") || name.contains("hmac")
    };
    let mut stripped = request.clone();
    stripped.headers.retain(|h| !signature(&h.name));
    let mut removed = stripped.headers.len() != request.headers.len();
    if let Ok(mut body) = serde_json::from_slice::<Value>(&request.body) {
        if strip_keys(&mut body, &signature) {
            removed = true;
            stripped.body = serde_json::to_vec(&body).unwrap_or_default();
        }
    }
    removed.then_some(stripped)
}

fn strip_keys(value: &mut Value, matches: &impl Fn(&str) -> bool) -> bool {
    match value {
        Value::Object(map) => {
            let before = map.len();
            map.retain(|k, _| !matches(k));
            let mut removed = map.len() != before;
            for v in map.values_mut() {
                removed |= strip_keys(v, matches);
            }
            removed
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |removed, v| strip_keys(v, matches) | removed),
        _ => false,
    }
}

/// Nothing the adapter returned or logged holds a secret or a card number.
pub(crate) fn no_leaks(kit: &mut Kit, logged: Option<String>) {
    let secrets = kit.account.secret_values();
    let name = "nothing returned or logged contains a secret or a card number";
    let started = Instant::now();
    let mut result = Ok(());
    for (source, text) in &kit.outputs {
        if let Some(leak) = scan::find_leak(text, &secrets) {
            result = Err(format!("{source} returned {leak}"));
            break;
        }
    }
    if result.is_ok() {
        match &logged {
            Some(log) => {
                if let Some(leak) = scan::find_leak(log, &secrets) {
                    result = Err(format!("the adapter's log holds {leak}"));
                }
            }
            None => {
                kit.record(SUITE, name, started, result);
                let why = "another tracing subscriber was installed first, so the adapter's log could not be read";
                kit.skip(SUITE, "the adapter's log holds no secret", why);
                return;
            }
        }
    }
    kit.record(SUITE, name, started, result);
}

/// What an adapter wrote, quoted in a reason: bounded, so a hostile adapter
/// cannot flood the report.
pub(crate) fn clip(text: &str) -> String {
    const MAX: usize = 120;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text.to_owned(),
    }
}

/// A call that broke the sandbox: its limits, a trap, a refusal.
fn limits(error: &AdapterError) -> String {
    format!("the call did not complete within the sandbox: {error}")
}

pub(crate) async fn build(kit: &mut Kit, ctx: OperationContext) -> Result<HttpRequest, String> {
    let operation = ctx.operation;
    let built = kit
        .adapter()
        .build_request(&kit.scope, ctx)
        .await
        .map_err(|e| limits(&e))?;
    kit.witness(format!("build-request {operation:?}"), &built);
    built.map_err(|f| {
        format!(
            "build-request {operation:?} refused: {} ({})",
            clip(&f.code),
            clip(&f.message)
        )
    })
}

pub(crate) async fn parse(
    kit: &mut Kit,
    ctx: OperationContext,
    response: HttpResponse,
) -> Result<Parsed, String> {
    let operation = ctx.operation;
    let parsed = kit
        .adapter()
        .parse_response(&kit.scope, ctx, response)
        .await
        .map_err(|e| limits(&e))?;
    kit.witness(format!("parse-response {operation:?}"), &parsed);
    Ok(parsed)
}

pub(crate) async fn webhook(
    kit: &mut Kit,
    scope: &ConnectorAccountScope,
    request: WebhookRequest,
) -> Result<WebhookAnswer, String> {
    let answer = kit
        .adapter()
        .handle_webhook(scope, request)
        .await
        .map_err(|e| limits(&e))?;
    kit.witness("handle-webhook", &answer);
    Ok(answer)
}

pub(crate) async fn settlement(
    kit: &mut Kit,
    report: Vec<u8>,
) -> Result<Result<Vec<SettlementLine>, Failure>, String> {
    let parsed = kit
        .adapter()
        .parse_settlement(&kit.scope, report)
        .await
        .map_err(|e| limits(&e))?;
    kit.witness("parse-settlement", &parsed);
    Ok(parsed)
}

/// The built request is the one the fixture recorded.
pub(crate) fn request_matches(
    expected: &ExpectedRequest,
    built: &HttpRequest,
) -> Result<(), String> {
    if let Some(method) = &expected.method {
        if !method.eq_ignore_ascii_case(&built.method) {
            return Err(format!("method {}, expected {method}", clip(&built.method)));
        }
    }
    if let Some(url) = &expected.url {
        if url != &built.url {
            return Err(format!("URL {}, expected {url}", clip(&built.url)));
        }
    }
    for (name, value) in &expected.headers {
        let found = built
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str());
        if found != Some(value.as_str()) {
            let found = found.map(clip);
            return Err(format!("header {name}: {found:?}, expected {value:?}"));
        }
    }
    let body = String::from_utf8_lossy(&built.body);
    match expected
        .body_contains
        .iter()
        .find(|part| !body.contains(part.as_str()))
    {
        Some(missing) => Err(format!("the body lacks {missing:?}")),
        None => Ok(()),
    }
}
