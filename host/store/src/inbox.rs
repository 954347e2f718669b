//! The webhook inbox: transport-level dedupe and a replayable work queue.
//!
//! The webhook route verifies a PSP notification through its adapter, then
//! inserts one row per normalised event keyed by (adapter, connector account,
//! provider event id); a redelivery hits the unique key and is acknowledged
//! without being processed again. A processor claims rows, applies each event
//! through [`Store::apply_event`] with the row's id (which marks the row
//! processed in the same transaction), and marks failures for retry or
//! quarantines poison events.

use crate::db::{int, opt_int, opt_text, text};
use crate::{ids, Backend, Store, StoreError};
use sqlx::any::AnyRow;
use sqlx::AnyConnection;

#[derive(Debug, Clone, PartialEq)]
pub struct InboxEntry {
    pub id: String,
    pub adapter: String,
    pub connector_account_id: String,
    pub provider_event_id: Option<String>,
    pub payload_digest: String,
    /// `verified` or `rejected`.
    pub verification: String,
    pub verification_detail: Option<String>,
    /// The normalised event as the adapter produced it (None for rejected rows).
    pub event: Option<serde_json::Value>,
    /// `pending`, `processing`, `processed`, `failed` or `quarantined`.
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub claimed_until: Option<i64>,
    pub last_error: Option<String>,
    pub quarantine_reason: Option<String>,
    pub received_at: i64,
    pub processed_at: Option<i64>,
    /// The sealed raw body the event came in ([`Store::inbox_raw_body`]); None for
    /// rejected rows and rows from before migration 0014.
    pub raw_body_id: Option<String>,
}

/// A verified event to put in the inbox.
#[derive(Debug, Clone)]
pub struct NewInboxEvent {
    pub adapter: String,
    pub connector_account_id: String,
    /// The PSP's notification id; when the PSP has none, the caller passes a
    /// digest of the normalised event so redeliveries still collide.
    pub provider_event_id: String,
    pub payload_digest: String,
    pub event: serde_json::Value,
    /// The verified raw body, kept sealed ([`Store::keep_webhook_body`]).
    pub raw_body_id: Option<String>,
}

/// Outcome of [`Store::inbox_insert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxInsert {
    Inserted {
        id: String,
    },
    /// The same provider event was received before; nothing was written.
    Duplicate {
        id: String,
        status: String,
    },
}

pub(crate) const INBOX_COLS: &str = "id, adapter, connector_account_id, provider_event_id, \
    payload_digest, verification, verification_detail, event_json, status, attempts, \
    next_attempt_at, claimed_until, last_error, quarantine_reason, received_at, processed_at, raw_body_id";

fn entry_from(row: &AnyRow) -> Result<InboxEntry, StoreError> {
    let event = opt_text(row, "event_json")?
        .map(|raw| {
            serde_json::from_str(&raw)
                .map_err(|e| StoreError::corrupt("webhook_inbox", format!("event_json: {e}")))
        })
        .transpose()?;
    Ok(InboxEntry {
        id: text(row, "id")?,
        adapter: text(row, "adapter")?,
        connector_account_id: text(row, "connector_account_id")?,
        provider_event_id: opt_text(row, "provider_event_id")?,
        payload_digest: text(row, "payload_digest")?,
        verification: text(row, "verification")?,
        verification_detail: opt_text(row, "verification_detail")?,
        event,
        status: text(row, "status")?,
        attempts: int(row, "attempts")?,
        next_attempt_at: int(row, "next_attempt_at")?,
        claimed_until: opt_int(row, "claimed_until")?,
        last_error: opt_text(row, "last_error")?,
        quarantine_reason: opt_text(row, "quarantine_reason")?,
        received_at: int(row, "received_at")?,
        processed_at: opt_int(row, "processed_at")?,
        raw_body_id: opt_text(row, "raw_body_id")?,
    })
}

/// The row a provider event received before left in the inbox.
pub(crate) async fn inbox_duplicate_in(
    conn: &mut AnyConnection,
    new: &NewInboxEvent,
) -> Result<InboxInsert, StoreError> {
    let row = sqlx::query(
        "SELECT id, status FROM webhook_inbox \
         WHERE adapter = $1 AND connector_account_id = $2 AND provider_event_id = $3",
    )
    .bind(&new.adapter)
    .bind(&new.connector_account_id)
    .bind(&new.provider_event_id)
    .fetch_one(conn)
    .await?;
    Ok(InboxInsert::Duplicate {
        id: text(&row, "id")?,
        status: text(&row, "status")?,
    })
}

pub(crate) fn body_context(body_id: &str) -> String {
    crate::secrets::secret_context("webhook_bodies", "sealed_body", body_id)
}

