//! The state history: one append-only row per decision about an aggregate,
//! applied or not, with its evidence. The database refuses UPDATE and DELETE.

use crate::db::{int, opt_int, opt_text, text, Conn};
use crate::door::batch::{Bind, Expect, Write};
use crate::{Store, StoreError};
use sqlx::any::AnyRow;
use sqlx::Row;

/// Who or what produced an event or command, for the audit history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// The adapter that produced the event (name, version, component digest).
    pub adapter: Option<AdapterIdentity>,
    /// A person or component: `operator:<id>`, `merchant:<id>`, `system:scanner`, ...
    pub actor: Option<String>,
    pub trace_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterIdentity {
    pub name: String,
    pub version: String,
    pub digest: String,
}

impl Provenance {
    pub fn adapter(name: &str, version: &str, digest: &str) -> Self {
        Provenance {
            adapter: Some(AdapterIdentity {
                name: name.to_owned(),
                version: version.to_owned(),
                digest: digest.to_owned(),
            }),
            ..Provenance::default()
        }
    }

    pub fn actor(actor: &str) -> Self {
        Provenance {
            actor: Some(actor.to_owned()),
            ..Provenance::default()
        }
    }

    pub fn with_trace(mut self, trace_id: &str) -> Self {
        self.trace_id = Some(trace_id.to_owned());
        self
    }
}

/// One row of a payment's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub id: i64,
    pub payment_id: String,
    /// `order`, `attempt`, `capture` or `refund`.
    pub aggregate_type: String,
    pub aggregate_id: String,
    /// None when the row records the aggregate's creation.
    pub from_state: Option<String>,
    /// The state after the decision (equal to `from_state` unless applied).
    pub to_state: String,
    pub from_version: Option<i64>,
    pub to_version: i64,
    /// A core `EventKind`, or a command such as `COMMAND_START_ATTEMPT`.
    pub event_kind: String,
    /// A core `EvidenceSource`, or `command` for merchant/orchestrator commands.
    pub evidence_source: String,
    pub provider_event_id: Option<String>,
    pub psp_reference: Option<String>,
    pub event_identity: Option<String>,
    pub amount_minor: Option<i64>,
    pub currency: Option<String>,
    pub raw_status: Option<String>,
    pub failure_code: Option<String>,
    /// `applied`, `ignored_duplicate`, `ignored_stale`, `rejected`, `needs_reconciliation`.
    pub decision: String,
    pub reason: String,
    pub adapter_name: Option<String>,
    pub adapter_version: Option<String>,
    pub adapter_digest: Option<String>,
    pub actor: Option<String>,
    pub trace_id: Option<String>,
    pub inbox_id: Option<String>,
    pub recorded_at: i64,
}

/// What the door writes for one decision (ids and time are added on insert).
#[derive(Debug, Clone, Default)]
pub(crate) struct NewHistory<'a> {
    pub payment_id: &'a str,
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub from_state: Option<&'a str>,
    pub to_state: &'a str,
    pub from_version: Option<i64>,
    pub to_version: i64,
    pub event_kind: &'a str,
    pub evidence_source: &'a str,
    pub provider_event_id: Option<&'a str>,
    pub psp_reference: Option<&'a str>,
    pub event_identity: Option<&'a str>,
    pub amount_minor: Option<i64>,
    pub currency: Option<&'a str>,
    pub raw_status: Option<&'a str>,
    pub failure_code: Option<&'a str>,
    pub decision: &'a str,
    pub reason: &'a str,
    pub provenance: Option<&'a Provenance>,
    pub inbox_id: Option<&'a str>,
}

const HISTORY_COLS: &str = "id, payment_id, aggregate_type, aggregate_id, from_state, to_state, \
    from_version, to_version, event_kind, evidence_source, provider_event_id, psp_reference, \
    event_identity, amount_minor, currency, raw_status, failure_code, decision, reason, \
    adapter_name, adapter_version, adapter_digest, actor, trace_id, inbox_id, recorded_at";

