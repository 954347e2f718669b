//! Reservations: a refund or capture first reserves its amount with ONE
//! conditional UPDATE, before any PSP call. Only if that update touched a row
//! is the refund or capture row inserted, in the same transaction, with its
//! history row and outbox event. Settling and releasing happen later through
//! the door, when the PSP's answer arrives (success settles, definitive
//! failure releases, unknown keeps the reservation).

use crate::db::Conn;
use crate::history::{self, NewHistory, Provenance};
use crate::ids::{self, At};
use crate::outbox::{self, NewOutboxEvent};
use crate::payments::{
    amounts_in, attempt_from, capture_from, order_and_amounts_in, refund_from, Capture,
    PaymentAmounts, PaymentAttempt, PaymentOrder, Refund, ATTEMPT_COLS, CAPTURE_COLS, REFUND_COLS,
};
use crate::{Store, StoreError};
use sluice_core::{
    request_capture, request_refund, AmountError, AttemptState, CaptureState, Money, RefundState,
    RequestRefused,
};
use sqlx::Row;

/// A merchant's refund request.
#[derive(Debug, Clone)]
pub struct RefundRequest {
    pub payment_id: String,
    /// Scope the request to this merchant (client requests); None for internal callers.
    pub merchant_id: Option<String>,
    pub amount: Money,
    pub reason: Option<String>,
    /// The merchant's `Idempotency-Key`, if the request carried one: the
    /// refund reference is then derived from it and the payment
    /// ([`crate::keyed_refund_reference`]), so a replay finds this refund
    /// instead of reserving a second one. Without a key the reference is
    /// minted (and persisted with the reservation, before any PSP call).
    pub idempotency_key: Option<String>,
}

/// A merchant's capture request (manual capture).
#[derive(Debug, Clone)]
pub struct CaptureRequest {
    pub payment_id: String,
    pub merchant_id: Option<String>,
    pub amount: Money,
    /// As [`RefundRequest::idempotency_key`], for the capture reference.
    pub idempotency_key: Option<String>,
}

/// A committed reservation and the row it created.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation<T> {
    pub record: T,
    pub payment_version: i64,
    pub history_id: i64,
    pub outbox_event_id: String,
    /// A replay of a keyed request found the reservation its first run made
    /// (history and outbox ids are that run's); nothing new was reserved.
    pub replayed: bool,
}

/// Outbox event types of the reservation commands (not PSP outcomes, so
/// not in the core's `OutboxEvent`).
pub const REFUND_REQUESTED: &str = "refund.requested";
pub const CAPTURE_REQUESTED: &str = "capture.requested";

impl Store {
    /// Reserve `amount` of a succeeded payment for a refund and create the
    /// refund (state CREATED) with a stable reference for the PSP call. A
    /// keyed request that was reserved before returns that reservation.
    pub async fn reserve_refund(
        &self,
        request: &RefundRequest,
        provenance: &Provenance,
    ) -> Result<Reservation<Refund>, StoreError> {
        let mut tx = self.begin_write().await?;
        let reservation = self.reserve_refund_in(&mut tx, request, provenance).await?;
        self.commit_write(tx).await?;
        tracing::info!(payment_id = %reservation.record.payment_id, refund_id = %reservation.record.id,
            amount = reservation.record.amount.amount_minor, replayed = reservation.replayed,
            "refund reserved");
        Ok(reservation)
    }

