//! Test adapter that writes megabytes to stdout and stderr and floods the host `log`
//! import, then answers normally. The amounts come from the connector account settings
//! `flood_bytes` (default 4 MiB per stream) and `log_lines` (default 10 000).

wit_bindgen::generate!({
    path: "../../wit",
    world: "psp-adapter",
});

use exports::sluice::psp::adapter::Guest;
use sluice::psp::types::{
    AdapterInfo, Failure, HttpRequest, HttpResponse, OperationContext, PaymentEvent,
    WebhookAcceptance, WebhookRejection, WebhookRequest,
};

fn info() -> AdapterInfo {
    AdapterInfo {
        name: "test-stdout-flood".to_string(),
        version: "1.0.0".to_string(),
        capabilities: vec![],
        currencies: vec!["EUR".to_string()],
    }
}

use sluice::psp::host;
use sluice::psp::types::{FailureCategory, Header};
use std::io::Write;

const DEFAULT_FLOOD_BYTES: usize = 4 << 20;
const DEFAULT_LOG_LINES: usize = 10_000;

/// Writes `flood_bytes` to each of stdout and stderr, in lines of 1 KiB, then logs
/// `log_lines` lines. Write errors are ignored: the point is to push, not to be heard.
fn flood() {
    let total = host::get_config("flood_bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_FLOOD_BYTES);
    let mut line = vec![b'f'; 1023];
    line.push(b'\n');
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    for _ in 0..total / line.len() {
        let _ = stdout.write_all(&line);
        let _ = stderr.write_all(&line);
    }
    let _ = stdout.flush();
    let log_lines: usize = host::get_config("log_lines")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_LOG_LINES);
    for i in 0..log_lines {
        host::log(host::LogLevel::Info, &format!("flood log line {i}"));
    }
}

pub struct StdoutFlood;

impl Guest for StdoutFlood {
    fn parse_settlement(
        _report: Vec<u8>,
    ) -> Result<Vec<sluice::psp::types::SettlementLine>, Failure> {
        flood();
        Ok(Vec::new())
    }

    fn describe() -> AdapterInfo {
        info()
    }

    fn build_request(_context: OperationContext) -> Result<HttpRequest, Failure> {
        flood();
        Err(Failure {
            category: FailureCategory::Unsupported,
            code: "unsupported".into(),
            message: "test-stdout-flood only handles webhooks".into(),
        })
    }

    fn parse_response(
        _context: OperationContext,
        _response: HttpResponse,
    ) -> Result<Vec<PaymentEvent>, Failure> {
        flood();
        Ok(Vec::new())
    }

    fn handle_webhook(_request: WebhookRequest) -> Result<WebhookAcceptance, WebhookRejection> {
        flood();
        Ok(WebhookAcceptance {
            events: vec![],
            ack: HttpResponse {
                status: 200,
                headers: vec![Header {
                    name: "Content-Type".into(),
                    value: "text/plain".into(),
                }],
                body: b"flooded".to_vec(),
            },
        })
    }
}

// Only the wasm build exports the contract's symbols, so native builds of several
// adapters can be linked together.
#[cfg(target_arch = "wasm32")]
export!(StdoutFlood);
