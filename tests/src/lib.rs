//! Shared test support for the workspace's integration tests (a dev-dependency
//! only; nothing here ships in the gateway).
//!
//! - [`fake_psp`]: an in-process fake PSP over real HTTP for the
//!   `test-well-behaved` adapter, with fault modes and per-reference counts.
//!
//! The process-level system tests (kill -9, two scanner processes) live in
//! `host/server/tests/server/`, where Cargo provides the `sluice` binary.

pub mod fake_psp;
