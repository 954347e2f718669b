//! Two operators resolving payments in manual review, racing the workload,
//! recovery and webhooks through the real two-person rule of the store.
//!
//! The proposer reads the PSP's record of the open item, as a person reads
//! the PSP's dashboard, and proposes what it shows; the approver, a step or
//! more later, reads it again and approves only the same conclusion (else
//! rejects). What is under test is the system's side: a proposal the payment
//! moved past is refused as stale, the same person cannot decide their own
//! proposal, an approved outcome goes through the door once, and afterwards
//! our records still agree with the PSP's ledger (the convergence check).
//!
//! Besides the open items, the operators issue manual refunds
//! (`manual_refund.rs`) and resolve fulfillments frozen in `manual_review`
//! from the merchant's own truth (`review_fulfillment.rs`).

use std::collections::BTreeMap;

use sluice_sandbox_psp::{PayStatus, Refund, RefundStatus};
use sluice_store::review::{NewProposal, Proposal, ReviewError, ReviewOutcome};
use sluice_store::PaymentDetails;

use crate::world::{SimPayment, World};
use crate::SimError;

/// The two people (names; their ids are minted by the store).
pub const OPERATORS: [&str; 2] = ["operator-ana", "operator-ben"];

/// A proposal waiting for the second operator.
#[derive(Debug, Clone)]
pub struct PendingProposal {
    pub id: String,
    pub payment: SimPayment,
    pub conclusion: Conclusion,
    /// The payment's version the store recorded with the proposal: an
    /// approval of a payment that moved since must be refused as stale.
    pub payment_version: i64,
}

/// What the PSP's record says should be true of the payment's open item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conclusion {
    pub outcome: ReviewOutcome,
    pub target_id: Option<String>,
    pub psp_reference: Option<String>,
    /// `psp_dashboard` for the open items; the compensation reason of a
    /// fulfillment compensation; why a manual refund is issued.
    pub reason_code: &'static str,
    /// For a manual refund: the amount.
    pub amount: Option<i64>,
}

/// The reason code of a conclusion read on the PSP's record.
const PSP_DASHBOARD: &str = "psp_dashboard";

/// How often an operator step issues a manual refund instead of working the
/// review queue (per mille).
const MANUAL_REFUND_PER_MILLE: u64 = 300;

/// How many seeds of a thousand end with the operators issuing a manual
/// refund after convergence (each costs a second convergence).
const MANUAL_REFUND_AFTER_CONVERGENCE_PER_MILLE: u64 = 300;

impl World {
    /// An operator step: decide a waiting proposal, or propose for a payment
    /// in manual review.
    pub async fn review(&mut self) -> Result<(), SimError> {
        if !self.proposals.is_empty() && self.rng.chance(500) {
            let index = self.rng.below(self.proposals.len() as u64) as usize;
            let pending = self.proposals.remove(index);
            return self.decide(pending).await;
        }
        if self.rng.chance(MANUAL_REFUND_PER_MILLE) {
            return self.propose_manual_refund().await;
        }
        self.propose().await
    }

    /// Once faults stopped: every waiting proposal decided, then every
    /// payment still in review proposed for and decided at once, and now
    /// and then a manual refund proposed and decided (with nothing else
    /// moving, its approval meets no stale check: the amount decides). False
    /// when there was nothing to do (most seeds).
    pub async fn operators_turn(&mut self) -> Result<bool, SimError> {
        let flagged = self.flagged().await?;
        let refund = self.rng.chance(MANUAL_REFUND_AFTER_CONVERGENCE_PER_MILLE);
        if flagged.is_empty() && self.proposals.is_empty() && !refund {
            return Ok(false);
        }
        self.trace.line("operators: review what automation left");
        for pending in std::mem::take(&mut self.proposals) {
            self.decide(pending).await?;
        }
        for (payment, d) in flagged {
            self.propose_for(payment, &d).await?;
        }
        if refund {
            self.propose_manual_refund().await?;
        }
        for pending in std::mem::take(&mut self.proposals) {
            self.decide(pending).await?;
        }
        Ok(true)
    }

