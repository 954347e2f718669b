//! Merchant API tests through real HTTP. Every database test runs twice:
//! `<name>::on_sqlite` and `<name>::on_postgres`.

#[macro_use]
extern crate sluice_test_support;

pub mod common;

mod admin;
mod auth;
mod bad_input;
mod fulfillment;
mod idempotency;
mod openapi;
mod operations;
mod payments;
mod payments_admin;
mod reconciliation;
mod review;
mod timeline;
mod webhooks;
