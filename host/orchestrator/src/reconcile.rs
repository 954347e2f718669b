//! Reconciliation (issue 14): a connector account's settlement report for a
//! period against our records, item by item.
//!
//! The adapter reads the report (`parse-settlement`, through the runtime's
//! sandbox and bulkhead like every other call), the pure core matches it with
//! our records ([`sluice_core::reconcile`]), the store records the run and its
//! differences, and then each difference is carried out: its one safe repair
//! as an event of evidence `reconciliation` through the door, everything else
//! as a two-person review item (the payment flagged with the difference as
//! its reason). A run is identified by account, period and report digest, so
//! the same report again returns the recorded run and changes nothing; a run
//! interrupted after it was recorded resumes with its open differences only.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use sluice_adapter_runtime::{SettlementLine, SettlementLineType};
use sluice_core::{
    AttemptState, CaptureMode, CaptureState, Difference, EventKind, EvidenceSource,
    FulfillmentState, LineType, Money, OurAction, OurAttempt, OurFulfillment, OurRecords,
    PaymentEvent, PspLine, RefundState, SafeRepair,
};
use sluice_store::{
    Applied, ApplyEvent, DecisionKind, DifferenceFilter, EventTarget, NewDifference,
    NewReconciliationRun, PaymentAttempt, PaymentDetails, PendingKind, Provenance,
    ReconciliationRun, Resolution, RunKey, StoredDifference,
};

use crate::{Orchestrator, OrchestratorError};

/// The largest report accepted, in bytes.
pub const MAX_REPORT_BYTES: usize = 8 * 1024 * 1024;
/// The most lines a report may have.
pub const MAX_REPORT_LINES: usize = 50_000;
/// The most payments of ours one run reads for its period.
pub const MAX_RUN_PAYMENTS: i64 = 20_000;
/// The longest period one run may cover (92 days, in milliseconds).
pub const MAX_PERIOD_MS: i64 = 92 * 24 * 3600 * 1000;
/// How many differences are carried out per page read from the store.
const PAGE: i64 = 200;

/// A report to reconcile.
#[derive(Debug, Clone)]
pub struct ReconcileRequest {
    pub connector_account_id: String,
    /// `[period_start, period_end)`, Unix milliseconds.
    pub period_start: i64,
    pub period_end: i64,
    pub report: Vec<u8>,
    /// Who asked (an admin token's holder, the CLI): recorded in history.
    pub actor: String,
}

/// What a reconciliation call did.
#[derive(Debug, Clone)]
pub struct Reconciled {
    pub run: ReconciliationRun,
    /// False when the same report was reconciled before: nothing was done.
    pub created: bool,
}

/// Our records of the period, and where each came from.
struct OurSide {
    records: OurRecords,
    /// Attempt, refund and capture references → (payment id, kind, row id).
    rows: BTreeMap<String, (String, PendingKind, String)>,
    /// Our records as evidence, by reference.
    evidence: BTreeMap<String, serde_json::Value>,
}