    /// [`Store::reserve_refund`] inside the caller's transaction (an approved
    /// manual refund reserves in the approval's transaction). On an error the
    /// caller must roll back.
    pub(crate) async fn reserve_refund_in(
        &self,
        tx: &mut crate::db::Conn,
        request: &RefundRequest,
        provenance: &Provenance,
    ) -> Result<Reservation<Refund>, StoreError> {
        let (order, amounts) =
            scoped_order(tx, &request.payment_id, request.merchant_id.as_deref()).await?;
        let reference = match &request.idempotency_key {
            Some(key) => ids::keyed_refund_reference(&order.id, key),
            None => ids::refund_reference(&self.env),
        };
        // Only a keyed request can be a replay: a minted reference is new.
        let existing = if request.idempotency_key.is_some() {
            by_reference(tx, REFUND_TABLE, &reference, refund_from).await?
        } else {
            None
        };
        if let Some(existing) = existing {
            let same = existing.payment_id == order.id
                && existing.amount == request.amount
                && existing.reason == request.reason;
            let creation = creation_of(tx, &order.id, "refund", &existing.id, same).await?;
            return Ok(Reservation::replay(existing, &order, creation));
        }
        request_refund(&order.snapshot(&amounts)?, request.amount)
            .map_err(|e| refused(&order, &amounts, e))?;
        let attempt = succeeded_attempt(tx, &order).await?;
        let now = self.now_ms();
        // Lock order: the payment row first, as the door does, so a reservation
        // and a concurrent decision on the same payment cannot deadlock.
        let payment_version = bump_payment_version(tx, &order.id, now).await?;
        reserve_amount(tx, Reserve::Refund, &order.id, request.amount.amount_minor).await?;
        // In the recovery scan set from the start: if this process dies
        // before the first PSP call records anything, the scanner sends it
        // (same reference) instead of leaving the money reserved.
        let refund = created_refund(
            &order.id,
            &attempt,
            reference,
            request.amount,
            request.reason.clone(),
            now.saturating_add(self.query_delay_ms),
            self.at(now),
        );
        insert_refund(tx, &refund).await.map_err(raced)?;
        let reason = format!(
            "refund of {} reserved before any PSP call (refundable was {})",
            refund.amount.amount_minor,
            amounts.refundable_minor()
        );
        let (history_id, outbox_event_id) = record_creation(
            tx,
            Creation {
                order: &order,
                aggregate_type: "refund",
                aggregate_id: &refund.id,
                reference: &refund.reference,
                state: refund.state.as_str(),
                amount: refund.amount,
                event_kind: "COMMAND_REFUND",
                event_type: REFUND_REQUESTED,
                reason: &reason,
                payment_version,
                provenance,
            },
            self.at(now),
        )
        .await?;
        Ok(Reservation {
            record: refund,
            payment_version,
            history_id,
            outbox_event_id,
            replayed: false,
        })
    }

    /// Reserve `amount` of an authorization for a capture and create the
    /// capture (state CREATED) with a stable reference for the PSP call. A
    /// keyed request that was reserved before returns that reservation.
    pub async fn reserve_capture(
        &self,
        request: &CaptureRequest,
        provenance: &Provenance,
    ) -> Result<Reservation<Capture>, StoreError> {
        let mut tx = self.begin_write().await?;
        let (order, amounts) =
            scoped_order(&mut tx, &request.payment_id, request.merchant_id.as_deref()).await?;
        let reference = match &request.idempotency_key {
            Some(key) => ids::keyed_capture_reference(&order.id, key),
            None => ids::capture_reference(&self.env),
        };
        let existing = if request.idempotency_key.is_some() {
            by_reference(&mut tx, CAPTURE_TABLE, &reference, capture_from).await?
        } else {
            None
        };
        if let Some(existing) = existing {
            let same = existing.payment_id == order.id && existing.amount == request.amount;
            let creation = creation_of(&mut tx, &order.id, "capture", &existing.id, same).await?;
            self.commit_write(tx).await?;
            return Ok(Reservation::replay(existing, &order, creation));
        }
        let attempt = latest_live_attempt(&mut tx, &order).await?;
        request_capture(
            &order.snapshot(&amounts)?,
            &attempt.snapshot(),
            request.amount,
        )
        .map_err(|e| refused(&order, &amounts, e))?;
        let amount = request.amount.amount_minor;
        let now = self.now_ms();
        // Payment row first (see `reserve_refund`).
        let at = self.at(now);
        let payment_version = bump_payment_version(&mut tx, &order.id, now).await?;
        reserve_amount(&mut tx, Reserve::Capture, &order.id, amount).await?;
        let capture = created_capture(&attempt, reference, request.amount, at, self.query_delay_ms);
        insert_capture(&mut tx, &capture).await.map_err(raced)?;
        let reason = format!(
            "capture of {amount} reserved before any PSP call (capturable was {})",
            amounts.capturable_minor()
        );
        let (history_id, outbox_event_id) = record_creation(
            &mut tx,
            Creation {
                order: &order,
                aggregate_type: "capture",
                aggregate_id: &capture.id,
                reference: &capture.reference,
                state: capture.state.as_str(),
                amount: capture.amount,
                event_kind: "COMMAND_CAPTURE",
                event_type: CAPTURE_REQUESTED,
                reason: &reason,
                payment_version,
                provenance,
            },
            at,
        )
        .await?;
        self.commit_write(tx).await?;
        tracing::info!(payment_id = %order.id, capture_id = %capture.id, amount, "capture reserved");
        Ok(Reservation {
            record: capture,
            payment_version,
            history_id,
            outbox_event_id,
            replayed: false,
        })
    }
}

