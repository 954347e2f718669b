//! Operator review under `/admin/review` (seed 001 §10): what automation
//! could not prove, and two-person resolutions of it.
//!
//! Every route sits behind the server's admin token AND needs the calling
//! operator's own key in the `Sluice-Operator-Key` header: operators are
//! individually identified (`POST /admin/operators` issues a key, shown
//! once, stored only as a keyed hash), so one person cannot approve their
//! own proposal by typing another name. A proposal is applied only when a
//! second, different operator approves it; approval puts an event of
//! evidence `operator` through the store's one door (never a direct status
//! update), history names both people and the manual-review flag clears.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use sluice_store::{NewProposal, Operator, Proposal, ReviewError, ReviewOutcome};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, ErrorBody, ErrorType};
use crate::extract::{ApiJson, ApiPath, ApiQuery, OptionalJson};
use crate::openapi::fields as req_schema;
use crate::payments::json;
use crate::requests as req;
use crate::views::{PaymentResource, TimelineEvent};
use crate::MerchantApiState;
use sluice_orchestrator::{Target, Trigger};

/// The refund an applied proposal reserved (a manual refund, or the
/// compensation refund of a fulfillment resolution), while not yet sent.
async fn manual_refund_to_send(state: &MerchantApiState, proposal: &Proposal) -> Option<String> {
    let reserves_a_refund = proposal.outcome == ReviewOutcome::ManualRefund.as_str()
        || proposal.outcome == ReviewOutcome::FulfillmentCompensate.as_str();
    if !reserves_a_refund || proposal.status != "applied" {
        return None;
    }
    let refund_id = proposal
        .result
        .as_ref()?
        .get("refund_id")?
        .as_str()?
        .to_owned();
    let refund = state.store.get_refund(&refund_id).await.ok()?;
    (refund.state == sluice_core::RefundState::Created).then_some(refund_id)
}

/// The header that names the calling operator.
pub const OPERATOR_KEY_HEADER: &str = "sluice-operator-key";

const MAX_NAME_CHARS: usize = 100;
const MAX_REASON_CODE_CHARS: usize = 64;
const MAX_NOTE_CHARS: usize = 4000;
const MAX_PSP_REFERENCE_CHARS: usize = 255;
/// Default age after which an UNKNOWN is listed for review: 15 minutes.
const DEFAULT_UNKNOWN_AGE_MS: i64 = 15 * 60 * 1000;
const MAX_QUEUE: i64 = 100;

/// The operator who sent the request, from `Sluice-Operator-Key`.
#[derive(Debug, Clone)]
pub struct AuthedOperator(pub Operator);

