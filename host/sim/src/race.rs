//! Two gateway instances on one database, racing on one payment (issue 12:
//! "sometimes two gateway instances share the database").
//!
//! In a seed with two instances (`World::other`), a race step runs two
//! operations on one payment at once, one on each instance: captures,
//! refunds, a void, a recovery of one of the payment's due rows, a pass of
//! the inbox processor (the PSP's webhooks, maybe about this payment,
//! applied while the other instance reserves or records on it), a pass of
//! the outbox publisher (fan-out and the merchants' webhooks while the other
//! instance writes new events). They take
//! turns ([`crate::kills::Armed::start_race`]): only one runs at a time, and
//! it hands the turn over before a write transaction when the seed says so,
//! so the other instance's writes land between this one's reads and its
//! conditional `UPDATE`s, in an order the seed alone decides. Each instance
//! keeps its own memory (orchestrator, account cache, scanner, publisher).
//! Kills still happen (at the PSP call and the store's await points); a
//! killed instance's turn passes to the other, and it restarts after the
//! race.

use std::future::Future;
use std::pin::Pin;

use sluice_core::OrderState;
use sluice_delivery::Publisher;
use sluice_orchestrator::Orchestrator;
use sluice_scanner::Scanner;
use sluice_store::PendingKind;

use crate::kills::{Armed, CatchKilled};
use crate::merchants::report_line;
use crate::net::Crash;
use crate::ops::{error_label, eur, outcome_label, scanner_error_label};
use crate::world::{KeyedOp, SimPayment, World};
use crate::SimError;

/// One side of a race.
#[derive(Debug, Clone)]
enum RaceOp {
    Keyed(KeyedOp, String, i64),
    Void,
    Recover(PendingKind, String),
    Inbox,
    Publish,
}

impl RaceOp {
    fn label(&self) -> String {
        match self {
            RaceOp::Keyed(op, key, amount) => format!("{op:?} {key} {amount}"),
            RaceOp::Void => "void".to_owned(),
            RaceOp::Recover(kind, _) => format!("recover {kind:?}"),
            RaceOp::Inbox => "inbox".to_owned(),
            RaceOp::Publish => "publish".to_owned(),
        }
    }
}

/// What one instance runs: its handles, taken before the race.
struct Side {
    serial: u64,
    crash: Crash,
    orch: Orchestrator,
    scanner: Scanner,
    publisher: Publisher,
}

type Outcome = Pin<Box<dyn Future<Output = String>>>;

impl World {
    /// Two operations on one payment, one on each instance, at once.
    pub async fn race(&mut self) -> Result<(), SimError> {
        let Some(other) = self.other.as_ref() else {
            return Ok(());
        };
        let [a, b] = [side(&self.gw), side(other)];
        let Some(payment) = self.race_payment().await? else {
            return Ok(());
        };
        let id = payment.payment_id.clone();
        let state = self.gw.store.get_payment(None, &id).await?.state;
        let first = self.race_op(&payment, state).await?;
        let second = self.race_op(&payment, state).await?;
        let merchant = self.tenants[payment.tenant].merchant_id.clone();
        let labels = [first.label(), second.label()];
        let (fa, fb) = (
            run(&a, &merchant, &id, first),
            run(&b, &merchant, &id, second),
        );
        self.armed.start_race(a.serial, b.serial);
        let armed = self.armed.arm();
        let outcomes = tokio::join!(
            racer(&self.armed, a.serial, a.crash.clone(), fa),
            racer(&self.armed, b.serial, b.crash.clone(), fb),
        );
        drop(armed);
        self.armed.end_race();
        let outcomes = [outcomes.0, outcomes.1];
        for ((side, label), out) in [&a, &b].into_iter().zip(labels).zip(outcomes) {
            self.trace.line(format!(
                "step race {} on instance {}: {label} -> {}",
                payment.name,
                side.serial,
                out.unwrap_or_else(|| "killed".to_owned())
            ));
        }
        if a.crash.is_dead() {
            self.restart().await?;
        }
        if b.crash.is_dead() {
            self.restart_other().await?;
        }
        Ok(())
    }

    /// A payment that has money to move (authorized or succeeded), else any.
    async fn race_payment(&mut self) -> Result<Option<SimPayment>, SimError> {
        let mut moving = Vec::new();
        for payment in &self.payments {
            let order = self.gw.store.get_payment(None, &payment.payment_id).await?;
            if matches!(order.state, OrderState::Authorized | OrderState::Succeeded) {
                moving.push(payment.clone());
            }
        }
        let pool = if moving.is_empty() {
            &self.payments
        } else {
            &moving
        };
        Ok(self.rng.pick(pool).cloned())
    }

