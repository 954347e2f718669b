//! Plumbing: write transactions and row decoding on the store's `Any` pool.
//! The SQL is the same on both backends (`$n` placeholders, BIGINT millis).

use crate::DeliveryError;
use sluice_store::Store;
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

pub(crate) type Tx = Transaction<'static, Any>;

/// Begin a transaction that will write: the store's own (on SQLite it takes
/// the write lock up front; a deferred transaction that reads and then writes
/// fails with SQLITE_BUSY instead of waiting when another writer got in
/// first), so its start and its [`commit_write`] are the store's await points
/// (the simulator kills the gateway there).
pub(crate) async fn begin_write(store: &Store) -> Result<Tx, DeliveryError> {
    Ok(store.begin_write().await?)
}

/// Commit a transaction of [`begin_write`].
pub(crate) async fn commit_write(store: &Store, tx: Tx) -> Result<(), DeliveryError> {
    Ok(store.commit_write(tx).await?)
}

pub(crate) fn text(row: &AnyRow, col: &str) -> Result<String, DeliveryError> {
    Ok(row.try_get::<String, _>(col)?)
}

pub(crate) fn opt_text(row: &AnyRow, col: &str) -> Result<Option<String>, DeliveryError> {
    Ok(row.try_get::<Option<String>, _>(col)?)
}

pub(crate) fn int(row: &AnyRow, col: &str) -> Result<i64, DeliveryError> {
    Ok(row.try_get::<i64, _>(col)?)
}

pub(crate) fn opt_int(row: &AnyRow, col: &str) -> Result<Option<i64>, DeliveryError> {
    Ok(row.try_get::<Option<i64>, _>(col)?)
}
