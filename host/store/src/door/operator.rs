//! Paths through the one door that carry no PSP evidence: flagging a payment
//! for an operator (the scanner's escalation of an UNKNOWN past its age), and
//! applying a two-person-approved operator resolution (an event of evidence
//! `operator`, then clearing the flag).
//! Same transaction shape as every other decision: the order is CAS'ed (the
//! flag bumps its version), a history row records the decision and the
//! `payment.needs_review` outbox event tells the merchant. No aggregate
//! state changes here.

use super::*;
use crate::payments::PendingKind;
use crate::reserve::RefundRequest;
use crate::review::{proposal_from, Proposal, ReviewError, ReviewOutcome, PROPOSAL_COLS};
use sluice_core::{EvidenceSource, Failure, FailureCategory};

/// The history `event_kind` of an escalation.
pub const ESCALATE_KIND: &str = "COMMAND_ESCALATE_MANUAL_REVIEW";
/// The history `event_kind` of a reconciliation difference sent to review.
pub const RECONCILIATION_KIND: &str = "COMMAND_RECONCILIATION_REVIEW";

impl Store {
    /// Flag the payment of a pending attempt, capture or refund for manual
    /// review, with `reason`, without changing any state. It records once: a
    /// payment already flagged answers an ignored duplicate and writes
    /// nothing (no history row, no outbox event), however often its callers
    /// (each scanner round, each advance of a refund that cannot be sent)
    /// ask. An aggregate that turned terminal meanwhile records an ignored
    /// stale decision (nothing is flagged then).
    pub async fn flag_manual_review(
        &self,
        kind: PendingKind,
        id: &str,
        reason: &str,
        provenance: &Provenance,
    ) -> Result<Applied, StoreError> {
        self.flag(
            kind,
            id,
            reason,
            provenance,
            ESCALATE_KIND,
            escalation_verdict,
        )
        .await
    }

    /// Flag the payment of an attempt, capture or refund for two-person
    /// review because reconciliation found a difference about it (issue 14).
    /// Unlike [`Store::flag_manual_review`] this flags whatever the
    /// aggregate's state: a settlement report contradicting a terminal state
    /// is exactly what an operator must see. It records once, like it, and
    /// changes no state.
    pub async fn flag_reconciliation_review(
        &self,
        kind: PendingKind,
        id: &str,
        reason: &str,
        provenance: &Provenance,
    ) -> Result<Applied, StoreError> {
        let verdict = |_: &Subject, reason: &str| {
            let mut verdict = Verdict::duplicate(String::new());
            verdict.kind = DecisionKind::NeedsReconciliation;
            verdict.reason = reason.to_owned();
            verdict
        };
        self.flag(kind, id, reason, provenance, RECONCILIATION_KIND, verdict)
            .await
    }

    async fn flag(
        &self,
        kind: PendingKind,
        id: &str,
        reason: &str,
        provenance: &Provenance,
        history_kind: &'static str,
        verdict_of: impl Fn(&Subject, &str) -> Verdict,
    ) -> Result<Applied, StoreError> {
        for tries in 1..=MAX_CAS_TRIES {
            let mut tx = self.begin_write().await?;
            // Order first (see the lock order in the module doc of the door):
            // a change to the aggregate after this read bumps the order's
            // version and makes the CAS below miss.
            let payment_id = pending_payment_id(&mut tx, kind, id).await?;
            let (order, amounts) = order_and_amounts_in(&mut tx, &payment_id).await?;
            let subject = pending_subject(&mut tx, kind, id).await?;
            if order.manual_review {
                tx.rollback().await?;
                return Ok(already_flagged(&order, &subject));
            }
            let verdict = verdict_of(&subject, reason);
            let plan = Plan::command((order, amounts, subject), verdict, history_kind, provenance);
            let step = in_tx(self.carry_out(&mut Door::InTx(&mut tx), plan).await?)?;
            if let Some(applied) = finish_try(&self.env, tx, step, tries).await? {
                return Ok(applied);
            }
        }
        Err(StoreError::CasExhausted {
            aggregate: "order",
            id: id.to_owned(),
            tries: MAX_CAS_TRIES,
        })
    }
}

