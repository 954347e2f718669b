//! Test adapter that tries to exfiltrate the connector account's secrets through every
//! export of contract `sluice:psp@0.2.0`. It exists so the host can prove it cannot.
//!
//! What it tries, in every call:
//!
//! - `get-config` with the names of the account's secrets (`api_key`, `webhook_secret`,
//!   ...), hoping a secret is served as a setting;
//! - `keyring.hmac` with every algorithm and key encoding, hoping the keyring hands out
//!   key material (it returns MACs only);
//! - credential placeholders in the request's URL, headers and body (the host
//!   substitutes them on the wire copy only, after the destination check), asking the PSP
//!   to echo them back into `parse-response`;
//! - writing everything it learned, and everything it was handed (PSP answers, webhooks,
//!   settlement reports, operation contexts), into every output: `describe`, the request,
//!   the events of `parse-response` and `handle-webhook`, the webhook ack, the settlement
//!   lines, and the host's log;
//! - keeping what each call was handed in its own memory (a static), and writing what is
//!   still there from earlier calls into every output: the host must start each call from
//!   a fresh memory, so one account's call never sees what another account's handed over.
//!
//! Whatever it writes is "loot" the host-side tests search for the secrets (raw, hex and
//! base64). The wire request must carry the substituted secret; nothing else may.

wit_bindgen::generate!({
    path: "../../wit",
    world: "psp-adapter",
});

use exports::sluice::psp::adapter::Guest;
use sluice::psp::host::{self, LogLevel};
use sluice::psp::keyring::{self, HmacAlgorithm, KeyEncoding};
use sluice::psp::types::{
    AdapterInfo, Capability, EventKind, EvidenceSource, Failure, FailureCategory, Header,
    HttpRequest, HttpResponse, OperationContext, PaymentEvent, SettlementLine, SettlementLineType,
    WebhookAcceptance, WebhookRejection, WebhookRequest,
};

/// The secret names it probes.
pub const PROBED_NAMES: &[&str] = &["api_key", "webhook_secret", "password", "hmac_key"];

/// How much of what it was handed it copies into an output (the host's output cap
/// would refuse more, which would hide a leak instead of showing it).
const MAX_ECHO_BYTES: usize = 16 << 10;

/// Everything the adapter could find out about the secrets from inside the sandbox.
pub fn loot() -> String {
    let mut found = Vec::new();
    for name in PROBED_NAMES {
        found.push(format!("config {name}={:?}", host::get_config(name)));
        for algorithm in [HmacAlgorithm::Sha256, HmacAlgorithm::Sha512] {
            for encoding in [KeyEncoding::Utf8, KeyEncoding::Hex, KeyEncoding::Base64] {
                let macs = keyring::hmac(name, algorithm, encoding, name.as_bytes());
                found.push(format!(
                    "hmac {name} {algorithm:?} {encoding:?} = {}",
                    describe_macs(macs)
                ));
            }
        }
    }
    found.push(format!(
        "config base_url={:?}",
        host::get_config("base_url")
    ));
    found.join("\n")
}

fn describe_macs(macs: Result<Vec<Vec<u8>>, keyring::KeyringError>) -> String {
    match macs {
        Ok(macs) => macs.iter().map(|m| hex(m)).collect::<Vec<_>>().join(","),
        Err(e) => format!("{e:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// At most [`MAX_ECHO_BYTES`] of `bytes`, as text.
fn echo(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_ECHO_BYTES)]).into_owned()
}

fn headers_text(headers: &[Header]) -> String {
    headers
        .iter()
        .map(|h| format!("{}: {}", h.name, h.value))
        .collect::<Vec<_>>()
        .join("\n")
}

fn context_text(ctx: &OperationContext) -> String {
    format!("{ctx:?}")
}

/// What earlier calls were handed, if their memory survived into this one.
static REMEMBERED: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// What this call was handed goes into the memory; what earlier calls left there comes out.
fn remember(seen: &str) -> String {
    let mut memory = REMEMBERED.lock().unwrap_or_else(|p| p.into_inner());
    let before = std::mem::take(&mut *memory);
    memory.push_str(&seen.chars().take(MAX_ECHO_BYTES).collect::<String>());
    before
}

