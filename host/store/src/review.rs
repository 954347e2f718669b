//! Operator review (seed 001 §10): individually identified operators
//! (credentials stored only as a keyed hash, like API keys) and two-person
//! resolution proposals. A proposal is applied only by
//! [`Store::approve_proposal`], which puts an event of evidence `operator`
//! through the one door; this module never writes a payment state.

use rand::RngCore;
use sqlx::any::AnyRow;

use crate::db::{int, opt_int, opt_text, text};
use crate::merchants::ApiKeyPepper;
use crate::payments::{PaymentOrder, PendingKind};
use crate::{ids, Store, StoreError};

/// One person allowed to propose and approve resolutions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub id: String,
    pub name: String,
    /// The first characters of the key, to recognise it.
    pub key_prefix: String,
    pub created_at: i64,
    pub disabled_at: Option<i64>,
}

/// A freshly created operator and their key, shown this once.
#[derive(Clone)]
pub struct IssuedOperator {
    pub operator: Operator,
    pub key: String,
}

impl std::fmt::Debug for IssuedOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedOperator")
            .field("operator", &self.operator)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// What an operator proposes should be true of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReviewOutcome {
    /// The attempt took the money (PAYMENT_SUCCEEDED, evidence operator).
    AttemptSucceeded,
    /// The attempt definitively failed (PAYMENT_FAILED, evidence operator).
    AttemptFailed,
    /// The attempt was canceled before any money moved.
    AttemptCanceled,
    RefundSucceeded,
    RefundFailed,
    CaptureSucceeded,
    CaptureFailed,
    /// The recorded states stand (e.g. a contradiction was checked with the
    /// PSP and the recorded success is right): only the review flag clears.
    Dismiss,
    /// A refund of `amount_minor` that automation would not issue (e.g. the
    /// merchant cannot, or a definitively failed refund must be re-issued):
    /// approval reserves it through the normal reservation, in the approval's
    /// transaction, and the orchestrator sends it like any refund.
    ManualRefund,
    /// A fulfillment frozen in `manual_review` reached the goal with this
    /// payment (the core's `OperatorResolution::Fulfilled`).
    FulfillmentFulfilled,
    /// A fulfillment frozen in `manual_review` missed the goal: start the
    /// compensation refund; the reason code is the compensation reason
    /// (`fulfillment_deadline_passed` or `fulfilled_elsewhere`).
    FulfillmentCompensate,
    /// The cause of a fulfillment's `manual_review` was fixed: hand it back
    /// to automation.
    FulfillmentResume,
}