impl FromRequestParts<MerchantApiState> for AuthedOperator {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &MerchantApiState,
    ) -> Result<Self, ApiError> {
        let missing = || {
            ApiError::unauthorized(
                "operator_key_missing",
                "operator review needs the operator's own key in the Sluice-Operator-Key header",
            )
        };
        let key = parts
            .headers
            .get(OPERATOR_KEY_HEADER)
            .ok_or_else(missing)?
            .to_str()
            .map_err(|_| missing())?
            .trim();
        if key.is_empty() || key.len() > 256 {
            return Err(missing());
        }
        match state
            .store
            .authenticate_operator(key, &state.pepper)
            .await?
        {
            Some(operator) => Ok(AuthedOperator(operator)),
            None => {
                tracing::info!("operator request with an unknown or disabled key refused");
                Err(ApiError::unauthorized(
                    "operator_key_invalid",
                    "the operator key is not valid or the operator is disabled",
                ))
            }
        }
    }
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOperatorRequest {
    /// Unique, e.g. `alice`. Recorded in history as `operator:<name>`.
    #[schema(schema_with = operator_name_schema)]
    pub name: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OperatorView {
    pub id: String,
    /// Always `operator`.
    pub object: String,
    pub name: String,
    pub key_prefix: String,
    pub created_at: i64,
    /// When the operator was disabled (their key no longer works), if ever.
    pub disabled_at: Option<i64>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OperatorList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<OperatorView>,
}

/// A freshly created operator: `key` is shown this once.
#[derive(Serialize, ToSchema)]
pub struct IssuedOperatorView {
    #[serde(flatten)]
    pub operator: OperatorView,
    /// The operator's key, for the `Sluice-Operator-Key` header. Only its
    /// keyed hash is kept.
    pub key: String,
}

impl From<&Operator> for OperatorView {
    fn from(o: &Operator) -> Self {
        OperatorView {
            id: o.id.clone(),
            object: "operator".into(),
            name: o.name.clone(),
            key_prefix: o.key_prefix.clone(),
            created_at: o.created_at,
            disabled_at: o.disabled_at,
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProposalView {
    pub id: String,
    /// Always `review_proposal`.
    pub object: String,
    pub payment_id: String,
    /// `order`, `attempt`, `capture` or `refund`.
    pub target_type: String,
    pub target_id: String,
    /// `attempt_succeeded`, `attempt_failed`, `attempt_canceled`,
    /// `refund_succeeded`, `refund_failed`, `capture_succeeded`,
    /// `capture_failed`, `dismiss`, `manual_refund`, or for a fulfillment
    /// frozen in manual review `fulfillment_fulfilled`,
    /// `fulfillment_compensate` (reason code `fulfillment_deadline_passed`
    /// or `fulfilled_elsewhere`) or `fulfillment_resume`.
    pub outcome: String,
    pub reason_code: String,
    pub evidence_note: String,
    /// For `manual_refund`: the amount in minor units.
    pub amount: Option<i64>,
    /// For a success outcome: the PSP's reference given as evidence, recorded
    /// on the attempt, capture or refund on approval.
    pub psp_reference: Option<String>,
    /// The payment's version the proposer saw; approval is refused once it moved.
    pub payment_version: i64,
    pub target_state: String,
    pub target_version: i64,
    /// Operator id.
    pub proposed_by: String,
    pub proposed_at: i64,
    /// `proposed`, `applied`, `rejected`, `refused` (the door refused the
    /// event) or `stale` (the payment moved after the proposal).
    pub status: String,
    pub decided_by: Option<String>,
    pub decided_at: Option<i64>,
    pub decision_note: Option<String>,
    /// What the door decided on approval.
    #[schema(value_type = Option<Object>)]
    pub result: Option<serde_json::Value>,
}

impl From<&Proposal> for ProposalView {
    fn from(p: &Proposal) -> Self {
        ProposalView {
            id: p.id.clone(),
            object: "review_proposal".into(),
            payment_id: p.payment_id.clone(),
            target_type: p.target_type.clone(),
            target_id: p.target_id.clone(),
            outcome: p.outcome.clone(),
            reason_code: p.reason_code.clone(),
            evidence_note: p.evidence_note.clone(),
            amount: p.amount_minor,
            psp_reference: p.psp_reference.clone(),
            payment_version: p.payment_version,
            target_state: p.target_state.clone(),
            target_version: p.target_version,
            proposed_by: p.proposed_by.clone(),
            proposed_at: p.proposed_at,
            status: p.status.clone(),
            decided_by: p.decided_by.clone(),
            decided_at: p.decided_at,
            decision_note: p.decision_note.clone(),
            result: p.result.clone(),
        }
    }
}

/// One payment to review: its state, its timeline and its proposals.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReviewItem {
    /// Always `review_item`.
    pub object: String,
    pub payment: PaymentResource,
    pub timeline: Vec<TimelineEvent>,
    pub proposals: Vec<ProposalView>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReviewQueue {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ReviewItem>,
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReviewQueueQuery {
    /// List UNKNOWN attempts, captures and refunds older than this many
    /// milliseconds (default 15 minutes), besides flagged payments.
    #[param(schema_with = unknown_age_schema)]
    pub unknown_older_than_ms: Option<i64>,
    /// At most this many payments (1 to 100, default 100).
    #[param(schema_with = queue_limit_schema)]
    pub limit: Option<i64>,
}

/// Letters, digits, `.`, `_` and `-` (checked in [`create_operator`]).
fn operator_name_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_NAME_CHARS))
        .pattern(Some("^[A-Za-z0-9._-]+$"))
        .description(Some(
            "Unique, e.g. `alice`. Recorded in history as `operator:<name>`.",
        ))
        .build()
}

fn unknown_age_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::Int64,
        )))
        .minimum(Some(0))
        .description(Some(
            "List UNKNOWN attempts, captures and refunds older than this many milliseconds \
             (default 15 minutes), besides flagged payments.",
        ))
        .build()
}

