//! `test-well-behaved`: a small but sound PSP adapter for a JSON test wire format.
//!
//! It exists to exercise the adapter runtime and the end-to-end flow with a real
//! component. The wire format (all JSON, `Authorization: Bearer <api_key>`, written as
//! the placeholder `{{secret:api_key}}`):
//!
//! | operation     | request |
//! |---------------|---------|
//! | authorize/sale| `POST {base}/v1/payments` `{reference, amount, currency, capture: "manual"|"automatic", payment_method, return_url, description, metadata}` |
//! | capture       | `POST {base}/v1/payments/{id}/capture` `{reference, amount, currency}` |
//! | void          | `POST {base}/v1/payments/{id}/cancel` `{reference}` |
//! | refund        | `POST {base}/v1/refunds` `{payment, reference, amount, currency}` |
//! | query-payment | `GET {base}/v1/payments/{id}`, or `GET {base}/v1/payments?reference=<attempt>` |
//! | query-refund  | `GET {base}/v1/refunds/{id}`, or `GET {base}/v1/refunds?reference=<refund ref>` |
//!
//! Mutations carry `Idempotency-Key`: the attempt reference for payment creation, the
//! action reference for captures and refunds. Answers are
//! `{"id","status","amount","currency","decline_code","next_action_url","payment"}`.
//! Webhooks are signed with `X-Test-Signature: t=<unix>,v1=<hex hmac-sha256>` over
//! `"{t}.{body}"`; see [`webhook`].
//!
//! The logic lives in plain modules ([`request`], [`response`], [`webhook`]) that compile
//! natively, so benchmarks and tests can run the very same code outside the sandbox; the
//! component glue in [`component`] only fetches config, keyring MACs and the clock from the
//! host (the API key travels as the placeholder `{{secret:api_key}}`, substituted by the
//! host).

// The guest's `memcmp` (adapter-kit/src/memcmp.rs): the crate must be linked for its
// definition to replace wasi-libc's byte loop.
use sluice_adapter_kit as _;

pub mod component;
pub mod request;
pub mod response;
pub mod variant;
pub mod webhook;

/// Bindings generated from the Sluice adapter contract (`wit/psp-adapter.wit`).
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "psp-adapter",
    });
}

/// The contract's shared vocabulary (money, HTTP messages, events), as Rust types.
pub use bindings::sluice::psp::types;
pub use webhook::{verify_and_normalise, WebhookSecrets};

/// The name this adapter is loaded under; `describe().name` returns it.
pub const ADAPTER_NAME: &str = "test-well-behaved";
