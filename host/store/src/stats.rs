//! Cheap grouped counts of the non-terminal rows, for `/metrics`: each query
//! reads only the partial indexes over the pending set (and over flagged
//! payments and the webhook inbox's work queue), never history or terminal rows.

use crate::db::{int, opt_int, text};
use crate::{Store, StoreError};

/// How many rows of one aggregate sit in one non-terminal state, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount {
    /// `order`, `attempt`, `capture` or `refund`.
    pub aggregate: String,
    pub state: String,
    pub count: i64,
    /// `created_at` of the oldest row (unix ms).
    pub oldest_created_at: Option<i64>,
}

/// The pending set at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingStats {
    pub states: Vec<StateCount>,
    /// Payments flagged for manual review.
    pub manual_review: i64,
    /// `updated_at` of the longest-flagged payment (unix ms), approximately
    /// when it was flagged.
    pub oldest_manual_review_at: Option<i64>,
    /// Verified webhook events not yet applied, per inbox status (`pending`,
    /// `processing`, `failed`), with the oldest `received_at`.
    pub inbox_backlog: Vec<(String, i64, Option<i64>)>,
}

impl Store {
    /// Count and oldest age per non-terminal state of orders, attempts,
    /// captures and refunds, and the manual-review count.
    pub async fn pending_stats(&self) -> Result<PendingStats, StoreError> {
        // The WHERE clauses repeat the partial indexes' predicates exactly,
        // so both databases can answer from the index.
        let rows = sqlx::query(
            "SELECT 'attempt' AS aggregate, state, COUNT(*) AS n, MIN(created_at) AS oldest \
                FROM payment_attempts WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED') \
                GROUP BY state \
             UNION ALL SELECT 'capture' AS aggregate, state, COUNT(*) AS n, MIN(created_at) AS oldest \
                FROM captures WHERE state NOT IN ('SUCCEEDED', 'FAILED') GROUP BY state \
             UNION ALL SELECT 'refund' AS aggregate, state, COUNT(*) AS n, MIN(created_at) AS oldest \
                FROM refunds WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED') \
                GROUP BY state \
             UNION ALL SELECT 'order' AS aggregate, state, COUNT(*) AS n, MIN(created_at) AS oldest \
                FROM payment_orders \
                WHERE state IN ('CREATED', 'PROCESSING', 'REQUIRES_ACTION', 'AUTHORIZED') \
                GROUP BY state",
        )
        .fetch_all(self.pool())
        .await?;
        let mut stats = PendingStats::default();
        for row in &rows {
            stats.states.push(StateCount {
                aggregate: text(row, "aggregate")?,
                state: text(row, "state")?,
                count: int(row, "n")?,
                oldest_created_at: opt_int(row, "oldest")?,
            });
        }
        let review = sqlx::query(
            "SELECT COUNT(*) AS n, MIN(updated_at) AS oldest FROM payment_orders \
             WHERE manual_review = 1",
        )
        .fetch_one(self.pool())
        .await?;
        stats.manual_review = int(&review, "n")?;
        stats.oldest_manual_review_at = opt_int(&review, "oldest")?;
        let inbox = sqlx::query(
            "SELECT status, COUNT(*) AS n, MIN(received_at) AS oldest FROM webhook_inbox \
             WHERE status IN ('pending', 'processing', 'failed') GROUP BY status",
        )
        .fetch_all(self.pool())
        .await?;
        for row in &inbox {
            stats.inbox_backlog.push((
                text(row, "status")?,
                int(row, "n")?,
                opt_int(row, "oldest")?,
            ));
        }
        Ok(stats)
    }
}
