//! Bulkhead metrics, process-wide like the runtime itself:
//! `sluice_adapter_calls_shed_total{adapter,account,reason}` (calls refused by the
//! bulkhead: `queue_full`, `wait_timeout`, `cpu_budget`, `adapter_cpu_budget`),
//! `sluice_adapter_slot_waits_total{adapter,account}` (calls that had to queue for an
//! instance slot) and `sluice_adapter_slot_wait_seconds{adapter}` (how long they
//! waited). [`register_metrics`] adds them to the server's registry.

use super::ShedReason;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use std::sync::OnceLock;
use std::time::Duration;

struct BulkheadMetrics {
    shed: IntCounterVec,
    waits: IntCounterVec,
    wait_seconds: HistogramVec,
}

fn metrics() -> Option<&'static BulkheadMetrics> {
    static METRICS: OnceLock<Option<BulkheadMetrics>> = OnceLock::new();
    METRICS
        .get_or_init(|| {
            let shed = IntCounterVec::new(
                Opts::new(
                    "sluice_adapter_calls_shed_total",
                    "Adapter calls refused by the bulkhead, per adapter, connector account and \
                     reason (queue_full, wait_timeout, cpu_budget, adapter_cpu_budget)",
                ),
                &["adapter", "account", "reason"],
            )
            .ok()?;
            let waits = IntCounterVec::new(
                Opts::new(
                    "sluice_adapter_slot_waits_total",
                    "Adapter calls that queued for an instance slot, per adapter and account",
                ),
                &["adapter", "account"],
            )
            .ok()?;
            let wait_seconds = HistogramVec::new(
                HistogramOpts::new(
                    "sluice_adapter_slot_wait_seconds",
                    "How long queued adapter calls waited for a slot (granted or shed)",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ]),
                &["adapter"],
            )
            .ok()?;
            Some(BulkheadMetrics {
                shed,
                waits,
                wait_seconds,
            })
        })
        .as_ref()
}

/// Register the bulkhead metrics in `registry` (once per registry).
pub fn register_metrics(registry: &Registry) -> Result<(), prometheus::Error> {
    let Some(m) = metrics() else {
        return Err(prometheus::Error::Msg(
            "adapter bulkhead metrics could not be built".into(),
        ));
    };
    registry.register(Box::new(m.shed.clone()))?;
    registry.register(Box::new(m.waits.clone()))?;
    registry.register(Box::new(m.wait_seconds.clone()))?;
    Ok(())
}

/// The count of calls of `adapter`/`account` shed for `reason` so far.
pub fn shed_count(adapter: &str, account: &str, reason: ShedReason) -> u64 {
    metrics().map_or(0, |m| {
        m.shed
            .with_label_values(&[adapter, account, reason.as_str()])
            .get()
    })
}

pub(crate) fn shed(adapter: &str, account: &str, reason: ShedReason) {
    if let Some(m) = metrics() {
        m.shed
            .with_label_values(&[adapter, account, reason.as_str()])
            .inc();
    }
}

pub(crate) fn slot_wait(adapter: &str, account: &str) {
    if let Some(m) = metrics() {
        m.waits.with_label_values(&[adapter, account]).inc();
    }
}

pub(crate) fn slot_waited(adapter: &str, waited: Duration) {
    if let Some(m) = metrics() {
        m.wait_seconds
            .with_label_values(&[adapter])
            .observe(waited.as_secs_f64());
    }
}
