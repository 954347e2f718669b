//! The orchestrator's typed errors, shaped for the HTTP layer: each variant
//! maps to one response class (see [`OrchestratorError::http_status`]).

use sluice_adapter_runtime::AdapterError;
use sluice_store::StoreError;

/// Everything a public orchestrator call can refuse or fail with.
#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    /// The resource does not exist or belongs to another merchant (404 either
    /// way, so ids cannot be probed).
    #[error("{entity} not found: {id}")]
    NotFound { entity: &'static str, id: String },

    /// The event names an aggregate of another connector account than the
    /// one it came through (the tenant boundary); refused, kept as evidence.
    #[error("{0}")]
    OutOfScope(String),

    /// The request conflicts with what exists (e.g. a merchant order number
    /// reused with different parameters).
    #[error("conflict: {0}")]
    Conflict(String),

    /// A previous attempt has not failed definitively (it is in flight or
    /// UNKNOWN): no new attempt may start, whatever the caller asks.
    #[error("payment {payment_id} has attempt {attempt_id} in state {state}; it must reach a definitive result first")]
    AttemptInFlight {
        payment_id: String,
        attempt_id: String,
        state: String,
    },

    /// The operation is not allowed in the payment's current state.
    #[error("{0}")]
    InvalidState(String),

    /// More than the refundable amount was asked for; nothing changed.
    #[error("refund of {requested} exceeds the refundable amount {available}")]
    InsufficientRefundable { requested: i64, available: i64 },

    /// More than the capturable amount was asked for; nothing changed.
    #[error("capture of {requested} exceeds the capturable amount {available}")]
    InsufficientCapturable { requested: i64, available: i64 },

    /// The input is invalid (amount, currency, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// No connector account of the merchant can serve the payment.
    #[error("{0}")]
    Route(#[from] crate::create::RouteRefusal),

    /// The merchant order number is taken by a payment with other parameters.
    #[error("merchant_order_no {merchant_order_no:?} is already used by payment {payment_id} with different {}", fields.join(", "))]
    OrderNoConflict {
        merchant_order_no: String,
        payment_id: String,
        fields: Vec<&'static str>,
    },

    /// The adapter the connector account names is not loaded.
    #[error("adapter {0:?} is not loaded")]
    AdapterNotLoaded(String),

    /// The adapter sandbox failed for this call (trap, deadline, output cap).
    #[error("adapter call failed: {0}")]
    Adapter(#[from] AdapterError),

    /// A concurrent writer kept winning; the caller may retry.
    #[error("busy: {0}")]
    Busy(String),

    /// The fulfillment door refused the input (e.g. a confirmation after a
    /// compensation refund started); the message says what happened to the money.
    #[error("{0}")]
    FulfillmentRefused(sluice_core::FulfillmentRefusal),

    /// The store failed (database unreachable, corrupt row, ...).
    #[error("store error: {0}")]
    Store(StoreError),
}

impl OrchestratorError {
    /// The HTTP status class the API layer should answer with.
    pub fn http_status(&self) -> u16 {
        match self {
            OrchestratorError::NotFound { .. } | OrchestratorError::OutOfScope(_) => 404,
            OrchestratorError::Conflict(_)
            | OrchestratorError::OrderNoConflict { .. }
            | OrchestratorError::AttemptInFlight { .. }
            | OrchestratorError::InvalidState(_)
            | OrchestratorError::Busy(_) => 409,
            OrchestratorError::InsufficientRefundable { .. }
            | OrchestratorError::InsufficientCapturable { .. }
            | OrchestratorError::InvalidRequest(_)
            | OrchestratorError::Route(_) => 422,
            OrchestratorError::FulfillmentRefused(
                sluice_core::FulfillmentRefusal::UnknownAttempt { .. },
            ) => 422,
            OrchestratorError::FulfillmentRefused(_) => 409,
            OrchestratorError::AdapterNotLoaded(_) | OrchestratorError::Adapter(_) => 503,
            OrchestratorError::Store(_) => 500,
        }
    }
}

impl From<StoreError> for OrchestratorError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound { entity, key } => OrchestratorError::NotFound { entity, id: key },
            StoreError::Conflict(message) => OrchestratorError::Conflict(message),
            StoreError::InsufficientRefundable {
                requested,
                available,
            } => OrchestratorError::InsufficientRefundable {
                requested,
                available,
            },
            StoreError::InsufficientCapturable {
                requested,
                available,
            } => OrchestratorError::InsufficientCapturable {
                requested,
                available,
            },
            StoreError::AttemptInFlight {
                payment_id,
                attempt_id,
                state,
            } => OrchestratorError::AttemptInFlight {
                payment_id,
                attempt_id,
                state,
            },
            StoreError::InvalidState {
                entity,
                id,
                state,
                reason,
            } => OrchestratorError::InvalidState(format!("{entity} {id} is {state}: {reason}")),
            StoreError::InvalidRequest(message) => OrchestratorError::InvalidRequest(message),
            StoreError::CasExhausted { .. } => OrchestratorError::Busy(err.to_string()),
            other => OrchestratorError::Store(other),
        }
    }
}
