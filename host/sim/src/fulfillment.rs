//! The fulfillment workload (issue 7, seed 000 §7): payments created with a
//! business goal and a deadline, the merchant confirming the goal (push) or
//! the gateway calling and reading its business (pull, `business.rs`), and
//! the recovery scanner's fulfillment checks, which decide at the deadline.
//! What the merchant was told is remembered for the invariants: a
//! confirmation the gateway accepted is a goal the merchant granted.

use sluice_core::{FulfillmentMode, FulfillmentRefusal, FulfillmentState};
use sluice_orchestrator::OrchestratorError;

use crate::ops::{error_label, scanner_error_label};
use crate::world::{SimFulfillment, SimPayment, World};
use crate::SimError;

/// How many payments of a thousand carry a fulfillment block.
const WITH_FULFILLMENT_PER_MILLE: u64 = 450;

impl World {
    /// Maybe a fulfillment block for a new payment of `tenant`: a business
    /// key (sometimes one an earlier payment of the tenant already serves,
    /// so a goal can be reached by a sibling) and a deadline from seconds
    /// to two days ahead.
    pub fn draw_fulfillment(&self, tenant: usize, name: &str) -> Option<SimFulfillment> {
        if !self.rng.chance(WITH_FULFILLMENT_PER_MILLE) {
            return None;
        }
        let mode = match self.rng.chance(500) {
            true => FulfillmentMode::Pull,
            false => FulfillmentMode::Push,
        };
        // One business goal is learned one way: siblings share the mode.
        let earlier: Vec<&SimFulfillment> = self
            .payments
            .iter()
            .filter(|p| p.tenant == tenant)
            .filter_map(|p| p.fulfillment.as_ref())
            .filter(|f| f.mode == mode)
            .collect();
        let biz_key = match self.rng.chance(150) {
            true => self.rng.pick(&earlier).map(|f| f.biz_key.clone()),
            false => None,
        }
        .unwrap_or_else(|| format!("goal-{name}"));
        let ahead = match self.rng.below(10) {
            0..=3 => self.rng.between(10_000, 600_000),
            4..=6 => self.rng.between(600_000, 6 * 3_600_000),
            _ => self.rng.between(6 * 3_600_000, 2 * 86_400_000),
        };
        Some(SimFulfillment {
            mode,
            biz_key,
            deadline_ms: self.now_ms() + ahead,
            accepted: false,
        })
    }

    /// The merchant of a push-mode payment confirms its goal reached, attributed to the
    /// attempt that took the money (or, now and then, to a sibling payment
    /// of the same business key), sometimes right around the deadline and
    /// sometimes twice.
    pub async fn confirm_fulfillment(&mut self) -> Result<(), SimError> {
        let pushed: Vec<SimPayment> = self
            .payments
            .iter()
            .filter(|p| {
                p.fulfillment
                    .as_ref()
                    .is_some_and(|f| f.mode == FulfillmentMode::Push)
            })
            .cloned()
            .collect();
        // Mostly a payment that took the money (as the last check read it):
        // a merchant confirms once it sold something; now and then early.
        let succeeded: Vec<SimPayment> = pushed
            .iter()
            .filter(|p| {
                self.details_cache
                    .get(&p.payment_id)
                    .is_some_and(|(_, d)| d.order.state == sluice_core::OrderState::Succeeded)
            })
            .cloned()
            .collect();
        let candidates = match succeeded.is_empty() || self.rng.chance(150) {
            true => pushed,
            false => succeeded,
        };
        let Some(payment) = self.rng.pick(&candidates).cloned() else {
            return Ok(());
        };
        let Some(fulfillment) = payment.fulfillment.clone() else {
            return Ok(());
        };
        if self.rng.chance(200) {
            self.near_deadline(&payment, fulfillment.deadline_ms);
        }
        let Some((reference, label)) = self.attribution(&payment).await? else {
            self.trace
                .line(format!("step fulfil {}: no attempt to name", payment.name));
            return Ok(());
        };
        let tries = if self.rng.chance(250) { 2 } else { 1 };
        for round in 0..tries {
            let line = self.confirm_once(&payment, &reference, &label).await?;
            let to_deadline = fulfillment.deadline_ms - self.now_ms();
            self.trace.line(format!(
                "step fulfil {} attributed to {label} try {round} ({} deadline by {} ms) -> {line}",
                payment.name,
                if to_deadline > 0 { "before" } else { "past" },
                to_deadline.abs()
            ));
        }
        Ok(())
    }

    /// A merchant that confirms late: time moves to just before the
    /// deadline or into its settling window, where a confirmation still
    /// beats a scanner that has not looked yet.
    fn near_deadline(&mut self, payment: &SimPayment, deadline_ms: i64) {
        let settling = self.gw.store.fulfillment_policy().action_timeout_ms;
        let target = deadline_ms + self.rng.between(-2_000, 2 * settling);
        let now = self.now_ms();
        if target > now {
            self.clock.advance(target - now);
            self.trace.line(format!(
                "step time +{} ms to {}'s deadline",
                target - now,
                payment.name
            ));
        }
    }

