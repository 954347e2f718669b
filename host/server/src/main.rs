//! `sluice`: the gateway binary. See `sluice --help`.

use std::process::ExitCode;

use clap::Parser;
use sluice_server::cli::Cli;
use sluice_server::{commands, telemetry};

// jemalloc instead of glibc's malloc: glibc's malloc, free and their
// consolidation were about a fifth of the gateway's CPU under webhook ingest;
// with jemalloc ingest kept about 10 % more webhooks a second at the same RSS
// (BENCHMARKS.md, session 8). mimalloc was faster still but went past the
// RSS goal.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The conformance kit reads the adapter's log itself (it checks it for
    // secrets), so it installs its own subscriber instead.
    if !cli.is_adapter_test() {
        telemetry::init();
    }
    match commands::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
