//! Sluice's durable store: the one transactional door for every state change.
//!
//! Two backends, one behaviour: SQLite (embedded default, a file under
//! `./data/`, WAL, foreign keys on, busy timeout) and PostgreSQL (production,
//! multi-instance). Both are driven through sqlx's `Any` driver with the same
//! SQL text (`$n` placeholders, BIGINT millis and minor units, TEXT JSON);
//! only the migrations (identity columns, trigger syntax) and a couple of
//! locking hints differ per backend.
//!
//! The one-door rule: aggregate states (orders, attempts, captures, refunds)
//! change only inside [`Store::apply_event`] (and the creation/reservation
//! functions that insert new aggregates). Each runs in one transaction:
//! inbox dedupe → read snapshot → pure core decides → CAS on version →
//! append history (for every decision, applied or not) → write outbox.

mod accept;
mod clock;
mod db;
mod door;
pub mod env;
mod error;
mod fulfillment;
pub mod group_commit;
mod ids;
mod listing;
mod refusals;

pub mod account_cache;
pub mod account_health;
pub mod adapter_releases;
pub mod history;
pub mod idempotency;
pub mod inbox;
pub mod merchants;
pub mod outbox;
pub mod payments;
pub mod reconciliation;
pub mod reserve;
pub mod review;
pub mod routing;
pub mod secret_box;
pub mod secrets;
pub mod stats;

pub use accept::{AcceptedWebhook, DEFAULT_INGEST_GROUP};
pub use account_health::{AccountEvent, MAX_ACCOUNT_EVENTS};
pub use adapter_releases::{
    AdapterEvent, AdapterEventKind, AdapterPin, NewShadowDiff, ShadowDiff, MAX_ADAPTER_EVENTS,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use door::{
    cas_conflicts_total, psp_reference_lookups, AccountScope, Applied, ApplyEvent, DecisionKind,
    EventTarget, FirstSend, SentCall, ESCALATE_KIND, MAX_CAS_TRIES, RECONCILIATION_KIND,
    RESOLVE_KIND,
};
pub use env::{AwaitPoint, AwaitPoints, Entropy, Env, OsEntropy, SeededEntropy};
pub use error::StoreError;
pub use fulfillment::{DueFulfillment, FulfillmentApplied, FulfillmentEndpoint};
pub use history::{AdapterIdentity, HistoryEntry, Provenance};
pub use idempotency::{IdempotencyBegin, IdempotencyRecord};
pub use ids::{keyed_capture_reference, keyed_refund_reference};
pub use inbox::{InboxEntry, InboxInsert, NewInboxEvent};
pub use listing::{PaymentFilter, PaymentSearch, MAX_SEARCH_PAGE};
pub use merchants::{
    AccountPause, ApiKeyPepper, ApiKeyRecord, ConnectorAccount, ConnectorCredentials, IssuedApiKey,
    Merchant, NewConnectorAccount,
};
pub use outbox::OutboxMessage;
pub use payments::{
    AttemptHead, Capture, CreatedPayment, FreshPayment, Fulfillment, NewAttempt, NewPayment, Page,
    PaymentAmounts, PaymentAttempt, PaymentDetails, PaymentOrder, PendingKind, Refund, ScanCursor,
};
pub use reconciliation::{
    DifferenceFilter, NewDifference, NewReconciliationRun, ReconciliationRun, Resolution, RunKey,
    RunStatus, StoredDifference, UnresolvedClass,
};
pub use refusals::{NewScopeRefusal, RefusalSource, ScopeRefusal};
pub use reserve::{CaptureRequest, RefundRequest, Reservation};
pub use review::{IssuedOperator, NewProposal, Operator, Proposal, ReviewError, ReviewOutcome};
pub use routing::StoredRouting;
pub use secret_box::{LocalSecretBox, MasterKey, SecretBox, SecretBoxError};
pub use secrets::{ResealReport, SecretRotation};

use sqlx::AnyPool;
use std::sync::Arc;
use std::time::Duration;

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// Pick the backend from a database URL.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else {
            Err(StoreError::Config(
                "database URL must start with sqlite: or postgres://".into(),
            ))
        }
    }
}

/// The default embedded database: a SQLite file under `./data/`.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://data/sluice.db";

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Connections in all. On SQLite, with two or more, one of them is the
    /// write connection ([`Store::writer`]) and the rest read.
    pub max_connections: u32,
    /// How long a writer waits for SQLite's write lock before giving up.
    pub sqlite_busy_timeout: Duration,
    pub acquire_timeout: Duration,
    pub clock: Arc<dyn Clock>,
    /// Where jitter comes from (see [`env`]): the OS generator unless a test
    /// or the simulator seeds one.
    pub entropy: Arc<dyn Entropy>,
    /// How soon an UNKNOWN outcome is first queried when the caller gives no time.
    pub first_query_delay: Duration,
    /// The fulfillment checks' knobs (backoff, action timeout, review after).
    pub fulfillment_policy: sluice_core::FulfillmentPolicy,
    /// Seals every secret the store writes and opens what it reads. The default is
    /// [`LocalSecretBox::process_ephemeral`] (tests and tools); the server passes
    /// the box of its configured master key.
    pub secret_box: Arc<dyn SecretBox>,
    /// How long the payment path trusts a connector account it read without
    /// reading it again ([`account_cache`]): how soon a change made by another
    /// instance on the same database is seen. Zero reads every time.
    pub account_cache_ttl: Duration,
    /// PostgreSQL only: ping a pooled connection before handing it out. Off
    /// saves a round trip per acquire; a connection the server dropped then
    /// fails its first statement (its transaction never commits) instead.
    /// SQLite never pings: its connection is a handle in this process.
    pub ping_before_acquire: bool,
    /// With `ping_before_acquire`: only a connection that sat idle in the pool
    /// at least this long is pinged. One used more recently than that was
    /// talking to the server a moment ago, so under load (every connection
    /// busy) no statement pays a ping's round trip, and after a quiet spell,
    /// when a server restart or a dropped link is likeliest to have gone
    /// unnoticed, every connection is checked. Zero pings every time.
    pub ping_after_idle: Duration,
    /// Who watches the store's await points ([`env::AwaitPoints`]): nobody
    /// in production; the deterministic simulator kills the gateway there.
    pub await_points: Option<Arc<dyn AwaitPoints>>,
    /// PostgreSQL webhook ingest's group commit
    /// ([`group_commit`], [`accept::DEFAULT_INGEST_GROUP`]): how many
    /// webhooks one statement keeps at most, and how many such statements
    /// run at once before arriving webhooks queue for the next.
    pub ingest_group: group_commit::GroupLimits,
}

