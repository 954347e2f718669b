//! The fulfillment invariants (seed 000 §7, and its property
//! `status == BIZ_SUCCESS => refund_count == 0`), checked after
//! every step and once the world converged:
//!
//! - a payment whose goal was granted (the gateway accepted the merchant's
//!   push confirmation, its business credited one of its attempts in pull
//!   mode, or a check saw it `fulfilled`) is never refunded by
//!   automation: no compensation refund on it, here or at the PSP, and what
//!   we refunded or reserved only comes from refunds the merchant asked for;
//! - a compensated payment was refunded exactly once: one compensation
//!   refund, under the reference the order recorded, and at most one refund
//!   at the PSP under it (exactly one, succeeded, once compensated and
//!   converged);
//! - after convergence no fulfillment outside manual review is left waiting
//!   (`awaiting_fulfillment`, `compensating`): the deadline was acted on;
//! - every pull call a business received was signed with the endpoint's
//!   secret and keyed by its attempt reference.

use std::collections::{BTreeMap, BTreeSet};

use sluice_core::{compensation_refund_reference, CompensationReason, FulfillmentState};
use sluice_sandbox_psp::RefundStatus;
use sluice_store::payments::Refund;
use sluice_store::PaymentDetails;

use crate::world::{KeyedOp, SimPayment, World};

/// The payment's compensation refunds: under the compensation reference of
/// one of its attempts, or with a compensation reason.
pub fn compensation_refunds(d: &PaymentDetails) -> Vec<&Refund> {
    let references: BTreeSet<String> = d
        .attempts
        .iter()
        .map(|a| compensation_refund_reference(&a.reference))
        .collect();
    d.refunds
        .iter()
        .filter(|r| {
            references.contains(&r.reference)
                || r.reason
                    .as_deref()
                    .and_then(CompensationReason::parse)
                    .is_some()
        })
        .collect()
}

impl World {
    /// Why this payment's goal counts as reached, if it does: the merchant's
    /// confirmation was accepted, its business credited one of its attempts,
    /// or a check saw it fulfilled. Its money must never go back by
    /// automation then.
    pub fn granted(&self, payment: &SimPayment, d: &PaymentDetails) -> Option<&'static str> {
        let f = payment.fulfillment.as_ref()?;
        if f.accepted {
            return Some("the merchant's confirmation was accepted");
        }
        let ledger = self
            .business
            .ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let credited = ledger.granted.get(&f.biz_key);
        if d.attempts.iter().any(|a| Some(&a.reference) == credited) {
            return Some("its business granted the goal to it");
        }
        drop(ledger);
        self.seen_fulfilled
            .contains(&payment.name)
            .then_some("a check saw it fulfilled")
    }

    pub fn fulfillment_violations(
        &self,
        all: &[(SimPayment, PaymentDetails)],
        converged: bool,
    ) -> Vec<String> {
        let psp_refunds = self.psp_refunds_by_reference();
        let mut found = Vec::new();
        for (payment, d) in all {
            if let Some(why) = self.granted(payment, d) {
                let manual = self.manual_refunds_of(&payment.payment_id);
                found.extend(refunded_while_granted(
                    payment,
                    d,
                    &psp_refunds,
                    why,
                    manual,
                ));
            }
            found.extend(compensated_more_than_once(
                &payment.name,
                d,
                &psp_refunds,
                converged,
            ));
            if converged && !d.order.manual_review {
                found.extend(left_waiting(&payment.name, d));
            }
        }
        found
    }

    /// Pull calls a business refused as breaking the contract (unsigned,
    /// or not keyed by the attempt reference), each reported once.
    pub fn business_refusals(&self) -> Vec<String> {
        let mut ledger = self
            .business
            .ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut ledger.refused)
    }

    /// The PSP's refunds by the reference we sent (status, amount).
    fn psp_refunds_by_reference(&self) -> BTreeMap<String, Vec<(RefundStatus, i64)>> {
        let mut by_reference: BTreeMap<String, Vec<(RefundStatus, i64)>> = BTreeMap::new();
        for refund in self.sandbox.refunds() {
            if let Some(reference) = refund.reference {
                by_reference
                    .entry(reference)
                    .or_default()
                    .push((refund.status, refund.amount));
            }
        }
        by_reference
    }
}

