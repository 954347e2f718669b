//! The Sluice gateway: configuration, CLI, HTTP server and admin API.
//!
//! The binary `sluice` (`src/main.rs`) is a thin shell over this library, so that tests can
//! start a real server in-process on `127.0.0.1:0` ([`server::start`]).

pub mod adapter_test;
pub mod adapters;
pub mod admin;
pub mod api;
pub mod app;
pub mod auth;
pub mod cli;
pub mod client;
pub mod commands;
pub mod config;
pub mod console;
pub mod demo_setup;
pub mod error;
pub mod health;
pub mod master_key;
pub mod openapi;
pub mod payment_services;
pub mod payments_cli;
pub mod pending_metrics;
pub mod reconcile_cli;
pub mod releases;
pub mod releases_cli;
pub mod server;
pub mod supervise;
pub mod telemetry;
