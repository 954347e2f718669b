//! Integration tests of the gateway: real HTTP against servers bound to 127.0.0.1:0,
//! real compiled adapters (SLUICE_TEST_ADAPTERS_DIR, default <workspace>/target/adapters),
//! the real `sluice` binary, and PostgreSQL where a test needs it.

mod admin_api;
mod cli;
mod common;
mod metrics;
mod pg;
mod startup;
