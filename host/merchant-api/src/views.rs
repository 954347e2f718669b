//! What the API returns: resources built only from stored facts. The client
//! status is the core's projection (`sluice_core::client_status`), so a 200
//! never claims more than the evidence in the store shows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sluice_core::{
    client_status, refund_client_status, AttemptState, ClientStatus, Failure, PaymentView,
};
use sluice_store::{Capture, HistoryEntry, PaymentAttempt, PaymentDetails, Refund};
use utoipa::ToSchema;

/// Serialise a response body. Our views contain only strings, integers,
/// booleans and string maps, which always serialise; the fallback keeps a
/// bug from becoming a panic.
pub fn json_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|e| {
        tracing::error!(error = %e, "response serialisation failed");
        br#"{"error":{"type":"api_error","code":"internal_error","message":"response serialisation failed","param":null}}"#.to_vec()
    })
}

/// The client-facing status of a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// No attempt yet: confirm the payment to start one.
    Created,
    /// Not proven either way: poll again after `poll_after_ms`.
    Processing,
    /// The customer must act: see `next_action`.
    RequiresAction,
    /// Funds held (manual capture): not money taken. Capture or void it.
    Authorized,
    /// Money taken, nothing refunded.
    Succeeded,
    /// Money taken, part of it refunded (settled refunds only).
    PartiallyRefunded,
    /// Money taken and all of it refunded.
    Refunded,
    /// Definitive failure: the client may retry with other payment details.
    Failed,
    Canceled,
    Expired,
    /// Contradicting evidence: automatic processing stopped, a human decides.
    ManualReview,
}

impl From<PaymentStatus> for ClientStatus {
    fn from(status: PaymentStatus) -> Self {
        match status {
            PaymentStatus::Created => ClientStatus::Created,
            PaymentStatus::Processing => ClientStatus::Processing,
            PaymentStatus::RequiresAction => ClientStatus::RequiresAction,
            PaymentStatus::Authorized => ClientStatus::Authorized,
            PaymentStatus::Succeeded => ClientStatus::Succeeded,
            PaymentStatus::PartiallyRefunded => ClientStatus::PartiallyRefunded,
            PaymentStatus::Refunded => ClientStatus::Refunded,
            PaymentStatus::Failed => ClientStatus::Failed,
            PaymentStatus::Canceled => ClientStatus::Canceled,
            PaymentStatus::Expired => ClientStatus::Expired,
            PaymentStatus::ManualReview => ClientStatus::ManualReview,
        }
    }
}

impl From<ClientStatus> for PaymentStatus {
    fn from(status: ClientStatus) -> Self {
        match status {
            ClientStatus::Created => PaymentStatus::Created,
            ClientStatus::Processing => PaymentStatus::Processing,
            ClientStatus::RequiresAction => PaymentStatus::RequiresAction,
            ClientStatus::Authorized => PaymentStatus::Authorized,
            ClientStatus::Succeeded => PaymentStatus::Succeeded,
            ClientStatus::PartiallyRefunded => PaymentStatus::PartiallyRefunded,
            ClientStatus::Refunded => PaymentStatus::Refunded,
            ClientStatus::Failed => PaymentStatus::Failed,
            ClientStatus::Canceled => PaymentStatus::Canceled,
            ClientStatus::Expired => PaymentStatus::Expired,
            ClientStatus::ManualReview => PaymentStatus::ManualReview,
        }
    }
}

/// What the customer has to do next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct NextAction {
    /// Always `redirect_to_url` for now.
    #[serde(rename = "type")]
    pub kind: String,
    pub url: String,
}

/// A definitive failure reported by the PSP, or the host's classification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FailureView {
    /// `declined`, `invalid_request`, `configuration`, ... (the core's category).
    pub category: String,
    pub code: String,
    pub message: String,
}

impl From<&Failure> for FailureView {
    fn from(f: &Failure) -> Self {
        FailureView {
            category: f.category.as_str().to_owned(),
            code: f.code.clone(),
            message: f.message.clone(),
        }
    }
}

