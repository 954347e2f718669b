//! Calls into one adapter version, each in its own sandbox (fresh, or warm from an
//! earlier call of the same version and connector account: `warm.rs`).

use crate::bindings::PspAdapterPre;
use crate::bulkhead::pool::CallKey;
use crate::calls::{self, GuestCall};
use crate::engine::deadline_ticks;
use crate::error::{describe_wasm_error, AdapterError};
use crate::keyring::Keyring;
use crate::limits::SandboxLimits;
use crate::metered::Metered;
use crate::output::OutputSize;
use crate::runtime::{AdapterIdentity, AdapterVersionInfo, LoadedVersion, Shared};
use crate::sandbox::{CallState, MemoryLimitExceeded};
use crate::warm::{WarmInstance, WarmKey};
use crate::{
    AdapterInfo, ConnectorAccountScope, Failure, Header, HttpRequest, HttpResponse,
    OperationContext, PaymentEvent, SettlementLine, WebhookAcceptance, WebhookRejection,
    WebhookRequest,
};
use std::sync::Arc;
use tracing::Instrument;
use wasmtime::{Store, Trap, UpdateDeadline};

/// A snapshot of one adapter version. Cheap to clone; calls through it keep using this
/// version even after another one is activated.
#[derive(Clone)]
pub struct AdapterHandle {
    shared: Arc<Shared>,
    version: Arc<LoadedVersion>,
}

impl std::fmt::Debug for AdapterHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AdapterHandle")
            .field(&self.version.identity)
            .finish()
    }
}

impl AdapterHandle {
    pub(crate) fn new(shared: Arc<Shared>, version: Arc<LoadedVersion>) -> Self {
        AdapterHandle { shared, version }
    }

    pub fn identity(&self) -> &AdapterIdentity {
        &self.version.identity
    }

    pub fn info(&self) -> &AdapterVersionInfo {
        &self.version.info
    }

    pub fn limits(&self) -> &SandboxLimits {
        &self.version.info.limits
    }

    pub async fn describe(&self) -> Result<AdapterInfo, AdapterError> {
        self.call(
            "describe",
            &ConnectorAccountScope::default(),
            calls::Describe,
        )
        .await
    }

    /// The request as the adapter built it, credential placeholders and all: the host
    /// substitutes them only on the copy it sends, after the destination check.
    pub async fn build_request(
        &self,
        account: &ConnectorAccountScope,
        mut ctx: OperationContext,
    ) -> Result<Result<HttpRequest, Failure>, AdapterError> {
        redact_context(&account.secrets, &mut ctx);
        self.call("build-request", account, calls::BuildRequest(ctx))
            .await
    }

    /// The PSP's answer reaches the guest without any of the account's secret values
    /// (a PSP echoing a credential back must not bring it into the sandbox).
    pub async fn parse_response(
        &self,
        account: &ConnectorAccountScope,
        mut ctx: OperationContext,
        mut response: HttpResponse,
    ) -> Result<Result<Vec<PaymentEvent>, Failure>, AdapterError> {
        redact_context(&account.secrets, &mut ctx);
        redact_message(&account.secrets, &mut response.headers, &mut response.body);
        self.call(
            "parse-response",
            account,
            calls::ParseResponse(ctx, response),
        )
        .await
    }

    pub async fn handle_webhook(
        &self,
        account: &ConnectorAccountScope,
        mut request: WebhookRequest,
    ) -> Result<Result<WebhookAcceptance, WebhookRejection>, AdapterError> {
        redact_message(&account.secrets, &mut request.headers, &mut request.body);
        self.call("handle-webhook", account, calls::HandleWebhook(request))
            .await
    }

    /// A settlement report of the PSP (its bytes) → normalised lines. The report is
    /// the account's; secret values in it are redacted like in a PSP response.
    pub async fn parse_settlement(
        &self,
        account: &ConnectorAccountScope,
        mut report: Vec<u8>,
    ) -> Result<Result<Vec<SettlementLine>, Failure>, AdapterError> {
        account.secrets.redact(&mut report);
        self.call("parse-settlement", account, calls::ParseSettlement(report))
            .await
    }

