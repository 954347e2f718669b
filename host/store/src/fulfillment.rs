//! The fulfillment door (issue 7): every change of a payment's fulfillment
//! lifecycle is a decision of `sluice_core::decide_fulfillment`, applied here
//! in one transaction:
//!
//! 1. read the order row and its fulfillment columns, plus the attempt
//!    references of every payment of the same merchant and `biz_key`;
//! 2. the core decides;
//! 3. CAS `WHERE id = ? AND fulfillment_version = ?` on the order (an
//!    unapplied decision confirms the version without changing it), bumping
//!    the payment version too;
//! 4. bookkeeping effects in the same transaction: bind the attempt, schedule
//!    the next check (`fulfillment_next_check_at`), record the review reason,
//!    and reserve + create the compensation refund (`reserve.rs`);
//! 5. append a history row (aggregate `order`, event kind `FULFILLMENT_*`,
//!    from/to the fulfillment states) for every decision, applied or not;
//! 6. write the `fulfillment.*` outbox events.
//!
//! The payment door calls [`fulfillment_in`] inside its own transaction when
//! a payment with a fulfillment block succeeds and when a compensation
//! refund reaches a definitive outcome, so neither can be lost between two
//! transactions. Call, query and refund-sending effects are for the caller,
//! after commit, from the persisted row.

use crate::db::{int, opt_int, opt_text, Conn};
use crate::door::{Step, MAX_CAS_TRIES};
use crate::history::{self, NewHistory, Provenance};
use crate::ids::At;
use crate::outbox::{self, NewOutboxEvent};
use crate::payments::{amounts_in, order_in, PaymentOrder, Refund};
use crate::reserve::reserve_compensation_in;
use crate::{Store, StoreError};
use sluice_core::{
    decide_fulfillment, guard_compensation, Compensation, CompensationReason, FulfillmentDecision,
    FulfillmentEffect, FulfillmentEvent, FulfillmentInput, FulfillmentMode, FulfillmentPolicy,
    FulfillmentSnapshot, FulfillmentState, ReviewReason,
};
use sqlx::Row;

/// What the fulfillment door did.
#[derive(Debug, Clone, PartialEq)]
pub struct FulfillmentApplied {
    pub payment_id: String,
    pub merchant_id: String,
    /// The core's decision, as taken on the snapshot that committed.
    pub decision: FulfillmentDecision,
    pub from_state: FulfillmentState,
    pub to_state: FulfillmentState,
    /// The fulfillment version after the decision.
    pub version: i64,
    /// The snapshot after the decision (what the row now holds).
    pub snapshot: FulfillmentSnapshot,
    pub history_id: i64,
    pub outbox_event_ids: Vec<String>,
    /// The compensation refund this decision created, if any (CREATED, not
    /// sent yet: the caller sends it through the orchestrator's refund path).
    pub compensation_refund: Option<Refund>,
    /// The decision calls for the contradiction alert (a metric).
    pub alert: bool,
    pub tries: u32,
}

impl FulfillmentApplied {
    /// The effects the caller performs after commit (calls, queries).
    pub fn effects(&self) -> &[FulfillmentEffect] {
        self.decision.effects()
    }
}

/// A payment whose fulfillment wants a wake-up (scanner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueFulfillment {
    pub payment_id: String,
    pub merchant_id: String,
    pub state: String,
    pub next_check_at: i64,
}

/// Pull mode: where and how a merchant's business is asked.
#[derive(Clone, PartialEq, Eq)]
pub struct FulfillmentEndpoint {
    pub merchant_id: String,
    pub url: String,
    /// Signs the calls, like an outgoing webhook endpoint's secret.
    pub secret: String,
    pub timeout_ms: i64,
}

/// `Debug` never shows the secret.
impl std::fmt::Debug for FulfillmentEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FulfillmentEndpoint")
            .field("merchant_id", &self.merchant_id)
            .field("url", &self.url)
            .field("secret", &"<redacted>")
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

