//! The recovery scanner against real databases (SQLite and PostgreSQL), the
//! real compiled `test-well-behaved` adapter, the real orchestrator and a
//! fake PSP over real HTTP.

mod common;

mod authorizations;
mod recovery;
