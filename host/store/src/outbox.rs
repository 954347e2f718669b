//! The transactional outbox: events written in the same transaction as the
//! state change they announce, delivered at least once by a publisher.
//! Event ids are minted once at insert and never change, so consumers dedupe
//! on them.

use crate::db::{int, opt_int, opt_text, text, Conn};
use crate::door::batch::Write;
use crate::ids::{self, At};
use crate::{Backend, Store, StoreError};
use sqlx::any::AnyRow;

#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    pub seq: i64,
    pub event_id: String,
    pub event_type: String,
    /// The payment id: consumers keep per-payment order by `payment_version`.
    pub partition_key: String,
    pub merchant_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub payment_version: i64,
    pub payload: serde_json::Value,
    /// `pending`, `sent` or `dead`.
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub claimed_until: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub sent_at: Option<i64>,
}

/// An event to write with a state change.
#[derive(Debug, Clone)]
pub(crate) struct NewOutboxEvent<'a> {
    pub event_type: &'a str,
    pub payment_id: &'a str,
    pub merchant_id: &'a str,
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub payment_version: i64,
    pub payload: serde_json::Value,
}

const OUTBOX_COLS: &str = "seq, event_id, event_type, partition_key, merchant_id, aggregate_type, \
    aggregate_id, payment_version, payload, status, attempts, next_attempt_at, claimed_until, \
    last_error, created_at, sent_at";

fn message_from(row: &AnyRow) -> Result<OutboxMessage, StoreError> {
    let payload = serde_json::from_str(&text(row, "payload")?)
        .map_err(|e| StoreError::corrupt("outbox", format!("payload: {e}")))?;
    Ok(OutboxMessage {
        seq: int(row, "seq")?,
        event_id: text(row, "event_id")?,
        event_type: text(row, "event_type")?,
        partition_key: text(row, "partition_key")?,
        merchant_id: text(row, "merchant_id")?,
        aggregate_type: text(row, "aggregate_type")?,
        aggregate_id: text(row, "aggregate_id")?,
        payment_version: int(row, "payment_version")?,
        payload,
        status: text(row, "status")?,
        attempts: int(row, "attempts")?,
        next_attempt_at: int(row, "next_attempt_at")?,
        claimed_until: opt_int(row, "claimed_until")?,
        last_error: opt_text(row, "last_error")?,
        created_at: int(row, "created_at")?,
        sent_at: opt_int(row, "sent_at")?,
    })
}

/// Write one outbox row inside the caller's transaction; returns its event id.
pub(crate) async fn insert(
    tx: &mut Conn,
    event: &NewOutboxEvent<'_>,
    at: At<'_>,
) -> Result<String, StoreError> {
    let (write, event_id) = insert_write(event, at);
    crate::door::batch::bind_all(sqlx::query(&write.sql), write.binds)
        .execute(&mut *tx)
        .await?;
    Ok(event_id)
}

/// One outbox row as a write of a door's batch, and the event id minted for it.
pub(crate) fn insert_write(event: &NewOutboxEvent<'_>, at: At<'_>) -> (Write, String) {
    let event_id = ids::outbox_event(at.env);
    let write = Write::one_row(
        "INSERT INTO outbox (event_id, event_type, partition_key, merchant_id, aggregate_type, \
                aggregate_id, payment_version, payload, status, attempts, next_attempt_at, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', 0, $9, $9)",
        vec![
            event_id.as_str().into(),
            event.event_type.into(),
            event.payment_id.into(),
            event.merchant_id.into(),
            event.aggregate_type.into(),
            event.aggregate_id.into(),
            event.payment_version.into(),
            event.payload.to_string().as_str().into(),
            at.now.into(),
        ],
    );
    (write, event_id)
}

/// The outbox's claim: `$1` now, `$2` the end of the lease, `$3` the most events, oldest
/// first, each picked once (see [`crate::inbox::claim_sql`]).
pub fn claim_sql(backend: Backend) -> String {
    let due = "(status = 'pending' AND next_attempt_at <= $1 \
               AND (claimed_until IS NULL OR claimed_until < $1))";
    format!(
        "WITH picked AS MATERIALIZED (SELECT seq FROM outbox WHERE {due} \
                                      ORDER BY next_attempt_at, seq LIMIT $3 {lock}) \
         UPDATE outbox SET attempts = attempts + 1, claimed_until = $2 \
         WHERE {picked} \
         RETURNING {OUTBOX_COLS}",
        lock = backend.claim_lock(),
        picked = backend.claimed("seq"),
    )
}

impl Store {
    /// Claim up to `limit` due pending events for `lease_ms`, oldest first.
    pub async fn outbox_claim(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        let now = self.now_ms();
        let sql = claim_sql(self.backend);
        let claim = sqlx::query(&sql).bind(now).bind(now + lease_ms).bind(limit);
        let rows = self.claim_queue(claim).await?;
        let mut messages = rows
            .iter()
            .map(message_from)
            .collect::<Result<Vec<_>, _>>()?;
        messages.sort_by_key(|m| m.seq);
        Ok(messages)
    }

    /// The event was delivered.
    pub async fn outbox_mark_sent(&self, event_id: &str) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE outbox SET status = 'sent', sent_at = $2, claimed_until = NULL \
             WHERE event_id = $1 AND status = 'pending'",
        )
        .bind(event_id)
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::not_found("pending outbox event", event_id));
        }
        Ok(())
    }

    /// Delivery failed: retry at `next_attempt_at`, or give up (`dead`) once
    /// `max_attempts` claims have been spent. Returns the new status.
    pub async fn outbox_retry(
        &self,
        event_id: &str,
        error: &str,
        next_attempt_at: i64,
        max_attempts: i64,
    ) -> Result<String, StoreError> {
        let row = sqlx::query(
            "UPDATE outbox SET last_error = $2, next_attempt_at = $3, claimed_until = NULL, \
                status = CASE WHEN attempts >= $4 THEN 'dead' ELSE 'pending' END \
             WHERE event_id = $1 AND status = 'pending' RETURNING status",
        )
        .bind(event_id)
        .bind(error)
        .bind(next_attempt_at)
        .bind(max_attempts)
        .fetch_optional(&self.writer)
        .await?
        .ok_or_else(|| StoreError::not_found("pending outbox event", event_id))?;
        text(&row, "status")
    }

    /// Every outbox event of a payment, in write order.
    pub async fn outbox_for_payment(
        &self,
        payment_id: &str,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTBOX_COLS} FROM outbox WHERE partition_key = $1 ORDER BY seq"
        ))
        .bind(payment_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(message_from).collect()
    }

    /// Dead events, for the operator.
    pub async fn outbox_list_dead(&self, limit: i64) -> Result<Vec<OutboxMessage>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTBOX_COLS} FROM outbox WHERE status = 'dead' ORDER BY seq LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(message_from).collect()
    }
}
