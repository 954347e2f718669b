//! The guest's exports as calls the runtime can run on any instance: each owns its
//! arguments and awaits the export on the call's fiber.

use crate::bindings::PspAdapter;
use crate::output::OutputSize;
use crate::sandbox::CallState;
use crate::{
    AdapterInfo, Failure, HttpRequest, HttpResponse, OperationContext, PaymentEvent,
    SettlementLine, WebhookAcceptance, WebhookRejection, WebhookRequest,
};
use std::future::Future;
use wasmtime::Store;

/// One export call with its arguments.
pub(crate) trait GuestCall: Send {
    type Output: OutputSize + Send;

    fn run(
        self,
        guest: &PspAdapter,
        store: &mut Store<CallState>,
    ) -> impl Future<Output = wasmtime::Result<Self::Output>> + Send;
}

pub(crate) struct Describe;

impl GuestCall for Describe {
    type Output = AdapterInfo;

    async fn run(
        self,
        guest: &PspAdapter,
        store: &mut Store<CallState>,
    ) -> wasmtime::Result<AdapterInfo> {
        guest.sluice_psp_adapter().call_describe(store).await
    }
}

pub(crate) struct BuildRequest(pub(crate) OperationContext);

impl GuestCall for BuildRequest {
    type Output = Result<HttpRequest, Failure>;

    async fn run(
        self,
        guest: &PspAdapter,
        store: &mut Store<CallState>,
    ) -> wasmtime::Result<Self::Output> {
        guest
            .sluice_psp_adapter()
            .call_build_request(store, &self.0)
            .await
    }
}

pub(crate) struct ParseResponse(pub(crate) OperationContext, pub(crate) HttpResponse);

impl GuestCall for ParseResponse {
    type Output = Result<Vec<PaymentEvent>, Failure>;

    async fn run(
        self,
        guest: &PspAdapter,
        store: &mut Store<CallState>,
    ) -> wasmtime::Result<Self::Output> {
        guest
            .sluice_psp_adapter()
            .call_parse_response(store, &self.0, &self.1)
            .await
    }
}

pub(crate) struct HandleWebhook(pub(crate) WebhookRequest);

impl GuestCall for HandleWebhook {
    type Output = Result<WebhookAcceptance, WebhookRejection>;

    async fn run(
        self,
        guest: &PspAdapter,
        store: &mut Store<CallState>,
    ) -> wasmtime::Result<Self::Output> {
        guest
            .sluice_psp_adapter()
            .call_handle_webhook(store, &self.0)
            .await
    }
}

pub(crate) struct ParseSettlement(pub(crate) Vec<u8>);

impl GuestCall for ParseSettlement {
    type Output = Result<Vec<SettlementLine>, Failure>;

    async fn run(
        self,
        guest: &PspAdapter,
        store: &mut Store<CallState>,
    ) -> wasmtime::Result<Self::Output> {
        guest
            .sluice_psp_adapter()
            .call_parse_settlement(store, &self.0)
            .await
    }
}
