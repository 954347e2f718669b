//! One delivery row per (event, sink, target): its own status, attempts,
//! schedule, lease and last outcome. Claims, outcomes, dead letters, replay.

use crate::db::{begin_write, commit_write, int, opt_int, opt_text, text};
use crate::DeliveryError;
use serde::{Deserialize, Serialize};
use sluice_store::{Backend, Store};
use sqlx::any::AnyRow;

/// Where an event goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Sink {
    /// A merchant webhook endpoint (target = endpoint id).
    Webhook,
    /// The NATS JetStream stream (target = stream name).
    Nats,
}

impl Sink {
    pub fn as_str(&self) -> &'static str {
        match self {
            Sink::Webhook => "webhook",
            Sink::Nats => "nats",
        }
    }

    fn parse(raw: &str) -> Option<Sink> {
        match raw {
            "webhook" => Some(Sink::Webhook),
            "nats" => Some(Sink::Nats),
            _ => None,
        }
    }
}

/// A delivery as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Delivery {
    pub id: String,
    pub event_id: String,
    pub event_seq: i64,
    pub event_created_at: i64,
    pub payment_id: String,
    pub payment_version: i64,
    pub merchant_id: String,
    pub sink: Sink,
    pub target: String,
    pub endpoint_id: Option<String>,
    /// `pending`, `sent` or `dead`.
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub claimed_until: Option<i64>,
    pub last_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    pub last_response_status: Option<i64>,
    pub replays: i64,
    pub created_at: i64,
    pub sent_at: Option<i64>,
    pub dead_at: Option<i64>,
}

/// A claimed delivery and the token that proves the claim is still ours.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub delivery: Delivery,
    pub token: String,
}

/// The event a delivery carries, as sent on the wire (webhook body and
/// JetStream payload alike).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventEnvelope {
    /// The stable event id: the same on every retry, replay and sink.
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    /// When the state change committed, unix seconds.
    pub created: i64,
    pub payment_id: String,
    /// The payment's version after the change: consumers ignore an event
    /// whose version is not above the one they hold.
    pub payment_version: i64,
    pub data: serde_json::Value,
}

const COLS: &str = "id, event_id, event_seq, event_created_at, partition_key, payment_version, \
    merchant_id, sink, target, endpoint_id, status, attempts, next_attempt_at, claimed_until, \
    last_attempt_at, last_error, last_response_status, replays, created_at, sent_at, dead_at";

fn delivery_from(row: &AnyRow) -> Result<Delivery, DeliveryError> {
    let raw_sink = text(row, "sink")?;
    let sink = Sink::parse(&raw_sink).ok_or_else(|| {
        DeliveryError::corrupt("event_deliveries", format!("sink = {raw_sink:?}"))
    })?;
    Ok(Delivery {
        id: text(row, "id")?,
        event_id: text(row, "event_id")?,
        event_seq: int(row, "event_seq")?,
        event_created_at: int(row, "event_created_at")?,
        payment_id: text(row, "partition_key")?,
        payment_version: int(row, "payment_version")?,
        merchant_id: text(row, "merchant_id")?,
        sink,
        target: text(row, "target")?,
        endpoint_id: opt_text(row, "endpoint_id")?,
        status: text(row, "status")?,
        attempts: int(row, "attempts")?,
        next_attempt_at: int(row, "next_attempt_at")?,
        claimed_until: opt_int(row, "claimed_until")?,
        last_attempt_at: opt_int(row, "last_attempt_at")?,
        last_error: opt_text(row, "last_error")?,
        last_response_status: opt_int(row, "last_response_status")?,
        replays: int(row, "replays")?,
        created_at: int(row, "created_at")?,
        sent_at: opt_int(row, "sent_at")?,
        dead_at: opt_int(row, "dead_at")?,
    })
}