fn entry_from(row: &AnyRow) -> Result<HistoryEntry, StoreError> {
    Ok(HistoryEntry {
        id: int(row, "id")?,
        payment_id: text(row, "payment_id")?,
        aggregate_type: text(row, "aggregate_type")?,
        aggregate_id: text(row, "aggregate_id")?,
        from_state: opt_text(row, "from_state")?,
        to_state: text(row, "to_state")?,
        from_version: opt_int(row, "from_version")?,
        to_version: int(row, "to_version")?,
        event_kind: text(row, "event_kind")?,
        evidence_source: text(row, "evidence_source")?,
        provider_event_id: opt_text(row, "provider_event_id")?,
        psp_reference: opt_text(row, "psp_reference")?,
        event_identity: opt_text(row, "event_identity")?,
        amount_minor: opt_int(row, "amount_minor")?,
        currency: opt_text(row, "currency")?,
        raw_status: opt_text(row, "raw_status")?,
        failure_code: opt_text(row, "failure_code")?,
        decision: text(row, "decision")?,
        reason: text(row, "reason")?,
        adapter_name: opt_text(row, "adapter_name")?,
        adapter_version: opt_text(row, "adapter_version")?,
        adapter_digest: opt_text(row, "adapter_digest")?,
        actor: opt_text(row, "actor")?,
        trace_id: opt_text(row, "trace_id")?,
        inbox_id: opt_text(row, "inbox_id")?,
        recorded_at: int(row, "recorded_at")?,
    })
}

/// The columns of a history row, in the order [`bind_row`] binds them.
const HISTORY_INSERT: &str = "INSERT INTO state_history (payment_id, aggregate_type, \
    aggregate_id, from_state, to_state, from_version, to_version, event_kind, evidence_source, \
    provider_event_id, psp_reference, event_identity, amount_minor, currency, raw_status, \
    failure_code, decision, reason, adapter_name, adapter_version, adapter_digest, actor, \
    trace_id, inbox_id, recorded_at) VALUES ";
pub(crate) const HISTORY_COLUMNS: usize = 25;

/// At most this many rows in one statement (a decision writes up to three).
pub(crate) const MAX_ROWS_PER_APPEND: usize = 8;

/// Append one history row inside the caller's transaction; returns its id.
pub(crate) async fn append(tx: &mut Conn, h: &NewHistory<'_>, now: i64) -> Result<i64, StoreError> {
    let ids = append_all(tx, std::slice::from_ref(h), now).await?;
    ids.first()
        .copied()
        .ok_or_else(|| StoreError::Unapplicable("a history insert returned no id".into()))
}

/// Append `rows` in one statement inside the caller's transaction; returns
/// their ids in the order of `rows` (the ids grow in that order too).
pub(crate) async fn append_all(
    tx: &mut Conn,
    rows: &[NewHistory<'_>],
    now: i64,
) -> Result<Vec<i64>, StoreError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    if rows.len() > MAX_ROWS_PER_APPEND {
        return Err(StoreError::Unapplicable(format!(
            "{} history rows in one statement (at most {MAX_ROWS_PER_APPEND})",
            rows.len()
        )));
    }
    let sql = format!("{} RETURNING id", append_sql(rows.len(), 0));
    let mut query = sqlx::query(&sql);
    for h in rows {
        query = bind_row(query, h, now);
    }
    let returned = query.fetch_all(&mut *tx).await?;
    let mut ids = returned
        .iter()
        .map(|row| row.try_get::<i64, _>("id"))
        .collect::<Result<Vec<i64>, _>>()?;
    // RETURNING's row order is unspecified (SQLite says so); the ids are
    // drawn in the order of the VALUES rows, so sorted they are that order.
    ids.sort_unstable();
    if ids.len() != rows.len() {
        return Err(StoreError::Unapplicable(format!(
            "{} history rows inserted, {} ids returned",
            rows.len(),
            ids.len()
        )));
    }
    Ok(ids)
}

/// The `INSERT` of `rows` history rows whose parameters follow the first
/// `offset` of the statement ([`bind_row`] binds each row's, in order).
pub(crate) fn append_sql(rows: usize, offset: usize) -> String {
    let mut sql = String::from(HISTORY_INSERT);
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        let params: Vec<String> = (1..=HISTORY_COLUMNS)
            .map(|col| format!("${}", offset + row * HISTORY_COLUMNS + col))
            .collect();
        sql.push('(');
        sql.push_str(&params.join(", "));
        sql.push(')');
    }
    sql
}