impl Orchestrator {
    /// Reconcile one account's report for a period (see the module doc).
    pub async fn reconcile(
        &self,
        request: ReconcileRequest,
    ) -> Result<Reconciled, OrchestratorError> {
        check_request(&request)?;
        let key = RunKey {
            connector_account_id: request.connector_account_id.clone(),
            period_start: request.period_start,
            period_end: request.period_end,
            report_digest: format!("sha256:{}", hex::encode(Sha256::digest(&request.report))),
        };
        if let Some(run) = self.store().reconciliation_run_for(&key).await? {
            if run.status == sluice_store::RunStatus::Completed {
                return Ok(Reconciled {
                    run,
                    created: false,
                });
            }
        }
        let connector = self.connector(&request.connector_account_id).await?;
        let lines = self.read_report(&connector, request.report).await?;
        let ours = self.our_side(&key, &lines).await?;
        let found = sluice_core::reconcile(&ours.records, &lines);
        let new = NewReconciliationRun {
            connector_account_id: key.connector_account_id.clone(),
            adapter: connector.adapter.identity().name.clone(),
            period_start: key.period_start,
            period_end: key.period_end,
            report_digest: key.report_digest.clone(),
            line_count: lines.len() as i64,
            matched_lines: found.matched_lines as i64,
            ignored_lines: found.ignored_lines as i64,
            differences: found
                .differences
                .iter()
                .map(|d| recorded(d, &ours, &lines))
                .collect(),
        };
        let (run, created) = self.store().record_reconciliation_run(&new).await?;
        let provenance = Provenance::actor(&request.actor);
        self.carry_out_run(&run, &lines, &provenance).await?;
        let run = self
            .store()
            .complete_reconciliation_run(&run.id)
            .await?
            .ok_or_else(|| OrchestratorError::NotFound {
                entity: "reconciliation run",
                id: run.id.clone(),
            })?;
        Ok(Reconciled { run, created })
    }

    /// The adapter's reading of the report, within the line cap.
    async fn read_report(
        &self,
        connector: &crate::call::Connector,
        report: Vec<u8>,
    ) -> Result<Vec<PspLine>, OrchestratorError> {
        let shadow_input = connector.shadow.as_ref().map(|_| report.clone());
        let parsed = connector
            .adapter
            .parse_settlement(&connector.scope, report)
            .await?;
        if let (Some(tap), Some(input)) = (&connector.shadow, shadow_input) {
            tap.repeat_parse_settlement(connector, input, &parsed);
        }
        let lines = parsed.map_err(|failure| {
            OrchestratorError::InvalidRequest(format!(
                "the adapter could not read the report: {} ({})",
                failure.code, failure.message
            ))
        })?;
        if lines.len() > MAX_REPORT_LINES {
            return Err(OrchestratorError::InvalidRequest(format!(
                "the report has {} lines; at most {MAX_REPORT_LINES} are accepted",
                lines.len()
            )));
        }
        Ok(lines.into_iter().map(psp_line).collect())
    }

    /// Our records of the account for the period, plus the records outside
    /// it that a line names by our reference.
    async fn our_side(
        &self,
        key: &RunKey,
        lines: &[PspLine],
    ) -> Result<OurSide, OrchestratorError> {
        let store = self.store();
        let mut ids = store
            .reconciliation_payment_ids(
                &key.connector_account_id,
                key.period_start,
                key.period_end,
                MAX_RUN_PAYMENTS + 1,
            )
            .await?;
        if ids.len() as i64 > MAX_RUN_PAYMENTS {
            return Err(OrchestratorError::InvalidRequest(format!(
                "the period holds more than {MAX_RUN_PAYMENTS} payments of the account; reconcile a shorter period"
            )));
        }
        for reference in lines.iter().filter_map(|l| l.attempt_reference.as_ref()) {
            if let Ok(attempt) = store.get_attempt_by_reference(reference).await {
                if attempt.connector_account_id == key.connector_account_id
                    && !ids.contains(&attempt.payment_id)
                {
                    ids.push(attempt.payment_id);
                }
            }
        }
        let mut side = OurSide {
            records: OurRecords::default(),
            rows: BTreeMap::new(),
            evidence: BTreeMap::new(),
        };
        for id in ids {
            let details = store.payment_details(None, &id).await?;
            let chargebacks = store.chargebacked_attempts(&id).await?;
            add_payment(&mut side, &details, &chargebacks, key);
        }
        Ok(side)
    }

