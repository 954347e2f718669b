//! Plumbing shared by every module: connection set-up, write transactions and
//! row decoding.

use crate::env::{AwaitPoint, Env};
use crate::{Backend, Store, StoreError, StoreOptions};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyConnection, AnyPool, Row, Transaction};
use std::path::Path;

/// A write transaction on either backend.
pub(crate) type Tx = Transaction<'static, Any>;

/// What the store's statements run on: a [`Tx`]'s connection (a `&mut Tx`
/// coerces to it), or on PostgreSQL a connection outside any transaction for
/// a write that is one statement (`door.rs`, [`Door`](crate::door)).
pub(crate) type Conn = AnyConnection;

/// What one statement of a script gave ([`run_script`]): its rows, then its row count.
pub(crate) struct Ran {
    pub rows: Vec<AnyRow>,
    pub changes: u64,
}

/// SQLite: run a query string of several statements, its `$n` numbered across
/// all of them, in one round trip to the connection's worker thread (sqlx's
/// SQLite driver runs them in turn and streams back each one's rows, then
/// its count). The process's one write connection is held from a
/// transaction's `BEGIN` to its `COMMIT`, and a round trip per statement was
/// most of that time (BENCHMARKS.md, session 14). Returns each statement's
/// results up to the first that failed, and that failure.
pub(crate) async fn run_script(
    conn: &mut AnyConnection,
    query: crate::history::AnyQuery<'_>,
) -> (Vec<Ran>, Option<sqlx::Error>) {
    use futures_util::TryStreamExt;
    let mut ran = Vec::new();
    let mut rows = Vec::new();
    let mut results = sqlx::Executor::fetch_many(conn, query);
    loop {
        match results.try_next().await {
            Ok(Some(sqlx::Either::Right(row))) => rows.push(row),
            Ok(Some(sqlx::Either::Left(done))) => ran.push(Ran {
                rows: std::mem::take(&mut rows),
                changes: done.rows_affected(),
            }),
            Ok(None) => return (ran, None),
            Err(e) => return (ran, Some(e)),
        }
    }
}

/// Make the SQLite URL create its file, and the file's directory, if missing.
pub(crate) fn prepare_sqlite_url(url: &str) -> Result<String, StoreError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| StoreError::Config(format!("not a SQLite URL: {url}")))?;
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    if path.is_empty() || path == ":memory:" {
        return Err(StoreError::Config(
            "an in-memory SQLite database cannot be shared by a pool; use a file".into(),
        ));
    }
    if let Some(dir) = Path::new(path).parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Config(format!("cannot create directory {}: {e}", dir.display()))
            })?;
        }
    }
    let has_mode = query.is_some_and(|q| q.split('&').any(|kv| kv.starts_with("mode=")));
    Ok(match (query, has_mode) {
        (_, true) => url.to_owned(),
        (Some(_), false) => format!("{url}&mode=rwc"),
        (None, false) => format!("{url}?mode=rwc"),
    })
}

/// The store's read pool and its write pool, `options.max_connections`
/// connections in all.
///
/// SQLite lets one connection write at a time. With several connections
/// writing, the losers wait in SQLite's busy handler, which sleeps in steps
/// of up to 100 ms and serves nobody in order: a writer can lose to later
/// ones again and again. That was SQLite's p99 (443 ms beside a p50 of 53 ms
/// at 16 concurrent payments; with one connection for everything, 93 ms;
/// BENCHMARKS.md). So this process's writes get one connection of their own,
/// handed out by sqlx's pool in the order it was asked for, and reads (WAL:
/// never blocked by the writer) the others. The busy handler then only
/// arbitrates between processes. PostgreSQL locks rows, not the database: one
/// pool for both.
pub(crate) async fn open_pools(
    url: &str,
    backend: Backend,
    options: &StoreOptions,
) -> Result<(AnyPool, AnyPool), StoreError> {
    let total = options.max_connections.max(1);
    if backend == Backend::Postgres {
        let pool = pool_options(backend, options, total).connect(url).await?;
        return Ok((pool.clone(), pool));
    }
    let writer = pool_options(backend, options, 1).connect(url).await?;
    // Before any other connection opens: one opened earlier keeps reporting
    // its old journal mode until its next read transaction.
    enable_wal(&writer).await?;
    if total == 1 {
        return Ok((writer.clone(), writer));
    }
    let readers = pool_options(backend, options, total - 1)
        .connect(url)
        .await?;
    Ok((readers, writer))
}

/// Switch a SQLite file to WAL. Persistent in the file; setting it needs a
/// moment of exclusivity, which is why it is not part of every connection's
/// set-up.
async fn enable_wal(writer: &AnyPool) -> Result<(), StoreError> {
    let mode: AnyRow = sqlx::query("PRAGMA journal_mode = WAL")
        .fetch_one(writer)
        .await?;
    let mode: String = mode.try_get(0)?;
    if !mode.eq_ignore_ascii_case("wal") && !mode.eq_ignore_ascii_case("memory") {
        return Err(StoreError::Config(format!(
            "SQLite refused WAL mode (journal_mode = {mode})"
        )));
    }
    Ok(())
}