/// Which reservation column a conditional UPDATE moves.
#[derive(Clone, Copy)]
enum Reserve {
    Refund,
    Capture,
}

/// The one conditional UPDATE that decides who gets the money: it reserves
/// `amount` only if it fits in what is left; otherwise nothing changes and
/// the error names what was available.
async fn reserve_amount(
    tx: &mut Conn,
    what: Reserve,
    payment_id: &str,
    amount: i64,
) -> Result<(), StoreError> {
    let sql = match what {
        Reserve::Refund => {
            "UPDATE payment_amounts SET refund_reserved_minor = refund_reserved_minor + $2 \
             WHERE payment_id = $1 AND captured_minor - refunded_minor - refund_reserved_minor >= $2"
        }
        Reserve::Capture => {
            "UPDATE payment_amounts SET capture_reserved_minor = capture_reserved_minor + $2 \
             WHERE payment_id = $1 \
               AND authorized_minor - captured_minor - capture_reserved_minor >= $2"
        }
    };
    let reserved = sqlx::query(sql)
        .bind(payment_id)
        .bind(amount)
        .execute(&mut *tx)
        .await?;
    if reserved.rows_affected() > 0 {
        return Ok(());
    }
    let now_amounts = amounts_in(tx, payment_id).await?;
    Err(match what {
        Reserve::Refund => StoreError::InsufficientRefundable {
            requested: amount,
            available: now_amounts.refundable_minor(),
        },
        Reserve::Capture => StoreError::InsufficientCapturable {
            requested: amount,
            available: now_amounts.capturable_minor(),
        },
    })
}

/// Two runs of one keyed request at once (a retry took the key over while
/// the first still ran): the second finds the reference taken by the first's
/// commit. Its transaction rolls back, nothing is reserved twice, and a
/// retry replays the first's reservation.
fn raced(error: StoreError) -> StoreError {
    if error.is_unique_violation() {
        StoreError::Conflict(
            "a concurrent run of this request reserved it first; retry to see its result".into(),
        )
    } else {
        error
    }
}

const REFUND_TABLE: (&str, &str) = ("refunds", REFUND_COLS);
const CAPTURE_TABLE: (&str, &str) = ("captures", CAPTURE_COLS);

/// The refund or capture holding `reference`, if any.
async fn by_reference<T>(
    tx: &mut Conn,
    (table, cols): (&str, &str),
    reference: &str,
    from: fn(&sqlx::any::AnyRow) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let row = sqlx::query(&format!("SELECT {cols} FROM {table} WHERE reference = $1"))
        .bind(reference)
        .fetch_optional(&mut *tx)
        .await?;
    row.as_ref().map(from).transpose()
}

/// The history row and outbox event that created a refund or capture: what
/// a replay of its keyed request answers with. The same key with other
/// parameters (`same` false) is refused.
async fn creation_of(
    tx: &mut Conn,
    payment_id: &str,
    aggregate_type: &str,
    aggregate_id: &str,
    same: bool,
) -> Result<(i64, String), StoreError> {
    if !same {
        return Err(StoreError::IdempotencyMismatch);
    }
    // Both by the payment first: its history and its events are what the
    // indexes `(payment_id, id)` and `(partition_key, seq)` cover.
    let history = sqlx::query(
        "SELECT id FROM state_history WHERE payment_id = $1 AND aggregate_type = $2 \
           AND aggregate_id = $3 AND evidence_source = 'command' ORDER BY id LIMIT 1",
    )
    .bind(payment_id)
    .bind(aggregate_type)
    .bind(aggregate_id)
    .fetch_one(&mut *tx)
    .await?;
    let outbox = sqlx::query(
        "SELECT event_id FROM outbox WHERE partition_key = $1 AND aggregate_type = $2 \
         AND aggregate_id = $3 ORDER BY seq LIMIT 1",
    )
    .bind(payment_id)
    .bind(aggregate_type)
    .bind(aggregate_id)
    .fetch_one(&mut *tx)
    .await?;
    tracing::info!(
        aggregate_type,
        aggregate_id,
        "keyed request replayed: same reservation"
    );
    Ok((history.try_get("id")?, outbox.try_get("event_id")?))
}