/// The stored fulfillment columns of an order.
#[derive(Debug, Clone)]
struct Record {
    version: i64,
    state: Option<String>,
    attempt_reference: Option<String>,
    checks: i64,
    next_check_at: Option<i64>,
    compensation_refund_reference: Option<String>,
    compensation_reason: Option<String>,
    review_json: Option<String>,
}

const RECORD_COLS: &str = "fulfillment_version, fulfillment_state, fulfillment_attempt_reference, \
    fulfillment_checks, fulfillment_next_check_at, compensation_refund_reference, \
    compensation_reason, fulfillment_review_json";

async fn record_in(tx: &mut Conn, payment_id: &str) -> Result<Record, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {RECORD_COLS} FROM payment_orders WHERE id = $1"
    ))
    .bind(payment_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| StoreError::not_found("payment", payment_id))?;
    Ok(Record {
        version: int(&row, "fulfillment_version")?,
        state: opt_text(&row, "fulfillment_state")?,
        attempt_reference: opt_text(&row, "fulfillment_attempt_reference")?,
        checks: int(&row, "fulfillment_checks")?,
        next_check_at: opt_int(&row, "fulfillment_next_check_at")?,
        compensation_refund_reference: opt_text(&row, "compensation_refund_reference")?,
        compensation_reason: opt_text(&row, "compensation_reason")?,
        review_json: opt_text(&row, "fulfillment_review_json")?,
    })
}

/// Every attempt reference minted for the same business goal of the same
/// merchant, except `ours`.
async fn sibling_references(
    tx: &mut Conn,
    order: &PaymentOrder,
    biz_key: &str,
    ours: Option<&str>,
) -> Result<Vec<String>, StoreError> {
    let rows = sqlx::query(
        "SELECT a.reference FROM payment_attempts a \
         JOIN payment_orders o ON o.id = a.payment_id \
         WHERE o.merchant_id = $1 AND o.biz_key = $2 ORDER BY a.reference",
    )
    .bind(&order.merchant_id)
    .bind(biz_key)
    .fetch_all(&mut *tx)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let reference: String = row.try_get("reference")?;
        if Some(reference.as_str()) != ours {
            out.push(reference);
        }
    }
    Ok(out)
}

fn corrupt(detail: String) -> StoreError {
    StoreError::corrupt("payment_orders", detail)
}

/// The core's snapshot of an order's fulfillment, or None without a block.
async fn snapshot_in(
    tx: &mut Conn,
    order: &PaymentOrder,
    input: &FulfillmentInput,
) -> Result<Option<(FulfillmentSnapshot, Record)>, StoreError> {
    let f = &order.fulfillment;
    let (Some(biz_key), Some(deadline), Some(mode)) = (&f.biz_key, f.deadline, &f.mode) else {
        return Ok(None);
    };
    let mode = FulfillmentMode::parse(mode)
        .ok_or_else(|| corrupt(format!("fulfillment_mode {mode:?}")))?;
    let record = record_in(tx, &order.id).await?;
    let state = match record.state.as_deref() {
        None => FulfillmentState::PendingPayment,
        Some(text) => FulfillmentState::parse(text)
            .ok_or_else(|| corrupt(format!("fulfillment_state {text:?}")))?,
    };
    // Ours is the bound attempt, or the one that is succeeding right now.
    let ours = record.attempt_reference.as_deref().or(match input {
        FulfillmentInput::PaymentSucceeded { attempt_reference } => Some(attempt_reference),
        _ => None,
    });
    let sibling_references = sibling_references(tx, order, biz_key, ours).await?;
    let compensation = match (
        &record.compensation_refund_reference,
        &record.compensation_reason,
    ) {
        (Some(refund_reference), Some(reason)) => Some(Compensation {
            refund_reference: refund_reference.clone(),
            reason: CompensationReason::parse(reason)
                .ok_or_else(|| corrupt(format!("compensation_reason {reason:?}")))?,
        }),
        _ => None,
    };
    let review = record
        .review_json
        .as_deref()
        .map(serde_json::from_str::<ReviewReason>)
        .transpose()
        .map_err(|e| corrupt(format!("fulfillment_review_json: {e}")))?;
    let snapshot = FulfillmentSnapshot {
        state,
        version: record.version,
        mode,
        biz_key: biz_key.clone(),
        deadline_ms: deadline,
        attempt_reference: record.attempt_reference.clone(),
        sibling_references,
        checks: u32::try_from(record.checks.max(0)).unwrap_or(u32::MAX),
        compensation,
        review,
    };
    Ok(Some((snapshot, record)))
}