    /// Carry out every open difference of a run, a page at a time.
    async fn carry_out_run(
        &self,
        run: &ReconciliationRun,
        lines: &[PspLine],
        provenance: &Provenance,
    ) -> Result<(), OrchestratorError> {
        let mut after = None;
        loop {
            let filter = DifferenceFilter {
                resolved: Some(false),
                after_seq: after,
                limit: PAGE,
                ..Default::default()
            };
            let page = self
                .store()
                .reconciliation_differences(&run.id, &filter)
                .await?;
            for diff in page.iter().filter(|d| d.resolution == Resolution::Open) {
                self.carry_out(run, diff, lines, provenance).await?;
            }
            match page.last() {
                Some(last) if page.len() as i64 == PAGE => after = Some(last.seq),
                _ => return Ok(()),
            }
        }
    }

    /// One difference: its safe repair through the door, else a review.
    async fn carry_out(
        &self,
        run: &ReconciliationRun,
        diff: &StoredDifference,
        lines: &[PspLine],
        provenance: &Provenance,
    ) -> Result<(), OrchestratorError> {
        let repair = diff
            .repair
            .clone()
            .and_then(|r| serde_json::from_value::<SafeRepair>(r).ok());
        if let Some(repair) = repair {
            let line = diff
                .psp
                .get(0)
                .and_then(|l| l.get("line_id"))
                .and_then(|l| l.as_str());
            let line = lines.iter().find(|l| Some(l.line_id.as_str()) == line);
            if let Some(line) = line {
                let applied = self.repair(run, &repair, line, provenance).await?;
                if matches!(
                    applied.decision,
                    DecisionKind::Applied | DecisionKind::IgnoredDuplicate
                ) {
                    let detail = format!("{}: {}", applied.decision.as_str(), applied.reason);
                    let history = applied.history_ids.first().copied();
                    self.store()
                        .resolve_reconciliation_difference(
                            &diff.id,
                            Resolution::Repaired,
                            &detail,
                            history,
                        )
                        .await?;
                    return Ok(());
                }
            }
        }
        self.review(run, diff, provenance).await
    }

    /// The safe repair: the outcome the report proves, as an event of
    /// evidence `reconciliation` on the aggregate our own reference names
    /// (read from this account's records), with the report line as evidence.
    async fn repair(
        &self,
        run: &ReconciliationRun,
        repair: &SafeRepair,
        line: &PspLine,
        provenance: &Provenance,
    ) -> Result<Applied, OrchestratorError> {
        let (kind, target) = match repair {
            SafeRepair::AttemptSucceeded { attempt_reference } => (
                EventKind::PaymentSucceeded,
                EventTarget::Attempt(attempt_reference.clone()),
            ),
            SafeRepair::RefundSucceeded { refund_reference } => (
                EventKind::RefundSucceeded,
                EventTarget::Refund(refund_reference.clone()),
            ),
            SafeRepair::CaptureSucceeded { capture_reference } => (
                EventKind::PaymentCaptured,
                EventTarget::Capture(capture_reference.clone()),
            ),
        };
        let amount = sluice_core::Currency::parse(&line.currency)
            .ok()
            .map(|currency| Money {
                amount_minor: line.gross_minor.saturating_abs(),
                currency,
            });
        let event = PaymentEvent {
            attempt_reference: line.attempt_reference.clone(),
            action_reference: line.action_reference.clone(),
            psp_reference: line.psp_reference.clone(),
            psp_payment_reference: line.psp_payment_reference.clone(),
            amount,
            // The report line is the evidence: the run's digest and the line's id.
            provider_event_id: Some(format!("settlement:{}:{}", run.report_digest, line.line_id)),
            raw_status: line.status.clone(),
            ..PaymentEvent::new(kind, EvidenceSource::Reconciliation)
        };
        self.apply(ApplyEvent::new(target, event, provenance.clone()))
            .await
    }

