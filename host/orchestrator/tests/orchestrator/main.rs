//! The orchestrator against real databases (SQLite and PostgreSQL), the real
//! compiled `test-well-behaved` adapter and a fake PSP over real HTTP.

#[macro_use]
extern crate sluice_test_support;

mod common;

mod call_slots;
mod exfiltration;
mod failover;
mod money;
mod payments;
mod reconciliation;
mod releases;
mod resend;
mod sandbox_e2e;
mod webhooks;
