//! PSP operations on a payment: confirm, capture, void, refund. Input is
//! validated (and the payment's ownership checked) before anything is
//! written; the orchestrator then persists first, calls the PSP, and answers
//! within its wait budget with what the store shows, never more.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use sluice_core::Money;
use sluice_orchestrator::ConfirmOptions;
use sluice_store::PaymentOrder;

use crate::auth::AuthedMerchant;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, OptionalJson};
use crate::idempotency::RequestKey;
use crate::payments::{json, payment_id_or_404, record_payment_id};
use crate::requests::{
    self as req, CaptureRequestBody, ConfirmPaymentRequest, FulfillmentConfirmation,
    RefundRequestBody, VoidRequestBody,
};
use crate::views::{PaymentResource, RefundView};
use crate::MerchantApiState;

/// The merchant's own payment, or the same 404 as a missing one.
async fn owned_payment(
    state: &MerchantApiState,
    merchant: &AuthedMerchant,
    id: &str,
) -> Result<PaymentOrder, ApiError> {
    let id = payment_id_or_404(id)?;
    record_payment_id(id);
    state
        .store
        .get_payment(Some(&merchant.merchant_id), id)
        .await
        .map_err(|e| ApiError::from(e).before_execution())
}

/// An optional amount in the payment's currency.
fn amount_of(
    order: &PaymentOrder,
    amount: Option<i64>,
    currency: Option<&str>,
) -> Result<Option<Money>, ApiError> {
    req::same_currency(currency, order.amount.currency)?;
    amount
        .map(|minor| {
            Ok(Money {
                amount_minor: req::amount(minor, "amount")?,
                currency: order.amount.currency,
            })
        })
        .transpose()
}

fn payment_response(state: &MerchantApiState, details: &sluice_store::PaymentDetails) -> Response {
    json(
        StatusCode::OK,
        &PaymentResource::from_details(details, state.store.now_ms()),
    )
}

