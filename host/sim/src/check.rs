//! The invariants, checked after every step and once the world converged
//! (seed 000 §15, seed 001 §12). A violation fails the seed with its trace.

use std::collections::BTreeMap;

use sluice_core::FulfillmentState;
use sluice_sandbox_psp::{PayStatus, RefundStatus};
use sluice_store::PaymentDetails;

use crate::fulfillment_check::{compensation_refunds, fulfillment_outcomes, fulfillment_summary};
use crate::world::{KeyedOp, SimPayment, World};
use crate::SimError;

/// Every payment's aggregates as stored: one line per row of the order,
/// its attempts, captures, refunds and amounts, keyed by payment and row.
/// Read whole rather than through the versions the step checks cache: the
/// forged event under test is exactly what might change a row without
/// moving the payment's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot(BTreeMap<(String, String), String>);

impl Snapshot {
    /// One statement, as a forge step takes two.
    pub async fn take(world: &World) -> Result<Snapshot, SimError> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(SNAPSHOT)
            .fetch_all(world.gw.store.pool())
            .await?;
        Ok(Snapshot(
            rows.into_iter()
                .map(|(payment, row, line)| ((payment, row), line))
                .collect(),
        ))
    }

    /// What differs in `after` (rows changed, added or gone), one line per
    /// row, named by the world's payment names.
    pub fn changes(&self, after: &Snapshot, world: &World) -> Vec<String> {
        let name = |payment_id: &str| {
            world
                .payments
                .iter()
                .find(|p| p.payment_id == payment_id)
                .map_or_else(|| payment_id.to_owned(), |p| p.name.clone())
        };
        let keys: std::collections::BTreeSet<_> = self.0.keys().chain(after.0.keys()).collect();
        keys.into_iter()
            .filter_map(|key| {
                let (before, now) = (self.0.get(key), after.0.get(key));
                (before != now)
                    .then(|| format!("{} {}: {before:?} -> {now:?}", name(&key.0), key.1))
            })
            .collect()
    }
}

const SNAPSHOT: &str = "
SELECT id, 'order',
       state || ' v' || version || ' review=' || manual_review
       || ' fulfillment=' || COALESCE(fulfillment_state, '-')
    FROM payment_orders
UNION ALL
SELECT payment_id, 'attempt ' || id, state || ' v' || version FROM payment_attempts
UNION ALL
SELECT payment_id, 'capture ' || id, state || ' v' || version FROM captures
UNION ALL
SELECT payment_id, 'refund ' || id, state || ' v' || version FROM refunds
UNION ALL
SELECT payment_id, 'amounts',
       authorized_minor || '/' || capture_reserved_minor || '/' || captured_minor
       || '/' || refund_reserved_minor || '/' || refunded_minor
    FROM payment_amounts";

/// What was last seen of each aggregate, to check terminal states stay.
#[derive(Debug, Default)]
pub struct Observed(BTreeMap<String, (String, bool)>);