/// The history name of an input.
fn input_kind(input: &FulfillmentInput) -> &'static str {
    match input {
        FulfillmentInput::PaymentSucceeded { .. } => "FULFILLMENT_PAYMENT_SUCCEEDED",
        FulfillmentInput::CheckDue => "FULFILLMENT_CHECK_DUE",
        FulfillmentInput::Fact(_) => "FULFILLMENT_FACT",
        FulfillmentInput::PushConfirmation { .. } => "FULFILLMENT_PUSH_CONFIRMATION",
        FulfillmentInput::CompensationRefund { .. } => "FULFILLMENT_COMPENSATION_REFUND",
        FulfillmentInput::Operator(_) => "FULFILLMENT_OPERATOR",
    }
}

/// The history decision column (its CHECK knows no `needs_review`: a
/// contradiction is recorded as `needs_reconciliation`, which it is).
fn history_decision(decision: &FulfillmentDecision) -> &'static str {
    match decision {
        FulfillmentDecision::NeedsReview(_) => "needs_reconciliation",
        other => other.label(),
    }
}

/// Apply one fulfillment input inside the caller's transaction.
/// `bump_payment`: false when the caller (the payment door) already moved
/// the payment version in this transaction.
pub(crate) async fn fulfillment_in(
    tx: &mut Conn,
    payment_id: &str,
    input: &FulfillmentInput,
    provenance: &Provenance,
    policy: &FulfillmentPolicy,
    at: At<'_>,
    bump_payment: bool,
) -> Result<Step<FulfillmentApplied>, StoreError> {
    let decided = decide_in(tx, payment_id, input, policy, at.now).await?;
    if !decided.write_version(tx, bump_payment, at.now).await? {
        return Ok(Step::Retry);
    }
    let compensation_refund = decided.reserve_compensation(tx, provenance, at).await?;
    let history_id = decided.append_history(tx, provenance, at.now).await?;
    let payment_version = decided.order.version + i64::from(decided.applied() && bump_payment);
    let outbox_event_ids = decided.emit(tx, payment_version, at).await?;
    Ok(Step::Done(decided.into_applied(
        history_id,
        outbox_event_ids,
        compensation_refund,
    )))
}

/// One fulfillment decision on its way into the caller's transaction: the
/// row the core saw, its decision, and what the row holds after it.
struct Decided<'a> {
    input: &'a FulfillmentInput,
    order: PaymentOrder,
    record: Record,
    snapshot: FulfillmentSnapshot,
    decision: FulfillmentDecision,
    after: FulfillmentSnapshot,
    new_state: FulfillmentState,
}

