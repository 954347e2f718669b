//! PSP call metrics, process-wide (like the transport itself), per adapter,
//! connector account and payment method (seed 001 §11):
//!
//! - `sluice_psp_call_duration_seconds{adapter,connector_account,payment_method,operation}`:
//!   latency of the HTTP exchange, answered or not (p95/p99 with
//!   `histogram_quantile`);
//! - `sluice_psp_calls_total{adapter,connector_account,payment_method,operation,outcome,reason}`:
//!   outcome `answered` (the adapter interpreted the answer) or `unknown`
//!   (timeout, connection error, 5xx, garbage: the payment's outcome is
//!   UNKNOWN), reason the HTTP status class or the transport error code;
//! - `sluice_psp_results_total{adapter,connector_account,payment_method,operation,result}`:
//!   what each call showed (the first event's kind, `unknown` without an
//!   answer): the success rate is succeeded + authorized over all first sends;
//! - `sluice_psp_failures_total{adapter,connector_account,payment_method,code,class}`:
//!   the failure-code distribution, `code` only when the failure table knows
//!   it (an adapter is untrusted and could invent codes without end), `other`
//!   otherwise;
//! - `sluice_psp_calls_shed_total{adapter,connector_account,kind}`: calls shed
//!   for want of a call slot (`call_slots`);
//! - `sluice_breaker_state{connector_account}` (0 closed, 1 half-open, 2 open,
//!   as of the last transition) and
//!   `sluice_breaker_transitions_total{connector_account,to}`;
//! - `sluice_tenant_scope_refusals_total{adapter,source}`: events refused at
//!   the tenant boundary.
//!
//! No label carries a payment, attempt or reference: connector accounts are
//! configured, payment methods a fixed list ([`method_label`]), codes the
//! failure table's. [`register_metrics`] adds them to the server's registry.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

struct PspMetrics {
    duration: HistogramVec,
    calls: IntCounterVec,
    results: IntCounterVec,
    failures: IntCounterVec,
    scope_refusals: IntCounterVec,
    breaker_transitions: IntCounterVec,
    breaker_state: IntGaugeVec,
    calls_shed: IntCounterVec,
}

/// The labels every PSP call metric carries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallLabels<'a> {
    pub adapter: &'a str,
    pub account: &'a str,
    pub method: &'static str,
    pub operation: &'a str,
}

/// Payment method types that get their own label value; anything else is
/// `other` (the type is merchant input), and none recorded `unspecified`.
const METHODS: &[&str] = &[
    "card",
    "sepa_debit",
    "ideal",
    "bancontact",
    "sofort",
    "giropay",
    "paypal",
    "klarna",
    "wallet",
    "bank_transfer",
];

pub(crate) fn method_label(method: Option<&str>) -> &'static str {
    match method {
        None => "unspecified",
        Some(m) => METHODS
            .iter()
            .find(|known| **known == m)
            .copied()
            .unwrap_or("other"),
    }
}

