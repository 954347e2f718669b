//! Operators resolving a fulfillment frozen in `manual_review`
//! (`fulfillment_fulfilled`, `fulfillment_compensate`, `fulfillment_resume`)
//! from the merchant's own truth, which the simulator has: what the
//! business granted and to which attempt (pull), whether the merchant's
//! confirmation was accepted (push, the merchant grants only then).
//!
//! - granted to this payment: `fulfillment_fulfilled`;
//! - granted to another payment of the same business key:
//!   `fulfillment_compensate` with `fulfilled_elsewhere`;
//! - not granted and the deadline passed (a business grants only before
//!   it): `fulfillment_compensate` with `fulfillment_deadline_passed`;
//! - not granted, deadline ahead: `fulfillment_resume`.
//!
//! A fulfillment whose compensation already started (and whose refund then
//! failed, so it is frozen) is not the goal's to decide any more: an
//! operator who retries the compensation must be refused, with no second
//! compensation refund (its failed refund is re-issued as a manual refund,
//! `manual_refund.rs`).
//! Checked at the approval: the fulfillment is then in the state the
//! resolution names; an operator's `fulfilled` counts as granted from then
//! on (never refunded by automation); and at every check, an operator's
//! compensation refunds under the reason the operator gave (exactly once:
//! `fulfillment_check.rs`).

use std::collections::BTreeMap;

use sluice_core::{FulfillmentMode, FulfillmentState};
use sluice_store::review::{Proposal, ReviewError, ReviewOutcome};
use sluice_store::PaymentDetails;

use crate::review::{Conclusion, PendingProposal};
use crate::world::{SimPayment, World};
use crate::SimError;

/// A fulfillment frozen for an operator.
pub fn frozen(d: &PaymentDetails) -> bool {
    d.order.fulfillment.state.as_deref() == Some(FulfillmentState::ManualReview.as_str())
}

impl World {
    /// The resolution the merchant's truth calls for, if the payment's
    /// fulfillment is frozen and no compensation started.
    pub(crate) fn fulfillment_conclusion(
        &self,
        payment: &SimPayment,
        d: &PaymentDetails,
    ) -> Option<Conclusion> {
        let f = payment.fulfillment.as_ref()?;
        if !frozen(d) {
            return None;
        }
        if d.order.fulfillment.compensation_refund_reference.is_some() {
            return self.retried_compensation(payment, d);
        }
        let ours = |reference: &str| d.attempts.iter().any(|a| a.reference == reference);
        let credited = match f.mode {
            FulfillmentMode::Pull => self.credited(&f.biz_key),
            FulfillmentMode::Push => self.accepted_sibling(payment),
        };
        let (outcome, reason_code) = match credited {
            _ if f.accepted => (ReviewOutcome::FulfillmentFulfilled, "merchant_fulfilled"),
            Some(r) if ours(&r) => (ReviewOutcome::FulfillmentFulfilled, "merchant_fulfilled"),
            Some(_) => (ReviewOutcome::FulfillmentCompensate, "fulfilled_elsewhere"),
            None if self.now_ms() >= f.deadline_ms => (
                ReviewOutcome::FulfillmentCompensate,
                "fulfillment_deadline_passed",
            ),
            None => (ReviewOutcome::FulfillmentResume, "merchant_still_working"),
        };
        Some(Conclusion {
            outcome,
            target_id: None,
            psp_reference: None,
            reason_code,
            amount: None,
        })
    }

    /// An operator clicking "compensate" again on a compensation whose
    /// refund failed, with the reason recorded (when the merchant never
    /// granted the goal to this payment): the store must refuse it.
    fn retried_compensation(&self, payment: &SimPayment, d: &PaymentDetails) -> Option<Conclusion> {
        if self.granted(payment, d).is_some() {
            return None;
        }
        let recorded = d.order.fulfillment.compensation_reason.as_deref()?;
        let reason_code = sluice_core::CompensationReason::parse(recorded)?.as_str();
        Some(Conclusion {
            outcome: ReviewOutcome::FulfillmentCompensate,
            target_id: None,
            psp_reference: None,
            reason_code,
            amount: None,
        })
    }

    /// The attempt reference a pull business credited the goal to.
    fn credited(&self, biz_key: &str) -> Option<String> {
        let ledger = self
            .business
            .ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        ledger.granted.get(biz_key).cloned()
    }