    /// `handle_webhook` on the calling thread. For synchronous callers and benchmarks
    /// only: never call it from an async task, it blocks for up to the CPU deadline.
    /// It does not wait for an instance slot: when its key cannot have one now, the
    /// call is shed at once.
    pub fn handle_webhook_blocking(
        &self,
        account: &ConnectorAccountScope,
        request: &WebhookRequest,
    ) -> Result<Result<WebhookAcceptance, WebhookRejection>, AdapterError> {
        let _entered = self.span("handle-webhook", &account.account_id).entered();
        let slot = self.shared.slots.try_acquire(
            self.key(&account.account_id),
            self.version.info.limits.cpu_deadline,
        )?;
        let mut request = request.clone();
        redact_message(&account.secrets, &mut request.headers, &mut request.body);
        let call = run_call(
            &self.shared,
            &self.version.pre,
            &self.version.info.limits,
            account,
            Some(self.warm_key(&account.account_id)),
            calls::HandleWebhook(request),
        );
        futures::executor::block_on(Metered::new(slot, call))
    }

    fn key(&self, account: &str) -> CallKey {
        CallKey::new(self.version.identity.name.clone(), account)
    }

    /// Calls of this version for `account` may share an instance, no others.
    fn warm_key(&self, account: &str) -> WarmKey {
        WarmKey {
            digest: self.version.identity.digest.clone(),
            account: account.to_string(),
        }
    }

    fn span(&self, operation: &'static str, account: &str) -> tracing::Span {
        let id = &self.version.identity;
        tracing::info_span!(
            "adapter_call",
            adapter = %id.name,
            version = %id.version,
            digest = %id.digest,
            operation,
            account,
        )
    }

    /// Waits (bounded) for an instance slot of the call's (adapter, account) share,
    /// then runs the guest on this task, on a fiber: between epoch ticks it yields to
    /// the scheduler (`arm_deadline`), so a guest burning CPU until its deadline holds a
    /// worker thread for one tick at a time, never for the whole deadline. A call that
    /// gets no slot in time, or whose key is over its CPU budget, is shed: it never ran.
    async fn call<C: GuestCall>(
        &self,
        operation: &'static str,
        scope: &ConnectorAccountScope,
        call: C,
    ) -> Result<C::Output, AdapterError> {
        let span = self.span(operation, &scope.account_id);
        let slot = self
            .shared
            .slots
            .acquire(
                self.key(&scope.account_id),
                self.version.info.limits.cpu_deadline,
            )
            .instrument(span.clone())
            .await?;
        let warm = self.warm_key(&scope.account_id);
        let run = run_call(
            &self.shared,
            &self.version.pre,
            &self.version.info.limits,
            scope,
            Some(warm),
            call,
        );
        Metered::new(slot, run).instrument(span).await
    }
}

/// One call: on a warm instance of the same version and account if one is idle
/// (`warm.rs`), else on a fresh one from the pre-instance; capture output, classify
/// failures, check the output size. Only a call that returned normally parks its
/// instance for the next call of its key; on any failure the store is dropped here,
/// so no poisoned instance and nothing of a failed call survives it.
pub(crate) async fn run_call<C: GuestCall>(
    shared: &Shared,
    pre: &PspAdapterPre<CallState>,
    limits: &SandboxLimits,
    scope: &ConnectorAccountScope,
    key: Option<WarmKey>,
    call: C,
) -> Result<C::Output, AdapterError> {
    let mut instance = match key.as_ref().and_then(|k| shared.warm.take(k)) {
        Some(mut warm) => {
            warm.store.data_mut().begin_next_call(limits, scope);
            arm_deadline(&mut warm.store, shared, limits);
            warm
        }
        None => fresh_instance(shared, pre, limits, Arc::new(scope.clone())).await?,
    };
    let outcome = call
        .run(&instance.guest, &mut instance.store)
        .await
        .map_err(|e| classify(&e, instance.store.data(), false));
    instance.store.data().emit_captured_output();
    let value = outcome.inspect_err(|e| tracing::warn!(error = %e, "adapter call failed"))?;
    check_output_size(&value, limits)?;
    instance.calls = instance.calls.saturating_add(1);
    if let Some(key) = key {
        shared.warm.park(key, instance);
    }
    Ok(value)
}