fn metrics() -> Option<&'static PspMetrics> {
    static METRICS: OnceLock<Option<PspMetrics>> = OnceLock::new();
    METRICS
        .get_or_init(|| {
            let duration = HistogramVec::new(
                HistogramOpts::new(
                    "sluice_psp_call_duration_seconds",
                    "Latency of PSP HTTP calls, per adapter, connector account, payment \
                     method and operation",
                )
                .buckets(vec![
                    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ]),
                &CALL,
            )
            .ok()?;
            let calls = IntCounterVec::new(
                Opts::new(
                    "sluice_psp_calls_total",
                    "PSP calls per adapter, connector account, payment method, operation, \
                     outcome (answered, unknown) and reason (http status class or transport \
                     error code)",
                ),
                &with(&CALL, &["outcome", "reason"]),
            )
            .ok()?;
            let results = IntCounterVec::new(
                Opts::new(
                    "sluice_psp_results_total",
                    "What PSP calls showed (the first event's kind, or unknown), per adapter, \
                     connector account, payment method and operation",
                ),
                &with(&CALL, &["result"]),
            )
            .ok()?;
            let failures = IntCounterVec::new(
                Opts::new(
                    "sluice_psp_failures_total",
                    "Failures PSPs reported, per adapter, connector account, payment method, \
                     failure code (other when the failure table does not know it) and class",
                ),
                &[
                    "adapter",
                    "connector_account",
                    "payment_method",
                    "code",
                    "class",
                ],
            )
            .ok()?;
            let breaker_state = IntGaugeVec::new(
                Opts::new(
                    "sluice_breaker_state",
                    "Circuit breaker state per connector account as of its last transition \
                     (0 closed, 1 half-open, 2 open)",
                ),
                &["connector_account"],
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
            let calls_shed = IntCounterVec::new(
                Opts::new(
                    "sluice_psp_calls_shed_total",
                    "PSP calls shed because every call slot of the connector account was \
                     busy for the whole wait: nothing was sent or recorded, per adapter, \
                     connector account and kind (send, query)",
                ),
                &["adapter", "connector_account", "kind"],
            )
            .ok()?;
            Some(PspMetrics {
                duration,
                calls,
                results,
                failures,
                scope_refusals,
                breaker_transitions,
                breaker_state,
                calls_shed,
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
    registry.register(Box::new(m.results.clone()))?;
    registry.register(Box::new(m.failures.clone()))?;
    registry.register(Box::new(m.breaker_state.clone()))?;
    registry.register(Box::new(m.scope_refusals.clone()))?;
    registry.register(Box::new(m.breaker_transitions.clone()))?;
    registry.register(Box::new(m.calls_shed.clone()))?;
    let Some(r) = release_metrics() else {
        return Err(prometheus::Error::Msg(
            "adapter release metrics could not be built".into(),
        ));
    };
    registry.register(Box::new(r.shadow.clone()))?;
    registry.register(Box::new(r.canary_rollbacks.clone()))?;
    Ok(())
}

/// Adapter releases (`shadow`, `releases`): shadow comparisons and canary rollbacks.
struct ReleaseMetrics {
    shadow: IntCounterVec,
    canary_rollbacks: IntCounterVec,
}

fn release_metrics() -> Option<&'static ReleaseMetrics> {
    static METRICS: OnceLock<Option<ReleaseMetrics>> = OnceLock::new();
    METRICS
        .get_or_init(|| {
            let shadow = IntCounterVec::new(
                Opts::new(
                    "sluice_adapter_shadow_comparisons_total",
                    "Shadow adapter runs per adapter, operation and result (agreed, \
                     differed, failed, shed)",
                ),
                &["adapter", "operation", "result"],
            )
            .ok()?;
            let canary_rollbacks = IntCounterVec::new(
                Opts::new(
                    "sluice_adapter_canary_rollbacks_total",
                    "Canary adapter versions stopped automatically for doing worse than \
                     the active version, per adapter",
                ),
                &["adapter"],
            )
            .ok()?;
            Some(ReleaseMetrics {
                shadow,
                canary_rollbacks,
            })
        })
        .as_ref()
}

pub(crate) fn shadow_compared(adapter: &str, operation: &str, result: &str) {
    if let Some(r) = release_metrics() {
        r.shadow
            .with_label_values(&[adapter, operation, result])
            .inc();
    }
}

pub(crate) fn canary_rolled_back(adapter: &str) {
    if let Some(r) = release_metrics() {
        r.canary_rollbacks.with_label_values(&[adapter]).inc();
    }
}

const CALL: [&str; 4] = [
    "adapter",
    "connector_account",
    "payment_method",
    "operation",
];

fn with<'a>(base: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(more).copied().collect()
}

impl CallLabels<'_> {
    fn values(&self) -> [&str; 4] {
        [self.adapter, self.account, self.method, self.operation]
    }
}

/// Record one PSP call. `reason` is `2xx`/`4xx`/`5xx` for an answer, or the
/// transport error code when none came.
pub(crate) fn observe(labels: &CallLabels<'_>, elapsed: Duration, outcome: &str, reason: &str) {
    if let Some(m) = metrics() {
        let call = labels.values();
        m.duration
            .with_label_values(&call)
            .observe(elapsed.as_secs_f64());
        m.calls
            .with_label_values(&with(&call, &[outcome, reason]))
            .inc();
    }
}

/// Record what one call showed: its result, and each failure it reported
/// (the code only when the failure table knows it).
pub(crate) fn observe_result(
    labels: &CallLabels<'_>,
    events: Option<&[sluice_core::PaymentEvent]>,
) {
    let Some(m) = metrics() else {
        return;
    };
    let result = match events {
        None => "unknown",
        Some(events) => events.first().map_or("none", |e| e.kind.as_str()),
    };
    m.results
        .with_label_values(&with(&labels.values(), &[result]))
        .inc();
    for failure in events
        .into_iter()
        .flatten()
        .filter_map(|e| e.failure.as_ref())
    {
        let verdict = sluice_core::classify_failure(labels.adapter, &failure.code, &[]);
        let code = match verdict.source {
            sluice_core::VerdictSource::Fallback => "other",
            _ => failure.code.as_str(),
        };
        m.failures
            .with_label_values(&[
                labels.adapter,
                labels.account,
                labels.method,
                code,
                verdict.class.as_str(),
            ])
            .inc();
    }
}

/// Count one event refused at the tenant boundary.
pub(crate) fn scope_refused(adapter: &str, source: &str) {
    if let Some(m) = metrics() {
        m.scope_refusals.with_label_values(&[adapter, source]).inc();
    }
}

/// Count one breaker transition and set the account's state gauge.
pub(crate) fn breaker_moved(account: &str, to: &str) {
    if let Some(m) = metrics() {
        m.breaker_transitions
            .with_label_values(&[account, to])
            .inc();
        let state = match to {
            "closed" => 0,
            "half_open" => 1,
            _ => 2,
        };
        m.breaker_state.with_label_values(&[account]).set(state);
    }
}

/// Count one PSP call shed for want of a call slot.
pub(crate) fn psp_call_shed(adapter: &str, account: &str, kind: &str) {
    if let Some(m) = metrics() {
        m.calls_shed
            .with_label_values(&[adapter, account, kind])
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
