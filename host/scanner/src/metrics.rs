//! Prometheus counters of the scanner, registered in the server's registry.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::error::ScannerError;
use crate::ScanReport;

#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    rounds: IntCounter,
    scanned: IntCounter,
    hits: IntCounter,
    last_round_hits: IntGauge,
    outcomes: IntCounterVec,
    queries: IntCounterVec,
    deferred: IntCounterVec,
    fulfillment_alerts: IntCounter,
}

impl Metrics {
    pub(crate) fn register(registry: &Registry) -> Result<Metrics, ScannerError> {
        let metrics = Metrics {
            rounds: IntCounter::new("sluice_scanner_rounds_total", "Recovery scanner rounds")?,
            scanned: IntCounter::new(
                "sluice_scanner_rows_scanned_total",
                "Due rows the recovery scanner read",
            )?,
            hits: IntCounter::new(
                "sluice_scanner_hits_total",
                "Due rows that needed work (query, expiry or escalation)",
            )?,
            last_round_hits: IntGauge::new(
                "sluice_scanner_last_round_hits",
                "Hits of the latest recovery scanner round",
            )?,
            outcomes: IntCounterVec::new(
                Opts::new(
                    "sluice_scanner_outcomes_total",
                    "What the recovery scanner did with due rows",
                ),
                &["outcome"],
            )?,
            queries: IntCounterVec::new(
                Opts::new(
                    "sluice_scanner_psp_queries_total",
                    "PSP queries the recovery scanner made, per adapter",
                ),
                &["adapter"],
            )?,
            deferred: IntCounterVec::new(
                Opts::new(
                    "sluice_scanner_retry_budget_deferred_total",
                    "Due rows the adapter's retry budget refused: their next look pushed \
                     out with jitter, still pending, per adapter",
                ),
                &["adapter"],
            )?,
            fulfillment_alerts: IntCounter::new(
                "sluice_fulfillment_contradictory_facts_total",
                "Business facts that contradicted a fulfillment (automation frozen, manual review)",
            )?,
        };
        registry.register(Box::new(metrics.fulfillment_alerts.clone()))?;
        registry.register(Box::new(metrics.rounds.clone()))?;
        registry.register(Box::new(metrics.scanned.clone()))?;
        registry.register(Box::new(metrics.hits.clone()))?;
        registry.register(Box::new(metrics.last_round_hits.clone()))?;
        registry.register(Box::new(metrics.outcomes.clone()))?;
        registry.register(Box::new(metrics.queries.clone()))?;
        registry.register(Box::new(metrics.deferred.clone()))?;
        Ok(metrics)
    }

    pub(crate) fn fulfillment_alert(&self) {
        self.fulfillment_alerts.inc();
    }

    pub(crate) fn query(&self, adapter: &str) {
        self.queries.with_label_values(&[adapter]).inc();
    }

    pub(crate) fn deferred(&self, adapter: &str) {
        self.deferred.with_label_values(&[adapter]).inc();
    }

    pub(crate) fn round(&self, report: &ScanReport) {
        self.rounds.inc();
        self.scanned.inc_by(report.scanned);
        self.hits.inc_by(report.hits);
        self.last_round_hits
            .set(i64::try_from(report.hits).unwrap_or(i64::MAX));
        for (outcome, n) in [
            ("queried", report.queried),
            ("converged", report.converged),
            ("expired", report.expired),
            ("expire_blocked", report.expire_blocked),
            ("escalated", report.escalated),
            ("authorization_expired", report.authorizations_expired),
            ("not_yet", report.not_yet),
            ("parked", report.parked),
            ("skipped_budget", report.skipped_budget),
            ("deferred_budget", report.deferred_budget),
            ("shed", report.shed),
            ("skipped_claimed", report.skipped_claimed),
            ("skipped_stale", report.skipped_stale),
            ("fulfillment_checked", report.fulfillment_checks),
            ("error", report.errors),
        ] {
            self.outcomes.with_label_values(&[outcome]).inc_by(n);
        }
    }
}
