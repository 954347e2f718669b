//! Test adapter: `describe` works, every other export loops forever. Exists to prove
//! the host stops a guest at its CPU deadline.

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
        name: "test-infinite-loop".to_string(),
        version: "1.0.0".to_string(),
        capabilities: vec![],
        currencies: vec!["EUR".to_string()],
    }
}

/// Spins without end; `black_box` keeps the optimiser from reasoning the loop away.
fn spin() -> ! {
    let mut counter: u64 = 0;
    loop {
        counter = std::hint::black_box(counter.wrapping_add(1));
    }
}

pub struct InfiniteLoop;

impl Guest for InfiniteLoop {
    fn parse_settlement(
        _report: Vec<u8>,
    ) -> Result<Vec<sluice::psp::types::SettlementLine>, Failure> {
        spin()
    }

    fn describe() -> AdapterInfo {
        info()
    }

    fn build_request(_context: OperationContext) -> Result<HttpRequest, Failure> {
        spin()
    }

    fn parse_response(
        _context: OperationContext,
        _response: HttpResponse,
    ) -> Result<Vec<PaymentEvent>, Failure> {
        spin()
    }

    fn handle_webhook(_request: WebhookRequest) -> Result<WebhookAcceptance, WebhookRejection> {
        spin()
    }
}

// Only the wasm build exports the contract's symbols, so native builds of several
// adapters can be linked together.
#[cfg(target_arch = "wasm32")]
export!(InfiniteLoop);