    /// A push merchant granted the goal to another payment of the same
    /// business key (its confirmation was accepted): a marker reference
    /// that is none of this payment's attempts.
    fn accepted_sibling(&self, payment: &SimPayment) -> Option<String> {
        let biz_key = payment.fulfillment.as_ref().map(|f| &f.biz_key);
        self.payments
            .iter()
            .filter(|p| p.tenant == payment.tenant && p.payment_id != payment.payment_id)
            .filter_map(|p| p.fulfillment.as_ref())
            .find(|f| Some(&f.biz_key) == biz_key && f.accepted)
            .map(|_| "a sibling payment".to_owned())
    }

    /// What the approval of a fulfillment resolution did: the fulfillment is
    /// in the state it names, and a compensation's refund is sent as the
    /// admin API sends it.
    pub(crate) async fn after_fulfillment_resolution(
        &mut self,
        pending: &PendingProposal,
        before: &PaymentDetails,
        decided: Option<Result<Proposal, ReviewError>>,
    ) -> Result<(), SimError> {
        let started = before
            .order
            .fulfillment
            .compensation_refund_reference
            .is_some();
        let proposal = match decided {
            Some(Ok(proposal)) => proposal,
            // Lost with the process: what the store recorded happened.
            None => self.gw.store.get_proposal(&pending.id).await?,
            Some(Err(_)) => return Ok(()),
        };
        let name = pending.payment.name.clone();
        let outcome = pending.conclusion.outcome;
        if proposal.status == "applied" && started && outcome != ReviewOutcome::FulfillmentFulfilled
        {
            self.violation(format!(
                "{name}: an operator's second compensation was applied over the one that started"
            ));
        }
        if proposal.status != "applied" {
            return Ok(());
        }
        let outcome = pending.conclusion.outcome;
        self.fulfillment_resolutions
            .insert(name.clone(), (outcome, pending.conclusion.reason_code));
        let d = self
            .gw
            .store
            .payment_details(None, &pending.payment.payment_id)
            .await?;
        let state = d.order.fulfillment.state.clone().unwrap_or_default();
        if !resolved_state(outcome).contains(&state.as_str()) {
            self.violation(format!(
                "{name}: an operator's {} left the fulfillment {state}",
                outcome.as_str()
            ));
        }
        if outcome == ReviewOutcome::FulfillmentFulfilled {
            // The merchant is told it is fulfilled: never refunded by automation.
            self.seen_fulfilled.insert(name.clone());
        }
        // Reserved in the approval's transaction, sent as the admin API
        // sends it (a kill leaves it to recovery).
        if let Some(refund_id) = crate::manual_refund::applied_refund_id(&proposal) {
            let created = d
                .refunds
                .iter()
                .any(|r| r.id == refund_id && r.state == sluice_core::RefundState::Created);
            if created {
                self.send_operator_refund(&name, "compensation", refund_id)
                    .await?;
            }
        }
        Ok(())
    }

    /// An operator's compensation refunds under the reason the operator gave.
    pub fn operator_resolution_violations(
        &self,
        all: &[(SimPayment, PaymentDetails)],
    ) -> Vec<String> {
        let mut found = Vec::new();
        for (payment, d) in all {
            let Some((outcome, reason)) = self.fulfillment_resolutions.get(&payment.name) else {
                continue;
            };
            if *outcome != ReviewOutcome::FulfillmentCompensate {
                continue;
            }
            for r in crate::fulfillment_check::compensation_refunds(d) {
                if r.reason.as_deref() != Some(*reason) {
                    found.push(format!(
                        "{}: an operator compensated for {reason}, its refund says {}",
                        payment.name,
                        r.reason.as_deref().unwrap_or("nothing")
                    ));
                }
            }
        }
        found
    }
}

/// The fulfillment states an applied resolution may leave: a compensation
/// with nothing left to refund goes back to review (the core's guard), and
/// one whose refund already settled is compensated.
fn resolved_state(outcome: ReviewOutcome) -> &'static [&'static str] {
    match outcome {
        ReviewOutcome::FulfillmentFulfilled => &["fulfilled"],
        ReviewOutcome::FulfillmentCompensate => &["compensating", "compensated", "manual_review"],
        ReviewOutcome::FulfillmentResume => &["awaiting_fulfillment"],
        _ => &[],
    }
}

/// Operator fulfillment resolutions applied, by payment name.
pub type Resolutions = BTreeMap<String, (ReviewOutcome, &'static str)>;
