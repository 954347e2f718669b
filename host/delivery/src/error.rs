//! Typed errors of the delivery crate.

use sluice_store::StoreError;

/// Everything that can go wrong while configuring or delivering events.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// The addressed row does not exist.
    #[error("{entity} not found: {key}")]
    NotFound { entity: &'static str, key: String },

    /// The operation does not fit the row's current state (e.g. replaying a
    /// delivery that is not dead).
    #[error("{entity} {id} is {state}: {reason}")]
    InvalidState {
        entity: &'static str,
        id: String,
        state: String,
        reason: String,
    },

    /// A request from an operator or a merchant that cannot be accepted.
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// The publisher's configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A stored value does not parse.
    #[error("corrupt row in {table}: {detail}")]
    Corrupt { table: &'static str, detail: String },

    #[error("store error: {0}")]
    Store(#[from] StoreError),

    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),

    #[error("metrics registration failed: {0}")]
    Metrics(#[from] prometheus::Error),

    /// A fault hook asked the publisher to stop as if the process had died
    /// (tests only; nothing after the hook was written).
    #[error("simulated crash after sending delivery {delivery_id}")]
    SimulatedCrash { delivery_id: String },

    /// A background loop of the publisher ended abnormally.
    #[error("publisher task failed: {0}")]
    Task(String),
}

impl DeliveryError {
    pub(crate) fn not_found(entity: &'static str, key: impl Into<String>) -> Self {
        DeliveryError::NotFound {
            entity,
            key: key.into(),
        }
    }

    pub(crate) fn corrupt(table: &'static str, detail: impl Into<String>) -> Self {
        DeliveryError::Corrupt {
            table,
            detail: detail.into(),
        }
    }
}