/// The answer to flagging a payment that is flagged already: nothing written.
fn already_flagged(order: &PaymentOrder, subject: &Subject) -> Applied {
    Applied {
        decision: DecisionKind::IgnoredDuplicate,
        reason: "the payment is already flagged for manual review".to_owned(),
        payment_id: order.id.clone(),
        aggregate: subject.aggregate,
        aggregate_id: subject.id.clone(),
        from_state: subject.state.to_owned(),
        to_state: subject.state.to_owned(),
        aggregate_version: subject.version,
        payment_version: order.version,
        order_state: order.state,
        history_ids: Vec::new(),
        outbox_event_ids: Vec::new(),
        tries: 1,
        after: None,
    }
}

fn escalation_verdict(subject: &Subject, reason: &str) -> Verdict {
    let mut verdict = Verdict::duplicate(String::new());
    if is_terminal_state(subject.aggregate, subject.state) {
        verdict.kind = DecisionKind::IgnoredStale;
        verdict.reason = format!(
            "{} {} is already {}: nothing to escalate",
            subject.aggregate, subject.id, subject.state
        );
    } else {
        // Recorded like contradicting evidence: the door flags the order,
        // writes history and emits `payment.needs_review`, and moves no state.
        verdict.kind = DecisionKind::NeedsReconciliation;
        verdict.reason = reason.to_owned();
    }
    verdict
}

fn is_terminal_state(aggregate: Aggregate, state: &str) -> bool {
    match aggregate {
        Aggregate::Attempt => AttemptState::parse(state).is_some_and(|s| s.is_terminal()),
        Aggregate::Refund => RefundState::parse(state).is_some_and(|s| s.is_terminal()),
        Aggregate::Capture => CaptureState::parse(state).is_some_and(|s| s.is_terminal()),
        Aggregate::Order => OrderState::parse(state).is_some_and(|s| s.is_terminal()),
    }
}

fn pending_table(kind: PendingKind) -> (&'static str, &'static str) {
    match kind {
        PendingKind::Attempt => ("payment_attempts", "attempt"),
        PendingKind::Refund => ("refunds", "refund"),
        PendingKind::Capture => ("captures", "capture"),
    }
}

/// The payment an attempt, capture or refund belongs to.
pub(super) async fn pending_payment_id(
    tx: &mut Conn,
    kind: PendingKind,
    id: &str,
) -> Result<String, StoreError> {
    let (table, entity) = pending_table(kind);
    match find_row(tx, table, "id", id).await? {
        Some((_, payment_id)) => Ok(payment_id),
        None => Err(StoreError::not_found(entity, id)),
    }
}

/// The attempt, capture or refund `id` as a door subject.
pub(super) async fn pending_subject(
    tx: &mut Conn,
    kind: PendingKind,
    id: &str,
) -> Result<Subject, StoreError> {
    Ok(match kind {
        PendingKind::Attempt => attempt_subject(&attempt_in(tx, id).await?),
        PendingKind::Refund => refund_subject(&refund_in(tx, id).await?),
        PendingKind::Capture => capture_subject(&capture_in(tx, id).await?),
    })
}

/// The history `event_kind` of clearing the review flag after a resolution.
pub const RESOLVE_KIND: &str = "COMMAND_RESOLVE_MANUAL_REVIEW";

/// How approving ended inside the transaction.
enum Approval {
    /// Commit, then answer with the proposal.
    Commit(Result<(), ReviewError>),
    /// Roll back and answer at once (nothing to record).
    Abort(Result<(), ReviewError>),
    /// A CAS race: roll back and take the decision again.
    Retry,
}

