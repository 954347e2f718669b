//! The wit-bindgen glue: backs [`Host`] with the component's host imports and forwards
//! each export to the logic modules. Nothing here decides anything.

use crate::bindings::exports::sluice::psp::adapter::Guest;
use crate::bindings::sluice::psp::host::{self as imports, LogLevel};
use crate::bindings::sluice::psp::keyring;
use crate::host::{HmacAlgorithm, Host, KeyEncoding, KeyringError};
use crate::types::{
    AdapterInfo, Failure, HttpRequest, HttpResponse, OperationContext, PaymentEvent,
    SettlementLine, WebhookAcceptance, WebhookRejection, WebhookRequest,
};

/// The host as seen through the component's imports.
pub struct ImportedHost;

impl Host for ImportedHost {
    fn config(&self, key: &str) -> Option<String> {
        imports::get_config(key)
    }

    fn hmac(
        &self,
        key: &str,
        algorithm: HmacAlgorithm,
        encoding: KeyEncoding,
        data: &[u8],
    ) -> Result<Vec<Vec<u8>>, KeyringError> {
        keyring::hmac(key, algorithm, encoding, data)
    }

    fn now_unix_millis(&self) -> i64 {
        imports::now_unix_millis()
    }

    fn log(&self, level: LogLevel, message: &str) {
        imports::log(level, message)
    }
}

/// The exported adapter.
pub struct StripeAdapter;

impl Guest for StripeAdapter {
    fn describe() -> AdapterInfo {
        crate::describe()
    }

    fn build_request(context: OperationContext) -> Result<HttpRequest, Failure> {
        crate::request::build_request(&ImportedHost, &context)
    }

    fn parse_response(
        context: OperationContext,
        response: HttpResponse,
    ) -> Result<Vec<PaymentEvent>, Failure> {
        crate::response::parse_response(&context, &response)
    }

    fn handle_webhook(request: WebhookRequest) -> Result<WebhookAcceptance, WebhookRejection> {
        let result = crate::webhook::handle_webhook(&ImportedHost, &request);
        if let Err(rejection) = &result {
            imports::log(LogLevel::Info, &format!("webhook refused: {rejection:?}"));
        }
        result
    }

    fn parse_settlement(report: Vec<u8>) -> Result<Vec<SettlementLine>, Failure> {
        crate::settlement::parse_settlement(&report)
    }
}

// Only the wasm build exports the contract's symbols: native builds of several adapter
// rlibs linked into one binary would otherwise clash on identical export names.
#[cfg(target_arch = "wasm32")]
crate::bindings::export!(StripeAdapter with_types_in crate::bindings);