    /// Everything without a safe repair: flag the payment for two-person
    /// review with the difference as the reason. A difference with no record
    /// of ours stays on the run for an operator (there is nothing to flag).
    async fn review(
        &self,
        run: &ReconciliationRun,
        diff: &StoredDifference,
        provenance: &Provenance,
    ) -> Result<(), OrchestratorError> {
        let subject = diff
            .action_reference
            .as_ref()
            .or(diff.attempt_reference.as_ref());
        let row = diff.ours.get("row").and_then(|r| r.as_object());
        let (kind, id) = match row {
            Some(row) => (
                row.get("kind").and_then(|k| k.as_str()),
                row.get("id").and_then(|i| i.as_str()),
            ),
            None => (None, None),
        };
        let Some((kind, id)) = kind.and_then(pending_kind).zip(id) else {
            let detail = "no record of ours: the difference itself is the review item";
            self.store()
                .resolve_reconciliation_difference(&diff.id, Resolution::InReview, detail, None)
                .await?;
            return Ok(());
        };
        let reason = format!(
            "reconciliation run {}: {} on {} (difference {})",
            run.id,
            diff.class,
            subject.map(String::as_str).unwrap_or("-"),
            diff.id
        );
        let flagged = self
            .store()
            .flag_reconciliation_review(kind, id, &reason, provenance)
            .await?;
        let detail = format!("{}: {}", flagged.decision.as_str(), flagged.reason);
        let history = flagged.history_ids.first().copied();
        self.store()
            .resolve_reconciliation_difference(&diff.id, Resolution::InReview, &detail, history)
            .await?;
        Ok(())
    }
}

fn pending_kind(text: &str) -> Option<PendingKind> {
    match text {
        "attempt" => Some(PendingKind::Attempt),
        "refund" => Some(PendingKind::Refund),
        "capture" => Some(PendingKind::Capture),
        _ => None,
    }
}

/// Refuse what no run can be made of, before anything is read or written.
fn check_request(request: &ReconcileRequest) -> Result<(), OrchestratorError> {
    let invalid = |m: String| Err(OrchestratorError::InvalidRequest(m));
    if request.report.is_empty() {
        return invalid("the report is empty".into());
    }
    if request.report.len() > MAX_REPORT_BYTES {
        return invalid(format!(
            "the report is larger than {MAX_REPORT_BYTES} bytes"
        ));
    }
    if request.period_start < 0 || request.period_start >= request.period_end {
        return invalid("period_start must be before period_end (Unix milliseconds)".into());
    }
    if request.period_end - request.period_start > MAX_PERIOD_MS {
        return invalid(format!(
            "a period may cover at most {MAX_PERIOD_MS} ms (92 days)"
        ));
    }
    Ok(())
}

fn psp_line(line: SettlementLine) -> PspLine {
    let line_type = match line.line_type {
        SettlementLineType::Payment => LineType::Payment,
        SettlementLineType::Capture => LineType::Capture,
        SettlementLineType::Refund => LineType::Refund,
        SettlementLineType::Chargeback => LineType::Chargeback,
        SettlementLineType::Fee => LineType::Fee,
        SettlementLineType::Payout => LineType::Payout,
        SettlementLineType::Other => LineType::Other,
    };
    PspLine {
        line_type,
        attempt_reference: line.attempt_reference,
        action_reference: line.action_reference,
        psp_reference: line.psp_reference,
        psp_payment_reference: line.psp_payment_reference,
        line_id: line.line_id,
        gross_minor: line.gross_minor,
        net_minor: line.net_minor,
        currency: line.currency,
        status: line.status,
        booked_at_unix_millis: line.booked_at_unix_millis,
    }
}

/// One payment's attempts at this account, their refunds and captures, and
/// its fulfillment, into our side.
fn add_payment(side: &mut OurSide, details: &PaymentDetails, chargebacks: &[String], key: &RunKey) {
    let in_period = |at: i64| at >= key.period_start && at < key.period_end;
    let order = &details.order;
    let mine = details
        .attempts
        .iter()
        .filter(|a| a.connector_account_id == key.connector_account_id);
    for attempt in mine {
        let ours = our_attempt(details, attempt, chargebacks, in_period(attempt.created_at));
        let evidence = attempt_evidence(order, attempt, &ours);
        side.records.attempts.push(ours);
        let id = &attempt.id;
        note(
            side,
            &attempt.reference,
            &order.id,
            PendingKind::Attempt,
            id,
            evidence,
        );
        add_actions(side, details, attempt, key);
    }
    let fulfillment = &order.fulfillment;
    if let Some(state) = fulfillment
        .state
        .as_deref()
        .and_then(FulfillmentState::parse)
    {
        side.records.fulfillments.push(OurFulfillment {
            payment_id: order.id.clone(),
            state,
            attributed_attempt: fulfillment.attempt_reference.clone(),
        });
    }
}