impl Store {
    /// A second operator approves a proposal: in ONE transaction the proposal
    /// is claimed (two approvals at once: one applies, the other sees it
    /// decided), checked against the payment as it is now (a payment that
    /// moved since the proposal refuses it as stale), the operator event goes
    /// through the door with evidence `operator` and both people in its
    /// history, and the payment's review flag clears. Approving again by the
    /// same approver answers the applied proposal (idempotent).
    pub async fn approve_proposal(
        &self,
        proposal_id: &str,
        approver_id: &str,
        note: Option<&str>,
    ) -> Result<Proposal, ReviewError> {
        for tries in 1..=MAX_CAS_TRIES {
            let mut tx = self.begin_write().await?;
            match self
                .approve_once(&mut tx, proposal_id, approver_id, note)
                .await?
            {
                Approval::Commit(result) => {
                    self.commit_write(tx).await?;
                    result?;
                    return Ok(self.get_proposal(proposal_id).await?);
                }
                Approval::Abort(result) => {
                    tx.rollback().await.map_err(StoreError::from)?;
                    result?;
                    return Ok(self.get_proposal(proposal_id).await?);
                }
                Approval::Retry => {
                    tx.rollback().await.map_err(StoreError::from)?;
                    cas_backoff(&self.env, tries).await;
                }
            }
        }
        Err(StoreError::CasExhausted {
            aggregate: "proposal",
            id: proposal_id.to_owned(),
            tries: MAX_CAS_TRIES,
        }
        .into())
    }

    async fn approve_once(
        &self,
        tx: &mut Conn,
        proposal_id: &str,
        approver_id: &str,
        note: Option<&str>,
    ) -> Result<Approval, StoreError> {
        let proposal = proposal_in(tx, proposal_id).await?;
        if let Some(answer) = undecidable(&proposal, approver_id) {
            return Ok(Approval::Abort(answer));
        }
        let now = self.now_ms();
        if !claim_proposal(tx, &proposal.id, approver_id, note, now).await? {
            return Ok(Approval::Retry);
        }
        let proposer = operator_name_in(tx, &proposal.proposed_by).await?;
        let approver = operator_name_in(tx, approver_id).await?;
        let provenance = Provenance {
            actor: Some(format!("operator:{proposer}+operator:{approver}")),
            trace_id: Some(proposal.id.clone()),
            ..Provenance::default()
        };
        let order = order_in(tx, &proposal.payment_id).await?;
        if let Some(moved) = moved_since(tx, &proposal, &order).await? {
            let result = serde_json::json!({ "decision": "stale", "reason": moved });
            finish_proposal(tx, &proposal.id, "stale", &result).await?;
            return Ok(Approval::Commit(Err(ReviewError::Stale(moved))));
        }
        let outcome =
            ReviewOutcome::parse(&proposal.outcome).ok_or_else(|| StoreError::Corrupt {
                table: "review_proposals",
                detail: format!("unknown outcome {:?}", proposal.outcome),
            })?;
        let resolving = Resolving {
            proposal: &proposal,
            order: &order,
            provenance: &provenance,
            now,
        };
        let (mut result, version) = match self.resolve(tx, &resolving, outcome).await? {
            Resolved::Applied { result, version } => (result, version),
            Resolved::Ended(approval) => return Ok(approval),
        };
        if order.manual_review && ends_review(tx, &order.id, outcome).await? {
            let description = format!(
                "proposal {} ({}, reason code {}) proposed by {proposer}, approved by {approver}: {}",
                proposal.id, proposal.outcome, proposal.reason_code, proposal.evidence_note
            );
            let Some(id) = resolving.clear_review(tx, version, &description).await? else {
                return Ok(Approval::Retry);
            };
            result["review_cleared_history_id"] = serde_json::json!(id);
        } else if outcome == ReviewOutcome::Dismiss {
            // Checked by `moved_since` (the flag bumps the version), kept for clarity.
            return Ok(Approval::Abort(Err(ReviewError::Stale(
                "the payment is no longer flagged for manual review".into(),
            ))));
        }
        finish_proposal(tx, &proposal.id, "applied", &result).await?;
        tracing::info!(payment_id = %order.id, proposal = %proposal.id, outcome = %proposal.outcome,
            proposer = %proposer, approver = %approver, "operator resolution applied");
        Ok(Approval::Commit(Ok(())))
    }

