//! `sluice-adapter-adyen`: the Adyen-format PSP adapter, built as a WebAssembly component.
//!
//! It speaks Adyen's public Checkout API format as described in
//! `docs/psp-wire-subsets.md`: JSON `POST /v71/payments` and the modification endpoints
//! (`/captures`, `/cancels`, `/refunds`) with `X-API-Key: {{secret:api_key}}` (a
//! placeholder the host substitutes after its destination check) and the host's
//! references as `Idempotency-Key`, batched standard notifications whose items each carry
//! an HMAC-SHA256 signature (hex-decoded key, base64 signature in
//! `additionalData.hmacSignature`, computed by the host's keyring), and Settlement
//! details reports ([`settlement`]).
//!
//! The logic lives in plain modules that compile natively and take an explicit
//! [`Host`], so the golden tests run without a wasm runtime:
//!
//! - [`request`]: operation context → HTTP request,
//! - [`response`]: HTTP response → normalised events (and the error classification),
//! - [`notification`]: notification verification ([`hmac_signature`]) and normalisation,
//! - [`model`]: the subset of Adyen's messages the adapter reads.
//!
//! [`component`] is the thin wit-bindgen glue.

// The guest's `memcmp` (adapter-kit/src/memcmp.rs): the crate must be linked for its
// definition to replace wasi-libc's byte loop.
use sluice_adapter_kit as _;

pub mod component;
pub mod events;
pub mod hmac_signature;
pub mod host;
pub mod model;
pub mod notification;
pub mod request;
pub mod response;
pub mod settlement;

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
pub const ADAPTER_NAME: &str = "adyen";

/// Currencies this adapter offers: common ones whose Adyen minor units equal ISO 4217's.
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
