//! Merchant request idempotency: `(merchant, endpoint, Idempotency-Key)` maps
//! to one request fingerprint and, once done, its stored response.

use crate::db::{int, opt_int, opt_text, text};
use crate::{Backend, Store, StoreError};
use sqlx::any::AnyRow;

/// On PostgreSQL a key's own writes commit without waiting for their WAL
/// flush: each statement turns `synchronous_commit` off for its own
/// transaction only (`set_config(…, true)`, gone at its commit, so it never
/// reaches the next transaction on the pooled connection). Two of a keyed
/// request's five commits stop waiting for the disk, and nothing that matters
/// becomes losable:
/// - WAL is one sequence, and a commit that waits flushes everything written
///   before it. The key's row is written before the request's first money
///   write, so it is on disk once that write's commit is; a crash before then
///   loses the key together with a request that had changed nothing.
/// - A lost response (`idempotency_complete`) leaves the key in progress, as
///   a crash just before storing it always could: once its lease ends a retry
///   runs the request again, and every operation behind it answers that from
///   its own references (order number, attempt and refund references).
///
/// Visibility does not change: other requests see the row at once. SQLite
/// has one durability setting per connection and keeps it.
fn lazy_commit(backend: Backend, sqlite: &'static str, postgres: &'static str) -> &'static str {
    match backend {
        Backend::Sqlite => sqlite,
        Backend::Postgres => postgres,
    }
}

const BEGIN_SQLITE: &str = "INSERT INTO idempotency_keys \
     (merchant_id, endpoint, idem_key, request_fingerprint, state, locked_until, created_at) \
     VALUES ($1, $2, $3, $4, 'in_progress', $5, $6) \
     ON CONFLICT (merchant_id, endpoint, idem_key) DO NOTHING";
const BEGIN_POSTGRES: &str =
    "WITH lazy_commit AS (SELECT set_config('synchronous_commit', 'off', true)) \
     INSERT INTO idempotency_keys \
     (merchant_id, endpoint, idem_key, request_fingerprint, state, locked_until, created_at) \
     SELECT $1, $2, $3, $4, 'in_progress', $5, $6 FROM lazy_commit \
     ON CONFLICT (merchant_id, endpoint, idem_key) DO NOTHING";

const TAKE_OVER_SQLITE: &str = "UPDATE idempotency_keys SET locked_until = $4 \
     WHERE merchant_id = $1 AND endpoint = $2 AND idem_key = $3 \
       AND state = 'in_progress' AND locked_until < $5";
const TAKE_OVER_POSTGRES: &str = "UPDATE idempotency_keys SET locked_until = $4 \
     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit \
     WHERE merchant_id = $1 AND endpoint = $2 AND idem_key = $3 \
       AND state = 'in_progress' AND locked_until < $5";

const COMPLETE_SQLITE: &str =
    "UPDATE idempotency_keys SET state = 'completed', response_status = $4, \
     response_body = $5, completed_at = $6, locked_until = NULL \
     WHERE merchant_id = $1 AND endpoint = $2 AND idem_key = $3 AND state = 'in_progress'";
const COMPLETE_POSTGRES: &str =
    "UPDATE idempotency_keys SET state = 'completed', response_status = $4, \
     response_body = $5, completed_at = $6, locked_until = NULL \
     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit \
     WHERE merchant_id = $1 AND endpoint = $2 AND idem_key = $3 AND state = 'in_progress'";

const RELEASE_SQLITE: &str = "DELETE FROM idempotency_keys \
     WHERE merchant_id = $1 AND endpoint = $2 AND idem_key = $3 AND state = 'in_progress'";
const RELEASE_POSTGRES: &str = "DELETE FROM idempotency_keys \
     USING (SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit \
     WHERE merchant_id = $1 AND endpoint = $2 AND idem_key = $3 AND state = 'in_progress'";

/// What `idempotency_begin` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyBegin {
    /// The caller owns the key now: do the work, then `idempotency_complete`.
    Started,
    /// Another request with this key is still running (its lease has not expired).
    InProgress,
    /// The request already completed: replay this response.
    Completed { status: u16, body: String },
    /// The key was used with a different request.
    FingerprintMismatch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    pub merchant_id: String,
    pub endpoint: String,
    pub key: String,
    pub request_fingerprint: String,
    /// `in_progress` or `completed`.
    pub state: String,
    pub response_status: Option<u16>,
    pub response_body: Option<String>,
    pub locked_until: Option<i64>,
    pub created_at: i64,
    pub completed_at: Option<i64>,
}