impl World {
    pub fn violation(&mut self, what: String) {
        self.trace.line(format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    /// The PSP's payments by the attempt reference they were created with.
    fn psp_by_reference(&self) -> BTreeMap<String, sluice_sandbox_psp::Payment> {
        self.sandbox
            .payments()
            .into_iter()
            .map(|p| (p.reference.clone(), p))
            .collect()
    }

    /// The invariants that hold after every step, faults or not.
    pub async fn check_step(&mut self) -> Result<(), SimError> {
        let mut found = Vec::new();
        let mut all = Vec::with_capacity(self.payments.len());
        let versions = self.versions().await?;
        for payment in self.payments.clone() {
            let d = self.details(&payment.payment_id, &versions).await?;
            if d.order.fulfillment.state.as_deref() == Some(FulfillmentState::Fulfilled.as_str()) {
                self.seen_fulfilled.insert(payment.name.clone());
            }
            found.extend(amount_violations(&payment.name, &d));
            found.extend(self.terminal_violations(&payment.name, &d));
            let open = d.attempts.iter().filter(|a| !a.state.is_terminal()).count();
            if open > 1 {
                found.push(format!("{}: {open} attempts open at once", payment.name));
            }
            all.push((payment, d));
        }
        found.extend(self.psp_violations());
        found.extend(self.beyond_requests(&all));
        found.extend(self.fulfillment_violations(&all, false));
        found.extend(self.manual_refund_violations(&all, false));
        found.extend(self.operator_resolution_violations(&all));
        found.extend(self.business_refusals());
        if self.ingests != self.ingests_checked {
            self.ingests_checked = self.ingests;
            found.extend(self.inbox_duplicates().await?);
        }
        for what in found {
            self.violation(what);
        }
        Ok(())
    }

    /// Every payment's version: it moves with every applied change of the
    /// payment or any of its aggregates and amounts.
    pub(crate) async fn versions(&self) -> Result<BTreeMap<String, i64>, SimError> {
        let rows: Vec<(String, i64)> = sqlx::query_as("SELECT id, version FROM payment_orders")
            .fetch_all(self.gw.store.pool())
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// A payment's details, read again only when its version moved.
    pub(crate) async fn details(
        &mut self,
        payment_id: &str,
        versions: &BTreeMap<String, i64>,
    ) -> Result<PaymentDetails, SimError> {
        let version = versions.get(payment_id).copied();
        if let Some((seen, d)) = self.details_cache.get(payment_id) {
            if Some(*seen) == version {
                return Ok(d.clone());
            }
        }
        let d = self.gw.store.payment_details(None, payment_id).await?;
        self.details_cache
            .insert(payment_id.to_owned(), (d.order.version, d.clone()));
        Ok(d)
    }

    fn terminal_violations(&mut self, name: &str, d: &PaymentDetails) -> Vec<String> {
        let mut found = Vec::new();
        let mut seen = |key: String, state: &str, terminal: bool| {
            if let Some((before, true)) = self.observed.0.get(&key) {
                if before != state {
                    found.push(format!("{key}: terminal {before} changed to {state}"));
                }
            }
            self.observed.0.insert(key, (state.to_owned(), terminal));
        };
        seen(
            format!("{name} order"),
            d.order.state.as_str(),
            d.order.state.is_terminal(),
        );
        if let Some(state) = d.order.fulfillment.state.as_deref() {
            let terminal = FulfillmentState::parse(state).is_some_and(|s| s.is_terminal());
            seen(format!("{name} fulfillment"), state, terminal);
        }
        for a in &d.attempts {
            seen(
                format!("{name} attempt {}", a.attempt_no),
                a.state.as_str(),
                a.state.is_terminal(),
            );
        }
        // By id, not by position: two captures created in the same millisecond
        // by two gateway processes list in either order.
        for c in &d.captures {
            seen(
                format!("{name} capture {}", c.id),
                c.state.as_str(),
                c.state.is_terminal(),
            );
        }
        // By id, not by position: two refunds created in the same millisecond
        // by two gateway processes list in either order.
        for r in &d.refunds {
            seen(
                format!("{name} refund {}", r.id),
                r.state.as_str(),
                r.state.is_terminal(),
            );
        }
        found
    }

    /// The PSP never moved more than the merchants asked for: per payment,
    /// refunds within the sum of its distinct refund requests (one per
    /// Idempotency-Key, however often retried) and of the manual refunds two
    /// operators approved, captures of a manual-capture payment within the
    /// sum of its distinct capture requests.
    fn beyond_requests(&self, all: &[(SimPayment, PaymentDetails)]) -> Vec<String> {
        let psp = self.psp_by_reference();
        let mut found = Vec::new();
        for (payment, d) in all {
            let asked = |op: KeyedOp| -> i64 {
                let mut keys = BTreeMap::new();
                for (kind, key, amount) in &payment.keys {
                    if *kind == op {
                        keys.insert(key.as_str(), *amount);
                    }
                }
                keys.values().sum()
            };
            let at_psp: Vec<&sluice_sandbox_psp::Payment> = d
                .attempts
                .iter()
                .filter_map(|a| psp.get(&a.reference))
                .collect();
            let refunded: i64 = at_psp
                .iter()
                .map(|p| p.amount_refunded + p.amount_refund_pending)
                .sum();
            // A payment with a business goal the merchant never granted also
            // agreed to its one compensation refund at the deadline.
            let compensation: i64 = match self.granted(payment, d).is_some() {
                true => 0,
                false => compensation_refunds(d)
                    .iter()
                    .map(|r| r.amount.amount_minor)
                    .sum(),
            };
            let (_, manual) = self.manual_refunds_of(&payment.payment_id);
            if refunded > asked(KeyedOp::Refund) + compensation + manual {
                found.push(format!(
                    "{}: the PSP refunded {refunded}, the merchant asked for {} in its distinct refund requests (and compensation allows {compensation}, the operators' manual refunds {manual})",
                    payment.name,
                    asked(KeyedOp::Refund)
                ));
            }
            let manual = d.order.capture_mode == sluice_core::CaptureMode::Manual;
            let received: i64 = at_psp.iter().map(|p| p.amount_received).sum();
            if manual && received > asked(KeyedOp::Capture) {
                found.push(format!(
                    "{}: the PSP captured {received}, the merchant asked for {} in its distinct capture requests",
                    payment.name,
                    asked(KeyedOp::Capture)
                ));
            }
        }
        found
    }

    /// One charge per attempt reference and one refund per refund reference
    /// at the PSP; the PSP's own amounts in order.
    fn psp_violations(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (reference, count) in self.sandbox.charge_counts() {
            if count.charges > 1 {
                found.push(format!(
                    "PSP charged {} times for one attempt reference {reference}",
                    count.charges
                ));
            }
        }
        let mut refunds: BTreeMap<String, u32> = BTreeMap::new();
        for refund in self.sandbox.refunds() {
            if let Some(reference) = refund.reference {
                *refunds.entry(reference).or_default() += 1;
            }
        }
        for (reference, n) in refunds {
            if n > 1 {
                found.push(format!(
                    "PSP made {n} refunds for one refund reference {reference}"
                ));
            }
        }
        for p in self.sandbox.payments() {
            if p.amount_received > p.amount
                || p.amount_refunded + p.amount_refund_pending > p.amount_received
            {
                found.push(format!(
                    "PSP amounts out of order for {}: amount {} received {} refunded {} pending {}",
                    p.id, p.amount, p.amount_received, p.amount_refunded, p.amount_refund_pending
                ));
            }
        }
        found
    }

    /// Once faults stopped and the world settled: every payment is closed or
    /// with an operator, and what we recorded agrees with the PSP's ledger.
    pub async fn check_converged(&mut self) -> Result<(), SimError> {
        let mut found = Vec::new();
        let psp = self.psp_by_reference();
        let psp_refunds = self.sandbox.refunds();
        let mut all = Vec::with_capacity(self.payments.len());
        for payment in self.payments.clone() {
            let d = self
                .gw
                .store
                .payment_details(None, &payment.payment_id)
                .await?;
            // A payment with an operator is not expected to be closed; what
            // must never happen to it is still checked below.
            if !d.order.manual_review {
                found.extend(open_aggregates(&payment.name, &d, &psp));
                found.extend(ledger_disagreements(&payment.name, &d, &psp, &psp_refunds));
            }
            all.push((payment, d));
        }
        found.extend(self.fulfillment_violations(&all, true));
        found.extend(self.manual_refund_violations(&all, true));
        found.extend(self.operator_resolution_violations(&all));
        self.fulfillment_outcomes = fulfillment_outcomes(&all);
        self.trace
            .line(fulfillment_summary(&self.fulfillment_outcomes));
        found.extend(self.inbox_duplicates().await?);
        found.extend(self.inbox_left_open().await?);
        found.extend(self.undelivered().await?);
        found.extend(self.self_approved().await?);
        for what in found {
            self.violation(what);
        }
        Ok(())
    }

    /// A webhook delivered twice is recorded once: no body has more inbox
    /// rows than it carries events.
    async fn inbox_duplicates(&self) -> Result<Vec<String>, SimError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT payload_digest, COUNT(*) FROM webhook_inbox \
             WHERE verification = 'verified' GROUP BY connector_account_id, payload_digest \
             ORDER BY connector_account_id, payload_digest",
        )
        .fetch_all(self.gw.store.pool())
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(digest, n)| {
                let events = *self.bodies.get(&digest)?;
                (usize::try_from(n).unwrap_or(usize::MAX) > events)
                    .then(|| format!("a webhook body carrying {events} events has {n} inbox rows"))
            })
            .collect())
    }

    /// Every outbox event reached its merchant's endpoint at least once
    /// (or is a dead letter), and none is marked delivered unreceived.
    async fn undelivered(&self) -> Result<Vec<String>, SimError> {
        let rows: Vec<(String, String, String, String)> =
            sqlx::query_as(crate::merchants::DELIVERIES)
                .fetch_all(self.gw.store.pool())
                .await?;
        Ok(crate::merchants::delivery_violations(
            &rows,
            &self.merchants.received(),
        ))
    }

    /// Accepted webhook events still waiting after convergence.
    async fn inbox_left_open(&self) -> Result<Vec<String>, SimError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT status, COUNT(*) FROM webhook_inbox \
             WHERE status IN ('pending', 'processing', 'failed') GROUP BY status ORDER BY status",
        )
        .fetch_all(self.gw.store.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(status, n)| {
                format!("{n} accepted webhook events still {status} after convergence")
            })
            .collect())
    }
}

