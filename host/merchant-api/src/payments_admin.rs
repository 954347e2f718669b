//! Payments across merchants for operators (`/admin/payments...`, issue 16):
//! the operations console's search, the pending-set counts per state, one
//! payment with what happens next, and its timeline.
//!
//! Read-only. Like the review routes, each sits behind the server's admin
//! token AND needs the calling operator's own key (`Sluice-Operator-Key`):
//! support staff look at payments of every merchant, so each look is made by
//! an identified person. Every read is bounded: a page of at most
//! [`MAX_SEARCH_PAGE`] orders, a timeline page of at most
//! [`req::MAX_TIMELINE_PAGE`] rows, the counts from the pending set's
//! partial indexes.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use sluice_core::OrderState;
use sluice_store::stats::PendingStats;
use sluice_store::{PaymentOrder, PaymentSearch, MAX_SEARCH_PAGE};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiPath, ApiQuery};
use crate::openapi::fields;
use crate::payments::{json, payment_id_or_404, record_payment_id, timeline_page};
use crate::requests::{self as req, TimelineQuery};
use crate::review::{AuthedOperator, ProposalView};
use crate::views::{NextSection, PaymentResource, Timeline, TimelineEvent};
use crate::MerchantApiState;

/// Longest search term: the longest of an id, an order number or a PSP reference.
pub const MAX_QUERY_CHARS: usize = 255;
/// Payments per page when `limit` is not given.
pub const DEFAULT_SEARCH_PAGE: i64 = 50;

/// `GET /admin/payments`: search and filters. Every field narrows the result.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AdminPaymentsQuery {
    /// A payment id, merchant order number, attempt/capture/refund reference
    /// or PSP reference (exact).
    #[param(schema_with = query_schema)]
    pub q: Option<String>,
    /// Only this merchant's payments (merchant id).
    #[param(schema_with = merchant_schema)]
    pub merchant: Option<String>,
    /// Only payments whose order is in this state.
    #[param(schema_with = state_schema)]
    pub state: Option<String>,
    /// Only payments created at least this many milliseconds ago.
    #[param(schema_with = older_than_schema)]
    pub older_than_ms: Option<i64>,
    #[param(schema_with = limit_schema)]
    pub limit: Option<i64>,
    #[param(schema_with = fields::cursor)]
    pub starting_after: Option<String>,
}

fn query_schema() -> utoipa::openapi::Object {
    fields::described(
        fields::required_text(MAX_QUERY_CHARS, false),
        "A payment id, merchant order number, attempt, capture or refund reference, or PSP \
         reference: exact match.",
    )
}

fn merchant_schema() -> utoipa::openapi::Object {
    fields::described(
        fields::id(false),
        "Only this merchant's payments (merchant id).",
    )
}

fn state_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .enum_values(Some(OrderState::ALL.iter().map(|s| s.as_str())))
        .description(Some("Only payments whose order is in this state."))
        .build()
}

fn older_than_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::Int64,
        )))
        .minimum(Some(0))
        .description(Some(
            "Only payments created at least this many milliseconds ago.",
        ))
        .build()
}

fn limit_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::Int64,
        )))
        .minimum(Some(1))
        .maximum(Some(MAX_SEARCH_PAGE))
        .description(Some(format!(
            "1 to {MAX_SEARCH_PAGE}, default {DEFAULT_SEARCH_PAGE}."
        )))
        .build()
}

/// One payment of a search: its order, without the attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PaymentSummary {
    pub id: String,
    /// Always `payment_summary`.
    pub object: String,
    pub merchant_id: String,
    pub merchant_order_no: String,
    /// Minor units.
    pub amount: i64,
    pub currency: String,
    /// The order's state (`CREATED`, `PROCESSING`, ...).
    pub state: String,
    pub manual_review: bool,
    /// Unix milliseconds.
    pub created_at: i64,
    pub updated_at: i64,
    /// Milliseconds since creation, at the time of the answer.
    pub age_ms: i64,
}

