//! Configuration: `sluice.toml` plus `SLUICE_*` environment overrides.
//!
//! Precedence, highest first: environment variable, `sluice.toml`, built-in default.
//! The file is the one named by `--config`, else `./sluice.toml` when it exists, else none.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default listen address: loopback only, so a fresh `sluice serve` is not exposed.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default data directory, relative to the working directory.
pub const DEFAULT_DATA_DIR: &str = "./data";
/// Config file looked for in the working directory when `--config` is not given.
pub const DEFAULT_CONFIG_FILE: &str = "sluice.toml";

/// Everything the gateway needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    /// `sqlite://...` (default, embedded) or `postgres://...`.
    pub database_url: Secret,
    /// Bearer token of the admin API. `None` disables the admin API (every call is 401).
    pub admin_token: Option<Secret>,
    /// Directory of `<name>.wasm` components loaded at start-up.
    pub adapters_dir: Option<PathBuf>,
    /// Root of everything Sluice writes: database file, compile cache, uploaded adapters.
    pub data_dir: PathBuf,
    /// Sandbox limits applied to every adapter unless overridden per adapter.
    pub default_limits: LimitsConfig,
    /// Per-adapter overrides, by adapter name.
    pub adapter_limits: BTreeMap<String, LimitsConfig>,
    /// Recovery facts of each adapter's PSP protocol (`[adapters.<name>]`
    /// `resend_window_ms`, `authorization_validity_ms`), by adapter name; a
    /// connector account's config keys of the same names win.
    pub adapter_recovery: BTreeMap<String, AdapterRecoveryConfig>,
    /// How adapter calls share instance slots and CPU across connector accounts
    /// (`[bulkhead]`); unset fields keep the runtime's defaults.
    pub bulkhead: BulkheadSettings,
    /// Timings of the background workers (`[workers]`).
    pub workers: WorkerTimings,
    /// Timings of the fulfillment guarantee (`[fulfillment]`).
    pub fulfillment: FulfillmentTimings,
    /// The per-account rate limit of the PSP webhook route (`[webhooks]`).
    pub webhooks: WebhookIntake,
    /// The database pool and the payment path's account cache (`[database]`).
    pub database: DatabaseSettings,
    /// Default PSP call slots of every connector account (`[psp_calls]`); an
    /// account's config keys of the same names win.
    pub psp_calls: sluice_orchestrator::CallLimits,
    /// The master key that seals secrets at rest (`master_key`, `SLUICE_MASTER_KEY`:
    /// 32 bytes as 64 hex digits or base64). `sluice serve` refuses to start without it.
    pub master_key: Option<Secret>,
    /// Keys that sealed values before the current one (`previous_master_keys`,
    /// `SLUICE_PREVIOUS_MASTER_KEYS`, comma-separated): read only, so a start-up with a
    /// new `master_key` re-seals everything under it.
    pub previous_master_keys: Vec<Secret>,
    /// Without a master key, use (and create) `<data_dir>/dev-master-key` with a
    /// warning instead of refusing to start. Set only by `sluice demo`, never read
    /// from a file or the environment.
    pub dev_master_key: bool,
}

impl Config {
    /// Where compiled adapter artifacts are cached across restarts.
    pub fn adapter_cache_dir(&self) -> PathBuf {
        self.data_dir.join("adapter-cache")
    }

    /// Where components uploaded through the admin API are kept (`<name>/<digest>.wasm`).
    pub fn uploaded_adapters_dir(&self) -> PathBuf {
        self.data_dir.join("adapters")
    }

    /// Limits for one adapter: its own overrides on top of the defaults.
    pub fn limits_for(&self, adapter: &str) -> LimitsConfig {
        match self.adapter_limits.get(adapter) {
            Some(own) => own.over(&self.default_limits),
            None => self.default_limits.clone(),
        }
    }
}

/// Sandbox limits as written in the config; unset fields fall back to the next layer
/// (per-adapter → `[limits]` → the runtime's safe defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Linear memory cap of one call, in bytes.
    pub memory_bytes: Option<usize>,
    /// CPU deadline of one call, in milliseconds.
    pub cpu_deadline_ms: Option<u64>,
    /// Cap on the size of what one call returns, in bytes.
    pub max_output_bytes: Option<usize>,
    /// Cap on the log and stdout/stderr bytes one call may write, in bytes.
    pub max_log_bytes: Option<usize>,
}

