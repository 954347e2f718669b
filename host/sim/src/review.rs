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

use std::collections::BTreeMap;

use sluice_sandbox_psp::{PayStatus, Refund, RefundStatus};
use sluice_store::review::{NewProposal, ReviewError, ReviewOutcome};
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
}

/// What the PSP's record says should be true of the payment's open item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conclusion {
    pub outcome: ReviewOutcome,
    pub target_id: Option<String>,
    pub psp_reference: Option<String>,
}

impl World {
    /// An operator step: decide a waiting proposal, or propose for a payment
    /// in manual review.
    pub async fn review(&mut self) -> Result<(), SimError> {
        if !self.proposals.is_empty() && self.rng.chance(500) {
            let index = self.rng.below(self.proposals.len() as u64) as usize;
            let pending = self.proposals.remove(index);
            return self.decide(pending).await;
        }
        self.propose().await
    }

    /// Once faults stopped: every waiting proposal decided, then every
    /// payment still in review proposed for and decided at once. False when
    /// there was nothing to review (most seeds).
    pub async fn operators_turn(&mut self) -> Result<bool, SimError> {
        let flagged = self.flagged().await?;
        if flagged.is_empty() && self.proposals.is_empty() {
            return Ok(false);
        }
        self.trace.line("operators: review what automation left");
        for pending in std::mem::take(&mut self.proposals) {
            self.decide(pending).await?;
        }
        for (payment, d) in flagged {
            self.propose_for(payment, &d).await?;
        }
        for pending in std::mem::take(&mut self.proposals) {
            self.decide(pending).await?;
        }
        Ok(true)
    }

    /// The payments in manual review, with their details.
    async fn flagged(&mut self) -> Result<Vec<(SimPayment, PaymentDetails)>, SimError> {
        let versions = self.versions().await?;
        let mut flagged = Vec::new();
        for payment in self.payments.clone() {
            let d = self.details(&payment.payment_id, &versions).await?;
            if d.order.manual_review {
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
        let Some(conclusion) = self.conclusion(d) else {
            self.trace.line(format!(
                "step review {}: the PSP's record decides nothing yet",
                payment.name
            ));
            return Ok(());
        };
        let new = NewProposal {
            payment_id: payment.payment_id.clone(),
            outcome: conclusion.outcome,
            target_id: conclusion.target_id.clone(),
            reason_code: "psp_dashboard".into(),
            evidence_note: "read on the PSP's own record".into(),
            amount_minor: None,
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
                });
                "proposed".to_owned()
            }
            Err(error) => review_error(&error),
        };
        self.trace.line(format!(
            "step review {} propose {} -> {line}",
            payment.name,
            conclusion.outcome.as_str()
        ));
        Ok(())
    }

    /// The second operator reads the PSP's record again: the same conclusion
    /// is approved, anything else rejected.
    async fn decide(&mut self, pending: PendingProposal) -> Result<(), SimError> {
        let d = self
            .gw
            .store
            .payment_details(None, &pending.payment.payment_id)
            .await?;
        let approver = self.operators[1].clone();
        let agrees = self.conclusion(&d).as_ref() == Some(&pending.conclusion);
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
        let line = match decided {
            None => "killed".to_owned(),
            Some(Ok(proposal)) => proposal.status,
            Some(Err(error)) => review_error(&error),
        };
        self.trace.line(format!(
            "step review {} {} {} -> {line}",
            pending.payment.name,
            if agrees { "approve" } else { "reject" },
            pending.conclusion.outcome.as_str()
        ));
        Ok(())
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
        });
    }
    let agrees = crate::check::ledger_disagreements("-", d, psp, psp_refunds).is_empty();
    agrees.then_some(Conclusion {
        outcome: ReviewOutcome::Dismiss,
        target_id: None,
        psp_reference: None,
    })
}

fn review_error(error: &ReviewError) -> String {
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