impl PaymentSummary {
    fn new(order: &PaymentOrder, now_ms: i64) -> Self {
        PaymentSummary {
            id: order.id.clone(),
            object: "payment_summary".into(),
            merchant_id: order.merchant_id.clone(),
            merchant_order_no: order.merchant_order_no.clone(),
            amount: order.amount.amount_minor,
            currency: order.amount.currency.as_str().to_owned(),
            state: order.state.as_str().to_owned(),
            manual_review: order.manual_review,
            created_at: order.created_at,
            updated_at: order.updated_at,
            age_ms: now_ms.saturating_sub(order.created_at).max(0),
        }
    }
}

/// A page of payments, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PaymentSummaryList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<PaymentSummary>,
    /// Pass as `starting_after` for the next page; null on the last page.
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

/// How many rows of one aggregate are in one open state, and the oldest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct StateCountView {
    /// `order`, `attempt`, `capture` or `refund`.
    pub aggregate: String,
    pub state: String,
    pub count: i64,
    /// `created_at` of the oldest row (unix ms).
    pub oldest_created_at: Option<i64>,
    /// Its age in milliseconds, at the time of the answer.
    pub oldest_age_ms: Option<i64>,
}

/// The open (non-terminal) set at a glance: a stuck backlog shows as a count
/// with an old age.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PaymentStats {
    /// Always `payment_stats`.
    pub object: String,
    /// When this was counted (unix ms).
    pub as_of: i64,
    /// One row per aggregate and open state that has rows.
    pub states: Vec<StateCountView>,
    /// Payments flagged for manual review.
    pub manual_review: i64,
    /// About when the longest-flagged payment was flagged (unix ms).
    pub oldest_manual_review_at: Option<i64>,
}

impl PaymentStats {
    fn new(stats: &PendingStats, now_ms: i64) -> Self {
        let age = |at: Option<i64>| at.map(|at| now_ms.saturating_sub(at).max(0));
        PaymentStats {
            object: "payment_stats".into(),
            as_of: now_ms,
            states: stats
                .states
                .iter()
                .map(|s| StateCountView {
                    aggregate: s.aggregate.clone(),
                    state: s.state.clone(),
                    count: s.count,
                    oldest_created_at: s.oldest_created_at,
                    oldest_age_ms: age(s.oldest_created_at),
                })
                .collect(),
            manual_review: stats.manual_review,
            oldest_manual_review_at: stats.oldest_manual_review_at,
        }
    }
}

/// One payment as an operator sees it: whose it is, the resource, what
/// happens next and the review proposals.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AdminPaymentView {
    /// Always `admin_payment`.
    pub object: String,
    pub merchant_id: String,
    pub payment: PaymentResource,
    pub next: NextSection,
    /// Every review proposal about the payment, oldest first.
    pub proposals: Vec<ProposalView>,
}

/// The search's validated form.
fn search_from(query: &AdminPaymentsQuery, now_ms: i64) -> Result<PaymentSearch, ApiError> {
    let q = req::optional_text(query.q.as_deref(), "q", MAX_QUERY_CHARS)?;
    let merchant_id = match query.merchant.as_deref() {
        Some(id) if req::looks_like_id(id) => Some(id.to_owned()),
        Some(_) => {
            return Err(ApiError::invalid(
                "parameter_invalid",
                "merchant",
                "merchant must be a merchant id",
            ))
        }
        None => None,
    };
    let state = query
        .state
        .as_deref()
        .map(|name| {
            OrderState::parse(name).ok_or_else(|| {
                let names: Vec<&str> = OrderState::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::invalid(
                    "parameter_invalid",
                    "state",
                    format!("state must be one of {}", names.join(", ")),
                )
            })
        })
        .transpose()?;
    let created_lte = match query.older_than_ms {
        Some(age) if age < 0 => {
            return Err(ApiError::invalid(
                "parameter_invalid",
                "older_than_ms",
                "older_than_ms must not be negative",
            ))
        }
        Some(age) => Some(now_ms.saturating_sub(age)),
        None => None,
    };
    Ok(PaymentSearch {
        q,
        merchant_id,
        state,
        created_lte,
    })
}