/// Steps 1 and 2: read the order's fulfillment, and the core decides (a
/// compensation refund capped by what is still refundable).
async fn decide_in<'a>(
    tx: &mut Conn,
    payment_id: &str,
    input: &'a FulfillmentInput,
    policy: &FulfillmentPolicy,
    now: i64,
) -> Result<Decided<'a>, StoreError> {
    let order = order_in(tx, payment_id).await?;
    let Some((snapshot, record)) = snapshot_in(tx, &order, input).await? else {
        return Err(StoreError::InvalidState {
            entity: "payment",
            id: order.id.clone(),
            state: order.state.to_string(),
            reason: "the payment has no fulfillment block".into(),
        });
    };
    let mut decision = decide_fulfillment(&snapshot, input, now, policy);
    if decision.starts_compensation().is_some() {
        let amounts = amounts_in(tx, &order.id).await?;
        decision = guard_compensation(
            decision,
            amounts.refundable_minor(),
            amounts.refund_reserved_minor,
            amounts.refunded_minor,
        );
    }
    let after = snapshot.applied(&decision);
    let new_state = decision.new_state().unwrap_or(snapshot.state);
    Ok(Decided {
        input,
        order,
        record,
        snapshot,
        decision,
        after,
        new_state,
    })
}

impl Decided<'_> {
    fn applied(&self) -> bool {
        self.decision.is_apply()
    }

    /// When the scanner next wakes this fulfillment up.
    fn next_check_at(&self) -> Option<i64> {
        if !self.applied() {
            return self.record.next_check_at;
        }
        let scheduled = self.decision.effects().iter().find_map(|e| match e {
            FulfillmentEffect::ScheduleCheck { at_ms, .. } => Some(*at_ms),
            _ => None,
        });
        match self.new_state {
            FulfillmentState::AwaitingFulfillment => scheduled.or(self.record.next_check_at),
            // The compensation refund's own recovery drives it from here;
            // terminal and frozen fulfillments are not woken up.
            _ => None,
        }
    }

    /// Step 3: CAS on the fulfillment version, applied or not (an unapplied
    /// decision confirms the version it was taken on). False: it moved.
    async fn write_version(
        &self,
        tx: &mut Conn,
        bump_payment: bool,
        now: i64,
    ) -> Result<bool, StoreError> {
        let rows = if self.applied() {
            self.write_applied(tx, bump_payment, now).await?
        } else {
            sqlx::query(
                "UPDATE payment_orders SET fulfillment_version = fulfillment_version \
                 WHERE id = $1 AND fulfillment_version = $2",
            )
            .bind(&self.order.id)
            .bind(self.snapshot.version)
            .execute(&mut *tx)
            .await?
            .rows_affected()
        };
        Ok(rows == 1)
    }

    async fn write_applied(
        &self,
        tx: &mut Conn,
        bump_payment: bool,
        now: i64,
    ) -> Result<u64, StoreError> {
        let after = &self.after;
        let review_json = after
            .review
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::Unapplicable(format!("review reason: {e}")))?;
        let compensation = after.compensation.as_ref();
        let done = sqlx::query(
            "UPDATE payment_orders SET fulfillment_state = $3, \
                fulfillment_version = fulfillment_version + 1, \
                version = version + $4, updated_at = $5, \
                fulfillment_attempt_reference = $6, fulfillment_checks = $7, \
                fulfillment_next_check_at = $8, compensation_refund_reference = $9, \
                compensation_reason = $10, fulfillment_review_json = $11 \
             WHERE id = $1 AND fulfillment_version = $2",
        )
        .bind(&self.order.id)
        .bind(self.snapshot.version)
        .bind(self.new_state.as_str())
        .bind(i64::from(bump_payment))
        .bind(now)
        .bind(after.attempt_reference.as_deref())
        .bind(i64::from(after.checks))
        .bind(self.next_check_at())
        .bind(compensation.map(|c| c.refund_reference.as_str()))
        .bind(compensation.map(|c| c.reason.as_str()))
        .bind(review_json.as_deref())
        .execute(&mut *tx)
        .await?;
        Ok(done.rows_affected())
    }

    /// Step 4: the compensation refund, reserved in this transaction.
    async fn reserve_compensation(
        &self,
        tx: &mut Conn,
        provenance: &Provenance,
        at: At<'_>,
    ) -> Result<Option<Refund>, StoreError> {
        let mut refund = None;
        for effect in self.decision.effects() {
            if let FulfillmentEffect::StartCompensationRefund {
                refund_reference,
                reason,
            } = effect
            {
                let reservation = reserve_compensation_in(
                    tx,
                    &self.order,
                    refund_reference,
                    reason.as_str(),
                    provenance,
                    at,
                )
                .await?;
                refund = Some(reservation.record);
            }
        }
        Ok(refund)
    }

    /// Step 5: history, for every decision.
    async fn append_history(
        &self,
        tx: &mut Conn,
        provenance: &Provenance,
        now: i64,
    ) -> Result<i64, StoreError> {
        let reason = self.decision.explain();
        // Never panics: a derived Serialize of plain fields cannot fail; were it
        // to, the history row keeps an empty raw input rather than losing the decision.
        let raw_input = serde_json::to_string(self.input).unwrap_or_default();
        let row = NewHistory {
            payment_id: &self.order.id,
            aggregate_type: "order",
            aggregate_id: &self.order.id,
            from_state: Some(self.snapshot.state.as_str()),
            to_state: self.new_state.as_str(),
            from_version: Some(self.snapshot.version),
            to_version: self.after.version,
            event_kind: input_kind(self.input),
            evidence_source: "fulfillment",
            raw_status: Some(&raw_input),
            decision: history_decision(&self.decision),
            reason: &reason,
            provenance: Some(provenance),
            ..NewHistory::default()
        };
        history::append(tx, &row, now).await
    }

    /// Step 6: the `fulfillment.*` events for the merchant.
    async fn emit(
        &self,
        tx: &mut Conn,
        payment_version: i64,
        at: At<'_>,
    ) -> Result<Vec<String>, StoreError> {
        let mut ids = Vec::new();
        for effect in self.decision.effects() {
            let FulfillmentEffect::Emit(event) = effect else {
                continue;
            };
            let new = NewOutboxEvent {
                event_type: event.as_str(),
                payment_id: &self.order.id,
                merchant_id: &self.order.merchant_id,
                aggregate_type: "order",
                aggregate_id: &self.order.id,
                payment_version,
                payload: self.event_payload(*event, payment_version, at.now),
            };
            ids.push(outbox::insert(tx, &new, at).await?);
        }
        Ok(ids)
    }

    fn event_payload(
        &self,
        event: FulfillmentEvent,
        payment_version: i64,
        now: i64,
    ) -> serde_json::Value {
        let (order, after) = (&self.order, &self.after);
        serde_json::json!({
            "type": event.as_str(),
            "payment_id": order.id,
            "merchant_id": order.merchant_id,
            "merchant_order_no": order.merchant_order_no,
            "payment_version": payment_version,
            "order_state": order.state.as_str(),
            "amount_minor": order.amount.amount_minor,
            "currency": order.amount.currency.as_str(),
            "fulfillment": {
                "state": self.new_state.as_str(),
                "version": after.version,
                "biz_key": after.biz_key,
                "deadline": after.deadline_ms,
                "mode": after.mode.as_str(),
                "attempt_reference": after.attempt_reference,
                "compensation": after.compensation.as_ref().map(|c| serde_json::json!({
                    "refund_reference": c.refund_reference,
                    "reason": c.reason.as_str(),
                })),
                "review_reason": after.review.as_ref().map(ToString::to_string),
            },
            "reason": self.decision.explain(),
            "dedupe_key": format!("{}:{}:{}", event.as_str(), order.id, after.version),
            "occurred_at": now,
        })
    }

    fn into_applied(
        self,
        history_id: i64,
        outbox_event_ids: Vec<String>,
        compensation_refund: Option<Refund>,
    ) -> FulfillmentApplied {
        let alert = matches!(self.decision, FulfillmentDecision::NeedsReview(_))
            || self
                .decision
                .effects()
                .contains(&FulfillmentEffect::AlertContradictoryFact);
        FulfillmentApplied {
            payment_id: self.order.id,
            merchant_id: self.order.merchant_id,
            from_state: self.snapshot.state,
            to_state: self.new_state,
            version: self.after.version,
            snapshot: self.after,
            decision: self.decision,
            history_id,
            outbox_event_ids,
            compensation_refund,
            alert,
            tries: 1,
        }
    }
}