/// The refunds and captures of one attempt into our side.
fn add_actions(
    side: &mut OurSide,
    details: &PaymentDetails,
    attempt: &PaymentAttempt,
    key: &RunKey,
) {
    for r in details
        .refunds
        .iter()
        .filter(|r| r.attempt_id == attempt.id)
    {
        let row = ActionRow {
            kind: PendingKind::Refund,
            id: &r.id,
            reference: &r.reference,
            psp_reference: &r.psp_reference,
            state: (r.state, r.state.as_str()),
            amount: r.amount,
            created_at: r.created_at,
        };
        let action = add_action(side, attempt, key, row);
        side.records.refunds.push(action);
    }
    for c in details
        .captures
        .iter()
        .filter(|c| c.attempt_id == attempt.id)
    {
        let row = ActionRow {
            kind: PendingKind::Capture,
            id: &c.id,
            reference: &c.reference,
            psp_reference: &c.psp_reference,
            state: (c.state, c.state.as_str()),
            amount: c.amount,
            created_at: c.created_at,
        };
        let action = add_action(side, attempt, key, row);
        side.records.captures.push(action);
    }
}

/// One refund or capture of ours, as the matcher and the evidence read it.
struct ActionRow<'a, S> {
    kind: PendingKind,
    id: &'a str,
    reference: &'a str,
    psp_reference: &'a Option<String>,
    /// The state and its stored name.
    state: (S, &'static str),
    amount: Money,
    created_at: i64,
}

/// Notes the row as evidence of our side; the action the matcher gets.
fn add_action<S>(
    side: &mut OurSide,
    attempt: &PaymentAttempt,
    key: &RunKey,
    row: ActionRow<'_, S>,
) -> OurAction<S> {
    let (state, state_name) = row.state;
    let action = our_action(
        row.reference.to_owned(),
        row.psp_reference,
        attempt,
        state,
        row.amount,
    );
    let record = Action {
        kind: match row.kind {
            PendingKind::Refund => "refund",
            _ => "capture",
        },
        id: row.id,
        state: state_name,
        action: &action,
    };
    let evidence = record.evidence(&attempt.payment_id);
    note(
        side,
        row.reference,
        &attempt.payment_id,
        row.kind,
        row.id,
        evidence,
    );
    OurAction {
        in_period: (key.period_start..key.period_end).contains(&row.created_at),
        ..action
    }
}

fn our_action<S>(
    reference: String,
    psp_reference: &Option<String>,
    attempt: &PaymentAttempt,
    state: S,
    amount: Money,
) -> OurAction<S> {
    OurAction {
        reference,
        attempt_reference: attempt.reference.clone(),
        psp_reference: psp_reference.clone(),
        state,
        amount,
        in_period: false,
    }
}

/// Our attempt as evidence: states, references and amounts only (no card
/// data, no secret).
fn attempt_evidence(
    order: &sluice_store::PaymentOrder,
    attempt: &PaymentAttempt,
    ours: &OurAttempt,
) -> serde_json::Value {
    serde_json::json!({
        "row": { "kind": "attempt", "id": attempt.id },
        "payment_id": order.id,
        "reference": attempt.reference,
        "psp_reference": attempt.psp_reference,
        "state": attempt.state.as_str(),
        "amount_minor": attempt.amount.amount_minor,
        "currency": attempt.amount.currency.as_str(),
        "captured_minor": ours.captured_minor,
        "refunded_minor": ours.refunded_minor,
        "order_state": order.state.as_str(),
    })
}