/// Amounts in minor units of the payment's currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AmountsView {
    pub amount: i64,
    pub authorized: i64,
    /// Captures requested whose outcome is not known yet.
    pub capture_reserved: i64,
    pub captured: i64,
    /// Refunds requested whose outcome is not known yet.
    pub refund_reserved: i64,
    pub refunded: i64,
    /// What a new capture may still take: authorized − captured − capture_reserved.
    pub capturable: i64,
    /// What a new refund may still return: captured − refunded − refund_reserved.
    pub refundable: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AttemptView {
    pub id: String,
    pub attempt_no: i64,
    /// The stable reference sent to the PSP as its idempotency key.
    pub reference: String,
    pub adapter: String,
    /// The adapter version that builds the attempt's requests, pinned when it was
    /// first sent (a canary's attempts stay on the canary); null before that.
    pub adapter_version: Option<String>,
    /// The sha256 digest of that version's component.
    pub adapter_digest: Option<String>,
    pub connector_account: String,
    /// The kind of payment method routing chose the account for (`card`, ...).
    pub payment_method_type: Option<String>,
    pub psp_reference: Option<String>,
    /// The attempt's detailed state (`SUCCEEDED`, `UNKNOWN`, ...).
    pub state: String,
    pub failure: Option<FailureView>,
    pub next_action_url: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CaptureView {
    pub id: String,
    pub payment_id: String,
    pub amount: i64,
    pub currency: String,
    /// The capture's detailed state (`CREATED`, `UNKNOWN`, `SUCCEEDED`, ...).
    pub state: String,
    pub reference: String,
    pub psp_reference: Option<String>,
    pub failure: Option<FailureView>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RefundView {
    pub id: String,
    /// Always `refund`.
    pub object: String,
    pub payment_id: String,
    pub amount: i64,
    pub currency: String,
    pub reason: Option<String>,
    /// `pending` (including an unknown outcome), `succeeded`, `failed` or `canceled`.
    pub status: String,
    /// The refund's detailed state.
    pub state: String,
    /// The stable reference sent to the PSP as its idempotency key.
    pub reference: String,
    pub psp_reference: Option<String>,
    pub failure: Option<FailureView>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Seed 000's business fulfilment block, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FulfillmentView {
    pub biz_key: Option<String>,
    /// Unix milliseconds.
    pub deadline: Option<i64>,
    pub mode: Option<String>,
    /// The fulfillment lifecycle: `pending_payment`, `awaiting_fulfillment`,
    /// `fulfilled`, `compensating`, `compensated` or `manual_review`.
    pub state: Option<String>,
    /// The attempt that took the money (confirm with this reference).
    pub attempt_reference: Option<String>,
    /// When Sluice checks next (unix ms), if a check is scheduled.
    pub next_check_at: Option<i64>,
    /// The compensation refund, once decided: its reference (`cmp_<attempt
    /// reference>`) and why (`fulfillment_deadline_passed`, `fulfilled_elsewhere`).
    pub compensation_refund_reference: Option<String>,
    pub compensation_reason: Option<String>,
    /// With `manual_review`: why a human must decide.
    pub review_reason: Option<String>,
}

/// A payment: the order, its attempts, captures, refunds and amounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PaymentResource {
    pub id: String,
    /// Always `payment`.
    pub object: String,
    pub merchant_order_no: String,
    /// Minor units.
    pub amount: i64,
    pub currency: String,
    /// `automatic` (sale) or `manual` (authorize, then capture).
    pub capture_mode: String,
    /// The client-facing status.
    pub status: PaymentStatus,
    /// With `refunded` (or `partially_refunded`) after a fulfillment
    /// compensation: `fulfillment_deadline_passed` or `fulfilled_elsewhere`.
    pub status_reason: Option<String>,
    /// With `processing`: when to poll again, in milliseconds.
    pub poll_after_ms: Option<i64>,
    /// With `requires_action`: what the customer has to do.
    pub next_action: Option<NextAction>,
    /// With `failed`: why the latest attempt failed.
    pub failure: Option<FailureView>,
    /// The order's detailed state (`CREATED`, `PROCESSING`, `SUCCEEDED`, ...).
    pub state: String,
    pub manual_review: bool,
    pub manual_review_reason: Option<String>,
    pub amounts: AmountsView,
    pub attempts: Vec<AttemptView>,
    pub captures: Vec<CaptureView>,
    pub refunds: Vec<RefundView>,
    pub payment_method: Option<String>,
    pub return_url: Option<String>,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub fulfillment: Option<FulfillmentView>,
    /// Moves with every change of the payment; a client can tell two reads apart.
    pub version: i64,
    /// Unix milliseconds.
    pub created_at: i64,
    pub updated_at: i64,
}

/// A page of payments, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PaymentList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<PaymentResource>,
    /// Pass as `starting_after` to get the next page; null when there is none.
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

/// Who produced a timeline event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AdapterRef {
    pub name: String,
    pub version: Option<String>,
    pub digest: Option<String>,
}