/// The inbox rows a processor may claim at `$1` (now): due, or claimed by a processor whose
/// lease ran out. Its first term is `webhook_inbox_work`'s predicate word for word: neither
/// planner proves it from the OR alone, and without it a backlog of 40,000 rows was read and
/// sorted on every claim (34 ms on PostgreSQL against 0.2 ms through the index; BENCHMARKS.md,
/// session 7).
pub const CLAIMABLE: &str = "(status IN ('pending', 'processing', 'failed') \
    AND ((status IN ('pending', 'failed') AND next_attempt_at <= $1) \
         OR (status = 'processing' AND claimed_until < $1)))";

/// The inbox's claim: `$1` now, `$2` the end of the lease, `$3` the most rows. A
/// materialized CTE picks the rows exactly once: as an IN-subquery, PostgreSQL may re-run
/// it per row and, skipping the rows this very statement already locked, hand out more
/// than `$3`. The update names them by key only ([`Backend::claimed`]).
pub fn claim_sql(backend: Backend) -> String {
    format!(
        "WITH picked AS MATERIALIZED (SELECT id FROM webhook_inbox WHERE {CLAIMABLE} \
                                      ORDER BY next_attempt_at, id LIMIT $3 {lock}) \
         UPDATE webhook_inbox SET status = 'processing', attempts = attempts + 1, \
            claimed_until = $2 \
         WHERE {picked} \
         RETURNING {INBOX_COLS}",
        lock = backend.claim_lock(),
        picked = backend.claimed("id"),
    )
}

impl Store {
    /// Keep a verified webhook body, sealed, as evidence; returns its id for the
    /// inbox rows made from it. The same body for the same account is kept once.
    pub async fn keep_webhook_body(
        &self,
        connector_account_id: &str,
        payload_digest: &str,
        body: &[u8],
    ) -> Result<String, StoreError> {
        let mut conn = self.writer.acquire().await?;
        self.keep_body_in(&mut conn, connector_account_id, payload_digest, body)
            .await
    }

    pub(crate) async fn keep_body_in(
        &self,
        conn: &mut AnyConnection,
        connector_account_id: &str,
        payload_digest: &str,
        body: &[u8],
    ) -> Result<String, StoreError> {
        let id = ids::webhook_body(&self.env);
        let sealed = self.seal_secret(&body_context(&id), body)?;
        let inserted = sqlx::query(
            "INSERT INTO webhook_bodies (id, connector_account_id, payload_digest, sealed_body, \
                received_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (connector_account_id, payload_digest) DO NOTHING",
        )
        .bind(&id)
        .bind(connector_account_id)
        .bind(payload_digest)
        .bind(&sealed)
        .bind(self.now_ms())
        .execute(&mut *conn)
        .await?;
        if inserted.rows_affected() == 1 {
            // Ours: the read below is only needed for a body kept before.
            return Ok(id);
        }
        let row = sqlx::query(
            "SELECT id FROM webhook_bodies WHERE connector_account_id = $1 AND payload_digest = $2",
        )
        .bind(connector_account_id)
        .bind(payload_digest)
        .fetch_one(&mut *conn)
        .await?;
        text(&row, "id")
    }

    /// The raw body an inbox row's event came in, opened through the secret box,
    /// for an operator; None when the row has none.
    pub async fn inbox_raw_body(&self, inbox_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let row = sqlx::query(
            "SELECT b.id, b.sealed_body FROM webhook_inbox i \
             JOIN webhook_bodies b ON b.id = i.raw_body_id WHERE i.id = $1",
        )
        .bind(inbox_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            self.inbox_get(inbox_id).await?;
            return Ok(None);
        };
        let id = text(&row, "id")?;
        let sealed = text(&row, "sealed_body")?;
        Ok(Some(self.open_secret(&body_context(&id), &sealed)?))
    }

    /// Record a verified event; a second delivery of the same provider event
    /// is reported as a duplicate and changes nothing.
    pub async fn inbox_insert(&self, new: &NewInboxEvent) -> Result<InboxInsert, StoreError> {
        let mut conn = self.writer.acquire().await?;
        self.inbox_insert_in(&mut conn, new).await
    }

    pub(crate) async fn inbox_insert_in(
        &self,
        conn: &mut AnyConnection,
        new: &NewInboxEvent,
    ) -> Result<InboxInsert, StoreError> {
        let now = self.now_ms();
        let id = ids::inbox(&self.env);
        let inserted = sqlx::query(
            "INSERT INTO webhook_inbox (id, adapter, connector_account_id, provider_event_id, \
                payload_digest, verification, event_json, status, attempts, next_attempt_at, received_at, \
                raw_body_id) \
             VALUES ($1, $2, $3, $4, $5, 'verified', $6, 'pending', 0, $7, $7, $8) \
             ON CONFLICT (adapter, connector_account_id, provider_event_id) DO NOTHING",
        )
        .bind(&id)
        .bind(&new.adapter)
        .bind(&new.connector_account_id)
        .bind(&new.provider_event_id)
        .bind(&new.payload_digest)
        .bind(new.event.to_string())
        .bind(now)
        .bind(&new.raw_body_id)
        .execute(&mut *conn)
        .await?;
        if inserted.rows_affected() == 1 {
            return Ok(InboxInsert::Inserted { id });
        }
        inbox_duplicate_in(conn, new).await
    }

