//! Per-adapter PSP call metrics, process-wide (like the transport itself):
//! `sluice_psp_call_duration_seconds{adapter,operation}` (latency of the
//! HTTP exchange, answered or not) and
//! `sluice_psp_calls_total{adapter,operation,outcome}` with outcome
//! `answered` (the adapter interpreted the answer) or `unknown` (timeout,
//! connection error, 5xx, garbage: the payment's outcome is UNKNOWN), and
//! `reason` the HTTP status class or the transport error code.
//! `sluice_tenant_scope_refusals_total{adapter,source}` counts events refused
//! at the tenant boundary. `sluice_breaker_transitions_total{connector_account,to}`
//! counts circuit breaker transitions. [`register_metrics`] adds them to the server's registry.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

struct PspMetrics {
    duration: HistogramVec,
    calls: IntCounterVec,
    scope_refusals: IntCounterVec,
    breaker_transitions: IntCounterVec,
}

fn metrics() -> Option<&'static PspMetrics> {
    static METRICS: OnceLock<Option<PspMetrics>> = OnceLock::new();
    METRICS
        .get_or_init(|| {
            let duration = HistogramVec::new(
                HistogramOpts::new(
                    "sluice_psp_call_duration_seconds",
                    "Latency of PSP HTTP calls, per adapter and operation",
                )
                .buckets(vec![
                    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ]),
                &["adapter", "operation"],
            )
            .ok()?;
            let calls = IntCounterVec::new(
                Opts::new(
                    "sluice_psp_calls_total",
                    "PSP calls per adapter, operation and outcome (answered, unknown) \
                     and reason (http status class or transport error code)",
                ),
                &["adapter", "operation", "outcome", "reason"],
            )
            .ok()?;
            let scope_refusals = IntCounterVec::new(
                Opts::new(
                    "sluice_tenant_scope_refusals_total",
                    "Events refused because they named an aggregate of another connector \
                     account than the one they came through, per adapter and source \
                     (webhook, response)",
                ),
                &["adapter", "source"],
            )
            .ok()?;
            let breaker_transitions = IntCounterVec::new(
                Opts::new(
                    "sluice_breaker_transitions_total",
                    "Circuit breaker transitions per connector account and the state \
                     entered (open, half_open, closed)",
                ),
                &["connector_account", "to"],
            )
            .ok()?;
            Some(PspMetrics {
                duration,
                calls,
                scope_refusals,
                breaker_transitions,
            })
        })
        .as_ref()
}

/// Register the PSP call metrics in `registry` (once per registry).
pub fn register_metrics(registry: &Registry) -> Result<(), prometheus::Error> {
    let Some(m) = metrics() else {
        return Err(prometheus::Error::Msg(
            "PSP call metrics could not be built".into(),
        ));
    };
    registry.register(Box::new(m.duration.clone()))?;
    registry.register(Box::new(m.calls.clone()))?;
    registry.register(Box::new(m.scope_refusals.clone()))?;
    registry.register(Box::new(m.breaker_transitions.clone()))?;
    Ok(())
}

/// Record one PSP call. `reason` is `2xx`/`4xx`/`5xx` for an answer, or the
/// transport error code when none came.
pub(crate) fn observe(
    adapter: &str,
    operation: &str,
    elapsed: Duration,
    outcome: &str,
    reason: &str,
) {
    if let Some(m) = metrics() {
        m.duration
            .with_label_values(&[adapter, operation])
            .observe(elapsed.as_secs_f64());
        m.calls
            .with_label_values(&[adapter, operation, outcome, reason])
            .inc();
    }
}

/// Count one event refused at the tenant boundary.
pub(crate) fn scope_refused(adapter: &str, source: &str) {
    if let Some(m) = metrics() {
        m.scope_refusals.with_label_values(&[adapter, source]).inc();
    }
}

/// Count one breaker transition.
pub(crate) fn breaker_moved(account: &str, to: &str) {
    if let Some(m) = metrics() {
        m.breaker_transitions
            .with_label_values(&[account, to])
            .inc();
    }
}

/// `2xx`, `4xx`, ... for an HTTP status.
pub(crate) fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}
