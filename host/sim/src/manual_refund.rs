//! Operators' manual refunds (`ReviewOutcome::ManualRefund`): a refund no
//! automation would issue, proposed by one operator and approved by a
//! second; approval reserves it through the normal refund reservation in its
//! own transaction, and the refund is then sent like any other (as the admin
//! API does, `Trigger::Operator`).
//!
//! What a person does here: re-issue a refund the merchant asked for that the
//! PSP failed definitively (`refund_reissue`, the amount the PSP failed), or
//! refund a customer who complained (`customer_complaint`), usually within
//! what the PSP still holds, sometimes more than is left (the customer asked
//! for everything): that one must be refused cleanly, nothing changed. A
//! payment whose goal was granted may be refunded this way: seed 000 forbids
//! refunds by *automation* once the business succeeded and sends after-sales
//! refunds through their own flow with review rules, which this is.
//!
//! The rules checked (`manual_refund_violations` and at the approval):
//! - an approval of an amount beyond what our records leave refundable is
//!   refused as such (`ReviewError::Refused`), and nothing changed: the
//!   payment's version, amounts and refunds are as before, the proposal
//!   still `proposed`; one within it is applied;
//! - an applied manual refund has its one refund row, of its amount, never a
//!   compensation refund; the PSP made at most one refund under its
//!   reference, and after convergence exactly the one we recorded (one
//!   succeeded of the amount, or none succeeded for a failed one);
//! - a refund the store records as manual was approved by the operators.
//!
//! The merchant's-intent bounds (`check.rs`, `fulfillment_check.rs`) count
//! an applied manual refund as asked for: by the operators, not automation.

use std::collections::{BTreeMap, BTreeSet};

use sluice_core::{OrderState, RefundState};
use sluice_orchestrator::{Target, Trigger};
use sluice_sandbox_psp::RefundStatus;
use sluice_store::review::{Proposal, ReviewError, ReviewOutcome};
use sluice_store::PaymentDetails;

use crate::review::{review_error, Conclusion, PendingProposal};
use crate::world::{SimPayment, World};
use crate::SimError;

/// Re-issuing a merchant's refund the PSP failed definitively.
const REISSUE: &str = "refund_reissue";
/// A goodwill refund after a customer's complaint.
const COMPLAINT: &str = "customer_complaint";
/// How the store words a manual refund's reason (`door/operator.rs`).
const MANUAL_REASON_PREFIX: &str = "manual refund, ";

/// A manual refund the operators approved, as the world learned it.
#[derive(Debug, Clone)]
pub struct ApprovedManualRefund {
    pub payment: String,
    pub payment_id: String,
    pub refund_id: String,
    pub amount: i64,
}

impl World {
    /// An operator issues a manual refund for a succeeded payment: a re-issue
    /// when the PSP failed one of its refunds, else a complaint's.
    pub(crate) async fn propose_manual_refund(&mut self) -> Result<(), SimError> {
        let versions = self.versions().await?;
        let mut succeeded = Vec::new();
        for payment in self.payments.clone() {
            let d = self.details(&payment.payment_id, &versions).await?;
            if d.order.state == OrderState::Succeeded {
                succeeded.push((payment, d));
            }
        }
        let reissues: Vec<(SimPayment, i64)> = succeeded
            .iter()
            .filter(|(p, _)| !self.has_manual_refund(&p.payment_id))
            .filter_map(|(p, d)| Some((p.clone(), self.failed_at_psp(d)?)))
            .collect();
        let (payment, reason_code, amount) = match self.rng.pick(&reissues).cloned() {
            Some((payment, amount)) => (payment, REISSUE, amount),
            None => {
                let Some((payment, d)) = self.rng.pick(&succeeded).cloned() else {
                    return Ok(());
                };
                let left = self.psp_refundable(&d);
                let amount = match left > 0 && self.rng.chance(700) {
                    true => self.rng.between(1, left),
                    false => left + self.rng.between(1, 2_000),
                };
                (payment, COMPLAINT, amount)
            }
        };
        let conclusion = Conclusion {
            outcome: ReviewOutcome::ManualRefund,
            target_id: None,
            psp_reference: None,
            reason_code,
            amount: Some(amount),
        };
        self.submit(payment, conclusion).await
    }

    /// A manual refund applied or waiting for the second operator.
    fn has_manual_refund(&self, payment_id: &str) -> bool {
        let manual = |p: &PendingProposal| {
            p.payment.payment_id == payment_id
                && p.conclusion.outcome == ReviewOutcome::ManualRefund
        };
        self.proposals.iter().any(manual)
            || self
                .manual_refunds
                .iter()
                .any(|m| m.payment_id == payment_id)
    }

    /// The amount of a refund of ours the PSP failed definitively.
    fn failed_at_psp(&self, d: &PaymentDetails) -> Option<i64> {
        let failed: BTreeSet<String> = self
            .sandbox
            .refunds()
            .into_iter()
            .filter(|r| r.status == RefundStatus::Failed)
            .filter_map(|r| r.reference)
            .collect();
        d.refunds
            .iter()
            .find(|r| r.state == RefundState::Failed && failed.contains(&r.reference))
            .map(|r| r.amount.amount_minor)
    }

