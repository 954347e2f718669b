//! Plumbing shared by every module: connection set-up, write transactions and
//! row decoding.

use crate::env::AwaitPoint;
use crate::{Backend, Store, StoreError};
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, Row, Transaction};
use std::path::Path;

/// A write transaction on either backend.
pub(crate) type Tx = Transaction<'static, Any>;

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
    /// holding it.
    pub(crate) async fn begin_write(&self) -> Result<Tx, StoreError> {
        self.env.reached(AwaitPoint::BeforeWrite).await;
        let tx = match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        };
        self.env.reached(AwaitPoint::InWrite).await;
        Ok(tx)
    }
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