    /// The payments in manual review (the payment flagged, or its
    /// fulfillment frozen), with their details.
    async fn flagged(&mut self) -> Result<Vec<(SimPayment, PaymentDetails)>, SimError> {
        let versions = self.versions().await?;
        let mut flagged = Vec::new();
        for payment in self.payments.clone() {
            let d = self.details(&payment.payment_id, &versions).await?;
            if d.order.manual_review || crate::review_fulfillment::frozen(&d) {
                flagged.push((payment, d));
            }
        }
        Ok(flagged)
    }

    async fn propose(&mut self) -> Result<(), SimError> {
        let flagged = self.flagged().await?;
        let Some((payment, d)) = self.rng.pick(&flagged).cloned() else {
            return Ok(());
        };
        self.propose_for(payment, &d).await
    }

    async fn propose_for(
        &mut self,
        payment: SimPayment,
        d: &PaymentDetails,
    ) -> Result<(), SimError> {
        let Some(conclusion) = self.conclude(&payment, d) else {
            self.trace.line(format!(
                "step review {}: the PSP's record decides nothing yet",
                payment.name
            ));
            return Ok(());
        };
        self.submit(payment, conclusion).await
    }

    /// What an operator concludes for a payment in review: the payment's
    /// open item from the PSP's record first; else, for a frozen
    /// fulfillment, the merchant's own truth.
    fn conclude(&self, payment: &SimPayment, d: &PaymentDetails) -> Option<Conclusion> {
        let open_item = d.order.manual_review.then(|| self.conclusion(d)).flatten();
        open_item.or_else(|| self.fulfillment_conclusion(payment, d))
    }

    /// The first operator records the proposal.
    pub(crate) async fn submit(
        &mut self,
        payment: SimPayment,
        conclusion: Conclusion,
    ) -> Result<(), SimError> {
        let new = NewProposal {
            payment_id: payment.payment_id.clone(),
            outcome: conclusion.outcome,
            target_id: conclusion.target_id.clone(),
            reason_code: conclusion.reason_code.into(),
            evidence_note: "read on the PSP's own record".into(),
            amount_minor: conclusion.amount,
            psp_reference: conclusion.psp_reference.clone(),
            proposed_by: self.operators[0].clone(),
        };
        let store = self.gw.store.clone();
        let Some(made) = self.guarded(store.create_proposal(&new)).await? else {
            self.trace
                .line(format!("step review {} propose -> killed", payment.name));
            return Ok(());
        };
        let line = match made {
            Ok(proposal) => {
                self.proposals.push(PendingProposal {
                    id: proposal.id,
                    payment: payment.clone(),
                    conclusion: conclusion.clone(),
                    payment_version: proposal.payment_version,
                });
                "proposed".to_owned()
            }
            Err(error) => review_error(&error),
        };
        self.trace.line(format!(
            "step review {} propose {}{} -> {line}",
            payment.name,
            conclusion.outcome.as_str(),
            detail(&conclusion)
        ));
        Ok(())
    }

    /// The second operator reads the PSP's record (or the merchant's truth)
    /// again: the same conclusion is approved, anything else rejected. What
    /// an approval must have done is checked at once.
    async fn decide(&mut self, pending: PendingProposal) -> Result<(), SimError> {
        let d = self
            .gw
            .store
            .payment_details(None, &pending.payment.payment_id)
            .await?;
        let approver = self.operators[1].clone();
        let agrees = self.still_holds(&pending, &d);
        if agrees && self.rng.chance(200) {
            self.try_self_approval(&pending).await?;
        }
        // A handle taken now: a kill above would have restarted the gateway.
        let store = self.gw.store.clone();
        let decided = if agrees {
            self.guarded(store.approve_proposal(&pending.id, &approver, None))
                .await?
        } else {
            let note = "the PSP's record no longer shows this";
            self.guarded(store.reject_proposal(&pending.id, &approver, note))
                .await?
        };
        let line = match &decided {
            None => "killed".to_owned(),
            Some(Ok(proposal)) => proposal.status.clone(),
            Some(Err(error)) => review_error(error),
        };
        self.trace.line(format!(
            "step review {} {} {}{} -> {line}",
            pending.payment.name,
            if agrees { "approve" } else { "reject" },
            pending.conclusion.outcome.as_str(),
            detail(&pending.conclusion)
        ));
        if !agrees {
            return Ok(());
        }
        self.check_flag_kept(&pending, &d, &decided).await?;
        match pending.conclusion.outcome {
            ReviewOutcome::ManualRefund => self.after_manual_refund(&pending, &d, decided).await,
            o if o.fulfillment_resolution("").is_some() => {
                self.after_fulfillment_resolution(&pending, &d, decided)
                    .await
            }
            _ => Ok(()),
        }
    }

