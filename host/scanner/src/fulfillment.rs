//! Fulfillment wake-ups (issue 7): every round also reads the payments whose
//! fulfillment check is due (`Store::due_fulfillments`, a partial index on
//! `fulfillment_next_check_at`) and hands each to
//! `Orchestrator::check_fulfillment` under a lease, so the deadline drives
//! the compensation even if nobody else looks. A stale wake-up (the payment
//! was fulfilled meanwhile) is decided as such by the core and does nothing.

use sluice_orchestrator::Trigger;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::{ItemOutcome, Round, Scanner, ScannerError};

/// The lease kind of fulfillment wake-ups in `scanner_leases`.
pub(crate) const LEASE_KIND: &str = "fulfillment";

impl Scanner {
    /// Read the due fulfillments (one page per round: they are cheap and the
    /// next round takes the rest) and check each in a task.
    pub(crate) async fn scan_fulfillments(
        &self,
        round: &mut Round,
        tasks: &mut JoinSet<Result<ItemOutcome, ScannerError>>,
    ) -> Result<(), ScannerError> {
        let store = self.inner.orch.store();
        let now = store.now_ms();
        let due = store
            .due_fulfillments(now, self.inner.config.batch_size)
            .await?;
        for row in due {
            round.report.scanned += 1;
            round.report.fulfillment_checks += 1;
            let this = self.clone();
            let span = tracing::info_span!("scanner.fulfillment", payment_id = %row.payment_id,
                state = %row.state);
            tasks.spawn(
                async move {
                    let result = this.check_fulfillment(&row.payment_id).await;
                    if let Err(error) = &result {
                        tracing::warn!(error = %error, "scanner could not check a fulfillment");
                    }
                    result
                }
                .instrument(span),
            );
        }
        Ok(())
    }

    /// Check one payment's fulfillment now, under a lease.
    pub async fn check_fulfillment(&self, payment_id: &str) -> Result<ItemOutcome, ScannerError> {
        let leases = &self.inner.leases;
        if !leases.claim_label(LEASE_KIND, payment_id).await? {
            return Ok(ItemOutcome::Claimed);
        }
        let result = self
            .inner
            .orch
            .check_fulfillment(payment_id, Trigger::Scanner)
            .await;
        let released = leases.release_label(LEASE_KIND, payment_id).await;
        let step = result?;
        released?;
        if step.alert() {
            tracing::error!(
                payment_id,
                "contradictory business fact: fulfillment frozen for manual review"
            );
            if let Some(metrics) = &self.inner.metrics {
                metrics.fulfillment_alert();
            }
        }
        let last = step.last();
        Ok(ItemOutcome::Fulfillment {
            state_after: last.to_state.as_str().to_owned(),
            decision: last.decision.label(),
            alert: step.alert(),
        })
    }
}