pub(crate) type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

pub(crate) fn bind_row<'q>(query: AnyQuery<'q>, h: &NewHistory<'_>, now: i64) -> AnyQuery<'q> {
    crate::door::batch::bind_all(query, row_binds(h, now))
}

/// The values of one row of [`append_sql`], in its columns' order.
fn row_binds(h: &NewHistory<'_>, now: i64) -> Vec<Bind> {
    let adapter = h.provenance.and_then(|p| p.adapter.as_ref());
    vec![
        h.payment_id.into(),
        h.aggregate_type.into(),
        h.aggregate_id.into(),
        h.from_state.into(),
        h.to_state.into(),
        h.from_version.into(),
        h.to_version.into(),
        h.event_kind.into(),
        h.evidence_source.into(),
        h.provider_event_id.into(),
        h.psp_reference.into(),
        h.event_identity.into(),
        h.amount_minor.into(),
        h.currency.into(),
        h.raw_status.into(),
        h.failure_code.into(),
        h.decision.into(),
        h.reason.into(),
        adapter.map(|a| a.name.as_str()).into(),
        adapter.map(|a| a.version.as_str()).into(),
        adapter.map(|a| a.digest.as_str()).into(),
        h.provenance.and_then(|p| p.actor.as_deref()).into(),
        h.provenance.and_then(|p| p.trace_id.as_deref()).into(),
        h.inbox_id.into(),
        now.into(),
    ]
}

/// [`append_all`] as a write of a door's batch: the rows' ids come back in
/// the batch's outcome.
pub(crate) fn append_write(rows: &[NewHistory<'_>], now: i64) -> Result<Write, StoreError> {
    if rows.is_empty() || rows.len() > MAX_ROWS_PER_APPEND {
        return Err(StoreError::Unapplicable(format!(
            "{} history rows in one statement (1 to {MAX_ROWS_PER_APPEND})",
            rows.len()
        )));
    }
    Ok(Write {
        sql: append_sql(rows.len(), 0),
        binds: rows.iter().flat_map(|h| row_binds(h, now)).collect(),
        expect: Expect::Ids(rows.len()),
    })
}

impl Store {
    /// Every decision about a payment and its attempts, captures and refunds,
    /// in the order they were recorded: "why is this payment in this state?".
    pub async fn timeline(&self, payment_id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {HISTORY_COLS} FROM state_history WHERE payment_id = $1 ORDER BY id"
        ))
        .bind(payment_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(entry_from).collect()
    }

    /// One page of a payment's timeline: at most `limit` rows recorded
    /// after the row `after_id` (None: from the start), in order, and
    /// whether more follow. Reads `limit + 1` rows through the
    /// `(payment_id, id)` index, so a page costs the same however long the
    /// history is.
    pub async fn timeline_page(
        &self,
        payment_id: &str,
        after_id: Option<i64>,
        limit: i64,
    ) -> Result<(Vec<HistoryEntry>, bool), StoreError> {
        let limit = limit.max(1);
        let rows = sqlx::query(&format!(
            "SELECT {HISTORY_COLS} FROM state_history WHERE payment_id = $1 AND id > $2 \
             ORDER BY id LIMIT $3"
        ))
        .bind(payment_id)
        .bind(after_id.unwrap_or(0))
        .bind(limit.saturating_add(1))
        .fetch_all(&self.pool)
        .await?;
        let mut entries = rows.iter().map(entry_from).collect::<Result<Vec<_>, _>>()?;
        let more = entries.len() > usize::try_from(limit).unwrap_or(usize::MAX);
        entries.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok((entries, more))
    }

    /// The history of one aggregate of a payment, in order (through the
    /// payment's index: every aggregate belongs to exactly one payment).
    pub async fn aggregate_history(
        &self,
        payment_id: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Vec<HistoryEntry>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {HISTORY_COLS} FROM state_history \
             WHERE payment_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 ORDER BY id"
        ))
        .bind(payment_id)
        .bind(aggregate_type)
        .bind(aggregate_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(entry_from).collect()
    }
}