    /// An approved manual refund or fulfillment resolution answers nothing
    /// that flags a payment for review (an attempt, capture or refund open
    /// too long, contradicting evidence, a reconciliation difference): a
    /// payment flagged before it is flagged after it, for the same reason.
    async fn check_flag_kept(
        &mut self,
        pending: &PendingProposal,
        before: &PaymentDetails,
        decided: &Option<Result<Proposal, ReviewError>>,
    ) -> Result<(), SimError> {
        let outcome = pending.conclusion.outcome;
        let beside_the_flag =
            outcome == ReviewOutcome::ManualRefund || outcome.fulfillment_resolution("").is_some();
        let applied = matches!(decided, Some(Ok(p)) if p.status == "applied");
        if !(beside_the_flag && applied && before.order.manual_review) {
            return Ok(());
        }
        let after = self
            .gw
            .store
            .get_payment(None, &pending.payment.payment_id)
            .await?;
        // The reason names store ids, which stay out of the trace.
        if !after.manual_review || after.manual_review_reason != before.order.manual_review_reason {
            self.violation(format!(
                "{}: an approved {} cleared the review flag raised for something else",
                pending.payment.name,
                outcome.as_str(),
            ));
        }
        Ok(())
    }

    /// Whether the approver, reading again now, reaches the proposer's
    /// conclusion. A manual refund's story holds while the payment is
    /// succeeded: whether the amount is still refundable is the store's
    /// check, which is what is under test.
    fn still_holds(&self, pending: &PendingProposal, d: &PaymentDetails) -> bool {
        match pending.conclusion.outcome {
            ReviewOutcome::ManualRefund => d.order.state == sluice_core::OrderState::Succeeded,
            _ => self.conclude(&pending.payment, d).as_ref() == Some(&pending.conclusion),
        }
    }

    /// The proposer tries to approve their own proposal: it must be refused
    /// as such.
    async fn try_self_approval(&mut self, pending: &PendingProposal) -> Result<(), SimError> {
        let store = self.gw.store.clone();
        let proposer = self.operators[0].clone();
        let own = store.approve_proposal(&pending.id, &proposer, None);
        if let Some(outcome) = self.guarded(own).await? {
            let line = match outcome {
                Err(ReviewError::SameOperator) => "refused: same operator".to_owned(),
                // The schema's CHECK would still stop it, but the door
                // must refuse first, typed, as the API's 403.
                Ok(proposal) => {
                    let what = format!("approved by its proposer: {}", proposal.status);
                    self.violation(format!("{}: {what}", pending.payment.name));
                    what
                }
                Err(error) => {
                    let what = review_error(&error);
                    self.violation(format!(
                        "{}: a self-approval was not refused as such: {what}",
                        pending.payment.name
                    ));
                    what
                }
            };
            self.trace.line(format!(
                "step review {} self-approve {} -> {line}",
                pending.payment.name,
                pending.conclusion.outcome.as_str()
            ));
        }
        Ok(())
    }