    /// What the PSP still holds of the payment: taken, less refunded and
    /// pending refunds.
    fn psp_refundable(&self, d: &PaymentDetails) -> i64 {
        let references: BTreeSet<&str> = d.attempts.iter().map(|a| a.reference.as_str()).collect();
        self.sandbox
            .payments()
            .iter()
            .filter(|p| references.contains(p.reference.as_str()))
            .map(|p| p.amount_received - p.amount_refunded - p.amount_refund_pending)
            .sum()
    }

    /// What the approval of a manual refund did, against what it must have
    /// done given the payment as read just before (`before`).
    pub(crate) async fn after_manual_refund(
        &mut self,
        pending: &PendingProposal,
        before: &PaymentDetails,
        decided: Option<Result<Proposal, ReviewError>>,
    ) -> Result<(), SimError> {
        let amount = pending.conclusion.amount.unwrap_or_default();
        let a = &before.amounts;
        let refundable = a.captured_minor - a.refunded_minor - a.refund_reserved_minor;
        // Not moved since the proposal: the approval is not stale, and the
        // amount decides alone.
        let fresh = before.order.version == pending.payment_version;
        let beyond = amount > refundable;
        let name = pending.payment.name.clone();
        match decided {
            None => self.learn_after_kill(pending).await,
            Some(Ok(proposal)) => {
                if fresh && beyond {
                    self.violation(format!(
                        "{name}: a manual refund of {amount} was approved with only {refundable} refundable"
                    ));
                }
                self.record_manual_refund(pending, &proposal);
                self.send_manual_refund(&name, &proposal).await
            }
            Some(Err(ReviewError::Refused(_))) => {
                if fresh && !beyond {
                    self.violation(format!(
                        "{name}: a manual refund of {amount} within the {refundable} refundable was refused"
                    ));
                }
                self.refused_changed_nothing(pending, before).await
            }
            Some(Err(error)) => {
                if fresh && beyond {
                    self.violation(format!(
                        "{name}: a manual refund of {amount} beyond the {refundable} refundable was not refused as such: {}",
                        review_error(&error)
                    ));
                }
                Ok(())
            }
        }
    }

    /// The approval's answer was lost with the process: what the store
    /// recorded is what happened.
    async fn learn_after_kill(&mut self, pending: &PendingProposal) -> Result<(), SimError> {
        let proposal = self.gw.store.get_proposal(&pending.id).await?;
        self.trace.line(format!(
            "step review {} manual refund after the kill: {}",
            pending.payment.name, proposal.status
        ));
        if proposal.status == "applied" {
            self.record_manual_refund(pending, &proposal);
        }
        Ok(())
    }

    fn record_manual_refund(&mut self, pending: &PendingProposal, proposal: &Proposal) {
        let Some(refund_id) = applied_refund_id(proposal) else {
            self.violation(format!(
                "{}: an applied manual refund names no refund",
                pending.payment.name
            ));
            return;
        };
        self.manual_refunds.push(ApprovedManualRefund {
            payment: pending.payment.name.clone(),
            payment_id: pending.payment.payment_id.clone(),
            refund_id,
            amount: pending.conclusion.amount.unwrap_or_default(),
        });
    }

    /// Sent at once, as the admin API sends it after the approval; a kill
    /// here leaves it to recovery (it is in the scan set from its creation).
    async fn send_manual_refund(
        &mut self,
        name: &str,
        proposal: &Proposal,
    ) -> Result<(), SimError> {
        match applied_refund_id(proposal) {
            Some(refund_id) => {
                self.send_operator_refund(name, "manual refund", refund_id)
                    .await
            }
            None => Ok(()),
        }
    }

    /// The refund an approval reserved, sent through `advance` with the
    /// operator as trigger.
    pub(crate) async fn send_operator_refund(
        &mut self,
        name: &str,
        what: &str,
        refund_id: String,
    ) -> Result<(), SimError> {
        let orch = self.gw.orch.clone();
        let sent = self
            .guarded(orch.advance(Target::Refund(refund_id), Trigger::Operator))
            .await?;
        let line = match sent {
            None => "killed".to_owned(),
            Some(Ok(advanced)) => advanced.state_after,
            Some(Err(error)) => crate::ops::error_label(&error),
        };
        self.trace
            .line(format!("step review {name} send {what} -> {line}"));
        Ok(())
    }