impl ReviewOutcome {
    pub const ALL: &'static [ReviewOutcome] = &[
        ReviewOutcome::AttemptSucceeded,
        ReviewOutcome::AttemptFailed,
        ReviewOutcome::AttemptCanceled,
        ReviewOutcome::RefundSucceeded,
        ReviewOutcome::RefundFailed,
        ReviewOutcome::CaptureSucceeded,
        ReviewOutcome::CaptureFailed,
        ReviewOutcome::Dismiss,
        ReviewOutcome::ManualRefund,
        ReviewOutcome::FulfillmentFulfilled,
        ReviewOutcome::FulfillmentCompensate,
        ReviewOutcome::FulfillmentResume,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            ReviewOutcome::AttemptSucceeded => "attempt_succeeded",
            ReviewOutcome::AttemptFailed => "attempt_failed",
            ReviewOutcome::AttemptCanceled => "attempt_canceled",
            ReviewOutcome::RefundSucceeded => "refund_succeeded",
            ReviewOutcome::RefundFailed => "refund_failed",
            ReviewOutcome::CaptureSucceeded => "capture_succeeded",
            ReviewOutcome::CaptureFailed => "capture_failed",
            ReviewOutcome::Dismiss => "dismiss",
            ReviewOutcome::ManualRefund => "manual_refund",
            ReviewOutcome::FulfillmentFulfilled => "fulfillment_fulfilled",
            ReviewOutcome::FulfillmentCompensate => "fulfillment_compensate",
            ReviewOutcome::FulfillmentResume => "fulfillment_resume",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        ReviewOutcome::ALL
            .iter()
            .copied()
            .find(|o| o.as_str() == text)
    }

    /// An outcome that says the PSP did it, so it may carry the PSP's reference.
    pub fn is_success(&self) -> bool {
        matches!(
            self,
            ReviewOutcome::AttemptSucceeded
                | ReviewOutcome::RefundSucceeded
                | ReviewOutcome::CaptureSucceeded
        )
    }

    /// The kind of row the outcome is about; `None` for the order itself.
    pub fn target_kind(&self) -> Option<PendingKind> {
        match self {
            ReviewOutcome::AttemptSucceeded
            | ReviewOutcome::AttemptFailed
            | ReviewOutcome::AttemptCanceled => Some(PendingKind::Attempt),
            ReviewOutcome::RefundSucceeded | ReviewOutcome::RefundFailed => {
                Some(PendingKind::Refund)
            }
            ReviewOutcome::CaptureSucceeded | ReviewOutcome::CaptureFailed => {
                Some(PendingKind::Capture)
            }
            ReviewOutcome::Dismiss
            | ReviewOutcome::ManualRefund
            | ReviewOutcome::FulfillmentFulfilled
            | ReviewOutcome::FulfillmentCompensate
            | ReviewOutcome::FulfillmentResume => None,
        }
    }

    /// The fulfillment resolution this outcome asks the core for, with the
    /// proposal's reason code (the compensation reason for a compensation);
    /// `None` for the payment outcomes. A reason code that names no
    /// compensation reason is refused.
    pub fn fulfillment_resolution(
        &self,
        reason_code: &str,
    ) -> Option<Result<sluice_core::OperatorResolution, ReviewError>> {
        use sluice_core::{CompensationReason, OperatorResolution};
        match self {
            ReviewOutcome::FulfillmentFulfilled => Some(Ok(OperatorResolution::Fulfilled)),
            ReviewOutcome::FulfillmentResume => Some(Ok(OperatorResolution::ResumeAutomation)),
            ReviewOutcome::FulfillmentCompensate => Some(
                CompensationReason::parse(reason_code)
                    .map(|reason| OperatorResolution::Compensate { reason })
                    .ok_or_else(|| {
                        let names: Vec<_> =
                            CompensationReason::ALL.iter().map(|r| r.as_str()).collect();
                        ReviewError::NotApplicable(format!(
                            "fulfillment_compensate needs reason_code {}",
                            names.join(" or ")
                        ))
                    }),
            ),
            _ => None,
        }
    }

    /// `order`, `attempt`, `capture` or `refund`.
    pub fn target_type(&self) -> &'static str {
        match self.target_kind() {
            Some(PendingKind::Attempt) => "attempt",
            Some(PendingKind::Refund) => "refund",
            Some(PendingKind::Capture) => "capture",
            None => "order",
        }
    }
}

/// Proposal states: `proposed` → `applied` | `rejected` (by a second
/// operator) | `refused` (the core refused the event on approval) |
/// `stale` (the payment moved after the proposal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub id: String,
    pub payment_id: String,
    pub target_type: String,
    pub target_id: String,
    pub outcome: String,
    pub reason_code: String,
    pub evidence_note: String,
    /// For `manual_refund`: the amount in minor units of the payment's currency.
    pub amount_minor: Option<i64>,
    /// For a success outcome: the PSP's reference of the payment (attempt),
    /// refund or capture, as evidence; recorded on the target on approval.
    pub psp_reference: Option<String>,
    pub payment_version: i64,
    pub target_state: String,
    pub target_version: i64,
    /// Operator ids.
    pub proposed_by: String,
    pub proposed_at: i64,
    pub status: String,
    pub decided_by: Option<String>,
    pub decided_at: Option<i64>,
    pub decision_note: Option<String>,
    pub result: Option<serde_json::Value>,
}