/// The event row a delivery points at.
pub(crate) async fn load_envelope(
    store: &Store,
    event_id: &str,
) -> Result<EventEnvelope, DeliveryError> {
    let row = sqlx::query(
        "SELECT event_id, event_type, partition_key, payment_version, payload, created_at \
         FROM outbox WHERE event_id = $1",
    )
    .bind(event_id)
    .fetch_optional(store.pool())
    .await?
    .ok_or_else(|| DeliveryError::not_found("outbox event", event_id))?;
    let payload = text(&row, "payload")?;
    let data = serde_json::from_str(&payload)
        .map_err(|e| DeliveryError::corrupt("outbox", format!("payload: {e}")))?;
    Ok(EventEnvelope {
        id: text(&row, "event_id")?,
        event_type: text(&row, "event_type")?,
        created: int(&row, "created_at")?.div_euclid(1000),
        payment_id: text(&row, "partition_key")?,
        payment_version: int(&row, "payment_version")?,
        data,
    })
}

/// How to claim.
#[derive(Debug, Clone)]
pub(crate) struct ClaimRequest<'a> {
    pub sink: Sink,
    /// Only rows for this target (the NATS stream); all targets when `None`.
    pub target: Option<&'a str>,
    pub limit: i64,
    pub lease_ms: i64,
    /// An earlier pending event of the same payment for the same target holds
    /// later ones back until it has used this many attempts.
    pub order_hold_attempts: i64,
}

/// The deliveries' claim: `$1` now, `$2` the end of the lease, `$3` the most rows, `$4` the
/// sink, `$5` the order hold's attempts, `$6` the claim token, `$7` one target or `''` for
/// all. Each row is picked once and the update names it by key only
/// ([`sluice_store::Backend::claimed`]). On PostgreSQL `OFFSET 0` keeps each `NOT EXISTS` a
/// subquery run per candidate, looking up that candidate's payment (the deliveries' through
/// `event_deliveries_order`): without it PostgreSQL may turn them into anti-joins, and a
/// generic plan made while the queue was nearly empty walked every pending delivery of the
/// target for each candidate, 150,000 rows for a claim of 50 from a backlog of 3,000
/// (BENCHMARKS.md, session 13). The outbox's is written `status || '' = 'pending'` so that
/// `outbox_pending`, whose predicate a plain `status = 'pending'` matches, cannot serve it:
/// that index is ordered by due time, and the lookup walked all of it for each candidate
/// (110 ms a claim behind 20,000 events not yet fanned out); `outbox_by_partition` finds
/// the payment's earlier events directly.
pub fn claim_sql(backend: Backend) -> String {
    format!(
        "WITH picked AS MATERIALIZED (\
            SELECT d.id FROM event_deliveries d \
            WHERE d.sink = $4 AND ($7 = '' OR d.target = $7) \
              AND d.status = 'pending' AND d.next_attempt_at <= $1 \
              AND (d.claimed_until IS NULL OR d.claimed_until < $1) \
              AND NOT EXISTS (SELECT 1 FROM event_deliveries e \
                              WHERE e.target = d.target AND e.sink = d.sink \
                                AND e.partition_key = d.partition_key \
                                AND e.event_seq < d.event_seq \
                                AND e.status = 'pending' AND e.attempts < $5{lookup}) \
              AND NOT EXISTS (SELECT 1 FROM outbox o \
                              WHERE o.partition_key = d.partition_key \
                                AND o.seq < d.event_seq AND o.status || '' = 'pending'{lookup}) \
            ORDER BY d.next_attempt_at, d.event_seq LIMIT $3 {lock}) \
         UPDATE event_deliveries SET attempts = attempts + 1, claimed_until = $2, \
            claim_token = $6, last_attempt_at = $1 \
         WHERE {picked} \
         RETURNING {COLS}",
        lock = backend.claim_lock(),
        picked = backend.claimed("id"),
        lookup = match backend {
            Backend::Postgres => " OFFSET 0",
            Backend::Sqlite => "",
        },
    )
}

