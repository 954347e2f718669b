//! The store's typed errors. Callers match on these; they never see raw SQL
//! errors for conditions the business cares about.

use sqlx::error::ErrorKind;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The addressed row does not exist (or is not visible to this merchant).
    #[error("{entity} not found: {key}")]
    NotFound { entity: &'static str, key: String },

    /// The event names an aggregate of another connector account than the
    /// one it came through (the tenant boundary); nothing was written.
    #[error("{entity} {key} is not an aggregate of connector account {account}")]
    OutOfScope {
        entity: &'static str,
        key: String,
        account: String,
    },

    /// A uniqueness rule refused the write (e.g. a merchant order number reused).
    #[error("conflict: {0}")]
    Conflict(String),

    /// The refund does not fit in `captured - refunded - refund_reserved`.
    #[error("refund of {requested} exceeds the refundable amount {available}")]
    InsufficientRefundable { requested: i64, available: i64 },

    /// The capture does not fit in `authorized - captured - capture_reserved`.
    #[error("capture of {requested} exceeds the capturable amount {available}")]
    InsufficientCapturable { requested: i64, available: i64 },

    /// A payment already has an attempt that has not failed definitively.
    #[error("payment {payment_id} already has a live attempt {attempt_id} in state {state}")]
    AttemptInFlight {
        payment_id: String,
        attempt_id: String,
        state: String,
    },

    /// The operation is not allowed in the aggregate's current state.
    #[error("{entity} {id} is {state}: {reason}")]
    InvalidState {
        entity: &'static str,
        id: String,
        state: String,
        reason: String,
    },

    /// Optimistic concurrency kept losing; the caller may retry later.
    #[error("gave up after {tries} concurrent-update conflicts on {aggregate} {id}")]
    CasExhausted {
        aggregate: &'static str,
        id: String,
        tries: u32,
    },

    /// An idempotency key was reused with a different request.
    #[error("idempotency key reused with a different request")]
    IdempotencyMismatch,

    /// A stored value does not parse (unknown state name, bad JSON, ...).
    #[error("corrupt row in {table}: {detail}")]
    Corrupt { table: &'static str, detail: String },

    /// A money invariant that the decision relied on does not hold in the
    /// database; nothing was written.
    #[error("amount invariant violated: {0}")]
    AmountInvariant(String),

    /// The core decided on something the store cannot carry out.
    #[error("decision cannot be applied: {0}")]
    Unapplicable(String),

    /// The request itself is not acceptable (bad amount, wrong currency, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    #[error("invalid configuration: {0}")]
    Config(String),

    /// A secret at rest could not be sealed or opened (a wrong or missing master
    /// key, an altered row). Never carries the secret.
    #[error("secret at rest: {0}")]
    Secret(#[from] crate::secret_box::SecretBoxError),

    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),

    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        StoreError::Database(err)
    }
}

impl StoreError {
    pub(crate) fn not_found(entity: &'static str, key: impl Into<String>) -> Self {
        StoreError::NotFound {
            entity,
            key: key.into(),
        }
    }

    pub(crate) fn corrupt(table: &'static str, detail: impl Into<String>) -> Self {
        StoreError::Corrupt {
            table,
            detail: detail.into(),
        }
    }

    /// True when the database refused the write because of a unique constraint.
    pub fn is_unique_violation(&self) -> bool {
        self.db_kind() == Some(ErrorKind::UniqueViolation)
    }

    /// True when the database refused the write because of a CHECK constraint.
    pub fn is_check_violation(&self) -> bool {
        self.db_kind() == Some(ErrorKind::CheckViolation)
    }

    /// True when the database refused the write because of a foreign key.
    pub fn db_is_fk_violation(&self) -> bool {
        self.db_kind() == Some(ErrorKind::ForeignKeyViolation)
    }

    fn db_kind(&self) -> Option<ErrorKind> {
        match self {
            StoreError::Database(sqlx::Error::Database(e)) => Some(e.kind()),
            _ => None,
        }
    }
}