fn queue_limit_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::Int64,
        )))
        .minimum(Some(1))
        .maximum(Some(MAX_QUEUE))
        .description(Some(format!(
            "At most this many payments (1 to {MAX_QUEUE}, default {MAX_QUEUE})."
        )))
        .build()
}

/// A proposal. Which fields go with which outcome is stated by its schema
/// ([`proposal_schema`]) and checked by [`validate_proposal`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateProposalRequest {
    /// See [`ProposalView::outcome`].
    pub outcome: String,
    /// The attempt, capture or refund id the outcome is about (not for
    /// `dismiss`, `manual_refund` or the fulfillment outcomes).
    pub target_id: Option<String>,
    /// A short code, e.g. `psp_settlement_report`.
    pub reason_code: String,
    /// What the evidence is and where it is kept.
    pub evidence_note: String,
    /// For `manual_refund` only: the amount to refund, in minor units of the
    /// payment's currency.
    #[serde(default, deserialize_with = "req::optional_integer")]
    pub amount: Option<i64>,
    /// For a success outcome only, and required for `attempt_succeeded`: the
    /// PSP's reference of the payment (or of the refund or capture) the
    /// evidence shows, e.g. `pi_3Nx...`. Refunds and captures of the payment
    /// are sent against it.
    pub psp_reference: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideProposalRequest {
    #[schema(schema_with = note_schema)]
    pub note: Option<String>,
}

fn note_schema() -> utoipa::openapi::Object {
    req_schema::described(
        req_schema::required_text(MAX_NOTE_CHARS, true),
        "Why; recorded in history.",
    )
}

impl utoipa::PartialSchema for CreateProposalRequest {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::RefOr::T(utoipa::openapi::schema::Schema::OneOf(proposal_schema()))
    }
}

impl ToSchema for CreateProposalRequest {}