    /// Draws one side's operation on `payment` (a keyed request is
    /// remembered like any other: the invariants count it as asked for).
    async fn race_op(
        &mut self,
        payment: &SimPayment,
        state: OrderState,
    ) -> Result<RaceOp, SimError> {
        // What the payment's state allows, mostly; now and then anything,
        // or one of the background workers.
        let draw = self.rng.below(12);
        let op = match (state, draw) {
            (_, 0) => KeyedOp::Refund,
            (_, 1) => KeyedOp::Capture,
            (_, 2) => return Ok(RaceOp::Void),
            (_, 10) => {
                // What the PSP sent arrives first, so the processor has
                // events (maybe about this payment) to apply in the race.
                self.deliver_webhooks(false).await?;
                return Ok(RaceOp::Inbox);
            }
            (_, 11) => return Ok(RaceOp::Publish),
            (OrderState::Authorized, 3..=6) => KeyedOp::Capture,
            (OrderState::Authorized, 7) => return Ok(RaceOp::Void),
            (OrderState::Succeeded, 3..=7) => KeyedOp::Refund,
            _ => {
                let due = self.due_rows().await?;
                let mine: Vec<(PendingKind, String)> = self.rows_of(payment, due).await?;
                if let Some((kind, id)) = self.rng.pick(&mine).cloned() {
                    return Ok(RaceOp::Recover(kind, id));
                }
                KeyedOp::Refund
            }
        };
        let keys = self
            .payments
            .iter()
            .find(|p| p.payment_id == payment.payment_id)
            .map_or(0, |p| p.keys.len());
        let (prefix, amount) = match op {
            KeyedOp::Capture => ("cap", self.rng.between(1, 2_500)),
            KeyedOp::Refund => ("rfd", self.rng.between(1, 3_000)),
        };
        let key = format!("{prefix}-{}-{keys}r", payment.name);
        self.remember_key(payment, op, &key, amount);
        Ok(RaceOp::Keyed(op, key, amount))
    }

    /// The due rows that belong to `payment`.
    async fn rows_of(
        &self,
        payment: &SimPayment,
        due: Vec<(PendingKind, String)>,
    ) -> Result<Vec<(PendingKind, String)>, SimError> {
        let d = self
            .gw
            .store
            .payment_details(None, &payment.payment_id)
            .await?;
        let ids: std::collections::BTreeSet<&str> = d
            .attempts
            .iter()
            .map(|a| a.id.as_str())
            .chain(d.captures.iter().map(|c| c.id.as_str()))
            .chain(d.refunds.iter().map(|r| r.id.as_str()))
            .collect();
        Ok(due
            .into_iter()
            .filter(|(_, id)| ids.contains(id.as_str()))
            .collect())
    }
}

fn side(gw: &crate::world::Incarnation) -> Side {
    Side {
        serial: gw.serial,
        crash: gw.crash.clone(),
        orch: gw.orch.clone(),
        scanner: gw.scanner.clone(),
        publisher: gw.publisher.clone(),
    }
}

/// One racer: waits for its first turn, runs to its end or its death, and
/// hands the turn to the other for good.
async fn racer(armed: &Armed, serial: u64, crash: Crash, op: Outcome) -> Option<String> {
    armed.turn_of(serial).await;
    let out = tokio::select! {
        biased;
        _ = crash.killed() => None,
        out = CatchKilled::new(op) => out,
    };
    armed.finish(serial);
    out
}

/// The operation as a future of its outcome's label, on `side`'s instance.
fn run(side: &Side, merchant: &str, payment_id: &str, op: RaceOp) -> Outcome {
    let (orch, scanner, publisher) = (
        side.orch.clone(),
        side.scanner.clone(),
        side.publisher.clone(),
    );
    let (merchant, payment_id) = (merchant.to_owned(), payment_id.to_owned());
    Box::pin(async move {
        match op {
            RaceOp::Keyed(KeyedOp::Capture, key, amount) => {
                let money = match eur(amount) {
                    Ok(money) => money,
                    Err(error) => return error.to_string(),
                };
                outcome_label(
                    orch.capture_keyed(&merchant, &payment_id, Some(money), Some(&key))
                        .await
                        .map(|v| v.capture.state.as_str().to_owned()),
                )
            }
            RaceOp::Keyed(KeyedOp::Refund, key, amount) => {
                let money = match eur(amount) {
                    Ok(money) => money,
                    Err(error) => return error.to_string(),
                };
                outcome_label(
                    orch.refund_keyed(&merchant, &payment_id, Some(money), None, Some(&key))
                        .await
                        .map(|v| v.refund.state.as_str().to_owned()),
                )
            }
            RaceOp::Void => outcome_label(
                orch.void(&merchant, &payment_id)
                    .await
                    .map(|v| v.details.order.state.as_str().to_owned()),
            ),
            RaceOp::Recover(kind, id) => match scanner.recover_one(kind, &id).await {
                Ok(outcome) => format!("{outcome:?}"),
                Err(error) => format!("error {}", scanner_error_label(&error)),
            },
            RaceOp::Inbox => match orch.process_inbox_once().await {
                Ok(round) => format!(
                    "claimed {} applied {} retried {} quarantined {}",
                    round.claimed, round.applied, round.retried, round.quarantined
                ),
                Err(error) => error_label(&error),
            },
            // A kill after a merchant's 2xx throws the instance's kill
            // switch: the racer sees it and the instance restarts after the
            // race. Other errors name store-minted ids: kept out of the trace.
            RaceOp::Publish => match publisher.publish_once().await {
                Ok(report) => report_line(&report),
                Err(_) => "error".to_owned(),
            },
        }
    })
}