/// Claim due deliveries, keeping per-payment order per target: a delivery is
/// not handed out while an earlier event of its payment is still pending for
/// the same target (within `order_hold_attempts`), nor while an earlier event
/// of its payment has not been fanned out yet.
pub(crate) async fn claim(
    store: &Store,
    req: &ClaimRequest<'_>,
) -> Result<Vec<Claimed>, DeliveryError> {
    let now = store.now_ms();
    let token = store.env().uuid_v4().simple().to_string();
    let sql = claim_sql(store.backend());
    let claim = sqlx::query(&sql)
        .bind(now)
        .bind(now.saturating_add(req.lease_ms))
        .bind(req.limit)
        .bind(req.sink.as_str())
        .bind(req.order_hold_attempts)
        .bind(&token)
        .bind(req.target.unwrap_or(""));
    let rows = store.claim_queue(claim).await?;
    let mut claimed = rows
        .iter()
        .map(|row| {
            Ok(Claimed {
                delivery: delivery_from(row)?,
                token: token.clone(),
            })
        })
        .collect::<Result<Vec<_>, DeliveryError>>()?;
    claimed.sort_by_key(|c| (c.delivery.event_seq, c.delivery.target.clone()));
    Ok(claimed)
}

/// The delivery reached its sink. Success wins even when our lease ran out
/// and another instance re-claimed the row: the event did arrive.
/// Returns false when the row was no longer pending.
pub(crate) async fn mark_sent(
    store: &Store,
    delivery_id: &str,
    response_status: Option<i64>,
) -> Result<bool, DeliveryError> {
    let done = sqlx::query(
        "UPDATE event_deliveries SET status = 'sent', sent_at = $2, claimed_until = NULL, \
            claim_token = NULL, last_response_status = $3 \
         WHERE id = $1 AND status = 'pending'",
    )
    .bind(delivery_id)
    .bind(store.now_ms())
    .bind(response_status)
    .execute(store.writer())
    .await?;
    Ok(done.rows_affected() == 1)
}

/// What became of a failed delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureOutcome {
    Retry {
        at: i64,
    },
    Dead,
    /// Our claim was no longer ours (lease expired, another instance took
    /// over, or an operator acted): nothing written.
    LostClaim,
}

/// Record a failed try: schedule the next one, or dead-letter the delivery.
/// Only the holder of the claim may do this.
pub(crate) async fn record_failure(
    store: &Store,
    claimed: &Claimed,
    error: &str,
    response_status: Option<i64>,
    next_attempt_at: Option<i64>,
) -> Result<FailureOutcome, DeliveryError> {
    let now = store.now_ms();
    let (status, next, dead_at) = match next_attempt_at {
        Some(at) => ("pending", at, None),
        None => ("dead", now, Some(now)),
    };
    let done = sqlx::query(
        "UPDATE event_deliveries SET status = $3, last_error = $4, last_response_status = $5, \
            next_attempt_at = $6, dead_at = $7, claimed_until = NULL, claim_token = NULL \
         WHERE id = $1 AND status = 'pending' AND claim_token = $2",
    )
    .bind(&claimed.delivery.id)
    .bind(&claimed.token)
    .bind(status)
    .bind(error)
    .bind(response_status)
    .bind(next)
    .bind(dead_at)
    .execute(store.writer())
    .await?;
    Ok(match (done.rows_affected(), next_attempt_at) {
        (0, _) => FailureOutcome::LostClaim,
        (_, Some(at)) => FailureOutcome::Retry { at },
        (_, None) => FailureOutcome::Dead,
    })
}

/// A new delivery row inside the fan-out transaction; a second fan-out of the
/// same event (after a crash) finds it already there.
pub(crate) struct NewDelivery<'a> {
    pub event_id: &'a str,
    pub event_seq: i64,
    pub event_created_at: i64,
    pub partition_key: &'a str,
    pub payment_version: i64,
    pub merchant_id: &'a str,
    pub sink: Sink,
    pub target: &'a str,
}

pub(crate) async fn insert(
    conn: &mut sqlx::AnyConnection,
    env: &sluice_store::Env,
    new: &NewDelivery<'_>,
    now: i64,
) -> Result<bool, DeliveryError> {
    let endpoint_id = (new.sink == Sink::Webhook).then_some(new.target);
    let done = sqlx::query(
        "INSERT INTO event_deliveries (id, event_id, event_seq, event_created_at, partition_key, \
            payment_version, merchant_id, sink, target, endpoint_id, status, attempts, \
            next_attempt_at, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', 0, $11, $11) \
         ON CONFLICT (event_id, sink, target) DO NOTHING",
    )
    .bind(format!("dlv_{}", env.uuid_v7().simple()))
    .bind(new.event_id)
    .bind(new.event_seq)
    .bind(new.event_created_at)
    .bind(new.partition_key)
    .bind(new.payment_version)
    .bind(new.merchant_id)
    .bind(new.sink.as_str())
    .bind(new.target)
    .bind(endpoint_id)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Dead-lettered deliveries, oldest death first.
pub async fn list_dead(store: &Store, limit: i64) -> Result<Vec<Delivery>, DeliveryError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLS} FROM event_deliveries WHERE status = 'dead' ORDER BY dead_at, id LIMIT $1"
    ))
    .bind(limit.clamp(1, 1000))
    .fetch_all(store.pool())
    .await?;
    rows.iter().map(delivery_from).collect()
}