/// One alternative per family of outcomes: those about an attempt, capture
/// or refund need its `target_id`; `manual_refund` needs an `amount` and
/// only it takes one; `fulfillment_compensate` takes one of the
/// compensation reasons as `reason_code`.
fn proposal_schema() -> utoipa::openapi::schema::OneOf {
    use utoipa::openapi::schema::{
        AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, Type,
    };
    let names = |outcomes: &mut dyn Iterator<Item = &ReviewOutcome>| -> Vec<&'static str> {
        outcomes.map(|o| o.as_str()).collect()
    };
    // The PSP reference: required evidence of an attempt success, optional
    // for the other successes, absent elsewhere.
    let targeted = names(
        &mut ReviewOutcome::ALL
            .iter()
            .filter(|o| o.target_kind().is_some() && !o.is_success()),
    );
    let other_successes = names(
        &mut ReviewOutcome::ALL
            .iter()
            .filter(|o| o.is_success() && **o != ReviewOutcome::AttemptSucceeded),
    );
    let plain = names(&mut ReviewOutcome::ALL.iter().filter(|o| {
        o.target_kind().is_none()
            && **o != ReviewOutcome::ManualRefund
            && **o != ReviewOutcome::FulfillmentCompensate
    }));
    let compensation_reasons = sluice_core::CompensationReason::ALL
        .iter()
        .map(|r| r.as_str());
    let null = || ObjectBuilder::new().schema_type(Type::Null).build();
    let variant = |outcomes: Vec<&'static str>,
                   target_id: utoipa::openapi::Object,
                   amount: utoipa::openapi::Object,
                   reason_code: utoipa::openapi::Object,
                   psp_reference: utoipa::openapi::Object,
                   required: &[&str]| {
        let mut object = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(
                "outcome",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(outcomes)),
            )
            .property("target_id", target_id)
            .property("reason_code", reason_code)
            .property(
                "evidence_note",
                req_schema::required_text(MAX_NOTE_CHARS, false),
            )
            .property("amount", amount)
            .property("psp_reference", psp_reference)
            .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)));
        for field in ["outcome", "reason_code", "evidence_note"]
            .iter()
            .chain(required)
        {
            object = object.required(*field);
        }
        object.build()
    };
    let reason_code = || req_schema::required_text(MAX_REASON_CODE_CHARS, false);
    let ignored_target = || {
        ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
                Type::String,
                Type::Null,
            ]))
            .description(Some("Ignored for this outcome"))
            .build()
    };
    OneOfBuilder::new()
        .description(Some(
            "A resolution for a second operator to approve. `outcome`: see ProposalView.              `target_id`: the attempt, capture or refund the outcome is about. `amount`:              for manual_refund only, in minor units of the payment's currency. `psp_reference`: the PSP's reference the evidence shows, required for attempt_succeeded.",
        ))
        .item(variant(
            vec![ReviewOutcome::AttemptSucceeded.as_str()],
            req_schema::id(false),
            null(),
            reason_code(),
            req_schema::required_text(MAX_PSP_REFERENCE_CHARS, false),
            &["target_id", "psp_reference"],
        ))
        .item(variant(
            other_successes,
            req_schema::id(false),
            null(),
            reason_code(),
            req_schema::required_text(MAX_PSP_REFERENCE_CHARS, true),
            &["target_id"],
        ))
        .item(variant(targeted, req_schema::id(false), null(), reason_code(), null(), &["target_id"]))
        .item(variant(plain, ignored_target(), null(), reason_code(), null(), &[]))
        .item(variant(
            vec![ReviewOutcome::ManualRefund.as_str()],
            ignored_target(),
            req_schema::amount(),
            reason_code(),
            null(),
            &["amount"],
        ))
        .item(variant(
            vec![ReviewOutcome::FulfillmentCompensate.as_str()],
            ignored_target(),
            null(),
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(compensation_reasons))
                .build(),
            null(),
            &[],
        ))
        .build()
}

fn review_error(error: ReviewError) -> ApiError {
    match error {
        ReviewError::SameOperator => ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorType::InvalidRequestError,
            "same_operator",
            error.to_string(),
        ),
        ReviewError::AlreadyDecided { .. } => {
            ApiError::conflict("proposal_already_decided", error.to_string())
        }
        ReviewError::Stale(_) => ApiError::conflict("proposal_stale", error.to_string()),
        ReviewError::Refused(_) => ApiError::conflict("resolution_refused", error.to_string()),
        // The request itself was checked before (`validate_proposal`): what
        // is left is about the payment's state (not flagged, fulfillment not
        // under review).
        ReviewError::NotApplicable(_) => {
            ApiError::conflict("proposal_not_applicable", error.to_string())
        }
        ReviewError::Store(e) => e.into(),
    }
}

/// What [`proposal_schema`] states beyond each field's own format, checked
/// before the payment is looked at: an amount goes with `manual_refund` and
/// only with it; `fulfillment_compensate` names why.
fn validate_proposal(
    outcome: ReviewOutcome,
    amount: Option<i64>,
    reason_code: &str,
) -> Result<(), ApiError> {
    match (outcome == ReviewOutcome::ManualRefund, amount) {
        (true, Some(amount)) => {
            req::amount(amount, "amount")?;
        }
        (true, None) => {
            return Err(ApiError::invalid(
                "proposal_invalid",
                "amount",
                "manual_refund needs the amount to refund, in minor units",
            ))
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "proposal_invalid",
                "amount",
                format!("outcome {} takes no amount", outcome.as_str()),
            ))
        }
        (false, None) => {}
    }
    if let Some(Err(refused)) = outcome.fulfillment_resolution(reason_code) {
        return Err(ApiError::invalid(
            "proposal_invalid",
            "reason_code",
            refused.to_string(),
        ));
    }
    Ok(())
}

