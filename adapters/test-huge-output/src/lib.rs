//! Test adapter that returns far more than the host accepts. The size comes from the
//! connector account setting `output_bytes` (default 8 MiB, under the default memory cap
//! and over the default output cap).

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
        name: "test-huge-output".to_string(),
        version: "1.0.0".to_string(),
        capabilities: vec![],
        currencies: vec!["EUR".to_string()],
    }
}

use sluice::psp::host;
use sluice::psp::types::{EventKind, EvidenceSource, Header};

const DEFAULT_OUTPUT_BYTES: usize = 8 << 20;

fn output_bytes() -> usize {
    host::get_config("output_bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_OUTPUT_BYTES)
}

pub struct HugeOutput;

impl Guest for HugeOutput {
    fn parse_settlement(
        _report: Vec<u8>,
    ) -> Result<Vec<sluice::psp::types::SettlementLine>, Failure> {
        let line = sluice::psp::types::SettlementLine {
            line_type: sluice::psp::types::SettlementLineType::Other,
            attempt_reference: None,
            action_reference: None,
            psp_reference: None,
            psp_payment_reference: None,
            line_id: "x".repeat(output_bytes()),
            gross_minor: 0,
            net_minor: 0,
            currency: "EUR".to_string(),
            status: String::new(),
            booked_at_unix_millis: None,
        };
        Ok(vec![line])
    }

    fn describe() -> AdapterInfo {
        info()
    }

    fn build_request(_context: OperationContext) -> Result<HttpRequest, Failure> {
        Ok(HttpRequest {
            method: "POST".into(),
            url: "http://127.0.0.1:9/huge".into(),
            headers: vec![],
            body: vec![b'x'; output_bytes()],
        })
    }

    /// Many events with a 1 KiB status each, to exercise the size of lists of records.
    fn parse_response(
        _context: OperationContext,
        _response: HttpResponse,
    ) -> Result<Vec<PaymentEvent>, Failure> {
        let status = "s".repeat(1024);
        let count = output_bytes() / 1024;
        Ok((0..count)
            .map(|i| PaymentEvent {
                kind: EventKind::PaymentProcessing,
                attempt_reference: None,
                action_reference: None,
                psp_reference: Some(format!("p{i}")),
                psp_payment_reference: None,
                amount: None,
                provider_event_id: None,
                evidence: EvidenceSource::SyncResponse,
                raw_status: status.clone(),
                failure: None,
                next_action_url: None,
            })
            .collect())
    }

    fn handle_webhook(_request: WebhookRequest) -> Result<WebhookAcceptance, WebhookRejection> {
        Ok(WebhookAcceptance {
            events: vec![],
            ack: HttpResponse {
                status: 200,
                headers: vec![Header {
                    name: "Content-Type".into(),
                    value: "text/plain".into(),
                }],
                body: vec![b'y'; output_bytes()],
            },
        })
    }
}

// Only the wasm build exports the contract's symbols, so native builds of several
// adapters can be linked together.
#[cfg(target_arch = "wasm32")]
export!(HugeOutput);