/// One decision about the payment or one of its attempts, captures, refunds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct TimelineEvent {
    pub id: i64,
    /// `order`, `attempt`, `capture` or `refund`.
    pub aggregate_type: String,
    pub aggregate_id: String,
    /// `EventKind` of the evidence (`PAYMENT_SUCCEEDED`, ...) or a command.
    pub event_kind: String,
    /// `sync_response`, `webhook`, `query`, `operator`, `reconciliation` (a line of
    /// the PSP's settlement report), `command`, ...
    pub source: String,
    /// True when the event changed the aggregate.
    pub accepted: bool,
    /// `applied`, `ignored_duplicate`, `ignored_stale`, `rejected`, `needs_reconciliation`.
    pub decision: String,
    /// Why it was applied or ignored.
    pub reason: String,
    pub from_state: Option<String>,
    pub to_state: String,
    pub provider_event_id: Option<String>,
    pub psp_reference: Option<String>,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    pub raw_status: Option<String>,
    pub failure_code: Option<String>,
    pub adapter: Option<AdapterRef>,
    /// A person or component (`merchant:<id>`, `system:scanner`, ...).
    pub actor: Option<String>,
    /// Unix milliseconds.
    pub recorded_at: i64,
}

/// A payment's past (one page of its history, oldest first) and its future
/// (`next`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Timeline {
    /// Always `list`.
    pub object: String,
    pub payment_id: String,
    /// Up to `limit` history rows after `starting_after`, oldest first.
    pub data: Vec<TimelineEvent>,
    /// Pass as `starting_after` for the next page; null on the last page.
    pub next_cursor: Option<i64>,
    pub has_more: bool,
    /// What happens next: who moves each open aggregate, when, with what.
    pub next: NextSection,
}

/// How soon a client should poll a processing payment when the store has no
/// better idea, and the bounds of any hint.
const DEFAULT_POLL_MS: i64 = 2_000;
const MIN_POLL_MS: i64 = 1_000;
const MAX_POLL_MS: i64 = 60_000;

impl PaymentResource {
    /// Build the resource from one consistent read of the store.
    pub fn from_details(details: &PaymentDetails, now_ms: i64) -> Self {
        let order = &details.order;
        let amounts = &details.amounts;
        let latest = details.attempts.iter().max_by_key(|a| a.attempt_no);
        let status = project(details);
        let poll_after_ms =
            (status == PaymentStatus::Processing).then(|| poll_after(latest, now_ms));
        let next_action = if status == PaymentStatus::RequiresAction {
            latest
                .and_then(|a| a.next_action_url.clone())
                .map(|url| NextAction {
                    kind: "redirect_to_url".into(),
                    url,
                })
        } else {
            None
        };
        let failure = if status == PaymentStatus::Failed {
            latest
                .and_then(|a| a.failure.as_ref())
                .map(FailureView::from)
        } else {
            None
        };
        PaymentResource {
            id: order.id.clone(),
            object: "payment".into(),
            merchant_order_no: order.merchant_order_no.clone(),
            amount: order.amount.amount_minor,
            currency: order.amount.currency.as_str().to_owned(),
            capture_mode: order.capture_mode.as_str().to_owned(),
            status_reason: sluice_core::refund_reason(
                status.into(),
                order
                    .fulfillment
                    .state
                    .as_deref()
                    .and_then(sluice_core::FulfillmentState::parse),
                order
                    .fulfillment
                    .compensation_reason
                    .as_deref()
                    .and_then(sluice_core::CompensationReason::parse),
            )
            .map(|reason| reason.as_str().to_owned()),
            status,
            poll_after_ms,
            next_action,
            failure,
            state: order.state.as_str().to_owned(),
            manual_review: order.manual_review,
            manual_review_reason: order.manual_review_reason.clone(),
            amounts: AmountsView {
                amount: amounts.amount_minor,
                authorized: amounts.authorized_minor,
                capture_reserved: amounts.capture_reserved_minor,
                captured: amounts.captured_minor,
                refund_reserved: amounts.refund_reserved_minor,
                refunded: amounts.refunded_minor,
                capturable: amounts.capturable_minor(),
                refundable: amounts.refundable_minor(),
            },
            attempts: details.attempts.iter().map(AttemptView::from).collect(),
            captures: details.captures.iter().map(CaptureView::from).collect(),
            refunds: details.refunds.iter().map(RefundView::from).collect(),
            payment_method: order.payment_method_token.clone(),
            return_url: order.return_url.clone(),
            description: order.description.clone(),
            metadata: string_map(&order.metadata),
            fulfillment: fulfillment_view(&order.fulfillment),
            version: order.version,
            created_at: order.created_at,
            updated_at: order.updated_at,
        }
    }
}