/// Every delivery of one event, by sink and target.
pub async fn deliveries_for_event(
    store: &Store,
    event_id: &str,
) -> Result<Vec<Delivery>, DeliveryError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLS} FROM event_deliveries WHERE event_id = $1 ORDER BY sink, target"
    ))
    .bind(event_id)
    .fetch_all(store.pool())
    .await?;
    rows.iter().map(delivery_from).collect()
}

/// Every delivery of one payment, in event order.
pub async fn deliveries_for_payment(
    store: &Store,
    payment_id: &str,
) -> Result<Vec<Delivery>, DeliveryError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLS} FROM event_deliveries WHERE partition_key = $1 \
         ORDER BY event_seq, sink, target"
    ))
    .bind(payment_id)
    .fetch_all(store.pool())
    .await?;
    rows.iter().map(delivery_from).collect()
}

/// One delivery by id.
pub async fn get_delivery(store: &Store, delivery_id: &str) -> Result<Delivery, DeliveryError> {
    let row = sqlx::query(&format!(
        "SELECT {COLS} FROM event_deliveries WHERE id = $1"
    ))
    .bind(delivery_id)
    .fetch_optional(store.pool())
    .await?
    .ok_or_else(|| DeliveryError::not_found("delivery", delivery_id))?;
    delivery_from(&row)
}

/// Put a dead-lettered delivery back in the queue with a fresh retry budget,
/// due now. The event id stays the same, so consumers that did get it after
/// all dedupe it. Only dead deliveries can be replayed.
pub async fn replay_dead_letter(
    store: &Store,
    delivery_id: &str,
) -> Result<Delivery, DeliveryError> {
    let mut tx = begin_write(store).await?;
    let row = sqlx::query(&format!(
        "SELECT {COLS} FROM event_deliveries WHERE id = $1"
    ))
    .bind(delivery_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| DeliveryError::not_found("delivery", delivery_id))?;
    let current = delivery_from(&row)?;
    if current.status != "dead" {
        return Err(DeliveryError::InvalidState {
            entity: "delivery",
            id: delivery_id.to_owned(),
            state: current.status,
            reason: "only dead-lettered deliveries can be replayed".into(),
        });
    }
    let row = sqlx::query(&format!(
        "UPDATE event_deliveries SET status = 'pending', attempts = 0, next_attempt_at = $2, \
            claimed_until = NULL, claim_token = NULL, dead_at = NULL, replays = replays + 1 \
         WHERE id = $1 AND status = 'dead' RETURNING {COLS}"
    ))
    .bind(delivery_id)
    .bind(store.now_ms())
    .fetch_one(&mut *tx)
    .await?;
    let replayed = delivery_from(&row)?;
    commit_write(store, tx).await?;
    tracing::info!(
        delivery_id,
        event_id = %replayed.event_id,
        payment_id = %replayed.payment_id,
        sink = replayed.sink.as_str(),
        "dead-lettered delivery replayed"
    );
    Ok(replayed)
}

/// Age of the oldest pending delivery per sink (ms since its event was
/// written), or `None` when nothing is pending.
pub(crate) async fn oldest_pending_event(
    store: &Store,
    sink: Sink,
) -> Result<Option<i64>, DeliveryError> {
    let row = sqlx::query(
        "SELECT MIN(event_created_at) AS oldest FROM event_deliveries \
         WHERE sink = $1 AND status = 'pending'",
    )
    .bind(sink.as_str())
    .fetch_one(store.pool())
    .await?;
    opt_int(&row, "oldest")
}