impl LimitsConfig {
    /// `self` where set, otherwise `base`.
    pub fn over(&self, base: &LimitsConfig) -> LimitsConfig {
        LimitsConfig {
            memory_bytes: self.memory_bytes.or(base.memory_bytes),
            cpu_deadline_ms: self.cpu_deadline_ms.or(base.cpu_deadline_ms),
            max_output_bytes: self.max_output_bytes.or(base.max_output_bytes),
            max_log_bytes: self.max_log_bytes.or(base.max_log_bytes),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == LimitsConfig::default()
    }

    pub fn cpu_deadline(&self) -> Option<Duration> {
        self.cpu_deadline_ms.map(Duration::from_millis)
    }
}

/// The adapter bulkhead as written in `[bulkhead]` (issue 13): every field optional,
/// the runtime validates the result at start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkheadSettings {
    /// Adapter instance slots in all (`max_concurrent_instances`, default 64).
    pub slots: Option<u32>,
    /// Percent of the slots one (adapter, connector account) may hold.
    pub key_share_percent: Option<u32>,
    /// Percent of the slots one adapter may hold over all its accounts.
    pub adapter_share_percent: Option<u32>,
    /// Calls of one (adapter, account) that may wait for a slot.
    pub queue_per_key: Option<usize>,
    /// Longest wait for a slot, in milliseconds; then the call is shed.
    pub max_wait_ms: Option<u64>,
    /// Guest CPU time (ms) one (adapter, account) may use in a burst ...
    pub cpu_burst_ms: Option<u64>,
    /// ... and gets back per second.
    pub cpu_refill_ms_per_sec: Option<u64>,
    /// CPU time (ms) of deadline-hitting calls one adapter may use in a burst ...
    pub adapter_deadline_burst_ms: Option<u64>,
    /// ... and gets back per second.
    pub adapter_deadline_refill_ms_per_sec: Option<u64>,
    /// Instances kept warm between calls of one (adapter version, account), in all;
    /// 0 gives every call a fresh instance.
    pub warm_instances: Option<u32>,
    /// Calls one warm instance serves before it is replaced.
    pub warm_instance_calls: Option<u32>,
}

impl BulkheadSettings {
    /// The runtime's warm-instance configuration: these settings over `base`.
    pub fn warm_over(
        &self,
        base: sluice_adapter_runtime::WarmConfig,
    ) -> sluice_adapter_runtime::WarmConfig {
        sluice_adapter_runtime::WarmConfig {
            max_idle: self.warm_instances.unwrap_or(base.max_idle),
            max_calls: self.warm_instance_calls.unwrap_or(base.max_calls),
        }
    }

    /// The runtime's configuration: these settings over `base`.
    pub fn over(
        &self,
        base: sluice_adapter_runtime::BulkheadConfig,
    ) -> sluice_adapter_runtime::BulkheadConfig {
        sluice_adapter_runtime::BulkheadConfig {
            key_share_percent: self.key_share_percent.unwrap_or(base.key_share_percent),
            adapter_share_percent: self
                .adapter_share_percent
                .unwrap_or(base.adapter_share_percent),
            queue_per_key: self.queue_per_key.unwrap_or(base.queue_per_key),
            max_wait: self
                .max_wait_ms
                .map_or(base.max_wait, Duration::from_millis),
            cpu_burst_ms: self.cpu_burst_ms.unwrap_or(base.cpu_burst_ms),
            cpu_refill_ms_per_sec: self
                .cpu_refill_ms_per_sec
                .unwrap_or(base.cpu_refill_ms_per_sec),
            adapter_deadline_burst_ms: self
                .adapter_deadline_burst_ms
                .unwrap_or(base.adapter_deadline_burst_ms),
            adapter_deadline_refill_ms_per_sec: self
                .adapter_deadline_refill_ms_per_sec
                .unwrap_or(base.adapter_deadline_refill_ms_per_sec),
        }
    }
}

/// Timings of the background workers, as written in `[workers]` (milliseconds).
/// Unset fields keep the built-in defaults, which suit production; tests and
/// demos shorten them so that recovery after a crash is quick.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerTimings {
    /// Pause between recovery scanner rounds.
    pub scanner_interval_ms: Option<u64>,
    /// How long a scanner instance holds a row it works on (a crashed
    /// holder's lease lapses after this).
    pub scanner_lease_ms: Option<u64>,
    /// The scanner's retry budget per adapter: contacts at once after a
    /// quiet time (not milliseconds: a count).
    pub scanner_retry_burst: Option<u32>,
    /// ... and contacts per second sustained (a count per second).
    pub scanner_retry_per_second: Option<u32>,
    /// A SUBMITTED attempt, capture or refund with no answer for this long is queried.
    pub submitted_timeout_ms: Option<u64>,
    /// A PSP that said "processing" is asked again after this long.
    pub processing_timeout_ms: Option<u64>,
    /// First backoff step of UNKNOWN queries (doubles per query).
    pub query_backoff_ms: Option<u64>,
    /// Cap of the query backoff.
    pub max_query_backoff_ms: Option<u64>,
    /// An UNKNOWN older than this is flagged for manual review (queries go on).
    pub max_unknown_age_ms: Option<u64>,
    /// An outcome that became UNKNOWN is first queried after this long.
    pub first_query_delay_ms: Option<u64>,
    /// A call in flight younger than its budget plus this grace belongs to its sender.
    pub in_flight_grace_ms: Option<u64>,
    /// How long the inbox processor holds a PSP webhook it works on.
    pub inbox_lease_ms: Option<u64>,
    /// How long the publisher holds an outbox event it fans out.
    pub outbox_lease_ms: Option<u64>,
    /// How long the publisher holds a delivery it sends; must exceed twice
    /// `delivery_timeout_ms` and twice `nats_ack_timeout_ms`.
    pub delivery_lease_ms: Option<u64>,
    /// Whole-request timeout of one merchant webhook POST.
    pub delivery_timeout_ms: Option<u64>,
    /// How long the publisher waits for JetStream's PubAck.
    pub nats_ack_timeout_ms: Option<u64>,
    /// Sleep of the publisher between passes that found nothing to do.
    pub publisher_poll_ms: Option<u64>,
    /// How long a merchant request holds its `Idempotency-Key` before a retry
    /// may take it over (the request's instance may have died). Longer than
    /// any request runs.
    pub idempotency_lease_ms: Option<u64>,
}