fn id_or_404(id: &str, what: &str) -> Result<String, ApiError> {
    if req::looks_like_id(id) {
        Ok(id.to_owned())
    } else {
        Err(ApiError::not_found(
            "resource_missing",
            format!("no such {what}"),
        ))
    }
}

async fn review_item(state: &MerchantApiState, payment_id: &str) -> Result<ReviewItem, ApiError> {
    let details = state.store.payment_details(None, payment_id).await?;
    let timeline = state.store.timeline(payment_id).await?;
    let proposals = state.store.proposals_for_payment(payment_id).await?;
    Ok(ReviewItem {
        object: "review_item".into(),
        payment: PaymentResource::from_details(&details, state.store.now_ms()),
        timeline: timeline.iter().map(TimelineEvent::from).collect(),
        proposals: proposals.iter().map(ProposalView::from).collect(),
    })
}

/// List the operators (admin token only; never their keys).
#[utoipa::path(
    get, path = "/admin/operators", tag = "review",
    responses((status = 200, body = OperatorList), (status = 401, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn list_operators(State(state): State<MerchantApiState>) -> Result<Response, ApiError> {
    let operators = state.store.list_operators().await?;
    Ok(json(
        StatusCode::OK,
        &OperatorList {
            object: "list".into(),
            data: operators.iter().map(OperatorView::from).collect(),
        },
    ))
}

/// Disable an operator (admin token only): their key stops working at once;
/// what they proposed or decided stays in history. Idempotent.
#[utoipa::path(
    post, path = "/admin/operators/{operator_id}/disable", tag = "review",
    params(("operator_id" = String, Path)),
    responses((status = 200, body = OperatorView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn disable_operator(
    State(state): State<MerchantApiState>,
    ApiPath(operator_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let operator_id = id_or_404(&operator_id, "operator")?;
    let operator = state.store.disable_operator(&operator_id).await?;
    tracing::info!(operator = %operator.id, name = %operator.name, "operator disabled");
    Ok(json(StatusCode::OK, &OperatorView::from(&operator)))
}

/// Create an operator (admin token only). The key is shown this once.
#[utoipa::path(
    post, path = "/admin/operators", tag = "review",
    request_body = CreateOperatorRequest,
    responses((status = 201, body = IssuedOperatorView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn create_operator(
    State(state): State<MerchantApiState>,
    ApiJson(body): ApiJson<CreateOperatorRequest>,
) -> Result<Response, ApiError> {
    let name = req::required_text(&body.name, "name", MAX_NAME_CHARS)?;
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(ApiError::invalid(
            "parameter_invalid",
            "name",
            "name may hold only letters, digits, '.', '_' and '-'",
        ));
    }
    let issued = state.store.create_operator(&name, &state.pepper).await?;
    tracing::info!(operator = %issued.operator.id, name = %issued.operator.name, "operator created");
    Ok(json(
        StatusCode::CREATED,
        &IssuedOperatorView {
            operator: OperatorView::from(&issued.operator),
            key: issued.key.clone(),
        },
    ))
}

/// Payments to review: flagged for manual review, or with an UNKNOWN
/// attempt, capture or refund past its age; each with timeline and proposals.
#[utoipa::path(
    get, path = "/admin/review/payments", tag = "review",
    params(ReviewQueueQuery),
    responses((status = 200, body = ReviewQueue), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn review_queue(
    State(state): State<MerchantApiState>,
    _operator: AuthedOperator,
    ApiQuery(query): ApiQuery<ReviewQueueQuery>,
) -> Result<Response, ApiError> {
    let age = query
        .unknown_older_than_ms
        .unwrap_or(DEFAULT_UNKNOWN_AGE_MS);
    if age < 0 {
        return Err(ApiError::invalid(
            "parameter_invalid",
            "unknown_older_than_ms",
            "unknown_older_than_ms must not be negative",
        ));
    }
    let limit = query.limit.unwrap_or(MAX_QUEUE);
    if !(1..=MAX_QUEUE).contains(&limit) {
        return Err(ApiError::invalid(
            "parameter_invalid",
            "limit",
            format!("limit must be between 1 and {MAX_QUEUE}"),
        ));
    }
    let before = state.store.now_ms().saturating_sub(age);
    let ids = state.store.review_queue(before, limit).await?;
    let mut data = Vec::with_capacity(ids.len());
    for id in &ids {
        data.push(review_item(&state, id).await?);
    }
    Ok(json(
        StatusCode::OK,
        &ReviewQueue {
            object: "list".into(),
            data,
        },
    ))
}

/// One payment with its timeline and proposals.
#[utoipa::path(
    get, path = "/admin/review/payments/{payment_id}", tag = "review",
    params(("payment_id" = String, Path)),
    responses((status = 200, body = ReviewItem), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn review_payment(
    State(state): State<MerchantApiState>,
    _operator: AuthedOperator,
    ApiPath(payment_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let payment_id = id_or_404(&payment_id, "payment")?;
    Ok(json(
        StatusCode::OK,
        &review_item(&state, &payment_id).await?,
    ))
}

/// Propose a resolution. Changes no payment state; a second operator decides.
#[utoipa::path(
    post, path = "/admin/review/payments/{payment_id}/proposals", tag = "review",
    params(("payment_id" = String, Path)),
    request_body = CreateProposalRequest,
    responses((status = 201, body = ProposalView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "The outcome does not apply to the payment as it stands (e.g. a fulfillment outcome for a fulfillment not under review)")),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn create_proposal(
    State(state): State<MerchantApiState>,
    AuthedOperator(operator): AuthedOperator,
    ApiPath(payment_id): ApiPath<String>,
    ApiJson(body): ApiJson<CreateProposalRequest>,
) -> Result<Response, ApiError> {
    let payment_id = id_or_404(&payment_id, "payment")?;
    let outcome = ReviewOutcome::parse(&body.outcome).ok_or_else(|| {
        let names: Vec<&str> = ReviewOutcome::ALL.iter().map(|o| o.as_str()).collect();
        ApiError::invalid(
            "parameter_invalid",
            "outcome",
            format!("outcome must be one of {}", names.join(", ")),
        )
    })?;
    let target_id = match (outcome.target_kind(), body.target_id.as_deref()) {
        (None, _) => None,
        (Some(_), Some(id)) if req::looks_like_id(id) => Some(id.to_owned()),
        (Some(_), _) => {
            return Err(ApiError::invalid(
                "parameter_invalid",
                "target_id",
                format!(
                    "outcome {} needs target_id, the id of the {}",
                    outcome.as_str(),
                    outcome.target_type()
                ),
            ))
        }
    };
    let reason_code = req::required_text(&body.reason_code, "reason_code", MAX_REASON_CODE_CHARS)?;
    let evidence_note = req::required_text(&body.evidence_note, "evidence_note", MAX_NOTE_CHARS)?;
    validate_proposal(outcome, body.amount, &reason_code)?;
    let psp_reference = evidence_reference(outcome, body.psp_reference.as_deref())?;
    let proposal = state
        .store
        .create_proposal(&NewProposal {
            payment_id,
            outcome,
            target_id,
            reason_code,
            evidence_note,
            amount_minor: body.amount,
            psp_reference,
            proposed_by: operator.id.clone(),
        })
        .await
        .map_err(review_error)?;
    Ok(json(StatusCode::CREATED, &ProposalView::from(&proposal)))
}

/// The PSP reference a proposal gives as evidence: required for
/// `attempt_succeeded` (a success without it could never be refunded),
/// allowed for the other successes, refused elsewhere.
fn evidence_reference(
    outcome: ReviewOutcome,
    given: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let given = req::optional_text(given, "psp_reference", MAX_PSP_REFERENCE_CHARS)?;
    match (outcome, &given) {
        (ReviewOutcome::AttemptSucceeded, None) => Err(ApiError::invalid(
            "parameter_missing",
            "psp_reference",
            "attempt_succeeded needs psp_reference, the PSP's reference of the payment, as \
             evidence: refunds and captures of the payment are sent against it",
        )),
        (outcome, Some(_)) if !outcome.is_success() => Err(ApiError::invalid(
            "parameter_invalid",
            "psp_reference",
            format!(
                "psp_reference is evidence of a success; {} carries none",
                outcome.as_str()
            ),
        )),
        _ => Ok(given),
    }
}

/// Approve a proposal (a different operator than the proposer). Applies the
/// operator event through the one door; idempotent for the same approver.
#[utoipa::path(
    post, path = "/admin/review/proposals/{proposal_id}/approve", tag = "review",
    params(("proposal_id" = String, Path)),
    request_body = DecideProposalRequest,
    responses((status = 200, body = ProposalView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn approve_proposal(
    State(state): State<MerchantApiState>,
    AuthedOperator(operator): AuthedOperator,
    ApiPath(proposal_id): ApiPath<String>,
    OptionalJson(body): OptionalJson<DecideProposalRequest>,
) -> Result<Response, ApiError> {
    let proposal_id = id_or_404(&proposal_id, "proposal")?;
    let note = req::optional_text(body.note.as_deref(), "note", MAX_NOTE_CHARS)?;
    let proposal = state
        .store
        .approve_proposal(&proposal_id, &operator.id, note.as_deref())
        .await
        .map_err(review_error)?;
    if let Some(refund_id) = manual_refund_to_send(&state, &proposal).await {
        // Reserved in the approval's transaction; sent like any refund. A
        // failure here leaves it for the recovery scanner.
        if let Err(error) = state
            .orchestrator
            .advance(Target::Refund(refund_id.clone()), Trigger::Operator)
            .await
        {
            tracing::warn!(payment_id = %proposal.payment_id, refund_id = %refund_id, %error,
                "approved manual refund not sent yet");
        }
    }
    let proposal = state.store.get_proposal(&proposal_id).await?;
    Ok(json(StatusCode::OK, &ProposalView::from(&proposal)))
}

/// Reject a proposal (a different operator than the proposer). Changes no
/// payment state.
#[utoipa::path(
    post, path = "/admin/review/proposals/{proposal_id}/reject", tag = "review",
    params(("proposal_id" = String, Path)),
    request_body = DecideProposalRequest,
    responses((status = 200, body = ProposalView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("admin_token" = [], "operator_key" = []))
)]
pub async fn reject_proposal(
    State(state): State<MerchantApiState>,
    AuthedOperator(operator): AuthedOperator,
    ApiPath(proposal_id): ApiPath<String>,
    OptionalJson(body): OptionalJson<DecideProposalRequest>,
) -> Result<Response, ApiError> {
    let proposal_id = id_or_404(&proposal_id, "proposal")?;
    let note =
        req::optional_text(body.note.as_deref(), "note", MAX_NOTE_CHARS)?.unwrap_or_default();
    let proposal = state
        .store
        .reject_proposal(&proposal_id, &operator.id, &note)
        .await
        .map_err(review_error)?;
    Ok(json(StatusCode::OK, &ProposalView::from(&proposal)))
}

/// Store errors of the review routes keep their usual mapping.
impl From<ReviewError> for ApiError {
    fn from(error: ReviewError) -> Self {
        review_error(error)
    }
}