    /// What the approved outcome does to the payment, in this transaction.
    async fn resolve(
        &self,
        tx: &mut Conn,
        r: &Resolving<'_>,
        outcome: ReviewOutcome,
    ) -> Result<Resolved, StoreError> {
        if outcome == ReviewOutcome::ManualRefund {
            self.approve_manual_refund(tx, r).await
        } else if let Some(resolution) = outcome.fulfillment_resolution(&r.proposal.reason_code) {
            match resolution {
                Ok(resolution) => self.approve_fulfillment(tx, r, resolution).await,
                Err(refused) => Ok(Resolved::Ended(Approval::Abort(Err(refused)))),
            }
        } else if outcome == ReviewOutcome::Dismiss {
            Ok(Resolved::Applied {
                result: serde_json::json!({ "decision": "applied" }),
                version: r.order.version,
            })
        } else {
            self.approve_payment_event(tx, r, outcome).await
        }
    }

    /// A manual refund: the normal reservation (the core's refund rule, the
    /// one conditional UPDATE on the amounts), in this transaction. A refusal
    /// rolls everything back: the proposal stays proposed.
    async fn approve_manual_refund(
        &self,
        tx: &mut Conn,
        r: &Resolving<'_>,
    ) -> Result<Resolved, StoreError> {
        let proposal = r.proposal;
        let amount = proposal.amount_minor.ok_or_else(|| StoreError::Corrupt {
            table: "review_proposals",
            detail: format!("manual refund {} without an amount", proposal.id),
        })?;
        let request = RefundRequest {
            payment_id: r.order.id.clone(),
            merchant_id: None,
            amount: sluice_core::Money {
                amount_minor: amount,
                currency: r.order.amount.currency,
            },
            reason: Some(format!(
                "manual refund, {}: {}",
                proposal.reason_code, proposal.evidence_note
            )),
            // Minted: the approval is claimed once, in this transaction.
            idempotency_key: None,
        };
        match self.reserve_refund_in(tx, &request, r.provenance).await {
            Ok(reservation) => Ok(Resolved::Applied {
                result: serde_json::json!({
                    "decision": "applied",
                    "refund_id": reservation.record.id,
                    "refund_reference": reservation.record.reference,
                    "payment_version": reservation.payment_version,
                    "history_ids": [reservation.history_id],
                    "outbox_event_ids": [reservation.outbox_event_id],
                }),
                version: reservation.payment_version,
            }),
            Err(
                error @ (StoreError::InsufficientRefundable { .. }
                | StoreError::InvalidState { .. }
                | StoreError::InvalidRequest(_)),
            ) => Ok(Resolved::Ended(Approval::Abort(Err(ReviewError::Refused(
                error.to_string(),
            ))))),
            Err(error) => Err(error),
        }
    }

    /// A fulfillment resolution, through the fulfillment door.
    async fn approve_fulfillment(
        &self,
        tx: &mut Conn,
        r: &Resolving<'_>,
        resolution: sluice_core::OperatorResolution,
    ) -> Result<Resolved, StoreError> {
        let input = sluice_core::FulfillmentInput::Operator(resolution);
        let policy = *self.fulfillment_policy();
        let at = self.at(r.now);
        let step = crate::fulfillment::fulfillment_in(
            tx,
            &r.order.id,
            &input,
            r.provenance,
            &policy,
            at,
            true,
        )
        .await?;
        let Step::Done(applied) = step else {
            return Ok(Resolved::Ended(Approval::Retry));
        };
        let mut result = serde_json::json!({
            "decision": applied.decision.label(),
            "reason": applied.decision.explain(),
            "aggregate": "fulfillment",
            "from_state": applied.from_state.as_str(),
            "to_state": applied.to_state.as_str(),
            "history_ids": [applied.history_id],
            "outbox_event_ids": applied.outbox_event_ids,
        });
        if let Some(refund) = &applied.compensation_refund {
            result["refund_id"] = serde_json::json!(refund.id);
            result["refund_reference"] = serde_json::json!(refund.reference);
        }
        if !applied.decision.is_apply() {
            let refused = format!(
                "{}: {}",
                applied.decision.label(),
                applied.decision.explain()
            );
            return r.refused(tx, &result, refused).await;
        }
        let version = order_in(tx, &r.order.id).await?.version;
        result["payment_version"] = serde_json::json!(version);
        Ok(Resolved::Applied { result, version })
    }