/// The PSP webhook route's token bucket per connector account, as written in
/// `[webhooks]`: PSPs send bursts after their own outages, so a gateway sizes
/// it from its measured ingest rate (BENCHMARKS.md). Unset: burst 2000,
/// 1000/s ([`sluice_merchant_api::limits::RateLimit`]'s default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookIntake {
    /// Webhooks one account may send at once.
    pub burst: Option<u32>,
    /// Refill of the bucket, webhooks per second.
    pub per_second: Option<u32>,
    /// How long a refused webhook waits for its 429 (0 to 5000; unset: 250), so a
    /// sender that ignores `Retry-After` cannot spend the gateway's CPU.
    pub refusal_hold_ms: Option<u64>,
}

/// Largest webhook burst or rate a config may set: the same bound as a connector
/// account's own `webhook_burst` / `webhook_per_second`.
pub use sluice_merchant_api::limits::MAX_WEBHOOK_RATE;

impl WebhookIntake {
    fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("webhooks.burst", self.burst),
            ("webhooks.per_second", self.per_second),
        ] {
            if let Some(v) = value.filter(|v| *v == 0 || *v > MAX_WEBHOOK_RATE) {
                return Err(ConfigError::InvalidValue {
                    name,
                    value: v.to_string(),
                    reason: format!("between 1 and {MAX_WEBHOOK_RATE}"),
                });
            }
        }
        let max_hold = sluice_merchant_api::limits::MAX_REFUSAL_HOLD.as_millis();
        if let Some(ms) = self.refusal_hold_ms.filter(|ms| u128::from(*ms) > max_hold) {
            return Err(ConfigError::InvalidValue {
                name: "webhooks.refusal_hold_ms",
                value: ms.to_string(),
                reason: format!("between 0 and {max_hold}"),
            });
        }
        Ok(())
    }
}

/// The store's pool and the payment path's connector-account cache, as written
/// in `[database]`. Unset fields keep the store's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// Connections in the pool (1 to 256; unset: 8).
    pub max_connections: Option<u32>,
    /// How long the payment path trusts a connector account it read (0 to
    /// 60000; unset: 1000): how soon another instance's change to an account
    /// is seen. Changes through this instance are seen at once.
    pub account_cache_ttl_ms: Option<u64>,
    /// PostgreSQL only: ping a pooled connection before each use (unset: true).
    /// Off saves a round trip per use; a connection the server dropped then
    /// fails its first statement instead (a transaction that never commits).
    pub ping_before_acquire: Option<bool>,
    /// With the ping on: only a connection idle in the pool at least this long
    /// is pinged (0 to 60000; unset: 500; 0 pings before every use).
    pub ping_after_idle_ms: Option<u64>,
    /// PostgreSQL webhook ingest: at most this many single-event webhooks
    /// kept by one statement and one commit (1 to 256; unset: 64; 1 writes
    /// each alone).
    pub ingest_batch_max: Option<usize>,
    /// PostgreSQL webhook ingest: statements writing webhooks at once before
    /// arriving ones queue to share the next (1 to 64; unset: 2).
    pub ingest_statements: Option<usize>,
}

/// Bounds of `[database]`.
pub const MAX_DATABASE_CONNECTIONS: u32 = 256;
pub const MAX_ACCOUNT_CACHE_TTL_MS: u64 = 60_000;
pub const MAX_PING_AFTER_IDLE_MS: u64 = 60_000;