fn pool_options(backend: Backend, options: &StoreOptions, max: u32) -> AnyPoolOptions {
    let busy_ms = options.sqlite_busy_timeout.as_millis();
    let ping = backend == Backend::Postgres && options.ping_before_acquire;
    let ping_after_idle = options.ping_after_idle;
    AnyPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(options.acquire_timeout)
        // sqlx's own test pings before every acquire; ours only after an
        // idle spell (`ping_after_idle`). A SQLite connection is a handle in
        // this process: there is no peer that could have gone away, so it
        // is never pinged (a ping is a round trip to the connection's
        // worker thread that can only succeed: 6 % of the simulator's CPU).
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                if ping && meta.idle_for >= ping_after_idle {
                    // An error closes this connection; the pool hands out another.
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if conn.backend_name().eq_ignore_ascii_case("sqlite") {
                    sqlite_session_pragmas(conn, busy_ms).await?;
                }
                Ok(())
            })
        })
}

/// Per-connection SQLite settings (journal mode is per file, set once elsewhere).
pub(crate) async fn sqlite_session_pragmas(
    conn: &mut AnyConnection,
    busy_timeout_ms: u128,
) -> Result<(), sqlx::Error> {
    let pragmas = [
        "PRAGMA foreign_keys = ON".to_owned(),
        format!("PRAGMA busy_timeout = {busy_timeout_ms}"),
        // Safe with WAL: a power cut may lose the last commits, never corrupt.
        "PRAGMA synchronous = NORMAL".to_owned(),
    ];
    for pragma in pragmas {
        sqlx::query(&pragma).execute(&mut *conn).await?;
    }
    Ok(())
}

impl Store {
    /// Begin a transaction that will write. On SQLite it takes the write lock
    /// up front (`BEGIN IMMEDIATE`): a deferred transaction that read first and
    /// writes later fails with SQLITE_BUSY instead of waiting when another
    /// writer got in between, which would turn every race into an error.
    ///
    /// Both sides of the `BEGIN` are await points ([`crate::env::AwaitPoints`]):
    /// the simulator kills the gateway there, before the transaction or
    /// holding it. Public for the crates that own tables of their own in the
    /// same database (the delivery crate), so their writes meet the same
    /// points; they end it with [`Store::commit_write`].
    pub async fn begin_write(&self) -> Result<Tx, StoreError> {
        self.env.reached(AwaitPoint::BeforeWrite).await;
        let tx = match self.backend {
            Backend::Sqlite => self.writer.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.writer.begin().await?,
        };
        self.env.reached(AwaitPoint::InWrite).await;
        Ok(tx)
    }

    /// PostgreSQL: a connection for a write that is one statement outside
    /// any transaction, which commits by itself. Reached between the same
    /// await points as [`Store::begin_write`]'s `BEGIN`, so that a try is
    /// the same sequence of them on both backends; its end is
    /// [`AwaitPoint::AfterCommit`] as a commit's.
    pub(crate) async fn begin_alone(&self) -> Result<sqlx::pool::PoolConnection<Any>, StoreError> {
        self.env.reached(AwaitPoint::BeforeWrite).await;
        let conn = self.writer.acquire().await?;
        self.env.reached(AwaitPoint::InWrite).await;
        Ok(conn)
    }

    /// Commit a write transaction. Its end is an await point too
    /// ([`AwaitPoint::AfterCommit`]): a process can die with its write
    /// durable and its caller never told.
    pub async fn commit_write(&self, tx: Tx) -> Result<(), StoreError> {
        commit_write(&self.env, tx).await
    }
}

/// What a work queue's claim runs under on PostgreSQL: the planner may walk the queue's
/// partial index in order and nothing else. Its statistics of a queue table are nearly
/// always stale (rows come and go faster than autovacuum's naptime), and on a fresh
/// estimate of a handful of pending rows it read a backlog of thousands through a bitmap
/// and sorted it on every claim: 14–31 ms a claim of 50 webhooks in the bench, where the
/// ordered index walk stops after 50 (BENCHMARKS.md, session 7).
const QUEUE_CLAIM_PLAN: &str = "SELECT set_config('enable_seqscan', 'off', true), \
                                       set_config('enable_bitmapscan', 'off', true)";

