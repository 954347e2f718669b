//! Sluice's orchestrator: one [`Orchestrator::advance`] for the merchant API,
//! the webhook processor, the recovery scanner and operators (seed 000 §5).
//!
//! - [`convert`]: the adapter contract's types ↔ `sluice-core`'s, in one place.
//! - [`transport`]: the host's PSP transport; adapters build requests, the
//!   host performs them, refusing any destination outside the connector
//!   account's `base_url`.
//! - `call`: one PSP operation and its classification — a timeout, a
//!   connection error, a 5xx or an answer the adapter cannot interpret is
//!   UNKNOWN (never FAILED); only a definitive decline the adapter reports is
//!   a failure.
//! - [`advance`]: the state-driven step for an attempt, capture or refund:
//!   record SUBMITTED / PROCESSING through the store's door first, then send
//!   with the stable reference as idempotency key; resolve UNKNOWN only by a
//!   query with the original reference.
//! - [`call_slots`]: the PSP call bulkhead, a concurrency limit per connector
//!   account with a share reserved for queries; a call without a slot in time
//!   is shed before anything is recorded as sent.
//! - `breakers`: a circuit breaker per connector account, fed by every PSP
//!   call, and the adapter's health derived from its accounts' breakers;
//!   asked before routing a new attempt (never before a query).
//! - [`commands`]: create / confirm / capture / void / refund with a bounded
//!   synchronous wait; the PSP step continues in the background.
//! - [`explain`]: the facts behind "what happens next to this payment",
//!   read for the pure `sluice_core::explain_next` (the timeline's `next`).
//! - [`webhook`] and [`inbox`]: verified webhook events go durably into the
//!   inbox before the PSP gets its ack; an asynchronous processor applies them
//!   through the door, retries, quarantines poison events, replays on request.
//!
//! Every state change goes through `sluice_store::Store::apply_event` (or
//! the store's creation and reservation functions); nothing here writes a
//! state itself.

pub mod advance;
mod breakers;
mod call;
pub mod call_slots;
pub mod commands;
pub mod config;
pub mod convert;
mod create;
mod error;
mod exits;
pub mod explain;
mod first_send;
pub mod fulfillment;
pub mod inbox;
mod keyrings;
mod metrics;
mod orchestrator;
pub mod psp_wait;
pub mod reconcile;
mod releases;
pub mod shadow;
pub mod transport;
pub mod webhook;

pub use advance::{Action, Advanced};
pub use breakers::{AccountHealth, AdapterHealth, BreakerHealth};
pub use call::NotSent;
pub use call_slots::{CallLimits, CallLimitsError, Shed};
pub use commands::{CaptureView, ConfirmOptions, Created, PaymentView, RefundView};
pub use config::{ConnectorRecovery, InboxConfig, OrchestratorConfig};
pub use create::{CreatePayment, RouteRefusal};
pub use error::OrchestratorError;
pub use explain::Explained;
pub use fulfillment::{
    FulfillmentRequest, FulfillmentResponse, FulfillmentStep, FulfillmentTransport,
    HttpFulfillmentTransport,
};
pub use inbox::{InboxRound, Replayed};
pub use metrics::register_metrics;
pub use orchestrator::{DecisionTally, Orchestrator, Target, Trigger};
pub use reconcile::{ReconcileRequest, Reconciled};
pub use releases::Tally as CanaryTally;
pub use shadow::{ShadowOperation, ShadowTally};
pub use transport::{CallBudget, PspTransport, ReqwestTransport};
pub use webhook::{InboxReceipt, RejectionKind, WebhookOutcome};