/// A new store with its limits and deadline, instantiated from the pre-instance
/// (instantiation may run guest code, so the deadline covers it too).
async fn fresh_instance(
    shared: &Shared,
    pre: &PspAdapterPre<CallState>,
    limits: &SandboxLimits,
    scope: Arc<ConnectorAccountScope>,
) -> Result<WarmInstance, AdapterError> {
    let state = CallState::new(limits, scope, Arc::clone(&shared.config.clock));
    let mut store = Store::new(&shared.engine, state);
    store.limiter(|state| &mut state.limiter);
    arm_deadline(&mut store, shared, limits);
    match pre.instantiate_async(&mut store).await {
        Ok(guest) => Ok(WarmInstance {
            store,
            guest,
            calls: 0,
        }),
        Err(e) => {
            let error = classify(&e, store.data(), true);
            store.data().emit_captured_output();
            tracing::warn!(error = %error, "adapter call failed");
            Err(error)
        }
    }
}

/// The call's CPU deadline from now, in epoch ticks. At every tick the guest yields
/// to the async scheduler (unless the runtime is configured not to, as the
/// deterministic simulator is), and at the last one it is interrupted.
fn arm_deadline(store: &mut Store<CallState>, shared: &Shared, limits: &SandboxLimits) {
    let mut ticks_left = deadline_ticks(limits.cpu_deadline, shared.config.epoch_tick);
    let yield_on_tick = shared.config.yield_on_tick;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        ticks_left = ticks_left.saturating_sub(1);
        Ok(match ticks_left {
            0 => UpdateDeadline::Interrupt,
            _ if yield_on_tick => UpdateDeadline::Yield(1),
            _ => UpdateDeadline::Continue(1),
        })
    });
}

fn check_output_size<R: OutputSize>(value: &R, limits: &SandboxLimits) -> Result<(), AdapterError> {
    let size = value.total_size();
    if size > limits.max_output_bytes {
        tracing::warn!(
            size,
            limit = limits.max_output_bytes,
            "adapter output over its cap"
        );
        return Err(AdapterError::OutputTooLarge {
            size,
            limit: limits.max_output_bytes,
        });
    }
    Ok(())
}

/// Secret values out of the headers and body of a message bound for a guest.
fn redact_message(keyring: &Keyring, headers: &mut [Header], body: &mut Vec<u8>) {
    if keyring.is_empty() {
        return;
    }
    let mut count = keyring.redact(body);
    for header in headers {
        count += keyring.redact_str(&mut header.value);
    }
    if count > 0 {
        tracing::warn!(
            occurrences = count,
            "a secret value of the connector account was redacted before the adapter saw it"
        );
    }
}

/// Secret values out of the merchant-supplied strings of an operation context.
fn redact_context(keyring: &Keyring, ctx: &mut OperationContext) {
    if keyring.is_empty() {
        return;
    }
    let mut count = keyring.redact_str(&mut ctx.merchant_order_no);
    for text in [&mut ctx.payment_method_token, &mut ctx.return_url]
        .into_iter()
        .flatten()
    {
        count += keyring.redact_str(text);
    }
    for (key, value) in &mut ctx.metadata {
        count += keyring.redact_str(key) + keyring.redact_str(value);
    }
    if count > 0 {
        tracing::warn!(
            occurrences = count,
            "a secret value in the operation context was redacted before the adapter saw it"
        );
    }
}

fn classify(err: &wasmtime::Error, state: &CallState, instantiating: bool) -> AdapterError {
    if state.limiter.hit || err.downcast_ref::<MemoryLimitExceeded>().is_some() {
        return AdapterError::MemoryLimit;
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => AdapterError::Timeout,
        Some(_) => AdapterError::Trap(describe_wasm_error(err)),
        None if instantiating => AdapterError::Instantiate(describe_wasm_error(err)),
        None => AdapterError::Trap(describe_wasm_error(err)),
    }
}
