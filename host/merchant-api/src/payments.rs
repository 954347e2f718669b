//! `/v1/payments...` and `/v1/refunds/{id}`: reads and creation through the
//! store; PSP operations through the orchestrator.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sluice_core::OrderState;
use sluice_orchestrator::{ConfirmOptions, CreatePayment};
use sluice_store::{NewPayment, PaymentFilter, Provenance, StoreError};

use crate::auth::AuthedMerchant;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::requests::{self as req, CreatePaymentRequest, ListPaymentsQuery, TimelineQuery};
use crate::views::{
    json_bytes, NextSection, PaymentList, PaymentResource, PaymentStatus, RefundView, Timeline,
    TimelineEvent,
};
use crate::MerchantApiState;

/// A JSON response with its status.
pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json_bytes(value),
    )
        .into_response()
}

pub fn record_payment_id(payment_id: &str) {
    tracing::Span::current().record("payment_id", payment_id);
}

/// The provenance of a merchant's command in the history.
pub fn merchant_provenance(merchant: &AuthedMerchant) -> Provenance {
    Provenance::actor(&merchant.actor())
}

/// A validated create request.
struct ValidCreate {
    new: NewPayment,
}

fn validate_create(
    merchant: &AuthedMerchant,
    body: &CreatePaymentRequest,
    now_ms: i64,
) -> Result<ValidCreate, ApiError> {
    let amount = req::money(body.amount, &body.currency)?;
    let merchant_order_no = req::required_text(
        &body.merchant_order_no,
        "merchant_order_no",
        req::MAX_ORDER_NO_CHARS,
    )?;
    let payment_method = req::optional_text(
        body.payment_method.as_deref(),
        "payment_method",
        req::MAX_TOKEN_CHARS,
    )?;
    let return_url = body
        .return_url
        .as_deref()
        .map(|u| req::url(u, "return_url"))
        .transpose()?;
    let description = body
        .description
        .as_deref()
        .map(|d| req::text(d, "description", req::MAX_DESCRIPTION_CHARS))
        .transpose()?;
    let metadata = match &body.metadata {
        Some(map) => req::metadata(map)?,
        None => serde_json::json!({}),
    };
    let fulfillment = body
        .fulfillment
        .as_ref()
        .map(|f| req::fulfillment(f, now_ms))
        .transpose()?
        .unwrap_or_default();
    if body.connector_account.is_some() && body.routing.is_some() {
        return Err(ApiError::invalid(
            "parameter_conflict",
            "routing",
            "give either connector_account or routing, not both",
        ));
    }
    Ok(ValidCreate {
        new: NewPayment {
            merchant_id: merchant.merchant_id.clone(),
            merchant_order_no,
            amount,
            capture_mode: body
                .capture_mode
                .unwrap_or(req::CaptureModeParam::Automatic)
                .into(),
            payment_method_token: payment_method,
            return_url,
            description,
            metadata,
            fulfillment,
        },
    })
}