impl DatabaseSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(n) = self
            .max_connections
            .filter(|n| *n == 0 || *n > MAX_DATABASE_CONNECTIONS)
        {
            return Err(ConfigError::InvalidValue {
                name: "database.max_connections",
                value: n.to_string(),
                reason: format!("between 1 and {MAX_DATABASE_CONNECTIONS}"),
            });
        }
        if let Some(ms) = self
            .account_cache_ttl_ms
            .filter(|ms| *ms > MAX_ACCOUNT_CACHE_TTL_MS)
        {
            return Err(ConfigError::InvalidValue {
                name: "database.account_cache_ttl_ms",
                value: ms.to_string(),
                reason: format!("between 0 and {MAX_ACCOUNT_CACHE_TTL_MS}"),
            });
        }
        if let Some(ms) = self
            .ping_after_idle_ms
            .filter(|ms| *ms > MAX_PING_AFTER_IDLE_MS)
        {
            return Err(ConfigError::InvalidValue {
                name: "database.ping_after_idle_ms",
                value: ms.to_string(),
                reason: format!("between 0 and {MAX_PING_AFTER_IDLE_MS}"),
            });
        }
        let mut group = sluice_store::DEFAULT_INGEST_GROUP;
        self.apply_ingest_group(&mut group);
        group
            .validated()
            .map_err(|reason| ConfigError::InvalidValue {
                name: "database.ingest_batch_max / database.ingest_statements",
                value: format!("{} / {}", group.max_batch, group.max_in_flight),
                reason,
            })?;
        Ok(())
    }

    fn apply_ingest_group(&self, group: &mut sluice_store::group_commit::GroupLimits) {
        if let Some(n) = self.ingest_batch_max {
            group.max_batch = n;
        }
        if let Some(n) = self.ingest_statements {
            group.max_in_flight = n;
        }
    }

    /// These settings over `options`.
    pub fn apply(&self, options: &mut sluice_store::StoreOptions) {
        if let Some(n) = self.max_connections {
            options.max_connections = n;
        }
        if let Some(ms) = self.account_cache_ttl_ms {
            options.account_cache_ttl = std::time::Duration::from_millis(ms);
        }
        if let Some(ping) = self.ping_before_acquire {
            options.ping_before_acquire = ping;
        }
        if let Some(ms) = self.ping_after_idle_ms {
            options.ping_after_idle = std::time::Duration::from_millis(ms);
        }
        self.apply_ingest_group(&mut options.ingest_group);
    }
}

/// The PSP call bulkhead's defaults per connector account, as written in
/// `[psp_calls]` (issue 13): calls in flight at once through one account, how
/// many of them only queries may use, and how long a call waits for a slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PspCalls {
    pub max_concurrent_calls: Option<u64>,
    pub reserved_query_calls: Option<u64>,
    pub call_slot_wait_ms: Option<u64>,
}

impl PspCalls {
    fn limits(&self) -> Result<sluice_orchestrator::CallLimits, ConfigError> {
        sluice_orchestrator::CallLimits::from_settings(
            self.max_concurrent_calls,
            self.reserved_query_calls,
            self.call_slot_wait_ms,
        )
        .map_err(|e| ConfigError::InvalidValue {
            name: match e.name {
                "max_concurrent_calls" => "psp_calls.max_concurrent_calls",
                "reserved_query_calls" => "psp_calls.reserved_query_calls",
                _ => "psp_calls.call_slot_wait_ms",
            },
            value: e.value.to_string(),
            reason: format!("between {} and {}", e.least, e.most),
        })
    }
}

/// Timings of the fulfillment guarantee, as written in `[fulfillment]`
/// (milliseconds). Unset fields keep the core's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FulfillmentTimings {
    /// Wait before the second business check (doubles with every check).
    pub first_check_delay_ms: Option<u64>,
    /// Cap on the wait between two business checks.
    pub max_check_delay_ms: Option<u64>,
    /// Budget of one call to a merchant's business: the deadline settles this
    /// long after it, and only a read started after that proves a missed goal.
    pub action_timeout_ms: Option<u64>,
    /// A business that gives no explicit answer this long after the deadline
    /// settled goes to manual review (never a blind refund).
    pub unanswered_review_after_ms: Option<u64>,
}

impl FulfillmentTimings {
    /// The core's policy with these timings over its defaults.
    pub fn policy(&self) -> sluice_core::FulfillmentPolicy {
        let default = sluice_core::FulfillmentPolicy::default();
        let or = |value: Option<u64>, fallback: i64| {
            value.map_or(fallback, |ms| i64::try_from(ms).unwrap_or(i64::MAX))
        };
        sluice_core::FulfillmentPolicy {
            first_check_delay_ms: or(self.first_check_delay_ms, default.first_check_delay_ms),
            max_check_delay_ms: or(self.max_check_delay_ms, default.max_check_delay_ms),
            action_timeout_ms: or(self.action_timeout_ms, default.action_timeout_ms),
            unanswered_review_after_ms: or(
                self.unanswered_review_after_ms,
                default.unanswered_review_after_ms,
            ),
        }
    }
}

/// `Some(ms)` as a duration.
pub fn millis(value: Option<u64>) -> Option<Duration> {
    value.map(Duration::from_millis)
}

/// A string that never shows up in logs or `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid {name}={value:?}: {reason}")]
    InvalidValue {
        name: &'static str,
        value: String,
        reason: String,
    },
}