/// Start an attempt at the PSP.
#[utoipa::path(
    post, path = "/v1/payments/{id}/confirm", tag = "payments",
    params(
        ("id" = String, Path, description = "Payment id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: the first response is replayed"),
    ),
    request_body(content = ConfirmPaymentRequest, description = "Optional; an empty body confirms with the defaults"),
    responses(
        (status = 200, description = "The payment after the attempt started: `processing` (poll after `poll_after_ms`) when the PSP's outcome is not known yet", body = PaymentResource),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "An attempt is in flight or UNKNOWN, or the payment is closed", body = ErrorBody),
        (status = 503, description = "The adapter is not available", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn confirm(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    ApiPath(id): ApiPath<String>,
    OptionalJson(body): OptionalJson<ConfirmPaymentRequest>,
) -> Result<Response, ApiError> {
    let order = owned_payment(&state, &merchant, &id).await?;
    let payment_method = req::optional_text(
        body.payment_method.as_deref(),
        "payment_method",
        req::MAX_TOKEN_CHARS,
    )?;
    if body.connector_account.is_some() && body.routing.is_some() {
        return Err(ApiError::invalid(
            "parameter_conflict",
            "routing",
            "give either connector_account or routing, not both",
        ));
    }
    let options = ConfirmOptions {
        connector_account_id: body.connector_account.clone(),
        adapter_hint: body.routing.as_ref().map(|hint| hint.adapter.clone()),
        payment_method_token: payment_method,
        payment_method_type: req::payment_method_type(body.payment_method_type.as_deref())?,
    };
    let view = state
        .orchestrator
        .confirm(&merchant.merchant_id, &order.id, &options)
        .await?;
    Ok(payment_response(&state, &view.details))
}

/// Capture all or part of an authorization (manual capture mode).
#[utoipa::path(
    post, path = "/v1/payments/{id}/capture", tag = "payments",
    params(
        ("id" = String, Path, description = "Payment id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: the first response is replayed"),
    ),
    request_body(content = CaptureRequestBody, description = "Optional; an empty body captures everything capturable"),
    responses(
        (status = 200, description = "The payment with the capture (its outcome may still be pending)", body = PaymentResource),
        (status = 400, description = "Invalid amount or currency, or more than the capturable amount; nothing changed", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn capture(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    key: Option<Extension<RequestKey>>,
    ApiPath(id): ApiPath<String>,
    OptionalJson(body): OptionalJson<CaptureRequestBody>,
) -> Result<Response, ApiError> {
    let order = owned_payment(&state, &merchant, &id).await?;
    let amount = amount_of(&order, body.amount, body.currency.as_deref())?;
    let key = key.map(|Extension(RequestKey(key))| key);
    let captured = state
        .orchestrator
        .capture_keyed(&merchant.merchant_id, &order.id, amount, key.as_deref())
        .await?;
    tracing::info!(payment_id = %order.id, capture_id = %captured.capture.id,
        state = %captured.capture.state, "capture requested");
    Ok(payment_response(&state, &captured.payment.details))
}

/// Void an authorization.
#[utoipa::path(
    post, path = "/v1/payments/{id}/void", tag = "payments",
    params(
        ("id" = String, Path, description = "Payment id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: the first response is replayed"),
    ),
    request_body(content = VoidRequestBody, description = "Optional; empty"),
    responses(
        (status = 200, description = "The payment: `canceled` once the PSP confirmed the void", body = PaymentResource),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Nothing to void in this state", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn void(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    ApiPath(id): ApiPath<String>,
    OptionalJson(_body): OptionalJson<VoidRequestBody>,
) -> Result<Response, ApiError> {
    let order = owned_payment(&state, &merchant, &id).await?;
    let view = state
        .orchestrator
        .void(&merchant.merchant_id, &order.id)
        .await?;
    Ok(payment_response(&state, &view.details))
}

/// Refund all or part of what was captured.
#[utoipa::path(
    post, path = "/v1/payments/{id}/refunds", tag = "refunds",
    params(
        ("id" = String, Path, description = "Payment id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: the first response is replayed"),
    ),
    request_body(content = RefundRequestBody, description = "Optional; an empty body refunds everything refundable"),
    responses(
        (status = 200, description = "The refund: `pending` until the PSP's outcome is known", body = RefundView),
        (status = 400, description = "Invalid amount or currency, or more than the refundable amount; nothing changed", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Nothing refundable in this state", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn refund(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    key: Option<Extension<RequestKey>>,
    ApiPath(id): ApiPath<String>,
    OptionalJson(body): OptionalJson<RefundRequestBody>,
) -> Result<Response, ApiError> {
    let order = owned_payment(&state, &merchant, &id).await?;
    let amount = amount_of(&order, body.amount, body.currency.as_deref())?;
    let reason = req::optional_text(body.reason.as_deref(), "reason", req::MAX_REASON_CHARS)?;
    let key = key.map(|Extension(RequestKey(key))| key);
    let refunded = state
        .orchestrator
        .refund_keyed(
            &merchant.merchant_id,
            &order.id,
            amount,
            reason,
            key.as_deref(),
        )
        .await?;
    tracing::info!(payment_id = %order.id, refund_id = %refunded.refund.id,
        state = %refunded.refund.state, "refund requested");
    Ok(json(StatusCode::OK, &RefundView::from(&refunded.refund)))
}

/// Confirm that the business goal of a payment with a fulfillment block was
/// reached (push mode), attributed to an attempt reference.
#[utoipa::path(
    post, path = "/v1/payments/{id}/fulfillment", tag = "payments",
    params(
        ("id" = String, Path, description = "Payment id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: the first response is replayed"),
    ),
    request_body(content = FulfillmentConfirmation),
    responses(
        (status = 200, description = "Recorded: `fulfillment.state` is `fulfilled` (or `compensating` when the attempt named is another payment's of the same `biz_key`); confirming again is a no-op", body = PaymentResource),
        (status = 400, description = "The attempt reference is not an attempt of this business goal; nothing changed", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Too late or not possible: `fulfillment_compensation_in_progress` / `fulfillment_refunded` (the money is being / was returned to the customer: do not grant the goal), `fulfillment_under_review`, `fulfillment_already_fulfilled` (by another attempt), `payment_not_succeeded`", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn confirm_fulfillment(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<FulfillmentConfirmation>,
) -> Result<Response, ApiError> {
    let order = owned_payment(&state, &merchant, &id).await?;
    let reference = req::required_text(
        &body.attempt_reference,
        "attempt_reference",
        req::MAX_ID_CHARS,
    )?;
    if order.fulfillment.mode.is_none() {
        return Err(ApiError::conflict(
            "fulfillment_not_requested",
            "this payment has no fulfillment block; nothing to confirm, the money has not moved",
        )
        .before_execution());
    }
    let step = state
        .orchestrator
        .confirm_fulfillment(&merchant.merchant_id, &order.id, &reference)
        .await?;
    tracing::info!(payment_id = %order.id, attempt_reference = %reference,
        fulfillment = %step.last().to_state, "fulfillment confirmed");
    let details = state
        .store
        .payment_details(Some(&merchant.merchant_id), &order.id)
        .await?;
    Ok(payment_response(&state, &details))
}