/// What an operator proposes.
#[derive(Debug, Clone)]
pub struct NewProposal {
    pub payment_id: String,
    pub outcome: ReviewOutcome,
    /// The attempt, capture or refund id (ignored for `dismiss`).
    pub target_id: Option<String>,
    pub reason_code: String,
    pub evidence_note: String,
    /// For `manual_refund` only.
    pub amount_minor: Option<i64>,
    /// For a success outcome only; required for `attempt_succeeded` (later
    /// refunds and captures are sent against it).
    pub psp_reference: Option<String>,
    pub proposed_by: String,
}

/// Why a review command was refused, typed so the API can answer 403 / 409.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the operator who proposed a resolution cannot decide it; a second operator must")]
    SameOperator,
    #[error("proposal {id} is already {status}")]
    AlreadyDecided { id: String, status: String },
    #[error("the payment moved since the proposal ({0}); look again and propose anew")]
    Stale(String),
    #[error("{0}")]
    NotApplicable(String),
    /// The door refused the operator event (recorded in history).
    #[error("the resolution was refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub(crate) const PROPOSAL_COLS: &str = "id, payment_id, target_type, target_id, outcome, \
    reason_code, evidence_note, amount_minor, psp_reference, payment_version, target_state, \
    target_version, proposed_by, proposed_at, status, decided_by, decided_at, decision_note, result_json";

pub(crate) fn proposal_from(row: &AnyRow) -> Result<Proposal, StoreError> {
    let result = opt_text(row, "result_json")?
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|e| StoreError::Corrupt {
            table: "review_proposals",
            detail: format!("result_json: {e}"),
        })?;
    Ok(Proposal {
        id: text(row, "id")?,
        payment_id: text(row, "payment_id")?,
        target_type: text(row, "target_type")?,
        target_id: text(row, "target_id")?,
        outcome: text(row, "outcome")?,
        reason_code: text(row, "reason_code")?,
        evidence_note: text(row, "evidence_note")?,
        amount_minor: opt_int(row, "amount_minor")?,
        psp_reference: opt_text(row, "psp_reference")?,
        payment_version: int(row, "payment_version")?,
        target_state: text(row, "target_state")?,
        target_version: int(row, "target_version")?,
        proposed_by: text(row, "proposed_by")?,
        proposed_at: int(row, "proposed_at")?,
        status: text(row, "status")?,
        decided_by: opt_text(row, "decided_by")?,
        decided_at: opt_int(row, "decided_at")?,
        decision_note: opt_text(row, "decision_note")?,
        result,
    })
}

fn operator_from(row: &AnyRow) -> Result<Operator, StoreError> {
    Ok(Operator {
        id: text(row, "id")?,
        name: text(row, "name")?,
        key_prefix: text(row, "key_prefix")?,
        created_at: int(row, "created_at")?,
        disabled_at: opt_int(row, "disabled_at")?,
    })
}

const OPERATOR_COLS: &str = "id, name, key_prefix, created_at, disabled_at";

