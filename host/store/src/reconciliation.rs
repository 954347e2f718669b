//! Reconciliation runs and their differences (issue 14, migration 0019).
//!
//! A run is identified by its inputs: connector account, period and the
//! report's digest. Recording the same inputs again finds the existing run and
//! writes nothing, so an upload retried, or a run resumed after a crash, never
//! repeats a repair. This module records; it never writes a payment state:
//! repairs go through the door ([`Store::apply_event`]), reviews through
//! [`Store::flag_manual_review`], and only their outcome is noted here.

use sqlx::any::AnyRow;

use crate::db::{int, json, opt_int, opt_text, text};
use crate::{ids, Store, StoreError};

/// The most differences one run may record (the report's line cap bounds it
/// anyway; this keeps one transaction bounded whatever the caller does).
pub const MAX_RUN_DIFFERENCES: usize = 50_000;
/// The largest page of differences a query answers.
pub const MAX_DIFFERENCE_PAGE: i64 = 500;

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Recorded; its repairs and reviews are being carried out.
    Repairing,
    /// Every difference was repaired or sent to review.
    Completed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Repairing => "repairing",
            RunStatus::Completed => "completed",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "repairing" => Some(RunStatus::Repairing),
            "completed" => Some(RunStatus::Completed),
            _ => None,
        }
    }
}

/// What was done about a difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Not acted on yet.
    Open,
    /// Its one safe repair went through the door.
    Repaired,
    /// Handed to an operator (the payment flagged for two-person review, or,
    /// with no payment of ours, this difference itself).
    InReview,
    /// An operator closed it after review, saying what they found.
    Closed,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Open => "open",
            Resolution::Repaired => "repaired",
            Resolution::InReview => "in_review",
            Resolution::Closed => "closed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "open" => Some(Resolution::Open),
            "repaired" => Some(Resolution::Repaired),
            "in_review" => Some(Resolution::InReview),
            "closed" => Some(Resolution::Closed),
            _ => None,
        }
    }
}

/// What identifies a run: its inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunKey {
    pub connector_account_id: String,
    pub period_start: i64,
    pub period_end: i64,
    pub report_digest: String,
}

fn key_of(new: &NewReconciliationRun) -> RunKey {
    RunKey {
        connector_account_id: new.connector_account_id.clone(),
        period_start: new.period_start,
        period_end: new.period_end,
        report_digest: new.report_digest.clone(),
    }
}

/// A run to record.
#[derive(Debug, Clone)]
pub struct NewReconciliationRun {
    pub connector_account_id: String,
    pub adapter: String,
    pub period_start: i64,
    pub period_end: i64,
    pub report_digest: String,
    pub line_count: i64,
    pub matched_lines: i64,
    pub ignored_lines: i64,
    pub differences: Vec<NewDifference>,
}

/// A difference to record, with both sides' evidence.
#[derive(Debug, Clone)]
pub struct NewDifference {
    pub class: String,
    pub attempt_reference: Option<String>,
    pub action_reference: Option<String>,
    pub psp_reference: Option<String>,
    pub payment_id: Option<String>,
    pub amount_minor: i64,
    pub currency: String,
    pub ours: serde_json::Value,
    pub psp: serde_json::Value,
    pub repair: Option<serde_json::Value>,
}

/// A recorded run.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconciliationRun {
    pub id: String,
    pub connector_account_id: String,
    pub adapter: String,
    pub period_start: i64,
    pub period_end: i64,
    pub report_digest: String,
    pub line_count: i64,
    pub matched_lines: i64,
    pub ignored_lines: i64,
    pub difference_count: i64,
    pub repaired_count: i64,
    pub review_count: i64,
    /// `{"<class>": {"count": n, "amount_minor": m}}`.
    pub class_totals: serde_json::Value,
    pub status: RunStatus,
    pub created_at: i64,
    pub completed_at: Option<i64>,
}

/// A recorded difference.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredDifference {
    pub id: String,
    pub run_id: String,
    pub seq: i64,
    pub class: String,
    pub attempt_reference: Option<String>,
    pub action_reference: Option<String>,
    pub psp_reference: Option<String>,
    pub payment_id: Option<String>,
    pub amount_minor: i64,
    pub currency: String,
    pub ours: serde_json::Value,
    pub psp: serde_json::Value,
    pub repair: Option<serde_json::Value>,
    pub resolution: Resolution,
    pub resolution_detail: Option<String>,
    pub history_id: Option<i64>,
    pub created_at: i64,
    pub resolved_at: Option<i64>,
}