impl<T> Reservation<T> {
    /// A replay: the first run's reservation, nothing new reserved or recorded.
    fn replay(
        record: T,
        order: &PaymentOrder,
        (history_id, outbox_event_id): (i64, String),
    ) -> Self {
        Reservation {
            record,
            payment_version: order.version,
            history_id,
            outbox_event_id,
            replayed: true,
        }
    }
}

/// Reserve the whole refundable amount of a payment for its compensation
/// refund and create the refund (CREATED, due for the scanner at once) under
/// the deterministic `refund_reference`, inside the caller's transaction.
///
/// The reservation is the same conditional UPDATE as every refund's, with
/// the fulfillment guard in the statement itself: it only reserves while the
/// order is `compensating` under exactly this reference, so it refuses a
/// `fulfilled` order (or any other state) whatever the caller believed. A
/// refusal changes nothing and is an error.
pub(crate) async fn reserve_compensation_in(
    tx: &mut Conn,
    order: &PaymentOrder,
    refund_reference: &str,
    reason: &str,
    provenance: &Provenance,
    at: At<'_>,
) -> Result<Reservation<Refund>, StoreError> {
    let now = at.now;
    let amounts = amounts_in(tx, &order.id).await?;
    let amount = amounts.refundable_minor();
    let attempt = succeeded_attempt(tx, order).await?;
    let payment_version = bump_payment_version(tx, &order.id, now).await?;
    reserve_compensation_amount(tx, &order.id, amount, refund_reference).await?;
    let money = Money {
        amount_minor: amount,
        currency: amounts.currency,
    };
    // Due at once: if the caller dies before sending it, the recovery
    // scanner sends it (same reference, so never a second refund).
    let refund = created_refund(
        &order.id,
        &attempt,
        refund_reference.to_owned(),
        money,
        Some(reason.to_owned()),
        now,
        at,
    );
    insert_refund(tx, &refund).await?;
    let why = format!("compensation refund of {amount} ({reason}) reserved before any PSP call");
    let (history_id, outbox_event_id) = record_creation(
        tx,
        Creation {
            order,
            aggregate_type: "refund",
            aggregate_id: &refund.id,
            reference: &refund.reference,
            state: refund.state.as_str(),
            amount: money,
            event_kind: "COMMAND_COMPENSATION_REFUND",
            event_type: REFUND_REQUESTED,
            reason: &why,
            payment_version,
            provenance,
        },
        at,
    )
    .await?;
    tracing::info!(payment_id = %order.id, refund_id = %refund.id, amount, "compensation refund reserved");
    Ok(Reservation {
        record: refund,
        payment_version,
        history_id,
        outbox_event_id,
        replayed: false,
    })
}

/// The compensation's reservation: the same conditional UPDATE as every
/// refund's, with the fulfillment guard in the statement itself. A refusal
/// changes nothing and is an error.
async fn reserve_compensation_amount(
    tx: &mut Conn,
    payment_id: &str,
    amount: i64,
    refund_reference: &str,
) -> Result<(), StoreError> {
    let reserved = sqlx::query(
        "UPDATE payment_amounts SET refund_reserved_minor = refund_reserved_minor + $2 \
         WHERE payment_id = $1 AND $2 > 0 \
           AND captured_minor - refunded_minor - refund_reserved_minor >= $2 \
           AND EXISTS (SELECT 1 FROM payment_orders o WHERE o.id = $1 \
                 AND o.fulfillment_state = 'compensating' \
                 AND o.fulfillment_state <> 'fulfilled' \
                 AND o.compensation_refund_reference = $3)",
    )
    .bind(payment_id)
    .bind(amount)
    .bind(refund_reference)
    .execute(&mut *tx)
    .await?;
    if reserved.rows_affected() != 0 {
        return Ok(());
    }
    let row = sqlx::query(
        "SELECT fulfillment_state, compensation_refund_reference FROM payment_orders WHERE id = $1",
    )
    .bind(payment_id)
    .fetch_one(&mut *tx)
    .await?;
    let state: Option<String> = row.try_get("fulfillment_state")?;
    let state = state.unwrap_or_else(|| "none".into());
    Err(StoreError::InvalidState {
        entity: "payment",
        id: payment_id.to_owned(),
        state: format!("fulfillment {state}"),
        reason: format!(
            "the compensation refund {refund_reference} may only be reserved while the \
             fulfillment is compensating under that reference, with money to return \
             (refundable {amount}); a fulfilled payment is never compensated"
        ),
    })
}