impl Backend {
    /// The lock a work queue claim's `picked` CTE takes on the rows it picks: on PostgreSQL
    /// `FOR UPDATE SKIP LOCKED`, so two claimers never pick one row and neither waits for the
    /// other; SQLite's one writer runs the whole claim alone and needs none.
    pub fn claim_lock(self) -> &'static str {
        match self {
            Backend::Postgres => "FOR UPDATE SKIP LOCKED",
            Backend::Sqlite => "",
        }
    }

    /// How a work queue claim's `UPDATE` names the rows its `picked` CTE chose: `key` is the
    /// queue's primary key. On PostgreSQL an array of those keys, which only the key's own
    /// index can look up. `key IN (SELECT key FROM picked) AND <due>` let the planner join
    /// the CTE against a walk of the queue's partial index instead, and a generic plan made
    /// while the queue was nearly empty kept that join as the backlog grew: every claim read
    /// the whole backlog, 64 ms a claim on average and up to 482 ms during the bench's
    /// webhook ingest, against 1 ms (BENCHMARKS.md, session 13). The due condition is not
    /// repeated: the CTE picked the rows under it and holds their locks to the end of the
    /// statement (SQLite: the statement holds the database's write lock), so nothing can
    /// have changed them in between, and repeating it is what made the partial index a
    /// candidate for the update.
    pub fn claimed(self, key: &str) -> String {
        match self {
            Backend::Postgres => format!("{key} = ANY (ARRAY(SELECT {key} FROM picked))"),
            Backend::Sqlite => format!("{key} IN (SELECT {key} FROM picked)"),
        }
    }
}

impl Store {
    /// Run a work queue's claim, one statement that picks the oldest due rows in its partial
    /// index's order and updates them, and return its rows. On PostgreSQL it runs in a
    /// transaction of its own under [`QUEUE_CLAIM_PLAN`]; on SQLite as it is (its planner
    /// takes the index for the `ORDER BY … LIMIT` without statistics). Neither is an await
    /// point of [`Store::begin_write`]: it is one statement, as before.
    pub async fn claim_queue<'q>(
        &self,
        claim: sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>,
    ) -> Result<Vec<AnyRow>, StoreError> {
        match self.backend {
            Backend::Sqlite => Ok(claim.fetch_all(&self.writer).await?),
            Backend::Postgres => {
                let mut tx = self.writer.begin().await?;
                sqlx::query(QUEUE_CLAIM_PLAN).execute(&mut *tx).await?;
                let rows = claim.fetch_all(&mut *tx).await?;
                tx.commit().await?;
                Ok(rows)
            }
        }
    }
}

/// [`Store::commit_write`] for the helpers that hold only the environment.
pub(crate) async fn commit_write(env: &Env, tx: Tx) -> Result<(), StoreError> {
    tx.commit().await?;
    env.reached(AwaitPoint::AfterCommit).await;
    Ok(())
}

pub(crate) fn text(row: &AnyRow, col: &str) -> Result<String, StoreError> {
    Ok(row.try_get::<String, _>(col)?)
}

pub(crate) fn opt_text(row: &AnyRow, col: &str) -> Result<Option<String>, StoreError> {
    Ok(row.try_get::<Option<String>, _>(col)?)
}

pub(crate) fn int(row: &AnyRow, col: &str) -> Result<i64, StoreError> {
    Ok(row.try_get::<i64, _>(col)?)
}

pub(crate) fn opt_int(row: &AnyRow, col: &str) -> Result<Option<i64>, StoreError> {
    Ok(row.try_get::<Option<i64>, _>(col)?)
}

/// Decode a stored enum name with its `parse` function.
pub(crate) fn parsed<T>(
    row: &AnyRow,
    table: &'static str,
    col: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T, StoreError> {
    let raw = text(row, col)?;
    parse(&raw).ok_or_else(|| StoreError::corrupt(table, format!("{col} = {raw:?}")))
}

/// Decode a stored JSON text column.
pub(crate) fn json(
    row: &AnyRow,
    table: &'static str,
    col: &str,
) -> Result<serde_json::Value, StoreError> {
    let raw = text(row, col)?;
    serde_json::from_str(&raw).map_err(|e| StoreError::corrupt(table, format!("{col}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::prepare_sqlite_url;

    #[test]
    fn sqlite_urls_get_their_directory_created_and_a_create_mode() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/data/nested/sluice.db", dir.path().display());
        let prepared = prepare_sqlite_url(&url).unwrap();
        assert_eq!(prepared, format!("{url}?mode=rwc"));
        assert!(dir.path().join("data/nested").is_dir());
        let with_query = format!("{url}?cache=private");
        assert_eq!(
            prepare_sqlite_url(&with_query).unwrap(),
            format!("{with_query}&mode=rwc")
        );
        let read_only = format!("{url}?mode=ro");
        assert_eq!(prepare_sqlite_url(&read_only).unwrap(), read_only);
    }

    #[test]
    fn in_memory_sqlite_is_refused_because_a_pool_cannot_share_it() {
        assert!(prepare_sqlite_url("sqlite::memory:").is_err());
        assert!(prepare_sqlite_url("postgres://x").is_err());
    }
}
