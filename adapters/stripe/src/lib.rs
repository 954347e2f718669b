//! `sluice-adapter-stripe`: the Stripe-format PSP adapter, built as a WebAssembly component.
//!
//! It speaks Stripe's public API format as described in `docs/psp-wire-subsets.md`:
//! form-encoded PaymentIntents and Refunds with `Authorization: Bearer {{secret:api_key}}`
//! (a placeholder the host substitutes after its destination check) and the
//! host's references as `Idempotency-Key`, and `Stripe-Signature` webhooks
//! (`t=<unix>,v1=<hex hmac-sha256 over "{t}.{raw body}">`, keyed with the whole
//! `whsec_...` string).
//!
//! The logic lives in plain modules that compile natively and take an explicit
//! [`Host`] (configuration, keyring, clock, log), so the golden tests run without a wasm
//! runtime:
//!
//! - [`request`]: operation context → HTTP request,
//! - [`response`]: HTTP response → normalised events (and the error classification),
//! - [`webhook`] + [`signature`]: `Stripe-Signature` verification (MACs from the host's
//!   keyring: the adapter never holds a secret) and event normalisation,
//! - [`settlement`]: balance reports (CSV) → settlement lines,
//! - [`model`]: the subset of Stripe's objects the adapter reads.
//!
//! [`component`] is the thin wit-bindgen glue: it backs [`Host`] with the component's
//! host imports and forwards each export to the logic.

// The guest's `memcmp` (adapter-kit/src/memcmp.rs): the crate must be linked for its
// definition to replace wasi-libc's byte loop.
use sluice_adapter_kit as _;

pub mod component;
pub mod events;
pub mod host;
pub mod model;
pub mod normalise;
pub mod request;
pub mod response;
pub mod settlement;
pub mod signature;
pub mod webhook;

/// Bindings generated from the Sluice adapter contract (`wit/psp-adapter.wit`).
#[allow(unused_imports)] // the `export!` macro alias is only used by the wasm build
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "psp-adapter",
        additional_derives: [PartialEq, Clone],
    });
}

/// The contract's shared vocabulary (money, HTTP messages, events) as Rust types.
pub use bindings::sluice::psp::types;
pub use host::Host;

use types::{AdapterInfo, Capability};

/// The name the adapter is loaded under; also its webhook route segment.
pub const ADAPTER_NAME: &str = "stripe";

/// Currencies this adapter offers. Stripe supports many more; this list leaves out the
/// currencies whose Stripe amount rules differ from ISO 4217 minor units (for example
/// three-decimal currencies, whose last digit Stripe requires to be zero).
pub const CURRENCIES: &[&str] = &[
    "USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "NZD", "SEK", "NOK", "DKK", "PLN", "CZK",
    "SGD", "HKD",
];

/// Name, version, capabilities and currencies.
pub fn describe() -> AdapterInfo {
    AdapterInfo {
        name: ADAPTER_NAME.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        capabilities: vec![
            Capability::Authorize,
            Capability::Sale,
            Capability::Capture,
            Capability::PartialCapture,
            Capability::Void,
            Capability::Refund,
            Capability::PartialRefund,
            Capability::QueryPayment,
            Capability::QueryRefund,
            Capability::Webhooks,
            Capability::SettlementReports,
        ],
        currencies: CURRENCIES.iter().map(|c| c.to_string()).collect(),
    }
}
