//! The one test-support crate of the workspace (a dev-dependency, and the
//! simulator's way to its PostgreSQL databases; nothing here ships in the
//! gateway). Every crate's integration tests draw their
//! harness from here instead of keeping a copy:
//!
//! - [`db`]: a migrated store on a throwaway database, SQLite (a temp file) or
//!   PostgreSQL (a fresh database per test, dropped afterwards; PostgreSQL being
//!   unreachable is a failure, never a skip), and [`dual_test!`], which runs one
//!   test body on both;
//! - [`door`]: a merchant with one connector account and payments brought into a
//!   state through the store's one door;
//! - [`clock`]: the test clocks (`ManualClock` from the store, and
//!   [`clock::SkewClock`], the wall clock plus an offset a test moves forward);
//! - [`adapters`]: the compiled test adapters, one compile cache per test binary,
//!   a runtime with adapters loaded, the `test-well-behaved` webhook signature;
//! - [`orchestrator`]: orchestrator budgets sized for tests on 2 shared cores;
//! - [`wait`]: [`wait::eventually`], polling a condition under a deadline;
//! - [`plans`]: the rows a statement reads on PostgreSQL on a generic plan made earlier;
//! - [`fake_psp`]: an in-process fake PSP over real HTTP for the
//!   `test-well-behaved` adapter, with fault modes and per-reference counts.
//!
//! The process-level system tests (kill -9, two scanner processes) live in
//! `host/server/tests/server/`, where Cargo provides the `sluice` binary.

pub mod adapters;
pub mod clock;
pub mod db;
pub mod door;
pub mod fake_psp;
pub mod orchestrator;
pub mod plans;
pub mod wait;

pub use clock::{SkewClock, TestClock};
pub use db::TestDb;
pub use sluice_store::Backend;
pub use wait::eventually;

/// Run one async test body against both backends: two `#[tokio::test]`s,
/// `on_sqlite` and `on_postgres`, in a module named after the test.
///
/// The calling test crate says what a body gets: its `common` module defines
/// `type TestSubject` and `async fn test_subject(Backend) -> TestSubject` (a
/// bare [`TestDb`], or a harness built on one). `async fn name(db)` hands the
/// body the subject by value, `async fn name(&db)` by reference.
// `crate::common` is meant to resolve in the calling test crate: that is where
// its subject is defined.
#[allow(clippy::crate_in_macro_def)]
#[macro_export]
macro_rules! dual_test {
    ($(#[$meta:meta])* async fn $name:ident(&$subject:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($subject: &crate::common::TestSubject) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_sqlite() {
                let subject = crate::common::test_subject($crate::Backend::Sqlite).await;
                run(&subject).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_postgres() {
                let subject = crate::common::test_subject($crate::Backend::Postgres).await;
                run(&subject).await;
            }
        }
    };
    ($(#[$meta:meta])* async fn $name:ident($subject:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($subject: crate::common::TestSubject) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_sqlite() {
                run(crate::common::test_subject($crate::Backend::Sqlite).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_postgres() {
                run(crate::common::test_subject($crate::Backend::Postgres).await).await;
            }
        }
    };
}

/// Test logs at `warn` (or `RUST_LOG`), captured per test; once per binary.
pub fn init_tracing() {
    static ONCE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
    });
}