/// The core's projection over the stored order, latest attempt and amounts.
pub fn project(details: &PaymentDetails) -> PaymentStatus {
    let latest = details.attempts.iter().max_by_key(|a| a.attempt_no);
    let amounts = match details.amounts.to_core() {
        Ok(amounts) => amounts,
        // Amounts that break an invariant are contradicting evidence: claim nothing.
        Err(e) => {
            tracing::error!(payment_id = %details.order.id, error = %e, "stored amounts are inconsistent");
            return PaymentStatus::ManualReview;
        }
    };
    client_status(&PaymentView {
        order: details.order.state,
        latest_attempt: latest.map(|a| a.state),
        amounts,
        manual_review: details.order.manual_review,
    })
    .into()
}

fn poll_after(latest: Option<&PaymentAttempt>, now_ms: i64) -> i64 {
    let scheduled = latest
        .filter(|a| !matches!(a.state, AttemptState::RequiresAction))
        .and_then(|a| a.next_retry_time)
        .map(|at| at.saturating_sub(now_ms));
    scheduled
        .unwrap_or(DEFAULT_POLL_MS)
        .clamp(MIN_POLL_MS, MAX_POLL_MS)
}

fn fulfillment_view(f: &sluice_store::Fulfillment) -> Option<FulfillmentView> {
    if f.biz_key.is_none() && f.deadline.is_none() && f.mode.is_none() && f.state.is_none() {
        return None;
    }
    Some(FulfillmentView {
        biz_key: f.biz_key.clone(),
        deadline: f.deadline,
        mode: f.mode.clone(),
        state: f.state.clone(),
        attempt_reference: f.attempt_reference.clone(),
        next_check_at: f.next_check_at,
        compensation_refund_reference: f.compensation_refund_reference.clone(),
        compensation_reason: f.compensation_reason.clone(),
        review_reason: f.review_reason.clone(),
    })
}

