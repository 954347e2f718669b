//! Tracing set-up: `SLUICE_LOG` is an env-filter directive (default `info`),
//! `SLUICE_LOG_FORMAT=json` switches to one JSON object per line.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init() {
    let filter = EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("SLUICE_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // try_init fails only when a subscriber is already installed, which is fine.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