/// Inside the payment door: the fulfillment input a just-applied payment
/// decision implies, if any (the payment succeeded; the compensation refund
/// reached a definitive outcome). Returns Retry when the fulfillment moved.
pub(crate) async fn follow_payment_in(
    tx: &mut Conn,
    payment_id: &str,
    input: FulfillmentInput,
    provenance: &Provenance,
    policy: &FulfillmentPolicy,
    at: At<'_>,
) -> Result<Step<Option<FulfillmentApplied>>, StoreError> {
    match fulfillment_in(tx, payment_id, &input, provenance, policy, at, false).await? {
        Step::Done(applied) => {
            log_fulfillment(&applied);
            Ok(Step::Done(Some(applied)))
        }
        Step::Retry => Ok(Step::Retry),
    }
}

/// Whether `refund_reference` is this payment's compensation refund.
pub(crate) async fn is_compensation_refund(
    tx: &mut Conn,
    payment_id: &str,
    refund_reference: &str,
) -> Result<bool, StoreError> {
    let record = record_in(tx, payment_id).await?;
    Ok(record.compensation_refund_reference.as_deref() == Some(refund_reference))
}

fn log_fulfillment(applied: &FulfillmentApplied) {
    tracing::info!(
        payment_id = %applied.payment_id,
        from = %applied.from_state,
        to = %applied.to_state,
        decision = applied.decision.label(),
        reason = %applied.decision.explain(),
        "fulfillment decision"
    );
}