/// Everything into the log too.
fn log_all(what: &str, seen: &str) -> String {
    let before = remember(seen);
    let text = format!(
        "{what}\n{}\nseen:\n{seen}\nremembered from earlier calls:\n{before}",
        loot()
    );
    host::log(LogLevel::Warn, &text);
    text
}

fn event(raw: &str, evidence: EvidenceSource) -> PaymentEvent {
    PaymentEvent {
        kind: EventKind::PaymentProcessing,
        attempt_reference: None,
        action_reference: None,
        psp_reference: Some(raw.chars().take(200).collect()),
        psp_payment_reference: None,
        amount: None,
        provider_event_id: Some(format!("evt_{}", raw.len())),
        evidence,
        raw_status: raw.to_string(),
        failure: Some(Failure {
            category: FailureCategory::Unknown,
            code: "loot".to_string(),
            message: raw.to_string(),
        }),
        next_action_url: None,
    }
}

pub struct Exfiltrate;

impl Guest for Exfiltrate {
    fn describe() -> AdapterInfo {
        // `describe` runs with no account at all; it tries anyway.
        AdapterInfo {
            name: "test-exfiltrate".to_string(),
            version: "1.0.0".to_string(),
            capabilities: vec![
                Capability::Sale,
                Capability::Authorize,
                Capability::Webhooks,
            ],
            currencies: vec!["EUR".to_string(), loot()],
        }
    }

    fn build_request(context: OperationContext) -> Result<HttpRequest, Failure> {
        let text = log_all("build-request", &context_text(&context));
        let base = host::get_config("base_url").unwrap_or_default();
        let base = base.trim_end_matches('/');
        let body = format!(
            "echo={{{{secret:api_key}}}}&basic={{{{basic:api_key:webhook_secret}}}}&webhook={{{{secret:webhook_secret}}}}&loot={}",
            hex(text.as_bytes())
        );
        Ok(HttpRequest {
            method: "POST".to_string(),
            url: format!("{base}/v1/payments?leak={{{{secret:api_key}}}}"),
            headers: vec![
                Header {
                    name: "Authorization".to_string(),
                    value: "Bearer {{secret:api_key}}".to_string(),
                },
                Header {
                    name: "X-Echo".to_string(),
                    value: "{{basic:api_key:webhook_secret}}".to_string(),
                },
                Header {
                    name: "Idempotency-Key".to_string(),
                    value: context.attempt_reference.clone(),
                },
            ],
            body: body.into_bytes(),
        })
    }

    fn parse_response(
        context: OperationContext,
        response: HttpResponse,
    ) -> Result<Vec<PaymentEvent>, Failure> {
        let seen = format!(
            "{}\nstatus {}\n{}\n{}",
            context_text(&context),
            response.status,
            headers_text(&response.headers),
            echo(&response.body)
        );
        let text = log_all("parse-response", &seen);
        Ok(vec![event(&text, EvidenceSource::SyncResponse)])
    }

    fn handle_webhook(request: WebhookRequest) -> Result<WebhookAcceptance, WebhookRejection> {
        let seen = format!(
            "{} {}\n{}\n{}",
            request.method,
            request.path,
            headers_text(&request.headers),
            echo(&request.body)
        );
        let text = log_all("handle-webhook", &seen);
        Ok(WebhookAcceptance {
            events: vec![event(&text, EvidenceSource::Webhook)],
            ack: HttpResponse {
                status: 200,
                headers: vec![Header {
                    name: "X-Loot".to_string(),
                    value: hex(text.as_bytes()),
                }],
                body: text.into_bytes(),
            },
        })
    }

    fn parse_settlement(report: Vec<u8>) -> Result<Vec<SettlementLine>, Failure> {
        let text = log_all("parse-settlement", &echo(&report));
        Ok(vec![SettlementLine {
            line_type: SettlementLineType::Other,
            attempt_reference: Some(text.clone()),
            action_reference: None,
            psp_reference: None,
            psp_payment_reference: None,
            line_id: "loot".to_string(),
            gross_minor: 0,
            net_minor: 0,
            currency: "EUR".to_string(),
            status: text,
            booked_at_unix_millis: None,
        }])
    }
}

// Only the wasm build exports the contract's symbols, so native builds of several
// adapters can be linked together.
#[cfg(target_arch = "wasm32")]
export!(Exfiltrate);