/// Our amounts: captured ≤ authorized ≤ amount, refunds within captures.
fn amount_violations(name: &str, d: &PaymentDetails) -> Vec<String> {
    let a = &d.amounts;
    let mut found = Vec::new();
    if a.authorized_minor > a.amount_minor {
        found.push(format!(
            "{name}: authorized {} > amount {}",
            a.authorized_minor, a.amount_minor
        ));
    }
    if a.captured_minor + a.capture_reserved_minor > a.authorized_minor {
        found.push(format!(
            "{name}: captured {} + reserved {} > authorized {}",
            a.captured_minor, a.capture_reserved_minor, a.authorized_minor
        ));
    }
    if a.refunded_minor + a.refund_reserved_minor > a.captured_minor {
        found.push(format!(
            "{name}: refunded {} + reserved {} > captured {}",
            a.refunded_minor, a.refund_reserved_minor, a.captured_minor
        ));
    }
    if [
        a.captured_minor,
        a.capture_reserved_minor,
        a.refunded_minor,
        a.refund_reserved_minor,
    ]
    .iter()
    .any(|v| *v < 0)
    {
        found.push(format!("{name}: a negative amount {a:?}"));
    }
    found
}

fn open_aggregates(
    name: &str,
    d: &PaymentDetails,
    psp: &BTreeMap<String, sluice_sandbox_psp::Payment>,
) -> Vec<String> {
    let mut found = Vec::new();
    for a in d.attempts.iter().filter(|a| !a.state.is_terminal()) {
        let at_psp = psp.get(&a.reference).map_or("nothing".to_owned(), |p| {
            format!("{:?} received {}", p.status, p.amount_received)
        });
        found.push(format!(
            "{name}: attempt {} still {} after convergence (the PSP has {at_psp})",
            a.attempt_no,
            a.state.as_str()
        ));
    }
    for c in d.captures.iter().filter(|c| !c.state.is_terminal()) {
        found.push(format!(
            "{name}: a capture still {} after convergence",
            c.state.as_str()
        ));
    }
    for r in d.refunds.iter().filter(|r| !r.state.is_terminal()) {
        found.push(format!(
            "{name}: a refund still {} after convergence",
            r.state.as_str()
        ));
    }
    found
}

