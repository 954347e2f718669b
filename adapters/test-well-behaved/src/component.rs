//! Glue between the component model exports and the plain logic modules.

use crate::bindings::exports::sluice::psp::adapter::Guest;
use crate::bindings::sluice::psp::host;
use crate::types::{
    AdapterInfo, Capability, Failure, HttpRequest, HttpResponse, OperationContext, PaymentEvent,
    WebhookAcceptance, WebhookRejection, WebhookRequest,
};
use crate::webhook::DEFAULT_TOLERANCE_SECONDS;

/// The exported adapter.
pub struct TestWellBehaved;

impl Guest for TestWellBehaved {
    fn describe() -> AdapterInfo {
        AdapterInfo {
            name: crate::ADAPTER_NAME.to_string(),
            // A build-time override lets tests produce a second, distinguishable version.
            version: option_env!("SLUICE_TEST_ADAPTER_VERSION")
                .unwrap_or("1.0.0")
                .to_string(),
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
        let api_key = host::get_secret("api_key");
        crate::request::build_request(base_url.as_deref(), api_key.as_deref(), &context)
    }

    fn parse_response(
        context: OperationContext,
        response: HttpResponse,
    ) -> Result<Vec<PaymentEvent>, Failure> {
        crate::response::parse_response(&context, &response)
    }

    fn handle_webhook(request: WebhookRequest) -> Result<WebhookAcceptance, WebhookRejection> {
        let secret = host::get_secret("webhook_secret");
        let tolerance = host::get_config("webhook_tolerance_seconds")
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(DEFAULT_TOLERANCE_SECONDS);
        let secrets = crate::WebhookSecrets {
            webhook_secret: secret.as_deref(),
            tolerance_seconds: tolerance,
        };
        let now_unix_secs = host::now_unix_millis().div_euclid(1000);
        let result = crate::verify_and_normalise(&secrets, now_unix_secs, &request);
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
}

// Only the wasm build exports the contract's symbols: native builds of several adapter
// rlibs linked into one binary would otherwise clash on identical export names.
#[cfg(target_arch = "wasm32")]
crate::bindings::export!(TestWellBehaved with_types_in crate::bindings);