    /// A refused manual refund left the payment as it was and the proposal
    /// undecided; the approver then rejects it.
    async fn refused_changed_nothing(
        &mut self,
        pending: &PendingProposal,
        before: &PaymentDetails,
    ) -> Result<(), SimError> {
        let name = &pending.payment.name;
        let store = self.gw.store.clone();
        let after = store
            .payment_details(None, &pending.payment.payment_id)
            .await?;
        let proposal = store.get_proposal(&pending.id).await?;
        let mut found = Vec::new();
        if after.order.version != before.order.version
            || after.amounts != before.amounts
            || after.refunds.len() != before.refunds.len()
        {
            found.push(format!(
                "{name}: a refused manual refund changed the payment (version {} -> {}, amounts {:?} -> {:?}, {} -> {} refunds)",
                before.order.version, after.order.version, before.amounts, after.amounts,
                before.refunds.len(), after.refunds.len()
            ));
        }
        if proposal.status != "proposed" {
            found.push(format!(
                "{name}: a refused manual refund's proposal is {}, not still proposed",
                proposal.status
            ));
        }
        for what in found {
            self.violation(what);
        }
        let note = "refused: more than the payment has left to refund";
        let approver = self.operators[1].clone();
        let rejected = self
            .guarded(store.reject_proposal(&pending.id, &approver, note))
            .await?;
        let line = match rejected {
            None => "killed".to_owned(),
            Some(Ok(proposal)) => proposal.status,
            Some(Err(error)) => review_error(&error),
        };
        self.trace.line(format!(
            "step review {name} reject refused manual refund -> {line}"
        ));
        Ok(())
    }

    /// The payment's applied manual refunds: their refund ids and their sum.
    pub fn manual_refunds_of(&self, payment_id: &str) -> (BTreeSet<&str>, i64) {
        let mine = self
            .manual_refunds
            .iter()
            .filter(|m| m.payment_id == payment_id);
        let ids = mine.clone().map(|m| m.refund_id.as_str()).collect();
        (ids, mine.map(|m| m.amount).sum())
    }

    /// The manual-refund rules over every payment's details.
    pub fn manual_refund_violations(
        &self,
        all: &[(SimPayment, PaymentDetails)],
        converged: bool,
    ) -> Vec<String> {
        let mut psp: BTreeMap<String, Vec<(RefundStatus, i64)>> = BTreeMap::new();
        for refund in self.sandbox.refunds() {
            if let Some(reference) = refund.reference {
                psp.entry(reference)
                    .or_default()
                    .push((refund.status, refund.amount));
            }
        }
        let mut found = Vec::new();
        for (payment, d) in all {
            let (approved, _) = self.manual_refunds_of(&payment.payment_id);
            for r in &d.refunds {
                let manual = r
                    .reason
                    .as_deref()
                    .is_some_and(|x| x.starts_with(MANUAL_REASON_PREFIX));
                if manual && !approved.contains(r.id.as_str()) {
                    found.push(format!(
                        "{}: a manual refund of {} no approval of the operators made",
                        payment.name, r.amount.amount_minor
                    ));
                }
            }
        }
        for m in &self.manual_refunds {
            let Some((_, d)) = all.iter().find(|(p, _)| p.payment_id == m.payment_id) else {
                continue;
            };
            found.extend(approved_violations(m, d, &psp, converged));
        }
        found
    }
}

/// One applied manual refund: its row, and the PSP's refunds under its
/// reference.
fn approved_violations(
    m: &ApprovedManualRefund,
    d: &PaymentDetails,
    psp: &BTreeMap<String, Vec<(RefundStatus, i64)>>,
    converged: bool,
) -> Vec<String> {
    let name = &m.payment;
    let Some(ours) = d.refunds.iter().find(|r| r.id == m.refund_id) else {
        return vec![format!(
            "{name}: an approved manual refund of {} has no refund row",
            m.amount
        )];
    };
    let mut found = Vec::new();
    if ours.amount.amount_minor != m.amount {
        found.push(format!(
            "{name}: an approved manual refund of {} was reserved as {}",
            m.amount, ours.amount.amount_minor
        ));
    }
    let compensation = crate::fulfillment_check::compensation_refunds(d);
    if compensation.iter().any(|r| r.id == ours.id) {
        found.push(format!(
            "{name}: an approved manual refund is a compensation refund"
        ));
    }
    let at_psp = psp.get(&ours.reference).map_or(&[][..], Vec::as_slice);
    if at_psp.len() > 1 {
        found.push(format!(
            "{name}: an approved manual refund was sent {} times to the PSP",
            at_psp.len()
        ));
    }
    if converged && !d.order.manual_review {
        let succeeded: Vec<i64> = at_psp
            .iter()
            .filter(|(status, _)| *status == RefundStatus::Succeeded)
            .map(|(_, amount)| *amount)
            .collect();
        let expected: Vec<i64> = match ours.state {
            RefundState::Succeeded => vec![m.amount],
            _ => Vec::new(),
        };
        if succeeded != expected {
            found.push(format!(
                "{name}: an approved manual refund is {} here, the PSP refunded {succeeded:?} under its reference",
                ours.state.as_str()
            ));
        }
    }
    found
}

/// The refund an applied manual refund or compensation reserved.
pub(crate) fn applied_refund_id(proposal: &Proposal) -> Option<String> {
    let id = proposal.result.as_ref()?.get("refund_id")?.as_str()?;
    Some(id.to_owned())
}
