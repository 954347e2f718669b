//! Delivery tests. Every store-touching test runs twice: `<name>::on_sqlite`
//! and `<name>::on_postgres`. PostgreSQL and NATS JetStream being unreachable
//! are failures, never skips.

#[macro_use]
extern crate sluice_test_support;

pub mod common;

mod admin;
mod claims;
mod concurrency;
mod crash;
mod jetstream;
mod retries;
mod standard_webhooks;
mod webhooks;
