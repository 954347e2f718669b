//! Test harness: every store test body runs against SQLite (a temp file) and
//! PostgreSQL (a fresh database per test), through the workspace's one
//! test-support crate. PostgreSQL being unreachable is a test failure, never a skip.

use sluice_store::{Backend, ManualClock};

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