async fn scoped_order(
    tx: &mut Conn,
    payment_id: &str,
    merchant_id: Option<&str>,
) -> Result<(PaymentOrder, PaymentAmounts), StoreError> {
    let (order, amounts) = order_and_amounts_in(tx, payment_id).await?;
    if merchant_id.is_some_and(|m| m != order.merchant_id) {
        return Err(StoreError::not_found("payment", payment_id));
    }
    Ok((order, amounts))
}

fn refused(order: &PaymentOrder, amounts: &PaymentAmounts, e: RequestRefused) -> StoreError {
    match e {
        RequestRefused::Amount(AmountError::ExceedsRefundable {
            requested,
            available,
        }) => StoreError::InsufficientRefundable {
            requested,
            available,
        },
        RequestRefused::Amount(AmountError::ExceedsCapturable {
            requested,
            available,
        }) => StoreError::InsufficientCapturable {
            requested,
            available,
        },
        RequestRefused::Amount(AmountError::NotPositive(_)) | RequestRefused::Money(_) => {
            StoreError::InvalidRequest(e.to_string())
        }
        other => StoreError::InvalidState {
            entity: "payment",
            id: order.id.clone(),
            state: order.state.to_string(),
            reason: format!(
                "{other} (refundable {}, capturable {})",
                amounts.refundable_minor(),
                amounts.capturable_minor()
            ),
        },
    }
}

/// The attempt that took the money (at most one per payment).
async fn succeeded_attempt(
    tx: &mut Conn,
    order: &PaymentOrder,
) -> Result<PaymentAttempt, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {ATTEMPT_COLS} FROM payment_attempts WHERE payment_id = $1 AND state = $2"
    ))
    .bind(&order.id)
    .bind(AttemptState::Succeeded.as_str())
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| StoreError::InvalidState {
        entity: "payment",
        id: order.id.clone(),
        state: order.state.to_string(),
        reason: "no attempt of this payment succeeded".into(),
    })?;
    attempt_from(&row)
}

/// The one live attempt of a payment (the partial unique index allows at most one).
async fn latest_live_attempt(
    tx: &mut Conn,
    order: &PaymentOrder,
) -> Result<PaymentAttempt, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {ATTEMPT_COLS} FROM payment_attempts \
         WHERE payment_id = $1 AND state NOT IN ('FAILED', 'CANCELED')"
    ))
    .bind(&order.id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| StoreError::InvalidState {
        entity: "payment",
        id: order.id.clone(),
        state: order.state.to_string(),
        reason: "no authorized attempt to capture".into(),
    })?;
    attempt_from(&row)
}

/// Every change to a payment moves its version; concurrent deciders re-read.
async fn bump_payment_version(
    tx: &mut Conn,
    payment_id: &str,
    now: i64,
) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "UPDATE payment_orders SET version = version + 1, updated_at = $2 WHERE id = $1 \
         RETURNING version",
    )
    .bind(payment_id)
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    Ok(row.try_get::<i64, _>("version")?)
}

struct Creation<'a> {
    order: &'a PaymentOrder,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    reference: &'a str,
    state: &'a str,
    amount: Money,
    event_kind: &'a str,
    event_type: &'a str,
    reason: &'a str,
    payment_version: i64,
    provenance: &'a Provenance,
}