/// The default of [`StoreOptions::ping_after_idle`] (as HikariCP's
/// `aliveBypassWindowMs`).
pub const DEFAULT_PING_AFTER_IDLE: Duration = Duration::from_millis(500);

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 8,
            sqlite_busy_timeout: Duration::from_secs(10),
            acquire_timeout: Duration::from_secs(15),
            clock: Arc::new(SystemClock),
            entropy: Arc::new(OsEntropy),
            first_query_delay: Duration::from_secs(5),
            fulfillment_policy: sluice_core::FulfillmentPolicy::default(),
            secret_box: LocalSecretBox::process_ephemeral(),
            account_cache_ttl: account_cache::DEFAULT_TTL,
            ping_before_acquire: true,
            ping_after_idle: DEFAULT_PING_AFTER_IDLE,
            await_points: None,
            ingest_group: accept::DEFAULT_INGEST_GROUP,
        }
    }
}

/// A handle on the database. Cheap to clone; all clones share one pool.
#[derive(Debug, Clone)]
pub struct Store {
    /// Reads (and, on PostgreSQL, everything).
    pool: AnyPool,
    /// Every write: on SQLite with more than one connection, a pool of its own
    /// with one connection ([`db::open_pools`]); otherwise the same pool.
    writer: AnyPool,
    backend: Backend,
    env: Env,
    query_delay_ms: i64,
    fulfillment_policy: sluice_core::FulfillmentPolicy,
    secret_box: Arc<dyn SecretBox>,
    account_cache: Arc<account_cache::AccountCache>,
    /// Single-event webhooks waiting to share a statement (PostgreSQL).
    ingest: Arc<group_commit::GroupCommit<accept::PendingWebhook, accept::BatchAnswer>>,
}

static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");
static POSTGRES_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

impl Store {
    /// Open a store with default options. Does not migrate; call [`Store::migrate`].
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Store::connect_with(url, StoreOptions::default()).await
    }

    /// Open a store. For SQLite the file (and its directory) is created when
    /// missing and switched to WAL.
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::from_url(url)?;
        let url = match backend {
            Backend::Sqlite => db::prepare_sqlite_url(url)?,
            Backend::Postgres => url.to_owned(),
        };
        let ingest_group = options
            .ingest_group
            .validated()
            .map_err(StoreError::Config)?;
        let (pool, writer) = db::open_pools(&url, backend, &options).await?;
        Ok(Store {
            pool,
            writer,
            backend,
            env: Env {
                clock: options.clock,
                entropy: options.entropy,
                await_points: options.await_points,
            },
            query_delay_ms: i64::try_from(options.first_query_delay.as_millis())
                .unwrap_or(i64::MAX),
            fulfillment_policy: options.fulfillment_policy,
            secret_box: options.secret_box,
            account_cache: Arc::new(account_cache::AccountCache::new(options.account_cache_ttl)),
            ingest: Arc::new(group_commit::GroupCommit::new(ingest_group)),
        })
    }

    /// Bring the schema up to date. Runs at start-up and from `sluice migrate`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrator = match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATOR,
            Backend::Postgres => &POSTGRES_MIGRATOR,
        };
        migrator.run(&self.writer).await?;
        Ok(())
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The pool for reads, health checks and tests. Never change aggregate
    /// state through it: that is what [`Store::apply_event`] is for.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The pool every write of this process goes through (a crate beside the
    /// store with tables of its own, e.g. the delivery publisher's, writes
    /// through it too). On SQLite it holds one connection, so this process's
    /// writers queue for it in order instead of in SQLite's busy handler; on
    /// PostgreSQL it is [`Store::pool`].
    pub fn writer(&self) -> &AnyPool {
        &self.writer
    }

    /// Current time in unix milliseconds, from the store's clock.
    pub fn now_ms(&self) -> i64 {
        self.env.clock.now_ms()
    }

    /// `now` with this store's environment, for the row-writing helpers that
    /// mint ids inside a transaction.
    pub(crate) fn at(&self, now: i64) -> ids::At<'_> {
        ids::At {
            now,
            env: &self.env,
        }
    }

    /// The clock and entropy this store was opened with; every component
    /// built on the store draws from it.
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// The same store (same pool) deciding fulfillments with `policy`.
    pub fn with_fulfillment_policy(mut self, policy: sluice_core::FulfillmentPolicy) -> Store {
        self.fulfillment_policy = policy;
        self
    }

    /// The fulfillment policy the fulfillment door decides with.
    pub fn fulfillment_policy(&self) -> &sluice_core::FulfillmentPolicy {
        &self.fulfillment_policy
    }

    /// Cheap round trip for readiness probes.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
        self.writer.close().await;
    }
}