impl Store {
    /// Put one fulfillment input through the fulfillment door (see the
    /// module docs). Refusals are returned as decisions (`Reject`), recorded
    /// in history like every other decision.
    pub async fn apply_fulfillment(
        &self,
        payment_id: &str,
        input: &FulfillmentInput,
        provenance: &Provenance,
    ) -> Result<FulfillmentApplied, StoreError> {
        for tries in 1..=MAX_CAS_TRIES {
            let mut tx = self.begin_write().await?;
            let at = self.at(self.now_ms());
            match fulfillment_in(
                &mut tx,
                payment_id,
                input,
                provenance,
                &self.fulfillment_policy,
                at,
                true,
            )
            .await?
            {
                Step::Done(mut applied) => {
                    self.commit_write(tx).await?;
                    applied.tries = tries;
                    log_fulfillment(&applied);
                    return Ok(applied);
                }
                Step::Retry => {
                    tx.rollback().await?;
                    crate::door::cas_backoff(&self.env, tries).await;
                }
            }
        }
        Err(StoreError::CasExhausted {
            aggregate: "fulfillment",
            id: payment_id.to_owned(),
            tries: MAX_CAS_TRIES,
        })
    }

    /// The fulfillment as the core sees it (None: no fulfillment block).
    pub async fn fulfillment_snapshot(
        &self,
        payment_id: &str,
    ) -> Result<Option<FulfillmentSnapshot>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let order = order_in(&mut tx, payment_id).await?;
        let snapshot = snapshot_in(&mut tx, &order, &FulfillmentInput::CheckDue).await?;
        // A read: no await point (it wrote nothing a kill could cut off).
        tx.commit().await?;
        Ok(snapshot.map(|(s, _)| s))
    }

    /// Fulfillments whose next check has come, oldest first (partial index
    /// `payment_orders_fulfillment_due`).
    pub async fn due_fulfillments(
        &self,
        now: i64,
        limit: i64,
    ) -> Result<Vec<DueFulfillment>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, merchant_id, fulfillment_state, fulfillment_next_check_at \
             FROM payment_orders \
             WHERE fulfillment_next_check_at IS NOT NULL AND fulfillment_next_check_at <= $1 \
             ORDER BY fulfillment_next_check_at, id LIMIT $2",
        )
        .bind(now)
        .bind(limit.clamp(1, 1000))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(DueFulfillment {
                    payment_id: row.try_get("id")?,
                    merchant_id: row.try_get("merchant_id")?,
                    state: opt_text(row, "fulfillment_state")?.unwrap_or_default(),
                    next_check_at: int(row, "fulfillment_next_check_at")?,
                })
            })
            .collect()
    }

    /// Reserve and create the compensation refund of a payment outside the
    /// fulfillment door: the store's own net. It succeeds only when the
    /// fulfillment is `compensating` under the payment's deterministic
    /// reference and the refund does not exist yet; for a `fulfilled`
    /// payment the reservation statement itself refuses.
    pub async fn reserve_compensation_refund(
        &self,
        payment_id: &str,
        provenance: &Provenance,
    ) -> Result<Refund, StoreError> {
        let mut tx = self.begin_write().await?;
        let order = order_in(&mut tx, payment_id).await?;
        let record = record_in(&mut tx, payment_id).await?;
        let reference = sluice_core::compensation_refund_reference(
            record.attempt_reference.as_deref().unwrap_or_default(),
        );
        let reason = record.compensation_reason.clone().unwrap_or_else(|| {
            CompensationReason::FulfillmentDeadlinePassed
                .as_str()
                .into()
        });
        let at = self.at(self.now_ms());
        let reservation =
            reserve_compensation_in(&mut tx, &order, &reference, &reason, provenance, at).await?;
        self.commit_write(tx).await?;
        Ok(reservation.record)
    }

    /// Configure (or replace) a merchant's pull-mode fulfillment endpoint.
    pub async fn set_fulfillment_endpoint(
        &self,
        endpoint: &FulfillmentEndpoint,
    ) -> Result<(), StoreError> {
        let now = self.now_ms();
        let done = sqlx::query(
            "INSERT INTO merchant_fulfillment_endpoints \
                (merchant_id, url, secret, timeout_ms, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $5) \
             ON CONFLICT (merchant_id) DO UPDATE SET url = $2, secret = $3, timeout_ms = $4, \
                updated_at = $5",
        )
        .bind(&endpoint.merchant_id)
        .bind(&endpoint.url)
        .bind(self.seal_secret(
            &crate::secrets::fulfillment_context(&endpoint.merchant_id),
            endpoint.secret.as_bytes(),
        )?)
        .bind(endpoint.timeout_ms)
        .bind(now)
        .execute(&self.writer)
        .await;
        match done {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = StoreError::from(e);
                if e.db_is_fk_violation() {
                    Err(StoreError::not_found("merchant", &endpoint.merchant_id))
                } else {
                    Err(e)
                }
            }
        }
    }

    /// A merchant's pull-mode fulfillment endpoint, if configured.
    pub async fn fulfillment_endpoint(
        &self,
        merchant_id: &str,
    ) -> Result<Option<FulfillmentEndpoint>, StoreError> {
        let row = sqlx::query(
            "SELECT merchant_id, url, secret, timeout_ms FROM merchant_fulfillment_endpoints \
             WHERE merchant_id = $1",
        )
        .bind(merchant_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            let merchant_id: String = row.try_get("merchant_id")?;
            let sealed: String = row.try_get("secret")?;
            let context = crate::secrets::fulfillment_context(&merchant_id);
            Ok(FulfillmentEndpoint {
                secret: self.open_secret_text(&context, &sealed)?,
                merchant_id,
                url: row.try_get("url")?,
                timeout_ms: int(&row, "timeout_ms")?,
            })
        })
        .transpose()
    }
}