/// Which differences of a run to list: a page after `after_seq`.
#[derive(Debug, Clone, Default)]
pub struct DifferenceFilter {
    pub class: Option<String>,
    /// `Some(true)`: repaired or closed; `Some(false)`: open or in review.
    pub resolved: Option<bool>,
    pub after_seq: Option<i64>,
    pub limit: i64,
}

/// Unresolved differences of one class, over every run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnresolvedClass {
    pub class: String,
    pub count: i64,
    pub amount_minor: i64,
}

const RUN_COLS: &str = "id, connector_account_id, adapter, period_start, period_end, \
     report_digest, line_count, matched_lines, ignored_lines, difference_count, repaired_count, \
     review_count, class_totals, status, created_at, completed_at";
const DIFF_COLS: &str = "id, run_id, seq, class, attempt_reference, action_reference, \
     psp_reference, payment_id, amount_minor, currency, ours_json, psp_json, repair_json, \
     resolution, resolution_detail, history_id, created_at, resolved_at";

impl Store {
    /// Record a run and its differences in one transaction, or find the run
    /// already recorded for the same account, period and report digest
    /// (then nothing is written). The flag says whether it was created now.
    pub async fn record_reconciliation_run(
        &self,
        new: &NewReconciliationRun,
    ) -> Result<(ReconciliationRun, bool), StoreError> {
        if new.differences.len() > MAX_RUN_DIFFERENCES {
            return Err(StoreError::InvalidRequest(format!(
                "a run may record at most {MAX_RUN_DIFFERENCES} differences"
            )));
        }
        if new.period_start >= new.period_end {
            return Err(StoreError::InvalidRequest(
                "the period must start before it ends".into(),
            ));
        }
        if let Some(run) = self.reconciliation_run_for(&key_of(new)).await? {
            return Ok((run, false));
        }
        let id = ids::mint(&self.env, "rec");
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        let inserted = sqlx::query(
            "INSERT INTO reconciliation_runs (id, connector_account_id, adapter, period_start, \
             period_end, report_digest, line_count, matched_lines, ignored_lines, \
             difference_count, class_totals, status, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'repairing', $12) \
             ON CONFLICT (connector_account_id, period_start, period_end, report_digest) DO NOTHING",
        )
        .bind(&id)
        .bind(&new.connector_account_id)
        .bind(&new.adapter)
        .bind(new.period_start)
        .bind(new.period_end)
        .bind(&new.report_digest)
        .bind(new.line_count)
        .bind(new.matched_lines)
        .bind(new.ignored_lines)
        .bind(new.differences.len() as i64)
        .bind(class_totals(&new.differences).to_string())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            // Another caller recorded the same report first: theirs stands.
            tx.rollback().await?;
            let run = self.reconciliation_run_for(&key_of(new)).await?;
            return run.map(|r| (r, false)).ok_or_else(|| {
                StoreError::corrupt("reconciliation_runs", "a conflicting run vanished")
            });
        }
        for (seq, diff) in new.differences.iter().enumerate() {
            insert_difference(&mut tx, &id, seq as i64, diff, self.at(now)).await?;
        }
        self.commit_write(tx).await?;
        let run = self.reconciliation_run(&id).await?;
        run.map(|r| (r, true))
            .ok_or_else(|| StoreError::not_found("reconciliation run", id))
    }

    /// The run recorded for these inputs, if any.
    pub async fn reconciliation_run_for(
        &self,
        key: &RunKey,
    ) -> Result<Option<ReconciliationRun>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLS} FROM reconciliation_runs WHERE connector_account_id = $1 \
             AND period_start = $2 AND period_end = $3 AND report_digest = $4"
        ))
        .bind(&key.connector_account_id)
        .bind(key.period_start)
        .bind(key.period_end)
        .bind(&key.report_digest)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(run_from).transpose()
    }

    /// One run by id.
    pub async fn reconciliation_run(
        &self,
        id: &str,
    ) -> Result<Option<ReconciliationRun>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLS} FROM reconciliation_runs WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(run_from).transpose()
    }

    /// A page of a run's differences in their recorded order, filtered.
    pub async fn reconciliation_differences(
        &self,
        run_id: &str,
        filter: &DifferenceFilter,
    ) -> Result<Vec<StoredDifference>, StoreError> {
        let resolved = match filter.resolved {
            None => "",
            Some(true) => " AND resolution IN ('repaired', 'closed')",
            Some(false) => " AND resolution IN ('open', 'in_review')",
        };
        let rows = sqlx::query(&format!(
            "SELECT {DIFF_COLS} FROM reconciliation_differences WHERE run_id = $1 \
             AND ($2 IS NULL OR class = $2) AND seq > $3{resolved} ORDER BY seq LIMIT $4"
        ))
        .bind(run_id)
        .bind(filter.class.as_deref())
        .bind(filter.after_seq.unwrap_or(-1))
        .bind(filter.limit.clamp(1, MAX_DIFFERENCE_PAGE))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(difference_from).collect()
    }

    /// Note what was done about an open difference. Only an open difference
    /// changes, so a resumed run never records an outcome twice; the answer
    /// says whether this call recorded it.
    pub async fn resolve_reconciliation_difference(
        &self,
        id: &str,
        resolution: Resolution,
        detail: &str,
        history_id: Option<i64>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE reconciliation_differences SET resolution = $1, resolution_detail = $2, \
             history_id = $3, resolved_at = $4 WHERE id = $5 AND resolution = 'open'",
        )
        .bind(resolution.as_str())
        .bind(detail)
        .bind(history_id)
        .bind(self.now_ms())
        .bind(id)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// An operator closes a difference in review, with what they found: it stops
    /// counting as unresolved. Nothing about the payment changes here (a repair the
    /// operator decided goes through the two-person review, through the door). Only a
    /// difference in review is closed, and only once.
    pub async fn close_reconciliation_difference(
        &self,
        id: &str,
        operator: &str,
        note: &str,
    ) -> Result<StoredDifference, StoreError> {
        let detail = format!("closed by operator:{operator}: {note}");
        let done = sqlx::query(
            "UPDATE reconciliation_differences SET resolution = 'closed', \
             resolution_detail = $1, resolved_at = $2 WHERE id = $3 AND resolution = 'in_review'",
        )
        .bind(&detail)
        .bind(self.now_ms())
        .bind(id)
        .execute(&self.writer)
        .await?;
        let row = sqlx::query(&format!(
            "SELECT {DIFF_COLS} FROM reconciliation_differences WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("reconciliation difference", id))?;
        let difference = difference_from(&row)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "difference {id} is {}; only a difference in review is closed",
                difference.resolution.as_str()
            )));
        }
        Ok(difference)
    }

    /// Count what the run's differences came to and mark it completed.
    pub async fn complete_reconciliation_run(
        &self,
        run_id: &str,
    ) -> Result<Option<ReconciliationRun>, StoreError> {
        sqlx::query(
            "UPDATE reconciliation_runs SET status = 'completed', completed_at = $1, \
             repaired_count = (SELECT COUNT(*) FROM reconciliation_differences d \
                 WHERE d.run_id = $2 AND d.resolution = 'repaired'), \
             review_count = (SELECT COUNT(*) FROM reconciliation_differences d \
                 WHERE d.run_id = $2 AND d.resolution = 'in_review') \
             WHERE id = $2 AND status = 'repairing'",
        )
        .bind(self.now_ms())
        .bind(run_id)
        .execute(&self.writer)
        .await?;
        self.reconciliation_run(run_id).await
    }

    /// The payments with an attempt at a connector account created in
    /// `[start, end)` (milliseconds), in id order, at most `limit`: our side
    /// of a report's period.
    pub async fn reconciliation_payment_ids(
        &self,
        account_id: &str,
        start: i64,
        end: i64,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT DISTINCT payment_id FROM payment_attempts WHERE connector_account_id = $1 \
             AND created_at >= $2 AND created_at < $3 ORDER BY payment_id LIMIT $4",
        )
        .bind(account_id)
        .bind(start)
        .bind(end)
        .bind(limit.max(1))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| text(row, "payment_id")).collect()
    }

    /// The attempts of a payment on which a chargeback was applied.
    pub async fn chargebacked_attempts(&self, payment_id: &str) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT DISTINCT aggregate_id FROM state_history WHERE payment_id = $1 \
             AND aggregate_type = 'attempt' AND event_kind = 'CHARGEBACK' AND decision = 'applied'",
        )
        .bind(payment_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| text(row, "aggregate_id")).collect()
    }

    /// Unresolved differences (open or in review) by class, over every run,
    /// and when the oldest of them was recorded: for `/metrics`.
    pub async fn unresolved_differences(
        &self,
    ) -> Result<(Vec<UnresolvedClass>, Option<i64>), StoreError> {
        let rows = sqlx::query(
            "SELECT class, COUNT(*) AS n, CAST(COALESCE(SUM(amount_minor), 0) AS BIGINT) AS amount, \
             MIN(created_at) AS oldest FROM reconciliation_differences \
             WHERE resolution IN ('open', 'in_review') GROUP BY class ORDER BY class",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut oldest: Option<i64> = None;
        let mut classes = Vec::with_capacity(rows.len());
        for row in &rows {
            let at = int(row, "oldest")?;
            oldest = Some(oldest.map_or(at, |o| o.min(at)));
            classes.push(UnresolvedClass {
                class: text(row, "class")?,
                count: int(row, "n")?,
                amount_minor: int(row, "amount")?,
            });
        }
        Ok((classes, oldest))
    }
}

