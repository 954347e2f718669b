//! Integration tests of the gateway: real HTTP against servers bound to 127.0.0.1:0,
//! real compiled adapters (SLUICE_TEST_ADAPTERS_DIR, default <workspace>/target/adapters),
//! the real `sluice` binary, and PostgreSQL where a test needs it. `kill` and
//! `scanner_processes` are the process-level system tests of issue 6 (harness in
//! `system`): `sluice serve` child processes on PostgreSQL, the sandbox PSP,
//! a merchant webhook receiver and a JetStream consumer.

mod admin_api;
mod cli;
mod common;
mod console;
mod kill;
mod metrics;
mod openapi;
mod pg;
mod releases_api;
mod scanner_processes;
mod secrets_at_rest;
mod startup;
mod system;
mod tenant_attack;
mod webhook_limit;
