//! The workload: what merchants, customers, the PSP and time do in one step.
//! Each step draws its choices from the world's generator, runs the real
//! gateway code under the crash guard, and writes one trace line with the
//! outcome in world-local names.

use std::future::Future;

use sluice_core::{CaptureMode, Currency, Money};
use sluice_delivery::DeliveryError;
use sluice_orchestrator::{ConfirmOptions, CreatePayment, OrchestratorError};
use sluice_sandbox_psp::PayStatus;
use sluice_store::PendingKind;

use crate::kills::CatchKilled;
use crate::merchants::report_line;
use crate::world::{KeyedOp, SimFulfillment, SimPayment, World, HONEST};
use crate::SimError;

/// One step of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Create,
    Confirm,
    Capture,
    Void,
    Refund,
    RetryKeyed,
    CustomerAction,
    Settle,
    DeliverWebhooks,
    ProcessInbox,
    Scan,
    Advance,
    Forge,
    Publish,
    Crash,
    ConfirmFulfillment,
    Review,
    Race,
}

/// How often each step is drawn (weights).
const STEPS: &[(u64, Step)] = &[
    (14, Step::Create),
    (4, Step::Confirm),
    (6, Step::Capture),
    (3, Step::Void),
    (9, Step::Refund),
    (4, Step::RetryKeyed),
    (4, Step::CustomerAction),
    (4, Step::Settle),
    (12, Step::DeliverWebhooks),
    (10, Step::ProcessInbox),
    (8, Step::Scan),
    (12, Step::Advance),
    (3, Step::Forge),
    (6, Step::Publish),
    (1, Step::Crash),
    (6, Step::ConfirmFulfillment),
    (4, Step::Review),
    (4, Step::Race),
];

/// Payment method tokens and how often customers use them.
const TOKENS: &[(u64, &str)] = &[
    (60, "pm_card_visa"),
    (8, "pm_card_chargeDeclined"),
    (5, "pm_card_insufficient_funds"),
    (10, "pm_card_threeDSecureRequired"),
    (10, "pm_sluice_late_webhook_only"),
    (4, "pm_sluice_garbage"),
];

impl World {
    /// Draws and runs one workload step.
    pub async fn step(&mut self) -> Result<(), SimError> {
        self.switch_instance();
        let step = self.rng.weighted(STEPS).unwrap_or(Step::Advance);
        match step {
            Step::Create => self.create().await,
            Step::Confirm => self.confirm().await,
            Step::Capture => self.capture().await,
            Step::Void => self.void().await,
            Step::Refund => self.refund().await,
            Step::RetryKeyed => self.retry_keyed().await,
            Step::CustomerAction => self.customer_action(),
            Step::Settle => self.settle(),
            Step::DeliverWebhooks => self.deliver_webhooks(false).await,
            Step::ProcessInbox => self.process_inbox().await,
            Step::Scan => self.scan().await,
            Step::Advance => {
                self.advance_time();
                Ok(())
            }
            Step::Forge => self.forge().await,
            Step::Publish => self.publish().await.map(|_| ()),
            Step::Crash => {
                self.trace.line("step crash between two steps");
                self.restart().await
            }
            Step::ConfirmFulfillment => self.confirm_fulfillment().await,
            Step::Review => self.review().await,
            // A race needs two instances; with one, a refund as any other.
            Step::Race if self.other.is_none() => self.refund().await,
            Step::Race => self.race().await,
        }
    }

    /// Runs `op` on the live incarnation; None when the process was killed
    /// in the middle (then the world has already restarted). The kill switch
    /// is looked at first: once it is thrown nothing of the dead process
    /// runs again, not even to read a join error of the task that died.
    pub async fn guarded<T>(&mut self, op: impl Future<Output = T>) -> Result<Option<T>, SimError> {
        let crash = self.gw.crash.clone();
        let armed = self.armed.arm();
        let outcome = tokio::select! {
            biased;
            _ = crash.killed() => None,
            out = CatchKilled::new(op) => out,
        };
        drop(armed);
        if outcome.is_none() || crash.is_dead() {
            self.restart().await?;
            return Ok(None);
        }
        Ok(outcome)
    }