    /// An operator event (evidence `operator`) through the payment door.
    async fn approve_payment_event(
        &self,
        tx: &mut Conn,
        r: &Resolving<'_>,
        outcome: ReviewOutcome,
    ) -> Result<Resolved, StoreError> {
        let input = operator_event(tx, r.proposal, outcome, r.provenance.clone()).await?;
        let step = in_tx(
            self.apply_event_once(Door::InTx(tx), &input, None, None)
                .await?,
        )?;
        let Step::Done(applied) = step else {
            return Ok(Resolved::Ended(Approval::Retry));
        };
        let result = serde_json::json!({
            "decision": applied.decision.as_str(),
            "reason": applied.reason,
            "aggregate": applied.aggregate.as_str(),
            "aggregate_id": applied.aggregate_id,
            "from_state": applied.from_state,
            "to_state": applied.to_state,
            "order_state": applied.order_state.as_str(),
            "payment_version": applied.payment_version,
            "history_ids": applied.history_ids,
            "outbox_event_ids": applied.outbox_event_ids,
        });
        if applied.decision != DecisionKind::Applied {
            // The door recorded the refusal in history; the flag stays.
            let refused = format!("{}: {}", applied.decision.as_str(), applied.reason);
            return r.refused(tx, &result, refused).await;
        }
        Ok(Resolved::Applied {
            result,
            version: applied.payment_version,
        })
    }
}

/// The approval of one proposal, claimed, as its steps see it.
struct Resolving<'a> {
    proposal: &'a Proposal,
    order: &'a PaymentOrder,
    provenance: &'a Provenance,
    now: i64,
}

/// How the approved outcome ended inside the transaction.
enum Resolved {
    /// Applied: the proposal's result and the payment's version after it.
    Applied {
        result: serde_json::Value,
        version: i64,
    },
    /// Refused, raced or aborted: how the approval ends.
    Ended(Approval),
}

impl Resolving<'_> {
    /// The door refused the outcome: the proposal records it, and the
    /// refusal commits with it.
    async fn refused(
        &self,
        tx: &mut Conn,
        result: &serde_json::Value,
        why: String,
    ) -> Result<Resolved, StoreError> {
        finish_proposal(tx, &self.proposal.id, "refused", result).await?;
        Ok(Resolved::Ended(Approval::Commit(Err(
            ReviewError::Refused(why),
        ))))
    }

    /// Clear the payment's review flag, with its history row. None: the
    /// payment moved since (a CAS race; the approval is taken again).
    async fn clear_review(
        &self,
        tx: &mut Conn,
        version: i64,
        description: &str,
    ) -> Result<Option<i64>, StoreError> {
        let order = self.order;
        if !clear_review_flag(tx, &order.id, version, self.now).await? {
            return Ok(None);
        }
        let state = order_in(tx, &order.id).await?.state;
        let reason = format!("manual review resolved: {description}");
        let h = NewHistory {
            payment_id: &order.id,
            aggregate_type: "order",
            aggregate_id: &order.id,
            from_state: Some(state.as_str()),
            to_state: state.as_str(),
            from_version: Some(version),
            to_version: version + 1,
            event_kind: RESOLVE_KIND,
            evidence_source: EvidenceSource::Operator.as_str(),
            decision: DecisionKind::Applied.as_str(),
            reason: &reason,
            provenance: Some(self.provenance),
            ..NewHistory::default()
        };
        Ok(Some(history::append(tx, &h, self.now).await?))
    }
}