/// Metadata is stored as a JSON object of strings (the API only accepts that).
fn string_map(value: &serde_json::Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(k, v)| {
                    let v = v
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| v.to_string());
                    (k.clone(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

impl From<&PaymentAttempt> for AttemptView {
    fn from(a: &PaymentAttempt) -> Self {
        AttemptView {
            id: a.id.clone(),
            attempt_no: a.attempt_no,
            reference: a.reference.clone(),
            adapter: a.adapter.clone(),
            adapter_version: a.adapter_pin.as_ref().map(|p| p.version.clone()),
            adapter_digest: a.adapter_pin.as_ref().map(|p| p.digest.clone()),
            connector_account: a.connector_account_id.clone(),
            payment_method_type: a.payment_method_type.clone(),
            psp_reference: a.psp_reference.clone(),
            state: a.state.as_str().to_owned(),
            failure: a.failure.as_ref().map(FailureView::from),
            next_action_url: a.next_action_url.clone(),
            created_at: a.created_at,
            updated_at: a.updated_at,
        }
    }
}

impl From<&Capture> for CaptureView {
    fn from(c: &Capture) -> Self {
        CaptureView {
            id: c.id.clone(),
            payment_id: c.payment_id.clone(),
            amount: c.amount.amount_minor,
            currency: c.amount.currency.as_str().to_owned(),
            state: c.state.as_str().to_owned(),
            reference: c.reference.clone(),
            psp_reference: c.psp_reference.clone(),
            failure: c.failure.as_ref().map(FailureView::from),
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }
}

impl From<&Refund> for RefundView {
    fn from(r: &Refund) -> Self {
        RefundView {
            id: r.id.clone(),
            object: "refund".into(),
            payment_id: r.payment_id.clone(),
            amount: r.amount.amount_minor,
            currency: r.amount.currency.as_str().to_owned(),
            reason: r.reason.clone(),
            status: refund_client_status(r.state).to_owned(),
            state: r.state.as_str().to_owned(),
            reference: r.reference.clone(),
            psp_reference: r.psp_reference.clone(),
            failure: r.failure.as_ref().map(FailureView::from),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

impl From<&HistoryEntry> for TimelineEvent {
    fn from(h: &HistoryEntry) -> Self {
        TimelineEvent {
            id: h.id,
            aggregate_type: h.aggregate_type.clone(),
            aggregate_id: h.aggregate_id.clone(),
            event_kind: h.event_kind.clone(),
            source: h.evidence_source.clone(),
            accepted: h.decision == "applied",
            decision: h.decision.clone(),
            reason: h.reason.clone(),
            from_state: h.from_state.clone(),
            to_state: h.to_state.clone(),
            provider_event_id: h.provider_event_id.clone(),
            psp_reference: h.psp_reference.clone(),
            amount: h.amount_minor,
            currency: h.currency.clone(),
            raw_status: h.raw_status.clone(),
            failure_code: h.failure_code.clone(),
            adapter: h.adapter_name.as_ref().map(|name| AdapterRef {
                name: name.clone(),
                version: h.adapter_version.clone(),
                digest: h.adapter_digest.clone(),
            }),
            actor: h.actor.clone(),
            recorded_at: h.recorded_at,
        }
    }
}

// ---- the timeline's `next` section (issue 16) ----------------------------------

/// Who moves an aggregate (or the payment) next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NextMover {
    /// The recovery scanner: a query with the original reference, an
    /// escalation to review, or a business check.
    Scanner,
    /// The PSP's webhook; the scanner queries at `due_at` if none arrives.
    Webhook,
    /// A deadline: `deadline.then` says what happens at it.
    Deadline,
    /// Operators: a proposal, then a second operator's approval.
    Operator,
    /// The merchant: confirm, capture or void, confirm a fulfillment.
    Merchant,
    /// Nothing is left to happen.
    Nothing,
}

impl From<sluice_core::Mover> for NextMover {
    fn from(mover: sluice_core::Mover) -> Self {
        use sluice_core::Mover as M;
        match mover {
            M::Scanner => NextMover::Scanner,
            M::Webhook => NextMover::Webhook,
            M::Deadline => NextMover::Deadline,
            M::Operator => NextMover::Operator,
            M::Merchant => NextMover::Merchant,
            M::Nothing => NextMover::Nothing,
        }
    }
}

/// The aggregate a step is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepAggregateView {
    Order,
    Attempt,
    Capture,
    Refund,
    Fulfillment,
}

impl From<sluice_core::StepAggregate> for StepAggregateView {
    fn from(aggregate: sluice_core::StepAggregate) -> Self {
        use sluice_core::StepAggregate as A;
        match aggregate {
            A::Order => StepAggregateView::Order,
            A::Attempt => StepAggregateView::Attempt,
            A::Capture => StepAggregateView::Capture,
            A::Refund => StepAggregateView::Refund,
            A::Fulfillment => StepAggregateView::Fulfillment,
        }
    }
}

/// A deadline ahead of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct DeadlineView {
    /// Unix milliseconds.
    pub at: i64,
    /// What happens when it comes.
    pub then: String,
}

/// Who moves one open aggregate next, when and with what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct NextStepView {
    pub aggregate: StepAggregateView,
    /// The attempt, capture or refund id, the payment id (order) or the
    /// `biz_key` (fulfillment).
    pub id: String,
    /// The aggregate's detailed state (`UNKNOWN`, `awaiting_fulfillment`, ...).
    pub state: String,
    pub mover: NextMover,
    /// What happens: `query_psp`, `query_void`, `await_webhook`,
    /// `await_customer`, `await_event`, `escalate_to_review`,
    /// `expire_requires_action`, `expire_authorization`, `capture_or_void`,
    /// `confirm`, `await_payment`, `fulfillment_deadline`,
    /// `fulfillment_check`, `await_compensation_refund` or
    /// `operator_resolution`.
    pub action: String,
    /// When it happens (unix ms; now if overdue); null when only an outside
    /// party can act.
    pub due_at: Option<i64>,
    /// The reference the PSP or the business is contacted with.
    pub reference: Option<String>,
    /// Queries (or business checks) made so far.
    pub tries: Option<i64>,
    /// The wait after the next query or check, in ms, before jitter (the
    /// scanner waits between half of it and all of it).
    pub backoff_ms: Option<i64>,
    pub deadline: Option<DeadlineView>,
    /// The step in words.
    pub explanation: String,
}

/// One amount the payment holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct HoldView {
    /// `authorization`, `capture_reservation` or `refund_reservation`.
    pub kind: String,
    /// The attempt, capture or refund that holds it.
    pub aggregate_id: String,
    /// Minor units.
    pub amount: i64,
    pub reason: String,
}

/// The money the payment holds, in minor units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct MoneyHeldView {
    /// Authorised at the PSP, neither captured nor reserved for a capture.
    pub authorized: i64,
    pub capture_reserved: i64,
    pub refund_reserved: i64,
    pub holds: Vec<HoldView>,
}

/// A review proposal waiting for a second operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PendingProposalView {
    pub id: String,
    pub outcome: String,
    pub target_type: String,
    pub target_id: String,
    pub reason_code: String,
    pub evidence_note: String,
    /// For `manual_refund`: minor units.
    pub amount: Option<i64>,
    /// The proposing operator (who cannot approve it).
    pub proposed_by: String,
    /// Unix milliseconds.
    pub proposed_at: i64,
}