    async fn create(&mut self) -> Result<(), SimError> {
        let tenant = self.rng.below(HONEST as u64) as usize;
        let accounts = self.tenants[tenant].accounts.clone();
        let Some(account) = self.rng.pick(&accounts).cloned() else {
            return Ok(());
        };
        let name = format!("{}{}", self.tenants[tenant].name, self.payments.len());
        let token = self.rng.weighted(TOKENS).unwrap_or("pm_card_visa");
        let manual = self.rng.chance(350);
        let amount = self.rng.between(100, 5_000);
        let fulfillment = self.draw_fulfillment(tenant, &name);
        let params = create_params(&name, amount, manual, token, &account.id)?;
        let params = CreatePayment {
            fulfillment: fulfillment
                .as_ref()
                .map(store_fulfillment)
                .unwrap_or_default(),
            ..params
        };
        let merchant = self.tenants[tenant].merchant_id.clone();
        let orch = self.gw.orch.clone();
        // A client retry of the create (same order number) after a crash.
        let retries = if self.rng.chance(150) { 2 } else { 1 };
        for round in 0..retries {
            let outcome = self
                .guarded(orch_create(&orch, &merchant, params.clone()))
                .await?;
            let line = match &outcome {
                None => "killed".to_owned(),
                Some(Ok((payment_id, state))) => {
                    if !self.payments.iter().any(|p| &p.payment_id == payment_id) {
                        self.payments.push(SimPayment {
                            name: name.clone(),
                            tenant,
                            payment_id: payment_id.clone(),
                            keys: Vec::new(),
                            fulfillment: fulfillment.clone(),
                        });
                    }
                    // The id is in the trace (and its hash): the replay and
                    // the SQLite comparison then check that ids come from
                    // the seed, not from the wall clock or the OS.
                    format!("{payment_id} {state}")
                }
                Some(Err(error)) => error_label(error),
            };
            let goal = fulfillment.as_ref().map_or_else(String::new, |f| {
                format!(
                    " {} goal {} deadline in {} ms",
                    f.mode,
                    f.biz_key,
                    f.deadline_ms - self.now_ms()
                )
            });
            self.trace.line(format!(
                "step create {name} {} {amount} {} {token}{goal} try {round} -> {line}",
                self.account_label(&account.id),
                if manual { "manual" } else { "auto" }
            ));
        }
        Ok(())
    }

    /// The merchant confirms a payment again (after a decline, or a client
    /// that never saw the first answer), maybe with new card details and
    /// on another of its accounts.
    async fn confirm(&mut self) -> Result<(), SimError> {
        let Some((payment, merchant)) = self.pick_payment() else {
            return Ok(());
        };
        let accounts = self.tenants[payment.tenant].accounts.clone();
        let Some(account) = self.rng.pick(&accounts).cloned() else {
            return Ok(());
        };
        let token = self.rng.weighted(TOKENS).unwrap_or("pm_card_visa");
        let options = ConfirmOptions {
            connector_account_id: Some(account.id.clone()),
            payment_method_token: Some(token.to_owned()),
            ..ConfirmOptions::default()
        };
        let orch = self.gw.orch.clone();
        let id = payment.payment_id.clone();
        let line = self
            .guarded(async {
                orch.confirm(&merchant, &id, &options).await.map(|v| {
                    let attempt = v
                        .details
                        .attempts
                        .last()
                        .map(|a| a.state.as_str())
                        .unwrap_or("-");
                    format!("{} {attempt}", v.details.order.state.as_str())
                })
            })
            .await?
            .map(outcome_label);
        self.trace.line(format!(
            "step confirm {} {} {token} -> {}",
            payment.name,
            self.account_label(&account.id),
            line.unwrap_or_else(|| "killed".into())
        ));
        Ok(())
    }

    /// A payment of an honest tenant, and its merchant.
    fn pick_payment(&self) -> Option<(SimPayment, String)> {
        let payment = self.rng.pick(&self.payments)?.clone();
        let merchant = self.tenants[payment.tenant].merchant_id.clone();
        Some((payment, merchant))
    }