/// Why the proposal cannot be decided by this approver, if it cannot: it
/// was decided already (by the same approver: answered as applied), or the
/// approver proposed it.
fn undecidable(proposal: &Proposal, approver_id: &str) -> Option<Result<(), ReviewError>> {
    if proposal.status != "proposed" {
        let same =
            proposal.status == "applied" && proposal.decided_by.as_deref() == Some(approver_id);
        return Some(if same {
            Ok(())
        } else {
            Err(ReviewError::AlreadyDecided {
                id: proposal.id.clone(),
                status: proposal.status.clone(),
            })
        });
    }
    (proposal.proposed_by == approver_id).then_some(Err(ReviewError::SameOperator))
}

/// Claim the proposal: the row lock (PostgreSQL) or the write lock (SQLite)
/// makes a racing approval wait, then find it decided. False: it raced.
async fn claim_proposal(
    tx: &mut Conn,
    id: &str,
    approver_id: &str,
    note: Option<&str>,
    now: i64,
) -> Result<bool, StoreError> {
    let claimed = sqlx::query(
        "UPDATE review_proposals SET decided_by = $2, decided_at = $3, decision_note = $4 \
         WHERE id = $1 AND status = 'proposed' AND decided_by IS NULL",
    )
    .bind(id)
    .bind(approver_id)
    .bind(now)
    .bind(note)
    .execute(&mut *tx)
    .await?;
    Ok(claimed.rows_affected() == 1)
}

async fn proposal_in(tx: &mut Conn, id: &str) -> Result<Proposal, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {PROPOSAL_COLS} FROM review_proposals WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| StoreError::not_found("proposal", id))?;
    proposal_from(&row)
}