fn record_from(row: &AnyRow) -> Result<IdempotencyRecord, StoreError> {
    let status = opt_int(row, "response_status")?
        .map(|s| {
            u16::try_from(s).map_err(|_| StoreError::corrupt("idempotency_keys", "response_status"))
        })
        .transpose()?;
    Ok(IdempotencyRecord {
        merchant_id: text(row, "merchant_id")?,
        endpoint: text(row, "endpoint")?,
        key: text(row, "idem_key")?,
        request_fingerprint: text(row, "request_fingerprint")?,
        state: text(row, "state")?,
        response_status: status,
        response_body: opt_text(row, "response_body")?,
        locked_until: opt_int(row, "locked_until")?,
        created_at: int(row, "created_at")?,
        completed_at: opt_int(row, "completed_at")?,
    })
}

impl Store {
    /// Claim an idempotency key for a request. `lease_ms` bounds how long a
    /// crashed request can block its retries.
    pub async fn idempotency_begin(
        &self,
        merchant_id: &str,
        endpoint: &str,
        key: &str,
        fingerprint: &str,
        lease_ms: i64,
    ) -> Result<IdempotencyBegin, StoreError> {
        let now = self.now_ms();
        let inserted = sqlx::query(lazy_commit(self.backend, BEGIN_SQLITE, BEGIN_POSTGRES))
            .bind(merchant_id)
            .bind(endpoint)
            .bind(key)
            .bind(fingerprint)
            .bind(now + lease_ms)
            .bind(now)
            .execute(&self.writer)
            .await?;
        if inserted.rows_affected() == 1 {
            return Ok(IdempotencyBegin::Started);
        }
        let existing = self
            .idempotency_lookup(merchant_id, endpoint, key)
            .await?
            .ok_or_else(|| StoreError::Conflict("idempotency key pruned concurrently".into()))?;
        if existing.request_fingerprint != fingerprint {
            return Ok(IdempotencyBegin::FingerprintMismatch);
        }
        if let (Some(status), Some(body)) = (existing.response_status, existing.response_body) {
            return Ok(IdempotencyBegin::Completed { status, body });
        }
        // A request that crashed mid-way left its lease behind: take it over, at
        // most one taker wins the conditional update.
        let taken = sqlx::query(lazy_commit(
            self.backend,
            TAKE_OVER_SQLITE,
            TAKE_OVER_POSTGRES,
        ))
        .bind(merchant_id)
        .bind(endpoint)
        .bind(key)
        .bind(now + lease_ms)
        .bind(now)
        .execute(&self.writer)
        .await?;
        Ok(if taken.rows_affected() == 1 {
            IdempotencyBegin::Started
        } else {
            IdempotencyBegin::InProgress
        })
    }

    /// Store the response of a request that owns its key.
    pub async fn idempotency_complete(
        &self,
        merchant_id: &str,
        endpoint: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(lazy_commit(
            self.backend,
            COMPLETE_SQLITE,
            COMPLETE_POSTGRES,
        ))
        .bind(merchant_id)
        .bind(endpoint)
        .bind(key)
        .bind(i64::from(status))
        .bind(body)
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::not_found(
                "in-progress idempotency key",
                format!("{endpoint} {key}"),
            ));
        }
        Ok(())
    }

    /// Give a key back (the request failed before any side effect), so a
    /// retry with the same key starts afresh.
    pub async fn idempotency_release(
        &self,
        merchant_id: &str,
        endpoint: &str,
        key: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(lazy_commit(self.backend, RELEASE_SQLITE, RELEASE_POSTGRES))
            .bind(merchant_id)
            .bind(endpoint)
            .bind(key)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub async fn idempotency_lookup(
        &self,
        merchant_id: &str,
        endpoint: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT merchant_id, endpoint, idem_key, request_fingerprint, state, response_status, \
                    response_body, locked_until, created_at, completed_at \
             FROM idempotency_keys WHERE merchant_id = $1 AND endpoint = $2 AND idem_key = $3",
        )
        .bind(merchant_id)
        .bind(endpoint)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(record_from).transpose()
    }

    /// Delete completed keys created before `older_than_ms`; returns how many.
    pub async fn idempotency_prune(&self, older_than_ms: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idempotency_keys WHERE created_at < $1 AND state = 'completed'",
        )
        .bind(older_than_ms)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected())
    }
}