    /// The attempt reference the merchant names, and its world-local label.
    async fn attribution(
        &self,
        payment: &SimPayment,
    ) -> Result<Option<(String, String)>, SimError> {
        let biz_key = payment.fulfillment.as_ref().map(|f| f.biz_key.as_str());
        let siblings: Vec<&SimPayment> = self
            .payments
            .iter()
            .filter(|p| p.tenant == payment.tenant && p.payment_id != payment.payment_id)
            .filter(|p| p.fulfillment.as_ref().map(|f| f.biz_key.as_str()) == biz_key)
            .collect();
        let (named, label) = match self.rng.chance(150).then(|| self.rng.pick(&siblings)) {
            Some(Some(sibling)) => (*sibling, format!("sibling {}", sibling.name)),
            _ => (payment, "its own attempt".to_owned()),
        };
        let d = self
            .gw
            .store
            .payment_details(None, &named.payment_id)
            .await?;
        // The attempt that took the money once bound, else the latest one
        // (a merchant confirming before the payment succeeded is refused).
        let reference = d
            .order
            .fulfillment
            .attempt_reference
            .clone()
            .or_else(|| d.attempts.last().map(|a| a.reference.clone()));
        Ok(reference.map(|r| (r, label)))
    }

    /// One confirmation call; remembers an accepted one as granted.
    async fn confirm_once(
        &mut self,
        payment: &SimPayment,
        reference: &str,
        label: &str,
    ) -> Result<String, SimError> {
        let orch = self.gw.orch.clone();
        let merchant = self.tenants[payment.tenant].merchant_id.clone();
        let outcome = self
            .guarded(orch.confirm_fulfillment(&merchant, &payment.payment_id, reference))
            .await?;
        let line = match outcome {
            None => "killed".to_owned(),
            Some(Ok(step)) => {
                let last = step.last();
                let own = label == "its own attempt";
                if own && last.to_state == FulfillmentState::Fulfilled {
                    self.mark_accepted(&payment.payment_id);
                }
                format!("{} {}", last.decision.label(), last.to_state)
            }
            Some(Err(OrchestratorError::FulfillmentRefused(refusal))) => {
                format!("refused: {}", refusal_label(&refusal))
            }
            Some(Err(error)) => error_label(&error),
        };
        Ok(line)
    }

    fn mark_accepted(&mut self, payment_id: &str) {
        if let Some(f) = self
            .payments
            .iter_mut()
            .find(|p| p.payment_id == payment_id)
            .and_then(|p| p.fulfillment.as_mut())
        {
            f.accepted = true;
        }
    }

    /// The scanner's fulfillment wake-ups due now, as its round takes them
    /// (`Store::due_fulfillments`, earliest first), each under its lease.
    pub async fn scan_fulfillments(&mut self) -> Result<(), SimError> {
        let due = self.gw.store.due_fulfillments(self.now_ms(), 500).await?;
        for row in due {
            let scanner = self.gw.scanner.clone();
            let outcome = self
                .guarded(scanner.check_fulfillment(&row.payment_id))
                .await?;
            let line = match outcome {
                None => "killed".to_owned(),
                Some(Ok(outcome)) => format!("{outcome:?}"),
                Some(Err(error)) => format!("error {}", scanner_error_label(&error)),
            };
            let name = self.payment_name(&row.payment_id);
            self.trace
                .line(format!("step scan fulfillment {name} -> {line}"));
            if line == "killed" {
                break;
            }
        }
        Ok(())
    }

    /// The world-local name of a payment.
    pub fn payment_name(&self, payment_id: &str) -> String {
        self.payments
            .iter()
            .find(|p| p.payment_id == payment_id)
            .map_or_else(|| "?".to_owned(), |p| p.name.clone())
    }
}

/// What a refused confirmation says, without references (they carry store
/// ids the seed does not determine).
fn refusal_label(refusal: &FulfillmentRefusal) -> String {
    match refusal {
        FulfillmentRefusal::PaymentNotSucceeded => "payment not succeeded".into(),
        FulfillmentRefusal::RefundInProgress { reason, .. } => {
            format!("refund in progress ({reason})")
        }
        FulfillmentRefusal::Refunded { reason, .. } => format!("refunded ({reason})"),
        FulfillmentRefusal::UnderReview(_) => "under review".into(),
        FulfillmentRefusal::AlreadyFulfilled { .. } => "already fulfilled".into(),
        FulfillmentRefusal::UnknownAttempt { .. } => "unknown attempt".into(),
        FulfillmentRefusal::AttemptMismatch { .. } => "attempt mismatch".into(),
        _ => "refused otherwise".into(),
    }
}