    async fn capture(&mut self) -> Result<(), SimError> {
        let Some((payment, merchant)) = self.pick_payment() else {
            return Ok(());
        };
        let amount = self.rng.between(1, 2_500);
        let key = format!("cap-{}-{}", payment.name, payment.keys.len());
        self.remember_key(&payment, KeyedOp::Capture, &key, amount);
        self.keyed(KeyedOp::Capture, &payment, &merchant, &key, amount)
            .await
    }

    async fn refund(&mut self) -> Result<(), SimError> {
        let Some((payment, merchant)) = self.pick_payment() else {
            return Ok(());
        };
        let amount = self.rng.between(1, 3_000);
        let key = format!("rfd-{}-{}", payment.name, payment.keys.len());
        self.remember_key(&payment, KeyedOp::Refund, &key, amount);
        self.keyed(KeyedOp::Refund, &payment, &merchant, &key, amount)
            .await?;
        // Two refunds racing: a second, different request right behind.
        if self.rng.chance(250) {
            let key = format!("rfd-{}-{}b", payment.name, payment.keys.len());
            self.remember_key(&payment, KeyedOp::Refund, &key, amount);
            self.keyed(KeyedOp::Refund, &payment, &merchant, &key, amount)
                .await?;
        }
        Ok(())
    }

    /// A client that got no answer sends the same request with the same key.
    async fn retry_keyed(&mut self) -> Result<(), SimError> {
        let keyed: Vec<(SimPayment, KeyedOp, String, i64)> = self
            .payments
            .iter()
            .flat_map(|p| {
                p.keys
                    .iter()
                    .map(move |(op, k, a)| (p.clone(), *op, k.clone(), *a))
            })
            .collect();
        let Some((payment, op, key, amount)) = self.rng.pick(&keyed).cloned() else {
            return Ok(());
        };
        let merchant = self.tenants[payment.tenant].merchant_id.clone();
        self.keyed(op, &payment, &merchant, &key, amount).await
    }

    pub(crate) fn remember_key(
        &mut self,
        payment: &SimPayment,
        op: KeyedOp,
        key: &str,
        amount: i64,
    ) {
        if let Some(p) = self
            .payments
            .iter_mut()
            .find(|p| p.payment_id == payment.payment_id)
        {
            p.keys.push((op, key.to_owned(), amount));
        }
    }

    async fn keyed(
        &mut self,
        op: KeyedOp,
        payment: &SimPayment,
        merchant: &str,
        key: &str,
        amount: i64,
    ) -> Result<(), SimError> {
        let orch = self.gw.orch.clone();
        let money = eur(amount)?;
        let id = payment.payment_id.clone();
        let line = match op {
            KeyedOp::Capture => self
                .guarded(async {
                    orch.capture_keyed(merchant, &id, Some(money), Some(key))
                        .await
                        .map(|v| v.capture.state.as_str().to_owned())
                })
                .await?
                .map(outcome_label),
            KeyedOp::Refund => self
                .guarded(async {
                    orch.refund_keyed(merchant, &id, Some(money), None, Some(key))
                        .await
                        .map(|v| v.refund.state.as_str().to_owned())
                })
                .await?
                .map(outcome_label),
        };
        self.trace.line(format!(
            "step {op:?} {} {key} {amount} -> {}",
            payment.name,
            line.unwrap_or_else(|| "killed".into())
        ));
        Ok(())
    }

    async fn void(&mut self) -> Result<(), SimError> {
        let Some((payment, merchant)) = self.pick_payment() else {
            return Ok(());
        };
        let orch = self.gw.orch.clone();
        let id = payment.payment_id.clone();
        let line = self
            .guarded(async {
                orch.void(&merchant, &id)
                    .await
                    .map(|v| v.details.order.state.as_str().to_owned())
            })
            .await?
            .map(outcome_label);
        self.trace.line(format!(
            "step void {} -> {}",
            payment.name,
            line.unwrap_or_else(|| "killed".into())
        ));
        Ok(())
    }

    /// A customer finishes (or fails) a 3-D Secure step at the PSP.
    fn customer_action(&mut self) -> Result<(), SimError> {
        let waiting: Vec<String> = self
            .sandbox
            .payments()
            .into_iter()
            .filter(|p| p.status == PayStatus::RequiresAction)
            .map(|p| p.id)
            .collect();
        if let Some(id) = self.rng.pick(&waiting).cloned() {
            let authenticated = self.rng.chance(800);
            self.sandbox.complete_action(&id, authenticated);
            self.trace
                .line(format!("step customer {id} authenticated={authenticated}"));
        }
        self.collect_webhooks();
        Ok(())
    }

