//! Adapter releases (issue 15, migration 0021): which adapter version serves an
//! attempt (its pin), the append-only history of an adapter's shadow and canary
//! changes, and the diffs a shadow version produced against the active one.
//!
//! None of this is payment state: a pin is metadata of the attempt, written once and
//! never through the door, and diffs are evidence about an adapter, never about money.

use crate::db::{int, json, text};
use crate::error::StoreError;
use crate::Store;

/// Longest adapter history, and longest page of shadow diffs, one read returns.
pub const MAX_ADAPTER_EVENTS: i64 = 200;

/// The adapter version that builds an attempt's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterPin {
    pub version: String,
    pub digest: String,
}

/// What happened to an adapter's staged versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterEventKind {
    ShadowStaged,
    ShadowCleared,
    CanaryStarted,
    CanaryStopped,
    /// The gateway stopped a canary whose rates exceeded the active version's.
    CanaryRolledBack,
}

impl AdapterEventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AdapterEventKind::ShadowStaged => "shadow_staged",
            AdapterEventKind::ShadowCleared => "shadow_cleared",
            AdapterEventKind::CanaryStarted => "canary_started",
            AdapterEventKind::CanaryStopped => "canary_stopped",
            AdapterEventKind::CanaryRolledBack => "canary_rolled_back",
        }
    }
}

/// One entry of an adapter's release history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterEvent {
    pub seq: i64,
    pub digest: String,
    pub kind: String,
    pub detail: String,
    /// Who: `admin`, or `gateway` for an automatic rollback.
    pub actor: String,
    pub at_ms: i64,
}

/// A shadow version's output that differed from the active one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewShadowDiff {
    pub adapter: String,
    pub active_digest: String,
    pub shadow_digest: String,
    /// `build-request`, `parse-response`, `handle-webhook`, `parse-settlement`.
    pub operation: String,
    pub account_id: String,
    /// sha256 of the input both versions got; never the input itself.
    pub input_digest: String,
    /// The differing fields, redacted excerpts of both sides (a JSON array).
    pub fields: serde_json::Value,
}

/// A stored shadow diff.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowDiff {
    pub seq: i64,
    pub diff: NewShadowDiff,
    pub at_ms: i64,
}

impl Store {
    /// Appends to an adapter's release history.
    pub async fn record_adapter_event(
        &self,
        adapter: &str,
        digest: &str,
        kind: AdapterEventKind,
        detail: &str,
        actor: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO adapter_events (adapter, digest, kind, detail, actor, at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(adapter)
        .bind(digest)
        .bind(kind.as_str())
        .bind(detail)
        .bind(actor)
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// An adapter's newest release history entries, at most [`MAX_ADAPTER_EVENTS`].
    pub async fn adapter_events(&self, adapter: &str) -> Result<Vec<AdapterEvent>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, digest, kind, detail, actor, at_ms FROM adapter_events \
             WHERE adapter = $1 ORDER BY seq DESC LIMIT $2",
        )
        .bind(adapter)
        .bind(MAX_ADAPTER_EVENTS)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AdapterEvent {
                    seq: int(row, "seq")?,
                    digest: text(row, "digest")?,
                    kind: text(row, "kind")?,
                    detail: text(row, "detail")?,
                    actor: text(row, "actor")?,
                    at_ms: int(row, "at_ms")?,
                })
            })
            .collect()
    }

    pub async fn insert_shadow_diff(&self, diff: &NewShadowDiff) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO adapter_shadow_diffs (adapter, active_digest, shadow_digest, \
             operation, account_id, input_digest, fields_json, at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&diff.adapter)
        .bind(&diff.active_digest)
        .bind(&diff.shadow_digest)
        .bind(&diff.operation)
        .bind(&diff.account_id)
        .bind(&diff.input_digest)
        .bind(diff.fields.to_string())
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// The newest diffs of an adapter's shadow version `shadow_digest`, at most
    /// `limit` (capped at [`MAX_ADAPTER_EVENTS`]).
    pub async fn shadow_diffs(
        &self,
        adapter: &str,
        shadow_digest: &str,
        limit: i64,
    ) -> Result<Vec<ShadowDiff>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, adapter, active_digest, shadow_digest, operation, account_id, \
             input_digest, fields_json, at_ms FROM adapter_shadow_diffs \
             WHERE adapter = $1 AND shadow_digest = $2 ORDER BY seq DESC LIMIT $3",
        )
        .bind(adapter)
        .bind(shadow_digest)
        .bind(limit.clamp(1, MAX_ADAPTER_EVENTS))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(shadow_diff_from).collect()
    }
}

/// An attempt row's pin, if it has one (both columns are written together).
fn shadow_diff_from(row: &sqlx::any::AnyRow) -> Result<ShadowDiff, StoreError> {
    Ok(ShadowDiff {
        seq: int(row, "seq")?,
        diff: NewShadowDiff {
            adapter: text(row, "adapter")?,
            active_digest: text(row, "active_digest")?,
            shadow_digest: text(row, "shadow_digest")?,
            operation: text(row, "operation")?,
            account_id: text(row, "account_id")?,
            input_digest: text(row, "input_digest")?,
            fields: json(row, "adapter_shadow_diffs", "fields_json")?,
        },
        at_ms: int(row, "at_ms")?,
    })
}