async fn operator_name_in(tx: &mut Conn, id: &str) -> Result<String, StoreError> {
    let row = sqlx::query("SELECT name FROM operators WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::not_found("operator", id))?;
    Ok(row.try_get::<String, _>("name")?)
}

/// Why the proposal no longer describes the payment, if it does not.
async fn moved_since(
    tx: &mut Conn,
    proposal: &Proposal,
    order: &PaymentOrder,
) -> Result<Option<String>, StoreError> {
    if order.version != proposal.payment_version {
        return Ok(Some(format!(
            "payment {} is at version {}, the proposal saw version {}",
            order.id, order.version, proposal.payment_version
        )));
    }
    let (state, version) = match proposal.target_type.as_str() {
        "attempt" => {
            let a = attempt_in(tx, &proposal.target_id).await?;
            (a.state.as_str(), a.version)
        }
        "refund" => {
            let r = refund_in(tx, &proposal.target_id).await?;
            (r.state.as_str(), r.version)
        }
        "capture" => {
            let c = capture_in(tx, &proposal.target_id).await?;
            (c.state.as_str(), c.version)
        }
        _ => (order.state.as_str(), order.version),
    };
    if state != proposal.target_state || version != proposal.target_version {
        return Ok(Some(format!(
            "{} {} is {state} at version {version}, the proposal saw {} at version {}",
            proposal.target_type,
            proposal.target_id,
            proposal.target_state,
            proposal.target_version
        )));
    }
    Ok(None)
}

/// The controlled event an approved proposal puts through the door.
async fn operator_event(
    tx: &mut Conn,
    proposal: &Proposal,
    outcome: ReviewOutcome,
    provenance: Provenance,
) -> Result<ApplyEvent, StoreError> {
    use EventKind as K;
    let failure = || {
        Some(Failure {
            category: FailureCategory::Declined,
            code: proposal.reason_code.clone(),
            message: proposal.evidence_note.clone(),
        })
    };
    let (kind, failure) = match outcome {
        ReviewOutcome::AttemptSucceeded => (K::PaymentSucceeded, None),
        ReviewOutcome::AttemptFailed => (K::PaymentFailed, failure()),
        ReviewOutcome::AttemptCanceled => (K::PaymentCanceled, None),
        ReviewOutcome::RefundSucceeded => (K::RefundSucceeded, None),
        ReviewOutcome::RefundFailed => (K::RefundFailed, failure()),
        ReviewOutcome::CaptureSucceeded => (K::PaymentCaptured, None),
        ReviewOutcome::CaptureFailed => (K::CaptureFailed, failure()),
        ReviewOutcome::Dismiss
        | ReviewOutcome::ManualRefund
        | ReviewOutcome::FulfillmentFulfilled
        | ReviewOutcome::FulfillmentCompensate
        | ReviewOutcome::FulfillmentResume => {
            return Err(StoreError::Unapplicable(
                "a dismissal or a manual refund carries no event".into(),
            ))
        }
    };
    let mut event = PaymentEvent::new(kind, EvidenceSource::Operator);
    event.failure = failure;
    // The evidence of a success: recorded on the target by the door.
    event.psp_reference = proposal.psp_reference.clone();
    // Unique per proposal: the door's dedupe sees a re-application as a duplicate.
    event.provider_event_id = Some(format!("review:{}", proposal.id));
    event.raw_status = format!(
        "operator resolution {}: {}",
        proposal.id, proposal.reason_code
    );
    let target = match outcome.target_kind() {
        Some(PendingKind::Attempt) => {
            let reference = attempt_in(tx, &proposal.target_id).await?.reference;
            event.attempt_reference = Some(reference.clone());
            EventTarget::Attempt(reference)
        }
        Some(PendingKind::Refund) => {
            let reference = refund_in(tx, &proposal.target_id).await?.reference;
            event.action_reference = Some(reference.clone());
            EventTarget::Refund(reference)
        }
        Some(PendingKind::Capture) => {
            let reference = capture_in(tx, &proposal.target_id).await?.reference;
            event.action_reference = Some(reference.clone());
            EventTarget::Capture(reference)
        }
        None => {
            return Err(StoreError::Unapplicable(
                "a dismissal carries no event".into(),
            ))
        }
    };
    Ok(ApplyEvent {
        target,
        event,
        provenance,
        inbox_id: None,
        next_retry_time: None,
    })
}

/// Whether approving `outcome` ends the payment's manual review. What raises
/// the flag: an attempt, capture or refund still open past its age
/// ([`Store::flag_manual_review`]), contradicting evidence from the door, a
/// reconciliation difference ([`Store::flag_reconciliation_review`]). A
/// manual refund or a fulfillment resolution answers none of them, so it
/// never ends the review (it once did, whatever had raised the flag). A
/// resolution of an attempt, capture or refund ends it only when no other of
/// the payment's attempts, captures and refunds is still open (an
/// authorization waiting for its capture aside): an open one may be why the
/// payment was flagged. A dismissal ends it: the operators found nothing to do.
async fn ends_review(
    tx: &mut Conn,
    payment_id: &str,
    outcome: ReviewOutcome,
) -> Result<bool, StoreError> {
    if outcome == ReviewOutcome::Dismiss {
        return Ok(true);
    }
    if outcome == ReviewOutcome::ManualRefund || outcome.fulfillment_resolution("").is_some() {
        return Ok(false);
    }
    let open: i64 = sqlx::query_scalar(
        "SELECT (SELECT COUNT(*) FROM payment_attempts WHERE payment_id = $1 \
                   AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED', 'AUTHORIZED')) \
              + (SELECT COUNT(*) FROM captures WHERE payment_id = $1 \
                   AND state NOT IN ('SUCCEEDED', 'FAILED')) \
              + (SELECT COUNT(*) FROM refunds WHERE payment_id = $1 \
                   AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED'))",
    )
    .bind(payment_id)
    .fetch_one(&mut *tx)
    .await?;
    Ok(open == 0)
}

async fn clear_review_flag(
    tx: &mut Conn,
    payment_id: &str,
    version: i64,
    now: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE payment_orders SET manual_review = 0, manual_review_reason = NULL, \
            version = version + 1, updated_at = $3 WHERE id = $1 AND version = $2",
    )
    .bind(payment_id)
    .bind(version)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

async fn finish_proposal(
    tx: &mut Conn,
    id: &str,
    status: &str,
    result: &serde_json::Value,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE review_proposals SET status = $2, result_json = $3 WHERE id = $1")
        .bind(id)
        .bind(status)
        .bind(result.to_string())
        .execute(&mut *tx)
        .await?;
    Ok(())
}