    /// The PSP settles what was pending (late payments, pending refunds).
    pub fn settle(&mut self) -> Result<(), SimError> {
        let settled = self.sandbox.settle_pending();
        self.trace.line(format!("step psp settles {settled}"));
        self.collect_webhooks();
        Ok(())
    }

    /// Moves what the PSP sent into the network.
    pub fn collect_webhooks(&mut self) {
        self.in_flight.extend(self.sandbox.take_webhooks());
    }

    pub async fn process_inbox(&mut self) -> Result<(), SimError> {
        let orch = self.gw.orch.clone();
        let outcome = self.guarded(orch.process_inbox_once()).await?;
        let line = match outcome {
            None => "killed".to_owned(),
            Some(Ok(round)) => format!(
                "claimed {} applied {} retried {} quarantined {}",
                round.claimed, round.applied, round.retried, round.quarantined
            ),
            Some(Err(error)) => error_label(&error),
        };
        self.trace.line(format!("step inbox -> {line}"));
        Ok(())
    }

    /// One pass of the outbox publisher (fan-out, then the merchants'
    /// webhooks); true when it did anything. A kill after a merchant's 2xx
    /// and before the mark restarts the gateway.
    pub async fn publish(&mut self) -> Result<bool, SimError> {
        let publisher = self.gw.publisher.clone();
        let outcome = self.guarded(publisher.publish_once()).await?;
        let (line, busy) = match outcome {
            None => ("killed".to_owned(), false),
            Some(Ok(report)) => (report_line(&report), report.did_work()),
            // Killed after a merchant's 2xx and before the mark (the hook
            // threw the incarnation's kill switch, which `guarded` may see
            // first: either way the same line).
            Some(Err(DeliveryError::SimulatedCrash { .. })) => {
                self.trace.line("step publish -> killed");
                self.restart().await?;
                return Ok(false);
            }
            // Its text names store-minted ids, which stay out of the trace.
            Some(Err(error)) => {
                tracing::debug!(%error, "publisher pass failed");
                ("error".to_owned(), false)
            }
        };
        self.trace.line(format!("step publish -> {line}"));
        Ok(busy)
    }

    /// One recovery pass over everything due, in the order rows were created.
    pub async fn scan(&mut self) -> Result<(), SimError> {
        let due = self.due_rows().await?;
        for (kind, id) in due {
            let scanner = self.gw.scanner.clone();
            let outcome = self.guarded(scanner.recover_one(kind, &id)).await?;
            let line = match outcome {
                None => "killed".to_owned(),
                Some(Ok(outcome)) => format!("{outcome:?}"),
                Some(Err(error)) => format!("error {}", scanner_error_label(&error)),
            };
            // Store ids are minted by the store, not by the seed: they stay
            // out of the trace, and the outcome says what happened.
            self.trace.line(format!("step scan {kind:?} -> {line}"));
            if line == "killed" {
                return Ok(());
            }
        }
        self.scan_fulfillments().await
    }

    /// The pending rows due now, oldest first.
    pub async fn due_rows(&self) -> Result<Vec<(PendingKind, String)>, SimError> {
        let store = &self.gw.store;
        let now = self.now_ms();
        let mut rows: Vec<(i64, PendingKind, String)> = Vec::new();
        for a in store.due_attempts(now, 500, None).await? {
            rows.push((a.created_at, PendingKind::Attempt, a.id));
        }
        for c in store.due_captures(now, 500, None).await? {
            rows.push((c.created_at, PendingKind::Capture, c.id));
        }
        for r in store.due_refunds(now, 500, None).await? {
            rows.push((r.created_at, PendingKind::Refund, r.id));
        }
        // Created in this order; ids break ties the way they were minted.
        rows.sort_by(|a, b| (a.0, &a.2).cmp(&(b.0, &b.2)));
        Ok(rows.into_iter().map(|(_, kind, id)| (kind, id)).collect())
    }