/// The payment's manual review.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ReviewNextView {
    pub reason: Option<String>,
    pub pending_proposals: Vec<PendingProposalView>,
    /// What the review waits for.
    pub awaiting: String,
}

/// What happens next to the payment, from stored facts and the policies the
/// workers run with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct NextSection {
    /// Who moves the payment next: an operator while it is in review, else
    /// the mover of the step due first; `nothing` when nothing is open.
    pub mover: NextMover,
    /// The earliest due time of any step (unix ms).
    pub due_at: Option<i64>,
    /// When this was computed (unix ms).
    pub as_of: i64,
    /// The next step in words.
    pub summary: String,
    /// One step per open aggregate: order, attempts, captures, refunds, fulfillment.
    pub steps: Vec<NextStepView>,
    pub money_held: MoneyHeldView,
    /// Set while the payment is in manual review.
    pub review: Option<ReviewNextView>,
}

impl NextSection {
    pub fn new(next: &sluice_core::NextExplanation, as_of: i64) -> Self {
        NextSection {
            mover: next.mover.into(),
            due_at: next.due_at_ms,
            as_of,
            summary: next.summary.clone(),
            steps: next.steps.iter().map(NextStepView::from).collect(),
            money_held: MoneyHeldView {
                authorized: next.money_held.authorized_minor,
                capture_reserved: next.money_held.capture_reserved_minor,
                refund_reserved: next.money_held.refund_reserved_minor,
                holds: next
                    .money_held
                    .holds
                    .iter()
                    .map(|h| HoldView {
                        kind: h.kind.to_owned(),
                        aggregate_id: h.aggregate_id.clone(),
                        amount: h.amount_minor,
                        reason: h.reason.clone(),
                    })
                    .collect(),
            },
            review: next.review.as_ref().map(|r| ReviewNextView {
                reason: r.reason.clone(),
                pending_proposals: r
                    .pending_proposals
                    .iter()
                    .map(PendingProposalView::from)
                    .collect(),
                awaiting: r.awaiting.clone(),
            }),
        }
    }
}

impl From<&sluice_core::StepAhead> for NextStepView {
    fn from(s: &sluice_core::StepAhead) -> Self {
        NextStepView {
            aggregate: s.aggregate.into(),
            id: s.id.clone(),
            state: s.state.clone(),
            mover: s.mover.into(),
            action: s.action.to_owned(),
            due_at: s.due_at_ms,
            reference: s.reference.clone(),
            tries: s.tries.map(i64::from),
            backoff_ms: s.backoff_ms,
            deadline: s.deadline.as_ref().map(|d| DeadlineView {
                at: d.at_ms,
                then: d.then.clone(),
            }),
            explanation: s.explanation.clone(),
        }
    }
}

impl From<&sluice_core::PendingProposal> for PendingProposalView {
    fn from(p: &sluice_core::PendingProposal) -> Self {
        PendingProposalView {
            id: p.id.clone(),
            outcome: p.outcome.clone(),
            target_type: p.target_type.clone(),
            target_id: p.target_id.clone(),
            reason_code: p.reason_code.clone(),
            evidence_note: p.evidence_note.clone(),
            amount: p.amount_minor,
            proposed_by: p.proposed_by.clone(),
            proposed_at: p.proposed_at_ms,
        }
    }
}