/// The page size and cursor of a search.
fn search_page(query: &AdminPaymentsQuery) -> Result<(i64, Option<String>), ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_SEARCH_PAGE);
    if !(1..=MAX_SEARCH_PAGE).contains(&limit) {
        return Err(ApiError::invalid(
            "parameter_invalid",
            "limit",
            format!("limit must be between 1 and {MAX_SEARCH_PAGE}"),
        ));
    }
    match query.starting_after.as_deref() {
        Some(cursor) if !req::looks_like_id(cursor) => Err(ApiError::invalid(
            "parameter_invalid",
            "starting_after",
            "not a cursor",
        )),
        cursor => Ok((limit, cursor.map(str::to_owned))),
    }
}

/// Search payments across merchants, newest first.
#[utoipa::path(
    get, path = "/admin/payments", tag = "operations",
    params(AdminPaymentsQuery),
    responses(
        (status = 200, body = PaymentSummaryList),
        (status = 400, description = "Invalid filter; nothing was read", body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn search_payments(
    State(state): State<MerchantApiState>,
    _operator: AuthedOperator,
    ApiQuery(query): ApiQuery<AdminPaymentsQuery>,
) -> Result<Response, ApiError> {
    let now = state.store.now_ms();
    let search = search_from(&query, now)?;
    let (limit, cursor) = search_page(&query)?;
    let page = state
        .store
        .search_payments(&search, limit, cursor.as_deref())
        .await?;
    Ok(json(
        StatusCode::OK,
        &PaymentSummaryList {
            object: "list".into(),
            data: page
                .items
                .iter()
                .map(|o| PaymentSummary::new(o, now))
                .collect(),
            has_more: page.next_cursor.is_some(),
            next_cursor: page.next_cursor,
        },
    ))
}

/// Counts and oldest age per open state of orders, attempts, captures and
/// refunds, and the manual-review count.
#[utoipa::path(
    get, path = "/admin/payments/stats", tag = "operations",
    responses((status = 200, body = PaymentStats), (status = 401, body = ErrorBody)),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn payment_stats(
    State(state): State<MerchantApiState>,
    _operator: AuthedOperator,
) -> Result<Response, ApiError> {
    let stats = state.store.pending_stats().await?;
    Ok(json(
        StatusCode::OK,
        &PaymentStats::new(&stats, state.store.now_ms()),
    ))
}

/// One payment of any merchant, with what happens next and its proposals.
#[utoipa::path(
    get, path = "/admin/payments/{payment_id}", tag = "operations",
    params(("payment_id" = String, Path)),
    responses((status = 200, body = AdminPaymentView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn admin_payment(
    State(state): State<MerchantApiState>,
    _operator: AuthedOperator,
    ApiPath(payment_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let id = payment_id_or_404(&payment_id)?;
    record_payment_id(id);
    let explained = state
        .orchestrator
        .explain(None, id, &state.config.recovery_policy)
        .await?;
    let proposals = state.store.proposals_for_payment(id).await?;
    Ok(json(
        StatusCode::OK,
        &AdminPaymentView {
            object: "admin_payment".into(),
            merchant_id: explained.details.order.merchant_id.clone(),
            payment: PaymentResource::from_details(&explained.details, explained.as_of_ms),
            next: NextSection::new(&explained.next, explained.as_of_ms),
            proposals: proposals.iter().map(ProposalView::from).collect(),
        },
    ))
}

/// One page of a payment's history (any merchant's) and what happens next:
/// the merchant timeline's content for operators.
#[utoipa::path(
    get, path = "/admin/payments/{payment_id}/timeline", tag = "operations",
    params(("payment_id" = String, Path), TimelineQuery),
    responses(
        (status = 200, body = Timeline),
        (status = 400, description = "Invalid `limit` or `starting_after`; nothing was read", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn admin_timeline(
    State(state): State<MerchantApiState>,
    _operator: AuthedOperator,
    ApiPath(payment_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<TimelineQuery>,
) -> Result<Response, ApiError> {
    let id = payment_id_or_404(&payment_id)?;
    record_payment_id(id);
    let (limit, after) = timeline_page(&query)?;
    let explained = state
        .orchestrator
        .explain(None, id, &state.config.recovery_policy)
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