impl Store {
    /// Create an operator with a fresh key (`op_sluice_...`), returned once;
    /// only its keyed hash is stored. Names are unique.
    pub async fn create_operator(
        &self,
        name: &str,
        pepper: &ApiKeyPepper,
    ) -> Result<IssuedOperator, StoreError> {
        let mut secret = [0u8; 24];
        rand::rng().fill_bytes(&mut secret);
        let key = format!("op_sluice_{}", hex::encode(secret));
        let operator = Operator {
            id: ids::mint(&self.env, "opr"),
            name: name.to_owned(),
            key_prefix: key[..16].to_owned(),
            created_at: self.now_ms(),
            disabled_at: None,
        };
        let inserted = sqlx::query(
            "INSERT INTO operators (id, name, key_hash, key_prefix, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&operator.id)
        .bind(&operator.name)
        .bind(pepper.hash(&key))
        .bind(&operator.key_prefix)
        .bind(operator.created_at)
        .execute(self.writer())
        .await
        .map_err(StoreError::from);
        match inserted {
            Ok(_) => Ok(IssuedOperator { operator, key }),
            Err(e) if e.is_unique_violation() => Err(StoreError::Conflict(format!(
                "an operator named {name:?} already exists"
            ))),
            Err(e) => Err(e),
        }
    }

    /// The active operator a key belongs to.
    pub async fn authenticate_operator(
        &self,
        presented: &str,
        pepper: &ApiKeyPepper,
    ) -> Result<Option<Operator>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {OPERATOR_COLS} FROM operators WHERE key_hash = $1 AND disabled_at IS NULL"
        ))
        .bind(pepper.hash(presented))
        .fetch_optional(self.pool())
        .await?;
        row.as_ref().map(operator_from).transpose()
    }

    /// Disable an operator: their key stops working at once (for proposing,
    /// approving and rejecting). Their past decisions stay in history.
    /// Disabling again keeps the first time.
    pub async fn disable_operator(&self, operator_id: &str) -> Result<Operator, StoreError> {
        sqlx::query("UPDATE operators SET disabled_at = $2 WHERE id = $1 AND disabled_at IS NULL")
            .bind(operator_id)
            .bind(self.now_ms())
            .execute(self.writer())
            .await?;
        let row = sqlx::query(&format!(
            "SELECT {OPERATOR_COLS} FROM operators WHERE id = $1"
        ))
        .bind(operator_id)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| StoreError::not_found("operator", operator_id))?;
        operator_from(&row)
    }

    pub async fn list_operators(&self) -> Result<Vec<Operator>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OPERATOR_COLS} FROM operators ORDER BY created_at, id"
        ))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(operator_from).collect()
    }

    /// Record a proposal, with the payment's and the target's version as
    /// the proposer saw them. Changes no payment state.
    pub async fn create_proposal(&self, new: &NewProposal) -> Result<Proposal, ReviewError> {
        let order = self.get_payment(None, &new.payment_id).await?;
        check_proposal_shape(new)?;
        let (target_id, target_state, target_version) = self.proposal_target(new, &order).await?;
        let proposal = Proposal {
            id: ids::mint(&self.env, "rvp"),
            payment_id: order.id.clone(),
            target_type: new.outcome.target_type().to_owned(),
            target_id,
            outcome: new.outcome.as_str().to_owned(),
            reason_code: new.reason_code.clone(),
            evidence_note: new.evidence_note.clone(),
            amount_minor: new.amount_minor,
            psp_reference: new.psp_reference.clone(),
            payment_version: order.version,
            target_state,
            target_version,
            proposed_by: new.proposed_by.clone(),
            proposed_at: self.now_ms(),
            status: "proposed".into(),
            decided_by: None,
            decided_at: None,
            decision_note: None,
            result: None,
        };
        self.insert_proposal(&proposal).await?;
        tracing::info!(payment_id = %proposal.payment_id, proposal = %proposal.id,
            outcome = %proposal.outcome, operator = %proposal.proposed_by, "resolution proposed");
        Ok(proposal)
    }

    /// What the proposal is about, as the proposer sees it now: its id,
    /// state and version (the payment itself for outcomes without a target).
    async fn proposal_target(
        &self,
        new: &NewProposal,
        order: &PaymentOrder,
    ) -> Result<(String, String, i64), ReviewError> {
        let the_payment = || {
            (
                order.id.clone(),
                order.state.as_str().to_owned(),
                order.version,
            )
        };
        match new.outcome.target_kind() {
            Some(kind) => self.pending_target(new, order, kind).await,
            None if new.outcome == ReviewOutcome::ManualRefund => Ok(the_payment()),
            None if new.outcome.fulfillment_resolution("").is_some() => {
                // Checked here so the proposer hears it now, not the approver.
                if let Some(Err(refused)) = new.outcome.fulfillment_resolution(&new.reason_code) {
                    return Err(refused);
                }
                let frozen = self
                    .fulfillment_snapshot(&order.id)
                    .await?
                    .is_some_and(|f| f.state == sluice_core::FulfillmentState::ManualReview);
                if !frozen {
                    return Err(ReviewError::NotApplicable(
                        "the payment's fulfillment is not under manual review".into(),
                    ));
                }
                Ok(the_payment())
            }
            None if order.manual_review => Ok(the_payment()),
            None => Err(ReviewError::NotApplicable(
                "the payment is not flagged for manual review: nothing to dismiss".into(),
            )),
        }
    }

    /// The attempt, refund or capture an outcome resolves: it must belong to
    /// the proposal's payment (another payment's answers not found).
    async fn pending_target(
        &self,
        new: &NewProposal,
        order: &PaymentOrder,
        kind: PendingKind,
    ) -> Result<(String, String, i64), ReviewError> {
        let id = new.target_id.as_deref().ok_or_else(|| {
            ReviewError::NotApplicable(format!(
                "outcome {} needs the id of the {}",
                new.outcome.as_str(),
                new.outcome.target_type()
            ))
        })?;
        let (payment_id, state, version) = match kind {
            PendingKind::Attempt => {
                let a = self.get_attempt(id).await?;
                (a.payment_id, a.state.as_str(), a.version)
            }
            PendingKind::Refund => {
                let r = self.get_refund(id).await?;
                (r.payment_id, r.state.as_str(), r.version)
            }
            PendingKind::Capture => {
                let c = self.get_capture(id).await?;
                (c.payment_id, c.state.as_str(), c.version)
            }
        };
        if payment_id != order.id {
            return Err(StoreError::not_found(new.outcome.target_type(), id).into());
        }
        self.check_evidence_reference(new, id).await?;
        Ok((id.to_owned(), state.to_owned(), version))
    }

    async fn insert_proposal(&self, proposal: &Proposal) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO review_proposals (id, payment_id, target_type, target_id, outcome, \
                reason_code, evidence_note, payment_version, target_state, target_version, \
                proposed_by, proposed_at, status, amount_minor, psp_reference) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'proposed', $13, $14)",
        )
        .bind(&proposal.id)
        .bind(&proposal.payment_id)
        .bind(&proposal.target_type)
        .bind(&proposal.target_id)
        .bind(&proposal.outcome)
        .bind(&proposal.reason_code)
        .bind(&proposal.evidence_note)
        .bind(proposal.payment_version)
        .bind(&proposal.target_state)
        .bind(proposal.target_version)
        .bind(&proposal.proposed_by)
        .bind(proposal.proposed_at)
        .bind(proposal.amount_minor)
        .bind(proposal.psp_reference.as_deref())
        .execute(self.writer())
        .await?;
        Ok(())
    }

    /// An attempt success must name the PSP's payment reference: without it
    /// no later refund or capture can be sent. It must agree with one the
    /// attempt already has, and belong to no other attempt of the adapter.
    async fn check_evidence_reference(
        &self,
        new: &NewProposal,
        target_id: &str,
    ) -> Result<(), ReviewError> {
        if new.outcome != ReviewOutcome::AttemptSucceeded {
            return Ok(());
        }
        let given = new
            .psp_reference
            .as_deref()
            .filter(|r| !r.trim().is_empty());
        let given = given.ok_or_else(|| {
            ReviewError::NotApplicable(
                "attempt_succeeded needs psp_reference, the PSP's reference of the payment, \
                 as evidence: refunds and captures are sent against it"
                    .into(),
            )
        })?;
        let attempt = self.get_attempt(target_id).await?;
        if attempt.psp_reference.as_deref().is_some_and(|r| r != given) {
            return Err(ReviewError::NotApplicable(format!(
                "the attempt already carries the PSP reference {:?}, not {given:?}",
                attempt.psp_reference.unwrap_or_default()
            )));
        }
        let other = sqlx::query(
            "SELECT id FROM payment_attempts WHERE adapter = $1 AND psp_reference = $2 AND id <> $3",
        )
        .bind(&attempt.adapter)
        .bind(given)
        .bind(&attempt.id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::from)?;
        match other {
            Some(row) => Err(ReviewError::NotApplicable(format!(
                "the PSP reference {given:?} belongs to attempt {}",
                text(&row, "id")?
            ))),
            None => Ok(()),
        }
    }

    pub async fn get_proposal(&self, id: &str) -> Result<Proposal, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {PROPOSAL_COLS} FROM review_proposals WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| StoreError::not_found("proposal", id))?;
        proposal_from(&row)
    }

    pub async fn proposals_for_payment(
        &self,
        payment_id: &str,
    ) -> Result<Vec<Proposal>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {PROPOSAL_COLS} FROM review_proposals WHERE payment_id = $1 \
             ORDER BY proposed_at, id"
        ))
        .bind(payment_id)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(proposal_from).collect()
    }

    /// A second operator turns the proposal down. Changes no payment state.
    pub async fn reject_proposal(
        &self,
        id: &str,
        operator_id: &str,
        note: &str,
    ) -> Result<Proposal, ReviewError> {
        let proposal = self.get_proposal(id).await?;
        if proposal.proposed_by == operator_id {
            return Err(ReviewError::SameOperator);
        }
        let done = sqlx::query(
            "UPDATE review_proposals SET status = 'rejected', decided_by = $2, decided_at = $3, \
                decision_note = $4 WHERE id = $1 AND status = 'proposed'",
        )
        .bind(id)
        .bind(operator_id)
        .bind(self.now_ms())
        .bind(note)
        .execute(self.writer())
        .await
        .map_err(StoreError::from)?;
        let after = self.get_proposal(id).await?;
        if done.rows_affected() != 1 {
            return Err(ReviewError::AlreadyDecided {
                id: after.id,
                status: after.status,
            });
        }
        Ok(after)
    }

    /// Payments an operator should look at: flagged for manual review, or
    /// with an attempt, capture or refund UNKNOWN since before `unknown_before`
    /// (ms). Newest-flagged first is not promised; ordered by payment id.
    pub async fn review_queue(
        &self,
        unknown_before: i64,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT id FROM payment_orders WHERE manual_review = 1 \
             UNION SELECT id FROM payment_orders WHERE fulfillment_state = 'manual_review' \
             UNION SELECT payment_id AS id FROM payment_attempts \
                WHERE state = 'UNKNOWN' AND created_at <= $1 \
             UNION SELECT payment_id AS id FROM refunds \
                WHERE state = 'UNKNOWN' AND created_at <= $1 \
             UNION SELECT payment_id AS id FROM captures \
                WHERE state = 'UNKNOWN' AND created_at <= $1 \
             ORDER BY id LIMIT $2",
        )
        .bind(unknown_before)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(|row| text(row, "id")).collect()
    }
}

/// A proposal's own fields that must agree whatever the payment: evidence
/// of a success only with a success, an amount with a manual refund only.
fn check_proposal_shape(new: &NewProposal) -> Result<(), ReviewError> {
    if new.psp_reference.is_some() && !new.outcome.is_success() {
        return Err(ReviewError::NotApplicable(format!(
            "psp_reference is evidence of a success; {} carries none",
            new.outcome.as_str()
        )));
    }
    let manual_refund = new.outcome == ReviewOutcome::ManualRefund;
    if manual_refund != new.amount_minor.is_some() || new.amount_minor.is_some_and(|a| a <= 0) {
        return Err(ReviewError::NotApplicable(
            "a positive amount goes with manual_refund, and only with it".into(),
        ));
    }
    Ok(())
}
