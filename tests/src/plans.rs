//! What a statement reads on PostgreSQL when it runs on a plan made earlier: for tests that
//! pin a work queue claim's cost to the rows it claims, not to the length of the queue.
//!
//! A prepared statement's generic plan is made once and kept while its table grows (only an
//! `ANALYZE` or a schema change replans it). The gateway's claims are prepared statements on
//! pooled connections, so a plan chosen while a queue was nearly empty is the plan every
//! later claim runs, whatever the backlog is by then.

use sqlx::{AnyPool, Row};

/// A statement prepared on one connection with the plan PostgreSQL made for it when it was
/// first run: `plan_cache_mode = force_generic_plan`, and the work queue claims' planner
/// settings (no sequential or bitmap scans; `sluice_store::Store::claim_queue`).
pub struct GenericPlan {
    /// Taken out of the pool for good: its session settings and prepared statement must
    /// never reach another user of the pool. Closed when the plan is dropped.
    conn: sqlx::AnyConnection,
    args: String,
}

impl GenericPlan {
    /// Prepares `sql` (`$n` parameters of `types`, e.g. `"bigint, bigint, bigint"`) and runs
    /// it once with `args` in a transaction that is rolled back, so its generic plan is made
    /// now, on the tables as they are, and nothing is changed.
    pub async fn prepare(pool: &AnyPool, sql: &str, types: &str, args: &str) -> GenericPlan {
        let mut conn = pool
            .acquire()
            .await
            .expect("a PostgreSQL connection")
            .detach();
        let setup = format!(
            "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; \
             SET enable_bitmapscan = off; PREPARE probe ({types}) AS {sql}"
        );
        sqlx::raw_sql(&setup)
            .execute(&mut conn)
            .await
            .expect("the statement prepares");
        let mut plan = GenericPlan {
            conn,
            args: args.to_owned(),
        };
        plan.explain().await;
        plan
    }

    /// Runs the statement again on the plan made by [`GenericPlan::prepare`] (rolled back)
    /// and returns the rows its scans of `table` read: each scan's rows out times its loops,
    /// plus the rows its filters threw away.
    pub async fn rows_read(&mut self, table: &str) -> u64 {
        let plan = self.explain().await;
        rows_read_from(&plan, table)
    }

    /// The buffers the whole statement touched, run again (rolled back): its root node's
    /// `Buffers: shared hit=… read=…`. Index entries a scan steps over without returning
    /// them show here and not in [`GenericPlan::rows_read`].
    pub async fn buffers(&mut self) -> u64 {
        let plan = self.explain().await;
        plan.iter()
            .find(|line| line.contains("Buffers: shared"))
            .map(|line| number_after(line, "hit=") + number_after(line, "read="))
            .unwrap_or(0)
    }

    /// The plan it runs, run again (rolled back): `EXPLAIN ANALYZE`'s text lines.
    pub async fn plan(&mut self) -> Vec<String> {
        self.explain().await
    }

    async fn explain(&mut self) -> Vec<String> {
        let sql = format!(
            "BEGIN; EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE probe ({}); ROLLBACK",
            self.args
        );
        sqlx::raw_sql(&sql)
            .fetch_all(&mut self.conn)
            .await
            .expect("EXPLAIN ANALYZE of the prepared statement")
            .iter()
            .map(|row| row.try_get::<String, _>(0).expect("a plan line"))
            .collect()
    }
}

/// Writes rows straight into a queue table for a plan test: `template` is one statement
/// with `{now}`, `{from}` and `{to}` in it (e.g. a recursive CTE numbering the rows
/// `{from}..={to}`), the same SQL on both backends.
pub async fn write_rows(pool: &AnyPool, template: &str, now: i64, from: u64, to: u64) {
    let sql = template
        .replace("{now}", &now.to_string())
        .replace("{from}", &from.to_string())
        .replace("{to}", &to.to_string());
    sqlx::query(&sql)
        .execute(pool)
        .await
        .expect("the rows are written");
}

/// SQLite's `EXPLAIN QUERY PLAN` of `sql`, one line a step (`$n` parameters left unbound).
pub async fn sqlite_query_plan(pool: &AnyPool, sql: &str) -> Vec<String> {
    sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}"))
        .fetch_all(pool)
        .await
        .expect("SQLite explains the statement")
        .iter()
        .map(|row| row.try_get::<String, _>("detail").expect("a plan step"))
        .collect()
}

/// The rows read from `table` in `plan` (`EXPLAIN ANALYZE`'s text lines): every scan node of
/// it, its rows times its loops, plus what its filters removed (per loop, as `EXPLAIN` shows
/// them). A node's line is the one with its `(actual …)`; its detail lines follow it.
pub fn rows_read_from(plan: &[String], table: &str) -> u64 {
    let on_table = format!(" on {table} ");
    let mut total = 0;
    let mut loops = None;
    for line in plan {
        if line.contains("(actual ") {
            let scans_table = line.contains(" Scan ") && line.contains(&on_table);
            loops = scans_table.then(|| number_after(line, "loops="));
            if let Some(loops) = loops {
                total += number_after(line, "rows=") * loops;
            }
        } else if let Some(loops) = loops.filter(|_| line.contains("Rows Removed by")) {
            total += number_after(line, ": ") * loops;
        }
    }
    total
}

fn number_after(line: &str, marker: &str) -> u64 {
    line.split_once(marker)
        .map(|(_, rest)| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::rows_read_from;

    #[test]
    fn the_rows_of_every_scan_of_the_table_and_what_its_filters_removed_are_counted() {
        let plan: Vec<String> = [
            "Update on webhook_inbox (actual time=0.1..95.1 rows=50 loops=1)",
            "  CTE picked",
            "    ->  Limit (actual time=0.02..0.07 rows=50 loops=1)",
            "          ->  Index Scan using webhook_inbox_work on webhook_inbox webhook_inbox_1 (actual time=0.02..0.04 rows=50 loops=1)",
            "                Rows Removed by Filter: 7",
            "  ->  Nested Loop Semi Join (actual time=0.09..92.9 rows=50 loops=1)",
            "        Rows Removed by Join Filter: 299275",
            "        ->  Index Scan using webhook_inbox_work on webhook_inbox  (actual time=0.06..7.8 rows=6011 loops=1)",
            "        ->  CTE Scan on picked (actual time=0.0..0.01 rows=50 loops=6011)",
            "        ->  Index Scan using outbox_pkey on outbox (actual time=0.0..0.01 rows=1 loops=50)",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(rows_read_from(&plan, "webhook_inbox"), 50 + 7 + 6011);
        assert_eq!(rows_read_from(&plan, "outbox"), 50);
    }
}