/// Our captured and refunded amounts against the PSP's, per attempt.
pub(crate) fn ledger_disagreements(
    name: &str,
    d: &PaymentDetails,
    psp: &BTreeMap<String, sluice_sandbox_psp::Payment>,
    psp_refunds: &[sluice_sandbox_psp::Refund],
) -> Vec<String> {
    let mut found = Vec::new();
    let received: i64 = d
        .attempts
        .iter()
        .filter_map(|a| psp.get(&a.reference))
        .map(|p| p.amount_received)
        .sum();
    if received != d.amounts.captured_minor {
        found.push(format!(
            "{name}: we recorded {} captured, the PSP took {received}",
            d.amounts.captured_minor
        ));
    }
    let held = d
        .attempts
        .iter()
        .filter_map(|a| psp.get(&a.reference))
        .any(|p| {
            matches!(
                p.status,
                PayStatus::RequiresCapture | PayStatus::Processing | PayStatus::RequiresAction
            )
        });
    if held {
        found.push(format!(
            "{name}: the PSP still holds an open payment after convergence"
        ));
    }
    let ours: std::collections::BTreeSet<&str> =
        d.refunds.iter().map(|r| r.reference.as_str()).collect();
    let refunded: i64 = psp_refunds
        .iter()
        .filter(|r| r.status == RefundStatus::Succeeded)
        .filter(|r| r.reference.as_deref().is_some_and(|x| ours.contains(x)))
        .map(|r| r.amount)
        .sum();
    if refunded != d.amounts.refunded_minor {
        found.push(format!(
            "{name}: we recorded {} refunded, the PSP refunded {refunded}",
            d.amounts.refunded_minor
        ));
    }
    found
}