    /// Time moves: a little, to the next due timer, or a long way.
    pub fn advance_time(&mut self) {
        let by = match self.rng.below(10) {
            0..=4 => self.rng.between(1, 5_000),
            5..=7 => self.rng.between(5_000, 120_000),
            8 => self.rng.between(120_000, 6 * 3_600_000),
            _ => self.rng.between(6 * 3_600_000, 3 * 86_400_000),
        };
        self.clock.advance(by);
        self.trace.line(format!("step time +{by} ms"));
    }
}

async fn orch_create(
    orch: &sluice_orchestrator::Orchestrator,
    merchant: &str,
    params: CreatePayment,
) -> Result<(String, String), OrchestratorError> {
    let created = orch.create_payment(merchant, params).await?;
    let view = created.view;
    let attempt = view
        .details
        .attempts
        .last()
        .map(|a| a.state.as_str())
        .unwrap_or("-");
    Ok((
        view.details.order.id.clone(),
        format!("{} {attempt}", view.details.order.state.as_str()),
    ))
}

fn create_params(
    name: &str,
    amount: i64,
    manual: bool,
    token: &str,
    account: &str,
) -> Result<CreatePayment, SimError> {
    Ok(CreatePayment {
        merchant_order_no: name.to_owned(),
        amount: eur(amount)?,
        capture_mode: if manual {
            CaptureMode::Manual
        } else {
            CaptureMode::Automatic
        },
        payment_method_token: Some(token.to_owned()),
        return_url: Some("https://shop.example/return".into()),
        description: None,
        metadata: serde_json::json!({}),
        fulfillment: Default::default(),
        confirm: Some(ConfirmOptions {
            connector_account_id: Some(account.to_owned()),
            ..ConfirmOptions::default()
        }),
    })
}

/// The block the merchant API would store for `f`.
fn store_fulfillment(f: &SimFulfillment) -> sluice_store::Fulfillment {
    sluice_store::Fulfillment {
        biz_key: Some(f.biz_key.clone()),
        deadline: Some(f.deadline_ms),
        mode: Some(f.mode.as_str().to_owned()),
        ..Default::default()
    }
}

pub fn eur(amount: i64) -> Result<Money, SimError> {
    let currency = Currency::parse("EUR").map_err(|e| SimError::Setup(e.to_string()))?;
    Money::positive(amount, currency).map_err(|e| SimError::Setup(e.to_string()))
}

pub(crate) fn outcome_label(outcome: Result<String, OrchestratorError>) -> String {
    match outcome {
        Ok(state) => state,
        Err(error) => error_label(&error),
    }
}

/// The error's kind without ids (ids are not part of what a seed determines).
pub fn error_label(error: &OrchestratorError) -> String {
    let kind = match error {
        OrchestratorError::NotFound { .. } => "not_found",
        OrchestratorError::OutOfScope(_) => "out_of_scope",
        OrchestratorError::Conflict(_) => "conflict",
        OrchestratorError::AttemptInFlight { .. } => "attempt_in_flight",
        OrchestratorError::InvalidState(_) => "invalid_state",
        OrchestratorError::InsufficientRefundable { .. } => "insufficient_refundable",
        OrchestratorError::InsufficientCapturable { .. } => "insufficient_capturable",
        OrchestratorError::InvalidRequest(_) => "invalid_request",
        OrchestratorError::Route(_) => "route",
        OrchestratorError::OrderNoConflict { .. } => "order_no_conflict",
        OrchestratorError::AdapterNotLoaded(_) => "adapter_not_loaded",
        OrchestratorError::Adapter(_) => "adapter",
        OrchestratorError::Busy(_) => "busy",
        OrchestratorError::FulfillmentRefused(_) => "fulfillment_refused",
        _ => "other",
    };
    format!("error {kind}")
}

pub(crate) fn scanner_error_label(error: &sluice_scanner::ScannerError) -> &'static str {
    match error {
        sluice_scanner::ScannerError::Orchestrator(e) => match e {
            OrchestratorError::Busy(_) => "busy",
            OrchestratorError::NotFound { .. } => "not_found",
            _ => "orchestrator",
        },
        _ => "other",
    }
}
