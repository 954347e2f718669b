//! Evidence of the tenant boundary at work: events refused because they
//! named an aggregate of another connector account than the one they came
//! through (see `door/locate.rs`). Append-only (migration 0011); nothing
//! else in the store reads or acts on them.

use crate::db::{int, opt_text, text};
use crate::door::AccountScope;
use crate::{ids, Store, StoreError};
use sluice_core::PaymentEvent;

/// Where a refused event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalSource {
    /// A verified webhook (its inbox row is quarantined with the reason).
    Webhook,
    /// The adapter's parse of a PSP answer to one of our calls.
    Response,
}

impl RefusalSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalSource::Webhook => "webhook",
            RefusalSource::Response => "response",
        }
    }
}

/// One refused event, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeRefusal {
    pub id: String,
    pub source: String,
    pub connector_account_id: String,
    pub adapter: String,
    pub inbox_id: Option<String>,
    /// What the event named: `attempt`, `refund` or `capture`, and the reference.
    pub entity: String,
    pub reference: String,
    pub event: serde_json::Value,
    pub created_at: i64,
}

/// A refusal to record.
#[derive(Debug, Clone)]
pub struct NewScopeRefusal<'a> {
    pub source: RefusalSource,
    pub scope: &'a AccountScope,
    pub inbox_id: Option<&'a str>,
    pub entity: &'a str,
    pub reference: &'a str,
    pub event: &'a PaymentEvent,
}

impl Store {
    /// Keep a refused event as evidence; returns the refusal's id.
    pub async fn record_scope_refusal(
        &self,
        refusal: &NewScopeRefusal<'_>,
    ) -> Result<String, StoreError> {
        let id = ids::scope_refusal(&self.env);
        let event = serde_json::to_string(refusal.event)
            .map_err(|e| StoreError::InvalidRequest(format!("event not serialisable: {e}")))?;
        sqlx::query(
            "INSERT INTO scope_refusals (id, source, connector_account_id, adapter, inbox_id, \
             entity, reference, event_json, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&id)
        .bind(refusal.source.as_str())
        .bind(&refusal.scope.account_id)
        .bind(&refusal.scope.adapter)
        .bind(refusal.inbox_id)
        .bind(refusal.entity)
        .bind(refusal.reference)
        .bind(event)
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        Ok(id)
    }

    /// The refusals of events that came through one connector account,
    /// newest first, at most `limit`.
    pub async fn scope_refusals(
        &self,
        account_id: &str,
        limit: i64,
    ) -> Result<Vec<ScopeRefusal>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, source, connector_account_id, adapter, inbox_id, entity, reference, \
             event_json, created_at FROM scope_refusals WHERE connector_account_id = $1 \
             ORDER BY created_at DESC, id DESC LIMIT $2",
        )
        .bind(account_id)
        .bind(limit.clamp(1, 1000))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let event_json = text(row, "event_json")?;
                Ok(ScopeRefusal {
                    id: text(row, "id")?,
                    source: text(row, "source")?,
                    connector_account_id: text(row, "connector_account_id")?,
                    adapter: text(row, "adapter")?,
                    inbox_id: opt_text(row, "inbox_id")?,
                    entity: text(row, "entity")?,
                    reference: text(row, "reference")?,
                    event: serde_json::from_str(&event_json)
                        .map_err(|_| StoreError::corrupt("scope_refusals", "event_json"))?,
                    created_at: int(row, "created_at")?,
                })
            })
            .collect()
    }
}
