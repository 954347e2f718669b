//! Glue between the component model exports and the plain logic modules.

use crate::bindings::exports::sluice::psp::adapter::Guest;
use crate::bindings::sluice::psp::{host, keyring};
use crate::types::{
    AdapterInfo, Capability, Failure, FailureCategory, HttpRequest, HttpResponse, OperationContext,
    PaymentEvent, SettlementLine, WebhookAcceptance, WebhookRejection, WebhookRequest,
};
use crate::webhook::DEFAULT_TOLERANCE_SECONDS;

/// The exported adapter.
pub struct TestWellBehaved;

impl Guest for TestWellBehaved {
    fn describe() -> AdapterInfo {
        AdapterInfo {
            name: crate::ADAPTER_NAME.to_string(),
            // Build-time variants let tests load second, distinguishable versions.
            version: crate::variant::version().to_string(),
            capabilities: vec![
                Capability::Authorize,
                Capability::Sale,
                Capability::Capture,
                Capability::PartialCapture,
                Capability::Void,
                Capability::Refund,
                Capability::PartialRefund,
                Capability::QueryPayment,
                Capability::QueryRefund,
                Capability::Webhooks,
            ],
            currencies: ["EUR", "USD", "GBP", "JPY"].map(String::from).to_vec(),
        }
    }

    fn build_request(context: OperationContext) -> Result<HttpRequest, Failure> {
        let base_url = host::get_config("base_url");
        crate::request::build_request(base_url.as_deref(), &context)
    }

    fn parse_response(
        context: OperationContext,
        response: HttpResponse,
    ) -> Result<Vec<PaymentEvent>, Failure> {
        let mode = host::get_config("test_variant");
        crate::variant::after_parse(
            mode.as_deref(),
            &context,
            crate::response::parse_response(&context, &response),
        )
    }

    fn handle_webhook(request: WebhookRequest) -> Result<WebhookAcceptance, WebhookRejection> {
        let tolerance = host::get_config("webhook_tolerance_seconds")
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(DEFAULT_TOLERANCE_SECONDS);
        let macs = |data: &[u8]| {
            keyring::hmac(
                "webhook_secret",
                keyring::HmacAlgorithm::Sha256,
                keyring::KeyEncoding::Utf8,
                data,
            )
            .ok()
        };
        let now_unix_secs = host::now_unix_millis().div_euclid(1000);
        let result = crate::webhook::verify_with_macs(&macs, tolerance, now_unix_secs, &request);
        match &result {
            Ok(acceptance) => host::log(
                host::LogLevel::Debug,
                &format!("webhook verified, {} event(s)", acceptance.events.len()),
            ),
            Err(rejection) => host::log(
                host::LogLevel::Info,
                &format!("webhook rejected: {rejection:?}"),
            ),
        }
        result
    }

    fn parse_settlement(_report: Vec<u8>) -> Result<Vec<SettlementLine>, Failure> {
        Err(Failure {
            category: FailureCategory::Unsupported,
            code: "unsupported".into(),
            message: "test-well-behaved reads no settlement reports".into(),
        })
    }
}

// Only the wasm build exports the contract's symbols: native builds of several adapter
// rlibs linked into one binary would otherwise clash on identical export names.
#[cfg(target_arch = "wasm32")]
crate::bindings::export!(TestWellBehaved with_types_in crate::bindings);
