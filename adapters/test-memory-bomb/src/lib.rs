//! Test adapter: `handle-webhook` allocates (and touches) memory without bound. Exists
//! to prove the host caps a call's memory.

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
        name: "test-memory-bomb".to_string(),
        version: "1.0.0".to_string(),
        capabilities: vec![],
        currencies: vec!["EUR".to_string()],
    }
}

use sluice::psp::types::FailureCategory;

/// Allocates 1 MiB chunks filled with data (so pages are really touched) forever.
fn bomb() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        let chunk = vec![0xA5u8; 1 << 20];
        hoard.push(std::hint::black_box(chunk));
    }
}

pub struct MemoryBomb;

impl Guest for MemoryBomb {
    fn parse_settlement(
        _report: Vec<u8>,
    ) -> Result<Vec<sluice::psp::types::SettlementLine>, Failure> {
        bomb()
    }

    fn describe() -> AdapterInfo {
        info()
    }

    fn build_request(_context: OperationContext) -> Result<HttpRequest, Failure> {
        Err(Failure {
            category: FailureCategory::Unsupported,
            code: "unsupported".into(),
            message: "test-memory-bomb only explodes in handle-webhook".into(),
        })
    }

    fn parse_response(
        _context: OperationContext,
        _response: HttpResponse,
    ) -> Result<Vec<PaymentEvent>, Failure> {
        Ok(Vec::new())
    }

    fn handle_webhook(_request: WebhookRequest) -> Result<WebhookAcceptance, WebhookRejection> {
        bomb()
    }
}

// Only the wasm build exports the contract's symbols, so native builds of several
// adapters can be linked together.
#[cfg(target_arch = "wasm32")]
export!(MemoryBomb);