/// The file layout of `sluice.toml`. Every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    database_url: Option<String>,
    admin_token: Option<String>,
    adapters_dir: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    #[serde(default)]
    limits: LimitsConfig,
    #[serde(default)]
    adapters: BTreeMap<String, FileAdapterConfig>,
    #[serde(default)]
    bulkhead: BulkheadSettings,
    #[serde(default)]
    workers: WorkerTimings,
    #[serde(default)]
    fulfillment: FulfillmentTimings,
    #[serde(default)]
    webhooks: WebhookIntake,
    #[serde(default)]
    psp_calls: PspCalls,
    #[serde(default)]
    database: DatabaseSettings,
    master_key: Option<String>,
    #[serde(default)]
    previous_master_keys: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAdapterConfig {
    #[serde(default)]
    limits: LimitsConfig,
    resend_window_ms: Option<u64>,
    authorization_validity_ms: Option<u64>,
}

impl FileAdapterConfig {
    fn recovery(&self) -> AdapterRecoveryConfig {
        AdapterRecoveryConfig {
            resend_window_ms: self.resend_window_ms,
            authorization_validity_ms: self.authorization_validity_ms,
        }
    }
}

/// What recovery may rely on for one adapter's PSP protocol (milliseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterRecoveryConfig {
    /// How long the PSP honours an idempotency key, less a margin: an attempt
    /// younger than this whose query proved the PSP has no such payment is
    /// re-sent with the same key (Stripe-format keys live 24 h: e.g. 82800000).
    /// Unset: never re-sent.
    pub resend_window_ms: Option<u64>,
    /// How long the PSP holds an authorization (default 7 days).
    pub authorization_validity_ms: Option<u64>,
}

