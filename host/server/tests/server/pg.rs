//! Throw-away PostgreSQL databases on the test server (SLUICE_TEST_DATABASE_URL),
//! from the workspace's test-support crate.

pub use sluice_test_support::db::PgDatabase as TestDatabase;
