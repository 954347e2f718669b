//! Gauges of the pending set, refreshed from the database on every scrape of
//! `/metrics` (one cheap grouped query over the partial indexes of
//! non-terminal rows; see `Store::pending_stats`):
//!
//! - `sluice_pending_total{aggregate,state}`: rows per non-terminal state of
//!   orders, attempts, captures and refunds (0 for states with none);
//! - `sluice_pending_oldest_age_seconds{aggregate,state}`: age of the oldest
//!   such row (UNKNOWN aging: `{aggregate="attempt",state="UNKNOWN"}`);
//! - `sluice_manual_review_payments` and
//!   `sluice_manual_review_oldest_age_seconds`;
//! - `sluice_cas_conflicts_total`: decisions the store's door re-took after
//!   losing a CAS race (process-wide);
//! - `sluice_inbox_backlog{status}` and `sluice_inbox_oldest_backlog_age_seconds`:
//!   verified webhook events not yet applied (processing backlog);
//! - `sluice_reconciliation_unresolved_differences{class}` and
//!   `sluice_reconciliation_unresolved_amount_minor{class}`: reconciliation
//!   differences not repaired (open or in review), count and money at stake
//!   per class (0 for classes with none), and
//!   `sluice_reconciliation_oldest_unresolved_age_seconds`.

use prometheus::{Gauge, GaugeVec, IntCounter, IntGauge, IntGaugeVec, Opts, Registry};
use sluice_core::{AttemptState, CaptureState, OrderState, RefundState};
use sluice_store::Store;

/// The gauges; cheap to clone.
#[derive(Clone)]
pub struct PendingMetrics {
    count: IntGaugeVec,
    oldest: GaugeVec,
    review: IntGauge,
    review_oldest: Gauge,
    cas_conflicts: IntCounter,
    inbox: IntGaugeVec,
    inbox_oldest: Gauge,
    recon_count: IntGaugeVec,
    recon_amount: IntGaugeVec,
    recon_oldest: Gauge,
}

/// Every non-terminal state per aggregate, so a state that emptied reads 0.
fn open_states() -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    out.extend(
        OrderState::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .map(|s| ("order", s.as_str())),
    );
    out.extend(
        AttemptState::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .map(|s| ("attempt", s.as_str())),
    );
    out.extend(
        CaptureState::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .map(|s| ("capture", s.as_str())),
    );
    out.extend(
        RefundState::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .map(|s| ("refund", s.as_str())),
    );
    out
}

