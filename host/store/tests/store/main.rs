//! Store tests. Every test runs twice: `<name>::on_sqlite` and `<name>::on_postgres`.

#[macro_use]
extern crate sluice_test_support;

pub mod common;

mod accept;
mod account_cache;
mod boundary;
mod create;
mod door;
mod exits;
mod fulfillment;
mod history;
mod money;
mod pool;
mod queues;
mod reconciliation;
mod review;
mod schema;
mod search;
mod secrets;
mod tenants;