/// Create a payment, unique per merchant order number.
#[utoipa::path(
    post, path = "/v1/payments", tag = "payments",
    request_body = CreatePaymentRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: the first response is replayed")),
    responses(
        (status = 201, description = "Created", body = PaymentResource),
        (status = 200, description = "A payment with this merchant_order_no and the same parameters already exists", body = PaymentResource),
        (status = 400, description = "Invalid input; nothing was written", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "Unknown connector account", body = ErrorBody),
        (status = 409, description = "merchant_order_no already used with other parameters, or Idempotency-Key in use", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_payment(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    ApiJson(body): ApiJson<CreatePaymentRequest>,
) -> Result<Response, ApiError> {
    let now = state.orchestrator.now_ms();
    let valid = validate_create(&merchant, &body, now)?;
    let options = ConfirmOptions {
        connector_account_id: body.connector_account.clone(),
        adapter_hint: body.routing.as_ref().map(|hint| hint.adapter.clone()),
        payment_method_token: None,
        payment_method_type: req::payment_method_type(body.payment_method_type.as_deref())?,
    };
    let confirm = body.confirm == Some(true);
    if !confirm && (options.connector_account_id.is_some() || options.adapter_hint.is_some()) {
        // A named account or hint is checked even without a confirm.
        state
            .orchestrator
            .route(&merchant.merchant_id, &options)
            .await?;
    }
    let new = valid.new;
    let params = CreatePayment {
        merchant_order_no: new.merchant_order_no,
        amount: new.amount,
        capture_mode: new.capture_mode,
        payment_method_token: new.payment_method_token,
        return_url: new.return_url,
        description: new.description,
        metadata: new.metadata,
        fulfillment: new.fulfillment,
        confirm: confirm.then_some(options),
    };
    let created = state
        .orchestrator
        .create_payment(&merchant.merchant_id, params)
        .await?;
    record_payment_id(&created.view.details.order.id);
    let status = if created.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json(
        status,
        &PaymentResource::from_details(&created.view.details, state.orchestrator.now_ms()),
    ))
}

/// Reject ids that cannot exist with the same 404 as a missing one.
pub fn payment_id_or_404(id: &str) -> Result<&str, ApiError> {
    if req::looks_like_id(id) {
        Ok(id)
    } else {
        Err(ApiError::not_found(
            "resource_missing",
            format!("no such payment: {}", truncated(id)),
        ))
    }
}

fn truncated(id: &str) -> String {
    id.chars().take(req::MAX_ID_CHARS).collect()
}

/// The payment's current view, merchant-scoped.
pub async fn payment_view(
    state: &MerchantApiState,
    merchant: &AuthedMerchant,
    payment_id: &str,
) -> Result<PaymentResource, ApiError> {
    let details = state
        .store
        .payment_details(Some(&merchant.merchant_id), payment_id)
        .await?;
    Ok(PaymentResource::from_details(
        &details,
        state.store.now_ms(),
    ))
}

/// A payment with its attempts, captures, refunds, amounts and client status.
#[utoipa::path(
    get, path = "/v1/payments/{id}", tag = "payments",
    params(("id" = String, Path, description = "Payment id")),
    responses(
        (status = 200, body = PaymentResource),
        (status = 401, body = ErrorBody),
        (status = 404, description = "No such payment (or another merchant's)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_payment(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let id = payment_id_or_404(&id)?;
    record_payment_id(id);
    let view = payment_view(&state, &merchant, id).await?;
    Ok(json(StatusCode::OK, &view))
}

/// Every decision about the payment, with its evidence, one page at a time,
/// and what happens next.
#[utoipa::path(
    get, path = "/v1/payments/{id}/timeline", tag = "payments",
    params(("id" = String, Path, description = "Payment id"), TimelineQuery),
    responses(
        (status = 200, body = Timeline),
        (status = 400, description = "Invalid `limit` or `starting_after`; nothing was read", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn timeline(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<TimelineQuery>,
) -> Result<Response, ApiError> {
    let id = payment_id_or_404(&id)?;
    record_payment_id(id);
    let (limit, after) = timeline_page(&query)?;
    let explained = state
        .orchestrator
        .explain(
            Some(&merchant.merchant_id),
            id,
            &state.config.recovery_policy,
        )
        .await?;
    let (entries, has_more) = state.store.timeline_page(id, after, limit).await?;
    let next_cursor = entries.last().map(|e| e.id).filter(|_| has_more);
    Ok(json(
        StatusCode::OK,
        &Timeline {
            object: "list".into(),
            payment_id: id.to_owned(),
            data: entries.iter().map(TimelineEvent::from).collect(),
            has_more,
            next_cursor,
            next: NextSection::new(&explained.next, explained.as_of_ms),
        },
    ))
}

/// The page a timeline request asks for: its size and the row it follows.
pub(crate) fn timeline_page(query: &TimelineQuery) -> Result<(i64, Option<i64>), ApiError> {
    let limit = query.limit.unwrap_or(req::DEFAULT_TIMELINE_PAGE);
    if !(1..=req::MAX_TIMELINE_PAGE).contains(&limit) {
        return Err(ApiError::invalid(
            "parameter_invalid",
            "limit",
            format!("limit must be between 1 and {}", req::MAX_TIMELINE_PAGE),
        ));
    }
    if query.starting_after.is_some_and(|after| after < 0) {
        return Err(ApiError::invalid(
            "parameter_invalid",
            "starting_after",
            "not a cursor",
        ));
    }
    Ok((limit, query.starting_after))
}

/// One refund.
#[utoipa::path(
    get, path = "/v1/refunds/{id}", tag = "refunds",
    params(("id" = String, Path, description = "Refund id")),
    responses(
        (status = 200, body = RefundView),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_refund(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let missing = || {
        ApiError::not_found(
            "resource_missing",
            format!("no such refund: {}", truncated(&id)),
        )
    };
    if !req::looks_like_id(&id) {
        return Err(missing());
    }
    let refund = match state.store.get_refund(&id).await {
        Ok(refund) => refund,
        Err(StoreError::NotFound { .. }) => return Err(missing()),
        Err(e) => return Err(e.into()),
    };
    record_payment_id(&refund.payment_id);
    // Another merchant's refund reads exactly like a missing one.
    match state
        .store
        .get_payment(Some(&merchant.merchant_id), &refund.payment_id)
        .await
    {
        Ok(_) => Ok(json(StatusCode::OK, &RefundView::from(&refund))),
        Err(StoreError::NotFound { .. }) => Err(missing()),
        Err(e) => Err(e.into()),
    }
}

const DEFAULT_PAGE: i64 = 20;
use crate::requests::MAX_PAGE;
/// Rows a single list request may examine when a status filter needs the
/// projection: bounds the work of a request whatever the data looks like.
const SCAN_BUDGET: usize = 1000;

/// List payments, newest first, with filters and cursor pagination.
#[utoipa::path(
    get, path = "/v1/payments", tag = "payments",
    params(ListPaymentsQuery),
    responses(
        (status = 200, body = PaymentList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_payments(
    State(state): State<MerchantApiState>,
    merchant: AuthedMerchant,
    ApiQuery(query): ApiQuery<ListPaymentsQuery>,
) -> Result<Response, ApiError> {
    let list = ListRequest::validate(&query)?;
    let mut data = Vec::new();
    let mut cursor = list.cursor.clone();
    let mut scanned = 0usize;
    let mut more = true;
    let now = state.store.now_ms();
    while more && data.len() < list.limit as usize && scanned < SCAN_BUDGET {
        let page = state
            .store
            .list_payments_filtered(
                &merchant.merchant_id,
                &list.filter,
                list.limit,
                cursor.as_deref(),
            )
            .await?;
        more = page.next_cursor.is_some();
        let count = page.items.len();
        for (i, order) in page.items.into_iter().enumerate() {
            scanned += 1;
            cursor = Some(order.id.clone());
            let details = state
                .store
                .payment_details(Some(&merchant.merchant_id), &order.id)
                .await?;
            let view = PaymentResource::from_details(&details, now);
            if list.status.is_none_or(|s| s == view.status) {
                data.push(view);
            }
            if data.len() == list.limit as usize {
                more = more || i + 1 < count;
                break;
            }
        }
    }
    let next_cursor = more.then_some(cursor).flatten();
    Ok(json(
        StatusCode::OK,
        &PaymentList {
            object: "list".into(),
            has_more: next_cursor.is_some(),
            next_cursor,
            data,
        },
    ))
}

struct ListRequest {
    limit: i64,
    cursor: Option<String>,
    status: Option<PaymentStatus>,
    filter: PaymentFilter,
}

impl ListRequest {
    fn validate(q: &ListPaymentsQuery) -> Result<Self, ApiError> {
        let limit = q.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(ApiError::invalid(
                "parameter_invalid",
                "limit",
                format!("limit must be between 1 and {MAX_PAGE}"),
            ));
        }
        if let Some(cursor) = &q.starting_after {
            if !req::looks_like_id(cursor) {
                return Err(ApiError::invalid(
                    "parameter_invalid",
                    "starting_after",
                    "not a cursor",
                ));
            }
        }
        if let (Some(gte), Some(lte)) = (q.created_gte, q.created_lte) {
            if gte > lte {
                return Err(ApiError::invalid(
                    "parameter_invalid",
                    "created_gte",
                    "created_gte must not be after created_lte",
                ));
            }
        }
        let merchant_order_no = req::optional_text(
            q.merchant_order_no.as_deref(),
            "merchant_order_no",
            req::MAX_ORDER_NO_CHARS,
        )?;
        let status = q.status.as_deref().map(parse_status).transpose()?;
        let (states, manual_review) = status.map(prefilter).unwrap_or((None, None));
        Ok(ListRequest {
            limit,
            cursor: q.starting_after.clone(),
            status,
            filter: PaymentFilter {
                states,
                manual_review,
                created_gte: q.created_gte,
                created_lte: q.created_lte,
                merchant_order_no,
            },
        })
    }
}

fn parse_status(text: &str) -> Result<PaymentStatus, ApiError> {
    serde_json::from_value(serde_json::Value::String(text.to_owned())).map_err(|_| {
        ApiError::invalid(
            "parameter_invalid",
            "status",
            format!(
                "unknown status {:?}",
                text.chars().take(40).collect::<String>()
            ),
        )
    })
}

/// The stored order states (and manual-review flag) that can project to a
/// client status: a superset, narrowed exactly by the projection afterwards,
/// so the projection stays the only definition of a status.
fn prefilter(status: PaymentStatus) -> (Option<Vec<OrderState>>, Option<bool>) {
    use OrderState as O;
    let states = match status {
        PaymentStatus::ManualReview => return (None, Some(true)),
        PaymentStatus::Created | PaymentStatus::Processing => vec![O::Created, O::Processing],
        PaymentStatus::RequiresAction => vec![O::RequiresAction, O::Created, O::Processing],
        PaymentStatus::Failed => vec![O::Failed, O::Created, O::Processing],
        PaymentStatus::Authorized => vec![O::Authorized],
        PaymentStatus::Succeeded | PaymentStatus::PartiallyRefunded | PaymentStatus::Refunded => {
            vec![O::Succeeded]
        }
        PaymentStatus::Canceled => vec![O::Canceled],
        PaymentStatus::Expired => vec![O::Expired],
    };
    (Some(states), Some(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{client_status, Amounts, AttemptState, PaymentView};

    const ALL_STATUSES: &[PaymentStatus] = &[
        PaymentStatus::Created,
        PaymentStatus::Processing,
        PaymentStatus::RequiresAction,
        PaymentStatus::Authorized,
        PaymentStatus::Succeeded,
        PaymentStatus::PartiallyRefunded,
        PaymentStatus::Refunded,
        PaymentStatus::Failed,
        PaymentStatus::Canceled,
        PaymentStatus::Expired,
        PaymentStatus::ManualReview,
    ];

    fn amounts_variants() -> Vec<Amounts> {
        [
            (0, 0, 0),
            (100, 100, 0),
            (100, 100, 40),
            (100, 100, 100),
            (100, 0, 0),
        ]
        .iter()
        .filter_map(|&(auth, cap, refd)| Amounts::from_parts(auth, 0, cap, 0, refd).ok())
        .collect()
    }

    #[test]
    fn the_status_prefilter_never_hides_a_payment_the_projection_would_show() {
        let attempts: Vec<Option<AttemptState>> = std::iter::once(None)
            .chain(AttemptState::ALL.iter().copied().map(Some))
            .collect();
        let mut checked = 0;
        for &order in OrderState::ALL {
            for &latest_attempt in &attempts {
                for amounts in amounts_variants() {
                    for manual_review in [false, true] {
                        let view = PaymentView {
                            order,
                            latest_attempt,
                            amounts,
                            manual_review,
                        };
                        let status = PaymentStatus::from(client_status(&view));
                        let (states, manual) = prefilter(status);
                        assert!(
                            states.is_none_or(|s| s.contains(&order)),
                            "{view:?} → {status:?}"
                        );
                        assert!(
                            manual.is_none_or(|m| m == manual_review),
                            "{view:?} → {status:?}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 500);
    }

    #[test]
    fn every_status_name_parses_back() {
        for status in ALL_STATUSES {
            let name = serde_json::to_value(status).unwrap();
            assert_eq!(parse_status(name.as_str().unwrap()).unwrap(), *status);
        }
        assert!(parse_status("paid").is_err());
    }
}
