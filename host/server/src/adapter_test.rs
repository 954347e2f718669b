//! `sluice adapter test`: the conformance kit (`sluice-conformance`) on one
//! component, printed as a table, optionally written as JUnit XML.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use sluice_adapter_runtime::SandboxLimits;
use sluice_conformance::{KitError, KitOptions};

use crate::cli::AdapterTestArgs;

#[derive(Debug, thiserror::Error)]
pub enum AdapterTestError {
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },
    #[error("{failed} conformance checks failed")]
    Failed { failed: usize },
}

pub async fn run(args: &AdapterTestArgs) -> Result<(), AdapterTestError> {
    // Limits out of range are refused by the load, the kit's first check.
    let limits = args.cpu_deadline_ms.map(|ms| SandboxLimits {
        cpu_deadline: Duration::from_millis(ms),
        ..SandboxLimits::default()
    });
    let options = KitOptions {
        wasm: args.file.clone(),
        fixtures: args.fixtures.clone(),
        limits,
    };
    let report = sluice_conformance::run(&options).await?;
    let table = report.table();
    let _ = std::io::stdout().lock().write_all(table.as_bytes());
    if let Some(path) = &args.junit {
        let write_error = |message: String| AdapterTestError::Write {
            path: path.clone(),
            message,
        };
        let xml = report.junit().map_err(|e| write_error(e.to_string()))?;
        std::fs::write(path, xml).map_err(|e| write_error(e.to_string()))?;
    }
    match report.failures().count() {
        0 => Ok(()),
        failed => Err(AdapterTestError::Failed { failed }),
    }
}
