//! Orchestrator settings for tests.

use std::time::Duration;

use sluice_orchestrator::{InboxConfig, OrchestratorConfig};
use sluice_store::StoreOptions;

/// Budgets small enough for tests, large enough for 2 shared cores.
pub fn test_config() -> OrchestratorConfig {
    OrchestratorConfig {
        sync_wait: Duration::from_secs(3),
        psp_timeout: Duration::from_millis(800),
        in_flight_grace: Duration::from_millis(100),
        inbox: InboxConfig {
            max_tries: 3,
            retry_base: Duration::ZERO,
            retry_cap: Duration::ZERO,
            idle_poll: Duration::from_millis(20),
            ..InboxConfig::default()
        },
        ..OrchestratorConfig::default()
    }
}

/// Store options for tests that run the orchestrator on a moving clock: an
/// UNKNOWN outcome is first queried after 200 ms instead of 5 s.
pub fn store_options() -> StoreOptions {
    StoreOptions {
        first_query_delay: Duration::from_millis(200),
        ..StoreOptions::default()
    }
}
