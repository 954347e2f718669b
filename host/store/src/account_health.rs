//! The health record of a connector account (issue 13, migration 0016): an
//! operator's pause for new attempts and the account's append-only history
//! of pauses, resumes and breaker transitions. A pause never touches a
//! payment: attempts already at the PSP keep converging through queries and
//! webhooks; routing only skips the account for new ones.

use crate::db::{int, text};
use crate::error::StoreError;
use crate::merchants::ConnectorAccount;
use crate::Store;

/// Longest history an account's health view returns (newest first).
pub const MAX_ACCOUNT_EVENTS: i64 = 100;

/// One entry of an account's health history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountEvent {
    pub seq: i64,
    /// `paused`, `resumed` or `breaker`.
    pub kind: String,
    pub detail: String,
    /// The operator, or `breaker` for the gateway's own transitions.
    pub actor: String,
    pub at_ms: i64,
}

impl Store {
    /// Pause the account for new attempts (again: with the new reason), and
    /// say so in its history, in one transaction.
    pub async fn pause_connector_account(
        &self,
        account_id: &str,
        reason: &str,
        actor: &str,
    ) -> Result<ConnectorAccount, StoreError> {
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE connector_accounts SET paused_reason = $2, paused_at = $3, updated_at = $3 \
             WHERE id = $1",
        )
        .bind(account_id)
        .bind(reason)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::not_found("connector account", account_id));
        }
        insert_event(&mut tx, account_id, "paused", reason, actor, now).await?;
        self.commit_write(tx).await?;
        self.account_cache.invalidate();
        self.get_connector_account(account_id, None).await
    }

    /// Take new attempts again. Resuming an account that is not paused
    /// changes nothing and writes no history.
    pub async fn resume_connector_account(
        &self,
        account_id: &str,
        actor: &str,
    ) -> Result<ConnectorAccount, StoreError> {
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE connector_accounts SET paused_reason = NULL, paused_at = NULL, \
             updated_at = $2 WHERE id = $1 AND paused_reason IS NOT NULL",
        )
        .bind(account_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            insert_event(
                &mut tx,
                account_id,
                "resumed",
                "resumed by an operator",
                actor,
                now,
            )
            .await?;
        }
        self.commit_write(tx).await?;
        self.account_cache.invalidate();
        self.get_connector_account(account_id, None).await
    }

    /// A breaker transition of the account, for its history.
    pub async fn record_breaker_transition(
        &self,
        account_id: &str,
        detail: &str,
    ) -> Result<(), StoreError> {
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        insert_event(&mut tx, account_id, "breaker", detail, "breaker", now).await?;
        self.commit_write(tx).await?;
        Ok(())
    }

    /// The account's newest history entries, at most [`MAX_ACCOUNT_EVENTS`].
    pub async fn connector_account_events(
        &self,
        account_id: &str,
    ) -> Result<Vec<AccountEvent>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, kind, detail, actor, at_ms FROM connector_account_events \
             WHERE account_id = $1 ORDER BY seq DESC LIMIT $2",
        )
        .bind(account_id)
        .bind(MAX_ACCOUNT_EVENTS)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AccountEvent {
                    seq: int(row, "seq")?,
                    kind: text(row, "kind")?,
                    detail: text(row, "detail")?,
                    actor: text(row, "actor")?,
                    at_ms: int(row, "at_ms")?,
                })
            })
            .collect()
    }
}

async fn insert_event(
    tx: &mut crate::db::Conn,
    account_id: &str,
    kind: &str,
    detail: &str,
    actor: &str,
    at_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO connector_account_events (account_id, kind, detail, actor, at_ms) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(account_id)
    .bind(kind)
    .bind(detail)
    .bind(actor)
    .bind(at_ms)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