    /// The two-person rule, from the stored proposals: none was applied by
    /// the person who proposed it.
    pub async fn self_approved(&self) -> Result<Vec<String>, SimError> {
        let (count,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM review_proposals \
             WHERE status = 'applied' AND decided_by = proposed_by",
        )
        .fetch_one(self.gw.store.pool())
        .await?;
        Ok((count > 0)
            .then(|| format!("{count} proposals applied by the operator who proposed them"))
            .into_iter()
            .collect())
    }

    fn conclusion(&self, d: &PaymentDetails) -> Option<Conclusion> {
        let psp: BTreeMap<String, sluice_sandbox_psp::Payment> = self
            .sandbox
            .payments()
            .into_iter()
            .map(|p| (p.reference.clone(), p))
            .collect();
        conclusion(d, &psp, &self.sandbox.refunds())
    }
}

/// What a careful operator concludes from the PSP's record: the first open
/// refund's or attempt's outcome as the PSP has it; with nothing open, a
/// dismissal only when our amounts already agree with the PSP's; None when
/// the PSP's record is itself still moving (the operator waits).
fn conclusion(
    d: &PaymentDetails,
    psp: &BTreeMap<String, sluice_sandbox_psp::Payment>,
    psp_refunds: &[Refund],
) -> Option<Conclusion> {
    if let Some(refund) = d.refunds.iter().find(|r| !r.state.is_terminal()) {
        let theirs = psp_refunds
            .iter()
            .find(|x| x.reference.as_deref() == Some(refund.reference.as_str()));
        let (outcome, psp_reference) = match theirs.map(|x| (x.status, x.id.clone())) {
            Some((RefundStatus::Succeeded, id)) => (ReviewOutcome::RefundSucceeded, Some(id)),
            Some((RefundStatus::Failed, _)) | None => (ReviewOutcome::RefundFailed, None),
            Some((RefundStatus::Pending, _)) => return None,
        };
        return Some(Conclusion {
            outcome,
            target_id: Some(refund.id.clone()),
            psp_reference,
            reason_code: PSP_DASHBOARD,
            amount: None,
        });
    }
    if d.captures.iter().any(|c| !c.state.is_terminal()) {
        return None;
    }
    if let Some(attempt) = d.attempts.iter().find(|a| !a.state.is_terminal()) {
        let theirs = psp.get(&attempt.reference);
        let (outcome, psp_reference) = match theirs.map(|p| (p.status, p.id.clone())) {
            Some((PayStatus::Succeeded, id)) => (ReviewOutcome::AttemptSucceeded, Some(id)),
            Some((PayStatus::Failed | PayStatus::Canceled, _)) | None => {
                (ReviewOutcome::AttemptFailed, None)
            }
            Some(_) => return None,
        };
        return Some(Conclusion {
            outcome,
            target_id: Some(attempt.id.clone()),
            psp_reference,
            reason_code: PSP_DASHBOARD,
            amount: None,
        });
    }
    let agrees = crate::check::ledger_disagreements("-", d, psp, psp_refunds).is_empty();
    agrees.then_some(Conclusion {
        outcome: ReviewOutcome::Dismiss,
        target_id: None,
        psp_reference: None,
        reason_code: PSP_DASHBOARD,
        amount: None,
    })
}

/// The trace's words for a conclusion's reason code and amount (none for
/// what was read on the PSP's record, so those lines read as before).
fn detail(conclusion: &Conclusion) -> String {
    let mut text = String::new();
    if conclusion.reason_code != PSP_DASHBOARD {
        text.push_str(&format!(" ({})", conclusion.reason_code));
    }
    if let Some(amount) = conclusion.amount {
        text.push_str(&format!(" {amount}"));
    }
    text
}

pub(crate) fn review_error(error: &ReviewError) -> String {
    match error {
        ReviewError::SameOperator => "refused: same operator".into(),
        ReviewError::AlreadyDecided { status, .. } => format!("already {status}"),
        ReviewError::Stale(_) => "stale".into(),
        ReviewError::NotApplicable(_) => "not applicable".into(),
        ReviewError::Refused(_) => "refused by the door".into(),
        // Its text names rows by their minted ids, which the trace must not.
        ReviewError::Store(_) => "store error".into(),
    }
}