    /// Keep a webhook that failed verification as evidence. It is quarantined
    /// at once and holds no provider event id, so it can never shadow the
    /// genuine event.
    pub async fn inbox_record_rejected(
        &self,
        adapter: &str,
        connector_account_id: &str,
        payload_digest: &str,
        detail: &str,
    ) -> Result<String, StoreError> {
        let now = self.now_ms();
        let id = ids::inbox(&self.env);
        sqlx::query(
            "INSERT INTO webhook_inbox (id, adapter, connector_account_id, payload_digest, \
                verification, verification_detail, status, quarantine_reason, attempts, \
                next_attempt_at, received_at) \
             VALUES ($1, $2, $3, $4, 'rejected', $5, 'quarantined', 'verification failed', 0, $6, $6)",
        )
        .bind(&id)
        .bind(adapter)
        .bind(connector_account_id)
        .bind(payload_digest)
        .bind(detail)
        .bind(now)
        .execute(&self.writer)
        .await?;
        Ok(id)
    }

    pub async fn inbox_get(&self, id: &str) -> Result<InboxEntry, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {INBOX_COLS} FROM webhook_inbox WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("inbox entry", id))?;
        entry_from(&row)
    }

    /// Claim up to `limit` due entries for `lease_ms`: pending or failed rows
    /// whose retry time has come, and processing rows whose claimer's lease
    /// ran out (it crashed). Each claim counts as an attempt.
    pub async fn inbox_claim(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<InboxEntry>, StoreError> {
        let now = self.now_ms();
        let sql = claim_sql(self.backend);
        let claim = sqlx::query(&sql).bind(now).bind(now + lease_ms).bind(limit);
        let rows = self.claim_queue(claim).await?;
        let mut entries = rows.iter().map(entry_from).collect::<Result<Vec<_>, _>>()?;
        entries.sort_by(|a, b| (a.next_attempt_at, &a.id).cmp(&(b.next_attempt_at, &b.id)));
        Ok(entries)
    }

    /// Mark an entry processed without applying anything (e.g. an event kind
    /// Sluice records but does not act on). Events that are applied are
    /// marked by [`Store::apply_event`] in its own transaction.
    pub async fn inbox_mark_processed(&self, id: &str) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE webhook_inbox SET status = 'processed', processed_at = $2, claimed_until = NULL \
             WHERE id = $1 AND status IN ('pending', 'processing', 'failed')",
        )
        .bind(id)
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        self.expect_inbox_row(id, done.rows_affected()).await
    }

    /// Processing failed transiently; try again at `retry_at`.
    pub async fn inbox_mark_failed(
        &self,
        id: &str,
        error: &str,
        retry_at: i64,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE webhook_inbox SET status = 'failed', last_error = $2, next_attempt_at = $3, \
                claimed_until = NULL \
             WHERE id = $1 AND status IN ('pending', 'processing', 'failed')",
        )
        .bind(id)
        .bind(error)
        .bind(retry_at)
        .execute(&self.writer)
        .await?;
        self.expect_inbox_row(id, done.rows_affected()).await
    }

    /// Set a poison event aside for a human; it is never retried automatically.
    pub async fn inbox_quarantine(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE webhook_inbox SET status = 'quarantined', quarantine_reason = $2, \
                claimed_until = NULL \
             WHERE id = $1 AND status IN ('pending', 'processing', 'failed')",
        )
        .bind(id)
        .bind(reason)
        .execute(&self.writer)
        .await?;
        self.expect_inbox_row(id, done.rows_affected()).await
    }

    /// Quarantined entries, newest first, for the operator.
    pub async fn inbox_list_quarantined(&self, limit: i64) -> Result<Vec<InboxEntry>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {INBOX_COLS} FROM webhook_inbox WHERE status = 'quarantined' \
             ORDER BY received_at DESC, id DESC LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(entry_from).collect()
    }

    async fn expect_inbox_row(&self, id: &str, affected: u64) -> Result<(), StoreError> {
        if affected == 1 {
            return Ok(());
        }
        let entry = self.inbox_get(id).await?;
        Err(StoreError::InvalidState {
            entity: "inbox entry",
            id: id.to_owned(),
            state: entry.status,
            reason: "already settled".into(),
        })
    }
}