impl PendingMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = PendingMetrics {
            count: IntGaugeVec::new(
                Opts::new(
                    "sluice_pending_total",
                    "Non-terminal orders, attempts, captures and refunds per state",
                ),
                &["aggregate", "state"],
            )?,
            oldest: GaugeVec::new(
                Opts::new(
                    "sluice_pending_oldest_age_seconds",
                    "Age of the oldest non-terminal row per aggregate and state (0 when none)",
                ),
                &["aggregate", "state"],
            )?,
            review: IntGauge::new(
                "sluice_manual_review_payments",
                "Payments flagged for manual review (an operator must decide)",
            )?,
            review_oldest: Gauge::new(
                "sluice_manual_review_oldest_age_seconds",
                "How long the longest-flagged payment has waited for an operator (0 when none)",
            )?,
            cas_conflicts: IntCounter::new(
                "sluice_cas_conflicts_total",
                "Decisions the store's door re-took after losing a CAS race",
            )?,
            inbox: IntGaugeVec::new(
                Opts::new(
                    "sluice_inbox_backlog",
                    "Verified PSP webhook events not yet applied, per inbox status",
                ),
                &["status"],
            )?,
            inbox_oldest: Gauge::new(
                "sluice_inbox_oldest_backlog_age_seconds",
                "Age of the oldest verified webhook event not yet applied (0 when none)",
            )?,
            recon_count: IntGaugeVec::new(
                Opts::new(
                    "sluice_reconciliation_unresolved_differences",
                    "Reconciliation differences not repaired (open or in review), per class",
                ),
                &["class"],
            )?,
            recon_amount: IntGaugeVec::new(
                Opts::new(
                    "sluice_reconciliation_unresolved_amount_minor",
                    "Money at stake in unrepaired reconciliation differences, minor units, per class",
                ),
                &["class"],
            )?,
            recon_oldest: Gauge::new(
                "sluice_reconciliation_oldest_unresolved_age_seconds",
                "Age of the oldest unrepaired reconciliation difference (0 when none)",
            )?,
        };
        registry.register(Box::new(metrics.recon_count.clone()))?;
        registry.register(Box::new(metrics.recon_amount.clone()))?;
        registry.register(Box::new(metrics.recon_oldest.clone()))?;
        registry.register(Box::new(metrics.count.clone()))?;
        registry.register(Box::new(metrics.oldest.clone()))?;
        registry.register(Box::new(metrics.review.clone()))?;
        registry.register(Box::new(metrics.review_oldest.clone()))?;
        registry.register(Box::new(metrics.cas_conflicts.clone()))?;
        registry.register(Box::new(metrics.inbox.clone()))?;
        registry.register(Box::new(metrics.inbox_oldest.clone()))?;
        Ok(metrics)
    }

    /// Read the pending set and set the gauges. On a database error the
    /// gauges keep their last values (and the error is logged).
    pub async fn refresh(&self, store: &Store) {
        let stats = match store.pending_stats().await {
            Ok(stats) => stats,
            Err(error) => {
                tracing::warn!(%error, "cannot read the pending set for /metrics");
                return;
            }
        };
        let now = store.now_ms();
        let age =
            |at: Option<i64>| at.map_or(0.0, |at| (now.saturating_sub(at)).max(0) as f64 / 1000.0);
        for (aggregate, state) in open_states() {
            let found = stats
                .states
                .iter()
                .find(|s| s.aggregate == aggregate && s.state == state);
            self.count
                .with_label_values(&[aggregate, state])
                .set(found.map_or(0, |s| s.count));
            self.oldest
                .with_label_values(&[aggregate, state])
                .set(age(found.and_then(|s| s.oldest_created_at)));
        }
        self.review.set(stats.manual_review);
        self.review_oldest.set(age(stats.oldest_manual_review_at));
        let mut oldest_inbox: Option<i64> = None;
        for status in ["pending", "processing", "failed"] {
            let found = stats.inbox_backlog.iter().find(|(s, _, _)| s == status);
            self.inbox
                .with_label_values(&[status])
                .set(found.map_or(0, |(_, n, _)| *n));
            if let Some(at) = found.and_then(|(_, _, at)| *at) {
                oldest_inbox = Some(oldest_inbox.map_or(at, |o| o.min(at)));
            }
        }
        self.inbox_oldest.set(age(oldest_inbox));
        self.refresh_reconciliation(store, &age).await;
        let total = sluice_store::cas_conflicts_total();
        let seen = self.cas_conflicts.get();
        if total > seen {
            self.cas_conflicts.inc_by(total - seen);
        }
    }

    /// The unrepaired reconciliation differences; on a database error the
    /// gauges keep their last values.
    async fn refresh_reconciliation(&self, store: &Store, age: &impl Fn(Option<i64>) -> f64) {
        let (classes, oldest) = match store.unresolved_differences().await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%error, "cannot read reconciliation differences for /metrics");
                return;
            }
        };
        for class in sluice_core::DifferenceClass::ALL {
            let found = classes.iter().find(|c| c.class == class.as_str());
            let labels = [class.as_str()];
            self.recon_count
                .with_label_values(&labels)
                .set(found.map_or(0, |c| c.count));
            self.recon_amount
                .with_label_values(&labels)
                .set(found.map_or(0, |c| c.amount_minor));
        }
        self.recon_oldest.set(age(oldest));
    }
}