async fn record_creation(
    tx: &mut Conn,
    c: Creation<'_>,
    at: At<'_>,
) -> Result<(i64, String), StoreError> {
    let now = at.now;
    let history_id = history::append(
        tx,
        &NewHistory {
            payment_id: &c.order.id,
            aggregate_type: c.aggregate_type,
            aggregate_id: c.aggregate_id,
            to_state: c.state,
            to_version: 0,
            event_kind: c.event_kind,
            evidence_source: "command",
            amount_minor: Some(c.amount.amount_minor),
            currency: Some(c.amount.currency.as_str()),
            decision: "applied",
            reason: c.reason,
            provenance: Some(c.provenance),
            ..NewHistory::default()
        },
        now,
    )
    .await?;
    let payload = serde_json::json!({
        "type": c.event_type,
        "payment_id": c.order.id,
        "merchant_id": c.order.merchant_id,
        "merchant_order_no": c.order.merchant_order_no,
        "payment_version": c.payment_version,
        "order_state": c.order.state.as_str(),
        "amount_minor": c.amount.amount_minor,
        "currency": c.amount.currency.as_str(),
        "aggregate": {
            "type": c.aggregate_type,
            "id": c.aggregate_id,
            "state": c.state,
            "reference": c.reference,
        },
        "dedupe_key": format!("{}:{}", c.event_type, c.aggregate_id),
        "occurred_at": now,
    });
    let outbox_event_id = outbox::insert(
        tx,
        &NewOutboxEvent {
            event_type: c.event_type,
            payment_id: &c.order.id,
            merchant_id: &c.order.merchant_id,
            aggregate_type: c.aggregate_type,
            aggregate_id: c.aggregate_id,
            payment_version: c.payment_version,
            payload,
        },
        at,
    )
    .await?;
    Ok((history_id, outbox_event_id))
}

/// A refund just reserved: CREATED, nothing sent, due for the recovery
/// scanner at `due_at`.
fn created_refund(
    payment_id: &str,
    attempt: &PaymentAttempt,
    reference: String,
    amount: Money,
    reason: Option<String>,
    due_at: i64,
    at: At<'_>,
) -> Refund {
    let now = at.now;
    Refund {
        id: ids::refund(at.env),
        payment_id: payment_id.to_owned(),
        attempt_id: attempt.id.clone(),
        reference,
        adapter: attempt.adapter.clone(),
        psp_reference: None,
        amount,
        reason,
        state: RefundState::Created,
        version: 0,
        next_retry_time: Some(due_at),
        retry_count: 0,
        last_psp_call_at: None,
        last_event: None,
        failure: None,
        created_at: now,
        updated_at: now,
    }
}

async fn insert_refund(tx: &mut Conn, refund: &Refund) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO refunds (id, payment_id, attempt_id, reference, adapter, amount_minor, \
            currency, reason, state, version, retry_count, next_retry_time, created_at, \
            updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, 0, $10, $11, $11)",
    )
    .bind(&refund.id)
    .bind(&refund.payment_id)
    .bind(&refund.attempt_id)
    .bind(&refund.reference)
    .bind(&refund.adapter)
    .bind(refund.amount.amount_minor)
    .bind(refund.amount.currency.as_str())
    .bind(refund.reason.as_deref())
    .bind(refund.state.as_str())
    .bind(refund.next_retry_time)
    .bind(refund.created_at)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A capture just reserved: CREATED, nothing sent, due for the recovery
/// scanner after `query_delay_ms` (if this process dies before the first PSP
/// call records anything, the scanner sends it with the same reference
/// instead of leaving the money reserved).
fn created_capture(
    attempt: &PaymentAttempt,
    reference: String,
    amount: Money,
    at: At<'_>,
    query_delay_ms: i64,
) -> Capture {
    let now = at.now;
    Capture {
        id: ids::capture(at.env),
        payment_id: attempt.payment_id.clone(),
        attempt_id: attempt.id.clone(),
        reference,
        adapter: attempt.adapter.clone(),
        psp_reference: None,
        amount,
        state: CaptureState::Created,
        version: 0,
        next_retry_time: Some(now.saturating_add(query_delay_ms)),
        retry_count: 0,
        last_psp_call_at: None,
        last_event: None,
        failure: None,
        created_at: now,
        updated_at: now,
    }
}

async fn insert_capture(tx: &mut Conn, capture: &Capture) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO captures (id, payment_id, attempt_id, reference, adapter, amount_minor, \
            currency, state, version, retry_count, next_retry_time, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, 0, $9, $10, $10)",
    )
    .bind(&capture.id)
    .bind(&capture.payment_id)
    .bind(&capture.attempt_id)
    .bind(&capture.reference)
    .bind(&capture.adapter)
    .bind(capture.amount.amount_minor)
    .bind(capture.amount.currency.as_str())
    .bind(capture.state.as_str())
    .bind(capture.next_retry_time)
    .bind(capture.created_at)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