async fn insert_difference(
    tx: &mut crate::db::Conn,
    run_id: &str,
    seq: i64,
    diff: &NewDifference,
    at: crate::ids::At<'_>,
) -> Result<(), StoreError> {
    let now = at.now;
    sqlx::query(
        "INSERT INTO reconciliation_differences (seq, id, run_id, class, attempt_reference, \
         action_reference, psp_reference, payment_id, amount_minor, currency, ours_json, \
         psp_json, repair_json, resolution, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 'open', $14)",
    )
    .bind(seq)
    .bind(ids::mint(at.env, "rdf"))
    .bind(run_id)
    .bind(&diff.class)
    .bind(diff.attempt_reference.as_deref())
    .bind(diff.action_reference.as_deref())
    .bind(diff.psp_reference.as_deref())
    .bind(diff.payment_id.as_deref())
    .bind(diff.amount_minor.max(0))
    .bind(&diff.currency)
    .bind(diff.ours.to_string())
    .bind(diff.psp.to_string())
    .bind(diff.repair.as_ref().map(|r| r.to_string()))
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// `{"<class>": {"count": n, "amount_minor": m}}` of what a run found.
fn class_totals(differences: &[NewDifference]) -> serde_json::Value {
    let mut totals = std::collections::BTreeMap::<&str, (i64, i64)>::new();
    for diff in differences {
        let entry = totals.entry(diff.class.as_str()).or_default();
        entry.0 += 1;
        entry.1 = entry.1.saturating_add(diff.amount_minor.max(0));
    }
    totals
        .into_iter()
        .map(|(class, (count, amount))| {
            let value = serde_json::json!({ "count": count, "amount_minor": amount });
            (class.to_owned(), value)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn run_from(row: &AnyRow) -> Result<ReconciliationRun, StoreError> {
    let status = text(row, "status")?;
    Ok(ReconciliationRun {
        id: text(row, "id")?,
        connector_account_id: text(row, "connector_account_id")?,
        adapter: text(row, "adapter")?,
        period_start: int(row, "period_start")?,
        period_end: int(row, "period_end")?,
        report_digest: text(row, "report_digest")?,
        line_count: int(row, "line_count")?,
        matched_lines: int(row, "matched_lines")?,
        ignored_lines: int(row, "ignored_lines")?,
        difference_count: int(row, "difference_count")?,
        repaired_count: int(row, "repaired_count")?,
        review_count: int(row, "review_count")?,
        class_totals: json(row, "reconciliation_runs", "class_totals")?,
        status: RunStatus::parse(&status)
            .ok_or_else(|| StoreError::corrupt("reconciliation_runs", "status"))?,
        created_at: int(row, "created_at")?,
        completed_at: opt_int(row, "completed_at")?,
    })
}

fn difference_from(row: &AnyRow) -> Result<StoredDifference, StoreError> {
    const TABLE: &str = "reconciliation_differences";
    let resolution = text(row, "resolution")?;
    let repair = opt_text(row, "repair_json")?
        .map(|raw| serde_json::from_str(&raw))
        .transpose()
        .map_err(|_| StoreError::corrupt(TABLE, "repair_json"))?;
    Ok(StoredDifference {
        id: text(row, "id")?,
        run_id: text(row, "run_id")?,
        seq: int(row, "seq")?,
        class: text(row, "class")?,
        attempt_reference: opt_text(row, "attempt_reference")?,
        action_reference: opt_text(row, "action_reference")?,
        psp_reference: opt_text(row, "psp_reference")?,
        payment_id: opt_text(row, "payment_id")?,
        amount_minor: int(row, "amount_minor")?,
        currency: text(row, "currency")?,
        ours: json(row, TABLE, "ours_json")?,
        psp: json(row, TABLE, "psp_json")?,
        repair,
        resolution: Resolution::parse(&resolution)
            .ok_or_else(|| StoreError::corrupt(TABLE, "resolution"))?,
        resolution_detail: opt_text(row, "resolution_detail")?,
        history_id: opt_int(row, "history_id")?,
        created_at: int(row, "created_at")?,
        resolved_at: opt_int(row, "resolved_at")?,
    })
}
