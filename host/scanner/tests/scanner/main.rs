//! The recovery scanner against real databases (SQLite and PostgreSQL), the
//! real compiled `test-well-behaved` adapter, the real orchestrator and a
//! fake PSP over real HTTP.

#[macro_use]
extern crate sluice_test_support;

mod common;

mod authorizations;
mod recovery;
