//! Prometheus metrics of the publisher, registered in the server's registry
//! so `/metrics` exposes them with everything else.

use crate::deliveries::Sink;
use prometheus::{Gauge, GaugeVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Counters and gauges of event delivery. Cheap to clone (shared handles).
#[derive(Debug, Clone)]
pub struct DeliveryMetrics {
    /// `sluice_delivery_delivered_total{sink}`
    pub delivered: IntCounterVec,
    /// `sluice_delivery_retried_total{sink}`: failed tries rescheduled.
    pub retried: IntCounterVec,
    /// `sluice_delivery_dead_lettered_total{sink}`
    pub dead_lettered: IntCounterVec,
    /// `sluice_delivery_duplicates_total{sink}`: JetStream acknowledged a
    /// publish as a duplicate of an earlier one (a resend after a crash).
    pub duplicates: IntCounterVec,
    /// `sluice_outbox_fanned_out_total`: outbox events turned into deliveries.
    pub fanned_out: IntCounter,
    /// `sluice_outbox_oldest_pending_age_seconds`: the outbox lag, the age of
    /// the oldest event not yet fanned out (0 when none).
    pub outbox_lag_seconds: Gauge,
    /// `sluice_delivery_oldest_pending_age_seconds{sink}`: age of the event of
    /// the oldest pending delivery per sink (0 when none).
    pub delivery_lag_seconds: GaugeVec,
    /// `sluice_delivery_sink_up{sink}`: 1 when the sink could be reached on
    /// the last pass.
    pub sink_up: IntGaugeVec,
}

impl DeliveryMetrics {
    /// Create the metrics and register them in `registry`.
    pub fn register(registry: &Registry) -> Result<DeliveryMetrics, prometheus::Error> {
        let by_sink = |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), &["sink"]);
        let metrics = DeliveryMetrics {
            delivered: by_sink(
                "sluice_delivery_delivered_total",
                "Event deliveries acknowledged by their sink.",
            )?,
            retried: by_sink(
                "sluice_delivery_retried_total",
                "Failed event deliveries scheduled for another try.",
            )?,
            dead_lettered: by_sink(
                "sluice_delivery_dead_lettered_total",
                "Event deliveries that exhausted their retry schedule.",
            )?,
            duplicates: by_sink(
                "sluice_delivery_duplicates_total",
                "Deliveries the sink reported as duplicates of an earlier send.",
            )?,
            fanned_out: IntCounter::new(
                "sluice_outbox_fanned_out_total",
                "Outbox events turned into per-sink deliveries.",
            )?,
            outbox_lag_seconds: Gauge::new(
                "sluice_outbox_oldest_pending_age_seconds",
                "Age of the oldest outbox event not yet handed to the sinks.",
            )?,
            delivery_lag_seconds: GaugeVec::new(
                Opts::new(
                    "sluice_delivery_oldest_pending_age_seconds",
                    "Age of the event of the oldest pending delivery, per sink.",
                ),
                &["sink"],
            )?,
            sink_up: IntGaugeVec::new(
                Opts::new(
                    "sluice_delivery_sink_up",
                    "1 when the sink was reachable on the publisher's last pass.",
                ),
                &["sink"],
            )?,
        };
        registry.register(Box::new(metrics.delivered.clone()))?;
        registry.register(Box::new(metrics.retried.clone()))?;
        registry.register(Box::new(metrics.dead_lettered.clone()))?;
        registry.register(Box::new(metrics.duplicates.clone()))?;
        registry.register(Box::new(metrics.fanned_out.clone()))?;
        registry.register(Box::new(metrics.outbox_lag_seconds.clone()))?;
        registry.register(Box::new(metrics.delivery_lag_seconds.clone()))?;
        registry.register(Box::new(metrics.sink_up.clone()))?;
        Ok(metrics)
    }

    pub(crate) fn delivered(&self, sink: Sink) {
        self.delivered.with_label_values(&[sink.as_str()]).inc();
    }

    pub(crate) fn retried(&self, sink: Sink) {
        self.retried.with_label_values(&[sink.as_str()]).inc();
    }

    pub(crate) fn dead_lettered(&self, sink: Sink) {
        self.dead_lettered.with_label_values(&[sink.as_str()]).inc();
    }

    pub(crate) fn duplicate(&self, sink: Sink) {
        self.duplicates.with_label_values(&[sink.as_str()]).inc();
    }

    pub(crate) fn sink_up(&self, sink: Sink, up: bool) {
        self.sink_up
            .with_label_values(&[sink.as_str()])
            .set(i64::from(up));
    }

    pub(crate) fn outbox_lag(&self, age_ms: i64) {
        self.outbox_lag_seconds.set(seconds(age_ms));
    }

    pub(crate) fn delivery_lag(&self, sink: Sink, age_ms: i64) {
        self.delivery_lag_seconds
            .with_label_values(&[sink.as_str()])
            .set(seconds(age_ms));
    }

    /// The current value of a per-sink counter (for reports and tests).
    pub fn count(counter: &IntCounterVec, sink: Sink) -> u64 {
        counter.with_label_values(&[sink.as_str()]).get()
    }
}

/// Milliseconds as seconds for a gauge (an age, not money).
fn seconds(ms: i64) -> f64 {
    ms.max(0) as f64 / 1000.0
}