/// An attempt as the matcher sees it: what it captured (a sale its amount, a
/// manual capture its succeeded captures) and what was refunded of it.
fn our_attempt(
    details: &PaymentDetails,
    attempt: &PaymentAttempt,
    chargebacks: &[String],
    in_period: bool,
) -> OurAttempt {
    let captured: i64 = details
        .captures
        .iter()
        .filter(|c| c.attempt_id == attempt.id && c.state == CaptureState::Succeeded)
        .map(|c| c.amount.amount_minor)
        .sum();
    let refunded: i64 = details
        .refunds
        .iter()
        .filter(|r| r.attempt_id == attempt.id && r.state == RefundState::Succeeded)
        .map(|r| r.amount.amount_minor)
        .sum();
    let sale =
        attempt.capture_mode == CaptureMode::Automatic && attempt.state == AttemptState::Succeeded;
    OurAttempt {
        payment_id: attempt.payment_id.clone(),
        reference: attempt.reference.clone(),
        psp_reference: attempt.psp_reference.clone(),
        state: attempt.state,
        amount: attempt.amount,
        captured_minor: if sale {
            attempt.amount.amount_minor
        } else {
            captured
        },
        refunded_minor: refunded,
        chargeback_recorded: chargebacks.contains(&attempt.id),
        in_period,
    }
}

/// A refund or capture of ours, for its evidence.
struct Action<'a, S> {
    kind: &'static str,
    id: &'a str,
    state: &'static str,
    action: &'a OurAction<S>,
}

impl<S> Action<'_, S> {
    /// States, references and amounts only: no card data, no secret.
    fn evidence(&self, payment_id: &str) -> serde_json::Value {
        serde_json::json!({
            "row": { "kind": self.kind, "id": self.id },
            "payment_id": payment_id,
            "reference": self.action.reference,
            "attempt_reference": self.action.attempt_reference,
            "psp_reference": self.action.psp_reference,
            "state": self.state,
            "amount_minor": self.action.amount.amount_minor,
            "currency": self.action.amount.currency.as_str(),
        })
    }
}

fn note(
    side: &mut OurSide,
    reference: &str,
    payment_id: &str,
    kind: PendingKind,
    id: &str,
    evidence: serde_json::Value,
) {
    side.rows.insert(
        reference.to_owned(),
        (payment_id.to_owned(), kind, id.to_owned()),
    );
    side.evidence.insert(reference.to_owned(), evidence);
}

/// A difference as recorded: both sides' records as evidence. Our side is
/// the record its action (else attempt) reference names; the PSP's, the lines.
fn recorded(diff: &Difference, ours: &OurSide, lines: &[PspLine]) -> NewDifference {
    let subject = diff
        .action_reference
        .as_ref()
        .or(diff.attempt_reference.as_ref());
    let known = subject.filter(|s| ours.rows.contains_key(*s));
    let psp: Vec<&PspLine> = diff
        .line_ids
        .iter()
        .filter_map(|id| lines.iter().find(|l| &l.line_id == id))
        .collect();
    NewDifference {
        class: diff.class.as_str().to_owned(),
        attempt_reference: diff.attempt_reference.clone(),
        action_reference: diff.action_reference.clone(),
        psp_reference: diff.psp_reference.clone(),
        payment_id: known
            .and_then(|s| ours.rows.get(s))
            .map(|(payment, _, _)| payment.clone()),
        amount_minor: diff.amount_minor,
        currency: diff.currency.clone(),
        ours: known
            .and_then(|s| ours.evidence.get(s))
            .cloned()
            .unwrap_or(serde_json::Value::Null),
        psp: serde_json::to_value(&psp).unwrap_or(serde_json::Value::Null),
        repair: diff
            .repair
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok()),
    }
}