impl Config {
    /// Loads the config file (explicit path, or `./sluice.toml` if present) and applies the
    /// process environment.
    pub fn load(explicit_path: Option<&Path>) -> Result<Config, ConfigError> {
        let path = match explicit_path {
            Some(path) => Some(path.to_path_buf()),
            None => Some(PathBuf::from(DEFAULT_CONFIG_FILE)).filter(|p| p.is_file()),
        };
        let text = match &path {
            Some(path) => {
                Some(
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                        path: path.clone(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        Config::from_parts(text.as_deref().zip(path.as_deref()), |name| {
            std::env::var(name).ok().filter(|v| !v.is_empty())
        })
    }

    /// Builds a config from the text of a config file (with its path, for messages) and an
    /// environment lookup. Pure, so tests can drive it without touching the process.
    pub fn from_parts(
        file: Option<(&str, &Path)>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let file = match file {
            Some((text, path)) => {
                toml::from_str::<FileConfig>(text).map_err(|source| ConfigError::Parse {
                    path: path.to_path_buf(),
                    source: Box::new(source),
                })?
            }
            None => FileConfig::default(),
        };

        let listen_text = env("SLUICE_LISTEN")
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen = listen_text
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::InvalidValue {
                name: "listen",
                value: listen_text.clone(),
                reason: e.to_string(),
            })?;

        let data_dir = env("SLUICE_DATA_DIR")
            .map(PathBuf::from)
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));

        let database_url = env("SLUICE_DATABASE_URL")
            .or(file.database_url)
            .unwrap_or_else(|| format!("sqlite://{}/sluice.db", data_dir.display()));
        if !(database_url.starts_with("sqlite:")
            || database_url.starts_with("postgres://")
            || database_url.starts_with("postgresql://"))
        {
            return Err(ConfigError::InvalidValue {
                name: "database_url",
                // Only the scheme: the rest may hold a password.
                value: database_url.split(':').next().unwrap_or("").to_string(),
                reason: "expected a sqlite: or postgres:// URL".into(),
            });
        }

        let admin_token = env("SLUICE_ADMIN_TOKEN").or(file.admin_token);
        if let Some(token) = &admin_token {
            if token.len() < MIN_ADMIN_TOKEN_LEN {
                return Err(ConfigError::InvalidValue {
                    name: "admin_token",
                    value: "***".into(),
                    reason: format!("must be at least {MIN_ADMIN_TOKEN_LEN} characters"),
                });
            }
        }

        let (master_key, previous_master_keys) =
            master_keys(&env, file.master_key, file.previous_master_keys)?;

        let adapters_dir = env("SLUICE_ADAPTERS_DIR")
            .map(PathBuf::from)
            .or(file.adapters_dir);

        Ok(Config {
            listen,
            database_url: Secret::new(database_url),
            admin_token: admin_token.map(Secret::new),
            adapters_dir,
            data_dir,
            default_limits: file.limits,
            adapter_recovery: file
                .adapters
                .iter()
                .filter(|(_, a)| a.recovery() != AdapterRecoveryConfig::default())
                .map(|(name, a)| (name.clone(), a.recovery()))
                .collect(),
            adapter_limits: file
                .adapters
                .into_iter()
                .filter(|(_, a)| !a.limits.is_empty())
                .map(|(name, a)| (name, a.limits))
                .collect(),
            bulkhead: file.bulkhead,
            workers: file.workers,
            fulfillment: file.fulfillment,
            webhooks: {
                file.webhooks.validate()?;
                file.webhooks
            },
            psp_calls: file.psp_calls.limits()?,
            database: {
                file.database.validate()?;
                file.database
            },
            master_key: master_key.map(Secret::new),
            previous_master_keys: previous_master_keys.into_iter().map(Secret::new).collect(),
            dev_master_key: false,
        })
    }
}

/// `master_key` and `previous_master_keys` (the environment wins), each checked to be a
/// usable key; an error never repeats a key.
fn master_keys(
    env: &impl Fn(&str) -> Option<String>,
    file_key: Option<String>,
    file_previous: Vec<String>,
) -> Result<(Option<String>, Vec<String>), ConfigError> {
    let master_key = env("SLUICE_MASTER_KEY").or(file_key);
    let previous: Vec<String> = match env("SLUICE_PREVIOUS_MASTER_KEYS") {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect(),
        None => file_previous,
    };
    let named = master_key
        .iter()
        .map(|k| ("master_key", k))
        .chain(previous.iter().map(|k| ("previous_master_keys", k)));
    for (name, key) in named {
        if let Err(e) = sluice_store::MasterKey::parse(key) {
            return Err(ConfigError::InvalidValue {
                name,
                value: "***".into(),
                reason: e.to_string(),
            });
        }
    }
    Ok((master_key, previous))
}

/// Short admin tokens are guessable; refuse them at start-up rather than run exposed.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn master_keys_come_from_the_environment_over_the_file_and_a_bad_one_is_refused_unechoed() {
        let key = "ab".repeat(32);
        let old = "cd".repeat(32);
        let text = format!("master_key = \"{old}\"\nprevious_master_keys = [\"{key}\"]\n");
        let path = Path::new("sluice.toml");
        let from_file = Config::from_parts(Some((&text, path)), no_env).unwrap();
        assert_eq!(from_file.master_key, Some(Secret::new(old.clone())));
        assert_eq!(
            from_file.previous_master_keys,
            vec![Secret::new(key.clone())]
        );
        let env = |name: &str| match name {
            "SLUICE_MASTER_KEY" => Some("ab".repeat(32)),
            "SLUICE_PREVIOUS_MASTER_KEYS" => Some(format!(" {} , ", "cd".repeat(32))),
            _ => None,
        };
        let from_env = Config::from_parts(Some((&text, path)), env).unwrap();
        assert_eq!(from_env.master_key, Some(Secret::new(key)));
        assert_eq!(from_env.previous_master_keys, vec![Secret::new(old)]);
        assert!(
            !from_env.dev_master_key,
            "only `sluice demo` falls back to a dev key"
        );
        let bad = |name: &str| (name == "SLUICE_MASTER_KEY").then(|| "too-short-key".to_owned());
        let err = Config::from_parts(None, bad).unwrap_err().to_string();
        assert!(
            err.contains("master_key") && !err.contains("too-short-key"),
            "{err}"
        );
    }

    #[test]
    fn database_settings_are_read_applied_and_refused_out_of_bounds() {
        let path = Path::new("sluice.toml");
        let text = "[database]\nmax_connections = 16\naccount_cache_ttl_ms = 0\nping_before_acquire = false\nping_after_idle_ms = 0\ningest_batch_max = 1\ningest_statements = 2\n";
        let config = Config::from_parts(Some((text, path)), no_env).unwrap();
        let mut options = sluice_store::StoreOptions::default();
        config.database.apply(&mut options);
        assert_eq!(options.max_connections, 16);
        assert_eq!(options.account_cache_ttl, std::time::Duration::ZERO);
        assert!(!options.ping_before_acquire);
        assert_eq!(options.ping_after_idle, std::time::Duration::ZERO);
        assert_eq!(options.ingest_group.max_batch, 1);
        assert_eq!(options.ingest_group.max_in_flight, 2);
        for bad in [
            "[database]\ningest_batch_max = 0\n",
            "[database]\ningest_batch_max = 257\n",
            "[database]\ningest_statements = 0\n",
            "[database]\ningest_statements = 65\n",
            "[database]\nmax_connections = 0\n",
            "[database]\nmax_connections = 257\n",
            "[database]\naccount_cache_ttl_ms = 60001\n",
            "[database]\nping_after_idle_ms = 60001\n",
            "[database]\nno_such_key = 1\n",
        ] {
            assert!(
                Config::from_parts(Some((bad, path)), no_env).is_err(),
                "{bad}"
            );
        }
        let unset = Config::from_parts(None, no_env).unwrap();
        let mut options = sluice_store::StoreOptions::default();
        unset.database.apply(&mut options);
        assert_eq!(options.max_connections, 8);
        assert!(options.ping_before_acquire);
        assert_eq!(
            options.ping_after_idle,
            sluice_store::DEFAULT_PING_AFTER_IDLE
        );
        assert_eq!(options.ingest_group, sluice_store::DEFAULT_INGEST_GROUP);
    }

    #[test]
    fn defaults_apply_without_file_or_environment() {
        let config = Config::from_parts(None, no_env).unwrap();
        assert_eq!(config.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from("./data"));
        assert_eq!(config.database_url.expose(), "sqlite://./data/sluice.db");
        assert_eq!(config.admin_token, None);
        assert_eq!(config.adapters_dir, None);
        assert_eq!(
            config.adapter_cache_dir(),
            PathBuf::from("./data/adapter-cache")
        );
        assert_eq!(
            config.uploaded_adapters_dir(),
            PathBuf::from("./data/adapters")
        );
    }

    #[test]
    fn environment_overrides_the_file() {
        let text = r#"
            listen = "127.0.0.1:9000"
            database_url = "postgres://file@127.0.0.1/db"
            admin_token = "from-the-file-0123456789"
            data_dir = "/var/lib/sluice"
            adapters_dir = "/opt/adapters"
        "#;
        let env = |name: &str| match name {
            "SLUICE_LISTEN" => Some("0.0.0.0:7000".to_string()),
            "SLUICE_ADMIN_TOKEN" => Some("from-the-env-0123456789".to_string()),
            _ => None,
        };
        let config = Config::from_parts(Some((text, Path::new("sluice.toml"))), env).unwrap();
        assert_eq!(config.listen, "0.0.0.0:7000".parse().unwrap());
        assert_eq!(
            config.admin_token.as_ref().map(Secret::expose),
            Some("from-the-env-0123456789")
        );
        assert_eq!(config.database_url.expose(), "postgres://file@127.0.0.1/db");
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/sluice"));
        assert_eq!(config.adapters_dir, Some(PathBuf::from("/opt/adapters")));
    }

    #[test]
    fn default_database_lives_in_the_data_dir() {
        let env = |name: &str| (name == "SLUICE_DATA_DIR").then(|| "/tmp/x".to_string());
        let config = Config::from_parts(None, env).unwrap();
        assert_eq!(config.database_url.expose(), "sqlite:///tmp/x/sluice.db");
    }

    #[test]
    fn per_adapter_limits_override_the_defaults_field_by_field() {
        let text = r#"
            [limits]
            memory_bytes = 1000
            cpu_deadline_ms = 50

            [adapters.stripe.limits]
            cpu_deadline_ms = 200
        "#;
        let config = Config::from_parts(Some((text, Path::new("s.toml"))), no_env).unwrap();
        let stripe = config.limits_for("stripe");
        assert_eq!(stripe.memory_bytes, Some(1000));
        assert_eq!(stripe.cpu_deadline(), Some(Duration::from_millis(200)));
        assert_eq!(config.limits_for("adyen").cpu_deadline_ms, Some(50));
    }

    #[test]
    fn bulkhead_settings_override_the_runtime_defaults_one_by_one() {
        let text = r#"
            [bulkhead]
            slots = 32
            key_share_percent = 10
            max_wait_ms = 250
            warm_instances = 0
        "#;
        let config = Config::from_parts(Some((text, Path::new("s.toml"))), no_env).unwrap();
        assert_eq!(config.bulkhead.slots, Some(32));
        let base = sluice_adapter_runtime::BulkheadConfig::default();
        let runtime = config.bulkhead.over(base);
        assert_eq!(runtime.key_share_percent, 10);
        assert_eq!(runtime.max_wait, Duration::from_millis(250));
        let warm = config
            .bulkhead
            .warm_over(sluice_adapter_runtime::WarmConfig::default());
        assert_eq!(warm.max_idle, 0, "reuse turned off");
        assert_eq!(
            warm.max_calls,
            sluice_adapter_runtime::WarmConfig::default().max_calls
        );
        assert_eq!(runtime.cpu_refill_ms_per_sec, base.cpu_refill_ms_per_sec);
        let typo = "[bulkhead]\nkey_share = 10\n";
        assert!(Config::from_parts(Some((typo, Path::new("s.toml"))), no_env).is_err());
    }

    #[test]
    fn fulfillment_timings_override_the_core_defaults_one_by_one() {
        let text = r#"
            [fulfillment]
            action_timeout_ms = 3000
            first_check_delay_ms = 250
        "#;
        let config = Config::from_parts(Some((text, Path::new("s.toml"))), no_env).unwrap();
        let policy = config.fulfillment.policy();
        let default = sluice_core::FulfillmentPolicy::default();
        assert_eq!(policy.action_timeout_ms, 3000);
        assert_eq!(policy.first_check_delay_ms, 250);
        assert_eq!(policy.max_check_delay_ms, default.max_check_delay_ms);
        assert_eq!(
            policy.unanswered_review_after_ms,
            default.unanswered_review_after_ms
        );
        let err = Config::from_parts(
            Some((
                "[fulfillment]
action_timeout = 1",
                Path::new("s.toml"),
            )),
            no_env,
        )
        .unwrap_err();
        assert!(err.to_string().contains("action_timeout"), "{err}");
    }

    #[test]
    fn psp_call_slot_defaults_come_from_the_psp_calls_section_and_nonsense_is_refused() {
        let text = "[psp_calls]\nmax_concurrent_calls = 8\nreserved_query_calls = 3\ncall_slot_wait_ms = 500";
        let config = Config::from_parts(Some((text, Path::new("s.toml"))), no_env).unwrap();
        let limits = config.psp_calls;
        assert_eq!((limits.max_concurrent, limits.reserved_for_queries), (8, 3));
        assert_eq!(limits.wait, std::time::Duration::from_millis(500));
        let unset = Config::from_parts(None, no_env).unwrap();
        assert_eq!(unset.psp_calls, sluice_orchestrator::CallLimits::default());
        for (bad, field) in [
            ("max_concurrent_calls = 0", "psp_calls.max_concurrent_calls"),
            (
                "max_concurrent_calls = 2\nreserved_query_calls = 2",
                "psp_calls.reserved_query_calls",
            ),
            ("call_slot_wait_ms = 60000", "psp_calls.call_slot_wait_ms"),
            ("max_calls = 3", "max_calls"),
        ] {
            let text = format!("[psp_calls]\n{bad}");
            let err = Config::from_parts(Some((&text, Path::new("s.toml"))), no_env).unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn the_webhook_rate_limit_comes_from_the_webhooks_section_and_nonsense_is_refused() {
        let text = "[webhooks]\nburst = 5000\nper_second = 2500\nrefusal_hold_ms = 0";
        let config = Config::from_parts(Some((text, Path::new("s.toml"))), no_env).unwrap();
        assert_eq!(
            (
                config.webhooks.burst,
                config.webhooks.per_second,
                config.webhooks.refusal_hold_ms
            ),
            (Some(5000), Some(2500), Some(0))
        );
        let unset = Config::from_parts(None, no_env).unwrap();
        assert_eq!(unset.webhooks, WebhookIntake::default());
        for bad in [
            "[webhooks]\nburst = 0",
            "[webhooks]\nper_second = 1000001",
            "[webhooks]\nrefusal_hold_ms = 5001",
        ] {
            let err = Config::from_parts(Some((bad, Path::new("s.toml"))), no_env).unwrap_err();
            assert!(err.to_string().contains("webhooks."), "{err}");
        }
    }

    #[test]
    fn worker_timings_come_from_the_workers_section() {
        let text = r#"
            [workers]
            scanner_interval_ms = 200
            delivery_lease_ms = 5000
        "#;
        let config = Config::from_parts(Some((text, Path::new("s.toml"))), no_env).unwrap();
        assert_eq!(config.workers.scanner_interval_ms, Some(200));
        assert_eq!(config.workers.delivery_lease_ms, Some(5000));
        assert_eq!(config.workers.inbox_lease_ms, None);
        let err = Config::from_parts(
            Some(("[workers]\nscanner_intervall_ms = 1", Path::new("s.toml"))),
            no_env,
        )
        .unwrap_err();
        assert!(err.to_string().contains("scanner_intervall_ms"), "{err}");
    }

    #[test]
    fn unknown_keys_are_rejected_with_the_file_name() {
        let err =
            Config::from_parts(Some(("lisen = \"x\"", Path::new("my.toml"))), no_env).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("my.toml"), "{message}");
        assert!(message.contains("lisen"), "{message}");
    }

    #[test]
    fn bad_listen_address_is_a_clear_error() {
        let env = |name: &str| (name == "SLUICE_LISTEN").then(|| "localhost".to_string());
        let err = Config::from_parts(None, env).unwrap_err();
        assert!(err.to_string().contains("listen"), "{err}");
    }

    #[test]
    fn short_admin_token_is_refused_without_echoing_it() {
        let env = |name: &str| (name == "SLUICE_ADMIN_TOKEN").then(|| "short".to_string());
        let err = Config::from_parts(None, env).unwrap_err().to_string();
        assert!(err.contains("admin_token"), "{err}");
        assert!(!err.contains("short\""), "{err}");
    }

    #[test]
    fn unknown_database_scheme_is_refused_without_echoing_credentials() {
        let env = |name: &str| {
            (name == "SLUICE_DATABASE_URL").then(|| "mysql://u:hunter2@h/db".to_string())
        };
        let err = Config::from_parts(None, env).unwrap_err().to_string();
        assert!(err.contains("database_url"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn the_example_config_file_is_valid() {
        let text = include_str!("../../../sluice.toml.example");
        let config =
            Config::from_parts(Some((text, Path::new("sluice.toml.example"))), no_env).unwrap();
        assert_eq!(config.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(config.default_limits.cpu_deadline_ms, Some(200));
    }

    #[test]
    fn secrets_do_not_appear_in_debug_output() {
        let env = |name: &str| {
            (name == "SLUICE_ADMIN_TOKEN").then(|| "very-secret-admin-token".to_string())
        };
        let config = Config::from_parts(None, env).unwrap();
        assert!(!format!("{config:?}").contains("very-secret"));
    }
}
