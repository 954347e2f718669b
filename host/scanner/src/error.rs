//! The scanner's typed errors.

use sluice_orchestrator::OrchestratorError;
use sluice_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ScannerError {
    #[error("store: {0}")]
    Store(#[from] StoreError),

    #[error("orchestrator: {0}")]
    Orchestrator(#[from] OrchestratorError),

    #[error("database: {0}")]
    Database(#[from] sqlx::Error),

    #[error("metrics registration: {0}")]
    Metrics(#[from] prometheus::Error),

    #[error("invalid scanner configuration: {0}")]
    Config(String),
}
