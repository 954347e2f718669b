//! Test adapter that panics: always in `build-request` and `handle-webhook`, and in
//! `parse-response` when the response status is 5xx (otherwise it answers normally, so
//! a test can show a trap does not poison the next call).

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
        name: "test-panic".to_string(),
        version: "1.0.0".to_string(),
        capabilities: vec![],
        currencies: vec!["EUR".to_string()],
    }
}

pub struct Panics;

impl Guest for Panics {
    fn parse_settlement(
        _report: Vec<u8>,
    ) -> Result<Vec<sluice::psp::types::SettlementLine>, Failure> {
        panic!("test-panic: parse-settlement always panics")
    }

    fn describe() -> AdapterInfo {
        info()
    }

    fn build_request(_context: OperationContext) -> Result<HttpRequest, Failure> {
        panic!("test-panic: build-request always panics")
    }

    fn parse_response(
        _context: OperationContext,
        response: HttpResponse,
    ) -> Result<Vec<PaymentEvent>, Failure> {
        if response.status >= 500 {
            panic!(
                "test-panic: parse-response panics on status {}",
                response.status
            );
        }
        Ok(Vec::new())
    }

    fn handle_webhook(_request: WebhookRequest) -> Result<WebhookAcceptance, WebhookRejection> {
        panic!("test-panic: handle-webhook always panics")
    }
}

// Only the wasm build exports the contract's symbols, so native builds of several
// adapters can be linked together.
#[cfg(target_arch = "wasm32")]
export!(Panics);