/// A granted payment: no compensation refund, and only the merchant's own
/// refunds (one reference per Idempotency-Key) within what it asked, and the
/// manual refunds two operators approved (`manual`: their refund ids and
/// sum), which are after-sales, not automation.
fn refunded_while_granted(
    payment: &SimPayment,
    d: &PaymentDetails,
    psp_refunds: &BTreeMap<String, Vec<(RefundStatus, i64)>>,
    why: &str,
    manual: (BTreeSet<&str>, i64),
) -> Vec<String> {
    let (manual_ids, manual_sum) = manual;
    let name = &payment.name;
    let mut found = Vec::new();
    for r in compensation_refunds(d) {
        found.push(format!(
            "{name}: fulfilled ({why}) yet automation refunded it: a compensation refund {} of {} ({})",
            r.state.as_str(),
            r.amount.amount_minor,
            r.reason.as_deref().unwrap_or("no reason")
        ));
    }
    for a in &d.attempts {
        let reference = compensation_refund_reference(&a.reference);
        if let Some(at_psp) = psp_refunds.get(&reference) {
            found.push(format!(
                "{name}: fulfilled ({why}) yet the PSP holds {} refund(s) under its compensation reference",
                at_psp.len()
            ));
        }
    }
    let mut asked: BTreeMap<String, i64> = BTreeMap::new();
    for (op, key, amount) in &payment.keys {
        if *op == KeyedOp::Refund {
            let reference = sluice_store::keyed_refund_reference(&payment.payment_id, key);
            asked.insert(reference, *amount);
        }
    }
    let unasked = d
        .refunds
        .iter()
        .filter(|r| !asked.contains_key(&r.reference) && !manual_ids.contains(r.id.as_str()))
        .count();
    if unasked > 0 {
        found.push(format!(
            "{name}: fulfilled ({why}) yet it has {unasked} refund(s) the merchant never asked for"
        ));
    }
    let a = &d.amounts;
    let total: i64 = asked.values().sum::<i64>() + manual_sum;
    if a.refunded_minor + a.refund_reserved_minor > total {
        found.push(format!(
            "{name}: fulfilled ({why}) yet refunded {} + reserved {} > the {total} the merchant and the operators asked for",
            a.refunded_minor, a.refund_reserved_minor
        ));
    }
    found
}

/// One compensation refund at most, under the recorded reference, and at
/// most one PSP refund under it; once compensated and converged, exactly one
/// that succeeded, for the amount we recorded.
fn compensated_more_than_once(
    name: &str,
    d: &PaymentDetails,
    psp_refunds: &BTreeMap<String, Vec<(RefundStatus, i64)>>,
    converged: bool,
) -> Vec<String> {
    let mut found = Vec::new();
    let ours = compensation_refunds(d);
    if ours.len() > 1 {
        found.push(format!("{name}: {} compensation refunds", ours.len()));
    }
    let recorded = d.order.fulfillment.compensation_refund_reference.as_deref();
    for r in &ours {
        if Some(r.reference.as_str()) != recorded {
            found.push(format!(
                "{name}: a compensation refund under a reference the order did not record (recorded: {})",
                if recorded.is_some() { "another" } else { "none" }
            ));
        }
    }
    let Some(reference) = recorded else {
        return found;
    };
    let at_psp = psp_refunds.get(reference).map_or(&[][..], Vec::as_slice);
    if at_psp.len() > 1 {
        found.push(format!(
            "{name}: the PSP made {} refunds under its one compensation reference",
            at_psp.len()
        ));
    }
    let compensated =
        d.order.fulfillment.state.as_deref() == Some(FulfillmentState::Compensated.as_str());
    if converged && compensated {
        let succeeded: Vec<i64> = at_psp
            .iter()
            .filter(|(status, _)| *status == RefundStatus::Succeeded)
            .map(|(_, amount)| *amount)
            .collect();
        let expected = ours.first().map(|r| r.amount.amount_minor);
        if succeeded.len() != 1 || expected != succeeded.first().copied() {
            found.push(format!(
                "{name}: compensated, but the PSP refunded {succeeded:?} under its compensation reference (we recorded {expected:?})"
            ));
        }
    }
    found
}

/// After convergence a fulfillment outside manual review has been decided.
fn left_waiting(name: &str, d: &PaymentDetails) -> Vec<String> {
    let state = d.order.fulfillment.state.as_deref();
    let waiting = [
        FulfillmentState::AwaitingFulfillment,
        FulfillmentState::Compensating,
    ];
    match state.and_then(FulfillmentState::parse) {
        Some(s) if waiting.contains(&s) => vec![format!(
            "{name}: fulfillment still {} after convergence",
            s.as_str()
        )],
        _ => Vec::new(),
    }
}

/// How many payments with a business goal ended in each fulfillment state.
pub fn fulfillment_outcomes(all: &[(SimPayment, PaymentDetails)]) -> BTreeMap<String, usize> {
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for (payment, d) in all {
        if payment.fulfillment.is_some() {
            let state = d.order.fulfillment.state.as_deref().unwrap_or("none");
            *by_state.entry(state.to_owned()).or_default() += 1;
        }
    }
    by_state
}

/// One trace line: how the payments with a business goal ended.
pub fn fulfillment_summary(outcomes: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = outcomes
        .iter()
        .map(|(state, n)| format!("{n} {state}"))
        .collect();
    match parts.is_empty() {
        true => "fulfillment at convergence: no payment with a goal".to_owned(),
        false => format!("fulfillment at convergence: {}", parts.join(", ")),
    }
}
