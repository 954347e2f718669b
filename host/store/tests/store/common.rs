//! Test harness: every store test body runs against SQLite (a temp file) and
//! PostgreSQL (a fresh database per test), through the workspace's one
//! test-support crate. PostgreSQL being unreachable is a test failure, never a skip.

use sluice_store::{Backend, ManualClock};
use sqlx::Row;

pub use sluice_store::Clock as _;

/// The store tests' database: a store whose clock moves only when told.
pub type TestDb = sluice_test_support::TestDb<ManualClock>;
/// What `dual_test!` hands each body.
pub type TestSubject = TestDb;

pub async fn test_subject(backend: Backend) -> TestDb {
    TestDb::open(backend).await
}

pub use sluice_test_support::door::{
    adapter_provenance, count, declined, eur, event, on_attempt, on_capture, on_refund, sys,
    Shop as Fixture,
};

/// The plan of `sql` as text lines: SQLite's `EXPLAIN QUERY PLAN`; PostgreSQL's `EXPLAIN`
/// with sequential and bitmap scans forbidden, to see which index the planner can use at all.
pub async fn query_plan(db: &TestDb, sql: &str) -> Vec<String> {
    let mut conn = db.store.pool().acquire().await.unwrap();
    match db.backend {
        Backend::Sqlite => sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}"))
            .fetch_all(&mut *conn)
            .await
            .unwrap()
            .iter()
            .map(|r| r.try_get::<String, _>("detail").unwrap())
            .collect(),
        Backend::Postgres => {
            // Tiny tables make a sequential scan cheapest; forbid it to see
            // which index the planner can use at all.
            for off in ["SET enable_seqscan = off", "SET enable_bitmapscan = off"] {
                sqlx::query(off).execute(&mut *conn).await.unwrap();
            }
            let plan = sqlx::query(&format!("EXPLAIN {sql}"))
                .fetch_all(&mut *conn)
                .await
                .unwrap()
                .iter()
                .map(|r| r.try_get::<String, _>(0).unwrap())
                .collect();
            for on in ["SET enable_seqscan = on", "SET enable_bitmapscan = on"] {
                sqlx::query(on).execute(&mut *conn).await.unwrap();
            }
            plan
        }
    }
}
