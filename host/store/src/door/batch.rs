//! The writes of one applied decision, each with what it must do for the
//! decision to hold. On SQLite they run as one script of statements (one
//! round trip to the connection's worker thread); on PostgreSQL as one
//! statement (one data-modifying CTE per write). Either saves a round trip
//! per write, and the writes are then checked in their order, so the outcome
//! is the one the writes one by one would give. Either way they run inside
//! the door's transaction, which the caller rolls back on anything but
//! [`Outcome::Done`].
//!
//! One statement cannot change one row twice (PostgreSQL would apply only one
//! of the changes), so a batch whose writes may touch the same row is run one
//! by one on PostgreSQL too ([`Batch::one_by_one`]).
//!
//! On PostgreSQL a batch that is one statement can also run outside any
//! transaction ([`Batch::run_alone`]): the statement then checks its own
//! writes (`sluice_batch_check`, migration 0022) and raises at the first that
//! does not hold, so that it commits all of them or none, and saves the
//! `BEGIN` and `COMMIT` round trips of a transaction.

use sqlx::Row;

use crate::db::{run_script, Conn};
use crate::history::AnyQuery;
use crate::{Backend, StoreError};

/// A bound value. Owned, so a batch can outlive the values it was built from.
#[derive(Debug, Clone)]
pub(crate) enum Bind {
    Text(Option<String>),
    Int(Option<i64>),
}

impl From<&str> for Bind {
    fn from(v: &str) -> Self {
        Bind::Text(Some(v.to_owned()))
    }
}
impl From<Option<&str>> for Bind {
    fn from(v: Option<&str>) -> Self {
        Bind::Text(v.map(str::to_owned))
    }
}
impl From<i64> for Bind {
    fn from(v: i64) -> Self {
        Bind::Int(Some(v))
    }
}
impl From<Option<i64>> for Bind {
    fn from(v: Option<i64>) -> Self {
        Bind::Int(v)
    }
}

/// What a write must do for the decision to hold.
#[derive(Debug, Clone)]
pub(crate) enum Expect {
    /// Exactly one row. An update that finds none lost a compare-and-set
    /// (another writer moved the row first) and the decision is taken again
    /// ([`Outcome::Retry`]); an insert always writes its row or fails.
    OneRow,
    /// Exactly one row locked, not written: a `SELECT 0::BIGINT AS id … FOR
    /// SHARE` (PostgreSQL only) that names its own `id` and gets no
    /// `RETURNING`. Finding none is a lost compare-and-set, as for
    /// [`Expect::OneRow`]; the row stays locked against writers until commit.
    LockedRow,
    /// An amount movement: exactly one row, else the amounts do not allow it
    /// and the transaction fails with this message.
    Amount(String),
    /// An insert of this many rows that returns their `id`s.
    Ids(usize),
}

/// One write: its SQL with parameters `$1`, `$2`, … and their values, and
/// no `RETURNING` (the batch adds what it reads back; a lock,
/// [`Expect::LockedRow`], reads its own).
#[derive(Debug, Clone)]
pub(crate) struct Write {
    pub sql: String,
    pub binds: Vec<Bind>,
    pub expect: Expect,
}

impl Write {
    /// A write of exactly one row ([`Expect::OneRow`]).
    pub fn one_row(sql: impl Into<String>, binds: Vec<Bind>) -> Write {
        Write {
            sql: sql.into(),
            binds,
            expect: Expect::OneRow,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Batch {
    writes: Vec<Write>,
    one_by_one: bool,
    lazy: bool,
}

/// How a batch went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every write held; the ids of its inserts, in the order of their rows.
    Done(Vec<i64>),
    /// A compare-and-set missed: decide again.
    Retry,
}

impl Batch {
    pub fn push(&mut self, write: Write) {
        self.writes.push(write);
    }

    /// Run these writes one by one on every backend (they may touch one row twice).
    pub fn one_by_one(&mut self) {
        self.one_by_one = true;
    }

    /// Let [`Batch::run_alone`] commit without waiting for the WAL flush
    /// (`synchronous_commit` off for its own statement), for writes that are
    /// taken again from durable evidence when a crash loses them. Nothing
    /// else changes: a batch in a transaction commits with the transaction.
    pub fn commit_lazily(&mut self) {
        self.lazy = true;
    }

    /// Whether these writes need a transaction around them: more than one
    /// statement. Only then may [`Batch::run_alone`] not take them.
    pub fn needs_transaction(&self) -> bool {
        self.one_by_one && self.writes.len() > 1
    }

    /// PostgreSQL, outside any transaction: the writes as one statement that
    /// checks them itself and commits them all or none. A write that does
    /// not hold makes the statement raise, and the outcome is the one
    /// [`check`] gives for it, as in a transaction rolled back.
    pub async fn run_alone(&self, conn: &mut Conn) -> Result<Outcome, StoreError> {
        if self.needs_transaction() {
            return Err(StoreError::Unapplicable(
                "a batch of several statements runs in a transaction".into(),
            ));
        }
        let (sql, binds) = self.checked_statement();
        match bind_all(sqlx::query(&sql), binds).fetch_all(conn).await {
            Ok(rows) => self.outcome(&rows),
            Err(e) => match held_not(&e) {
                Some((index, rows)) => {
                    let write = self.writes.get(index).ok_or_else(|| {
                        StoreError::Unapplicable("a batch check names no write".into())
                    })?;
                    check(write, rows)?.ok_or_else(|| {
                        StoreError::Unapplicable(format!(
                            "write {index} of a batch held with {rows} rows, yet was refused"
                        ))
                    })
                }
                None => Err(e.into()),
            },
        }
    }

    pub async fn run(&self, tx: &mut Conn, backend: Backend) -> Result<Outcome, StoreError> {
        match backend {
            Backend::Postgres if !self.one_by_one && self.writes.len() > 1 => {
                self.run_at_once(tx).await
            }
            Backend::Postgres => self.run_in_turn(tx).await,
            Backend::Sqlite => self.run_as_script(tx).await,
        }
    }

    /// SQLite: the writes as one script, `w0; w1; …`, run in order by the
    /// connection's worker thread in one round trip, which streams back each
    /// statement's rows and then its row count. The process's one write
    /// connection is held for the whole transaction, so every round trip to
    /// its worker (two thread wake-ups) is time no other writer can use: one
    /// per write was most of the time it was held (BENCHMARKS.md, session 14).
    /// Every write of the script runs, where one by one would stop at the
    /// first that does not hold; the outcome is still that first one's, and
    /// the caller rolls the transaction back on anything but
    /// [`Outcome::Done`], so the writes after it are undone with it.
    async fn run_as_script(&self, tx: &mut Conn) -> Result<Outcome, StoreError> {
        if self.writes.is_empty() {
            return Ok(Outcome::Done(Vec::new()));
        }
        let (sql, binds) = self.script();
        let (statements, failed) = run_script(tx, bind_all(sqlx::query(&sql), binds)).await;
        if statements.len() > self.writes.len() {
            return Err(StoreError::Unapplicable(
                "a batch script ran more statements than writes".into(),
            ));
        }
        let mut per_write: Vec<Vec<i64>> = Vec::with_capacity(statements.len());
        for (write, statement) in self.writes.iter().zip(statements) {
            per_write.push(match write.expect {
                Expect::Ids(_) | Expect::LockedRow => returned_ids(&statement.rows, "id")?,
                Expect::OneRow | Expect::Amount(_) => {
                    vec![0; usize::try_from(statement.changes).unwrap_or(usize::MAX)]
                }
            });
        }
        let ran = per_write.len();
        // A write before a failed statement that did not hold decides, as one
        // by one, which would not have run the failed statement.
        match (self.outcome_of(per_write)?, failed) {
            (Outcome::Retry, _) => Ok(Outcome::Retry),
            (Outcome::Done(_), Some(e)) => Err(e.into()),
            (done, None) if ran == self.writes.len() => Ok(done),
            (_, None) => Err(StoreError::Unapplicable(format!(
                "a batch script of {} writes answered for {ran}",
                self.writes.len()
            ))),
        }
    }

    /// `w0; w1; …`: each write's parameters numbered after the ones before it.
    fn script(&self) -> (String, Vec<Bind>) {
        let mut statements = Vec::with_capacity(self.writes.len());
        let mut binds = Vec::new();
        for write in &self.writes {
            let returning = match write.expect {
                Expect::Ids(_) => " RETURNING id",
                _ => "",
            };
            statements.push(format!("{}{returning}", renumber(&write.sql, binds.len())));
            binds.extend(write.binds.iter().cloned());
        }
        (statements.join(";\n"), binds)
    }

    async fn run_in_turn(&self, tx: &mut Conn) -> Result<Outcome, StoreError> {
        let mut ids = Vec::new();
        for write in &self.writes {
            let found = match write.expect {
                Expect::Ids(_) => {
                    let sql = format!("{} RETURNING id", write.sql);
                    let query = bind_all(sqlx::query(&sql), write.binds.iter().cloned());
                    let rows = query.fetch_all(&mut *tx).await?;
                    let mut returned = returned_ids(&rows, "id")?;
                    returned.sort_unstable();
                    returned
                }
                _ => {
                    let query = bind_all(sqlx::query(&write.sql), write.binds.iter().cloned());
                    let done = query.execute(&mut *tx).await?;
                    vec![0; usize::try_from(done.rows_affected()).unwrap_or(usize::MAX)]
                }
            };
            if let Some(outcome) = check(write, found.len())? {
                return Ok(outcome);
            }
            if matches!(write.expect, Expect::Ids(_)) {
                ids.extend(found);
            }
        }
        Ok(Outcome::Done(ids))
    }

    async fn run_at_once(&self, tx: &mut Conn) -> Result<Outcome, StoreError> {
        let (sql, binds) = self.statement();
        let rows = bind_all(sqlx::query(&sql), binds)
            .fetch_all(&mut *tx)
            .await?;
        self.outcome(&rows)
    }

    /// The outcome of the batch statement's rows: each names its write, and
    /// the checked statement's row of its check (`w = -1`) is skipped.
    fn outcome(&self, rows: &[sqlx::any::AnyRow]) -> Result<Outcome, StoreError> {
        let mut per_write: Vec<Vec<i64>> = vec![Vec::new(); self.writes.len()];
        for row in rows {
            let w = row.try_get::<i64, _>("w")?;
            if w == CHECK_ROW {
                continue;
            }
            let index = usize::try_from(w)
                .ok()
                .and_then(|i| per_write.get_mut(i))
                .ok_or_else(|| StoreError::Unapplicable("a batch row names no write".into()))?;
            index.push(row.try_get::<i64, _>("id")?);
        }
        self.outcome_of(per_write)
    }

    /// The outcome of the first writes, each with the ids (or as many zeros as
    /// rows) it gave: the first that did not hold decides, else every id.
    fn outcome_of(&self, per_write: Vec<Vec<i64>>) -> Result<Outcome, StoreError> {
        let mut ids = Vec::new();
        for (write, mut found) in self.writes.iter().zip(per_write) {
            if let Some(outcome) = check(write, found.len())? {
                return Ok(outcome);
            }
            if matches!(write.expect, Expect::Ids(_)) {
                found.sort_unstable();
                ids.extend(found);
            }
        }
        Ok(Outcome::Done(ids))
    }

    /// `WITH w0 AS (… RETURNING …), w1 AS (…) SELECT w, id FROM w0 UNION ALL …`,
    /// each write's parameters numbered after the ones before it.
    fn statement(&self) -> (String, Vec<Bind>) {
        self.statement_with(None)
    }

    /// [`Batch::statement`] with a first row that checks every write's row
    /// count and raises at the first that does not hold. Reading each write's
    /// count runs it to completion first; a raise undoes the whole statement.
    fn checked_statement(&self) -> (String, Vec<Bind>) {
        let counts: Vec<String> = (0..self.writes.len())
            .map(|i| format!("(SELECT count(*) FROM w{i})"))
            .collect();
        let wanted: Vec<String> = (self.writes.iter())
            .map(|w| w.expect.rows().to_string())
            .collect();
        // `set_config(…, true)` lasts until the statement's own commit.
        let lazy = match self.lazy {
            true => " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit",
            false => "",
        };
        let check = format!(
            "SELECT {CHECK_ROW}::BIGINT AS w, sluice_batch_check(ARRAY[{}]::BIGINT[], \
             ARRAY[{}]::BIGINT[]) AS id{lazy}",
            counts.join(", "),
            wanted.join(", ")
        );
        self.statement_with(Some(check))
    }

    fn statement_with(&self, lead: Option<String>) -> (String, Vec<Bind>) {
        let mut ctes = Vec::with_capacity(self.writes.len());
        let mut selects: Vec<String> = lead.into_iter().collect();
        let mut binds = Vec::new();
        for (i, write) in self.writes.iter().enumerate() {
            let returning = match write.expect {
                Expect::Ids(_) => " RETURNING id",
                Expect::OneRow | Expect::Amount(_) => " RETURNING 0::BIGINT AS id",
                Expect::LockedRow => "",
            };
            let sql = renumber(&write.sql, binds.len());
            ctes.push(format!("w{i} AS ({sql}{returning})"));
            selects.push(format!("SELECT {i}::BIGINT AS w, id FROM w{i}"));
            binds.extend(write.binds.iter().cloned());
        }
        let sql = format!("WITH {} {}", ctes.join(", "), selects.join(" UNION ALL "));
        (sql, binds)
    }
}

/// The `w` of the checked statement's row of its check.
const CHECK_ROW: i64 = -1;

/// The SQLSTATE `sluice_batch_check` raises with (migration 0022).
const BATCH_CHECK_FAILED: &str = "SLB01";

/// Which write did not hold, and with how many rows, when `e` is the raise of
/// `sluice_batch_check` (its message is `<write>:<rows>`).
fn held_not(e: &sqlx::Error) -> Option<(usize, usize)> {
    let db = e.as_database_error()?;
    if db.code().as_deref() != Some(BATCH_CHECK_FAILED) {
        return None;
    }
    let (index, rows) = db.message().split_once(':')?;
    Some((index.trim().parse().ok()?, rows.trim().parse().ok()?))
}

impl Expect {
    /// The rows a write must move to hold.
    fn rows(&self) -> usize {
        match self {
            Expect::OneRow | Expect::LockedRow | Expect::Amount(_) => 1,
            Expect::Ids(n) => *n,
        }
    }
}

/// `None` when `write` held with `rows` rows; else what the batch comes to.
fn check(write: &Write, rows: usize) -> Result<Option<Outcome>, StoreError> {
    match &write.expect {
        Expect::OneRow | Expect::LockedRow if rows != 1 => Ok(Some(Outcome::Retry)),
        Expect::Amount(message) if rows != 1 => Err(StoreError::AmountInvariant(message.clone())),
        Expect::Ids(wanted) if rows != *wanted => Err(StoreError::Unapplicable(format!(
            "{wanted} rows inserted, {rows} ids returned"
        ))),
        _ => Ok(None),
    }
}

fn returned_ids(rows: &[sqlx::any::AnyRow], column: &str) -> Result<Vec<i64>, StoreError> {
    rows.iter()
        .map(|row| row.try_get::<i64, _>(column).map_err(StoreError::from))
        .collect()
}

pub(crate) fn bind_all<'q>(
    mut query: AnyQuery<'q>,
    binds: impl IntoIterator<Item = Bind>,
) -> AnyQuery<'q> {
    for bind in binds {
        query = match bind {
            Bind::Text(v) => query.bind(v),
            Bind::Int(v) => query.bind(v),
        };
    }
    query
}

/// `sql` with every parameter `$n` made `$(n + offset)`. The store's SQL has
/// no `$` but its parameters (no dollar quoting, no `$` in literals).
pub(crate) fn renumber(sql: &str, offset: usize) -> String {
    if offset == 0 {
        return sql.to_owned();
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut chars = sql.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        out.push(c);
        if c != '$' {
            continue;
        }
        let mut digits = String::new();
        while let Some(&(_, d)) = chars.peek() {
            if !d.is_ascii_digit() {
                break;
            }
            digits.push(d);
            chars.next();
        }
        match digits.parse::<usize>() {
            Ok(n) => out.push_str(&(n + offset).to_string()),
            Err(_) => out.push_str(&digits),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_after_the_writes_before() {
        assert_eq!(
            renumber("UPDATE t SET a = $2 WHERE id = $1 AND v = $12", 5),
            "UPDATE t SET a = $7 WHERE id = $6 AND v = $17"
        );
        assert_eq!(renumber("SELECT $1", 0), "SELECT $1");
    }

    #[test]
    fn one_statement_returns_which_write_each_row_came_from() {
        let mut batch = Batch::default();
        batch.push(Write {
            sql: "UPDATE o SET v = v + 1 WHERE id = $1 AND v = $2".into(),
            binds: vec!["o1".into(), 3.into()],
            expect: Expect::OneRow,
        });
        batch.push(Write {
            sql: "INSERT INTO h (a) VALUES ($1), ($2)".into(),
            binds: vec!["x".into(), "y".into()],
            expect: Expect::Ids(2),
        });
        let (sql, binds) = batch.statement();
        assert_eq!(
            sql,
            "WITH w0 AS (UPDATE o SET v = v + 1 WHERE id = $1 AND v = $2 RETURNING 0::BIGINT AS id), \
             w1 AS (INSERT INTO h (a) VALUES ($3), ($4) RETURNING id) \
             SELECT 0::BIGINT AS w, id FROM w0 UNION ALL SELECT 1::BIGINT AS w, id FROM w1"
        );
        assert_eq!(binds.len(), 4);
    }

    /// A migrated PostgreSQL store of its own, and how many merchants named `id` it holds.
    async fn postgres() -> (sluice_test_support::db::PgDatabase, crate::Store) {
        let pg = sluice_test_support::db::PgDatabase::create().await;
        let store = crate::Store::connect(&pg.url).await.unwrap();
        store.migrate().await.unwrap();
        (pg, store)
    }

    async fn merchants(store: &crate::Store, id: &str) -> i64 {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM merchants WHERE id = $1")
            .bind(id)
            .fetch_one(store.pool())
            .await
            .unwrap()
    }

    /// `batch` run alone on a pooled connection of `store`, given back before the caller looks.
    async fn alone(store: &crate::Store, batch: &Batch) -> Result<Outcome, StoreError> {
        let mut conn = store.writer.acquire().await.unwrap();
        batch.run_alone(&mut conn).await
    }

    fn new_merchant(id: &str) -> Write {
        Write::one_row(
            "INSERT INTO merchants (id, name, created_at, updated_at) VALUES ($1, 'm', 1, 1)",
            vec![id.into()],
        )
    }

    fn rename(id: &str, expect: Expect) -> Write {
        Write {
            sql: "UPDATE merchants SET name = 'renamed' WHERE id = $1".into(),
            binds: vec![id.into()],
            expect,
        }
    }

    #[tokio::test]
    async fn a_batch_alone_that_holds_commits_every_write_at_once() {
        let (_pg, store) = postgres().await;
        let mut batch = Batch::default();
        batch.push(new_merchant("m1"));
        batch.push(new_merchant("m2"));
        assert_eq!(alone(&store, &batch).await.unwrap(), Outcome::Done(vec![]));
        assert_eq!(
            merchants(&store, "m1").await + merchants(&store, "m2").await,
            2
        );
    }

    /// The door's compare-and-set outside a transaction: the miss of a later
    /// write undoes the earlier ones, as the rolled-back transaction did.
    #[tokio::test]
    async fn a_batch_alone_whose_compare_and_set_misses_writes_nothing_and_is_retried() {
        let (_pg, store) = postgres().await;
        let mut batch = Batch::default();
        batch.push(new_merchant("m1"));
        batch.push(rename("nobody", Expect::OneRow));
        assert_eq!(alone(&store, &batch).await.unwrap(), Outcome::Retry);
        assert_eq!(
            merchants(&store, "m1").await,
            0,
            "the insert before the miss is undone"
        );
    }

    #[tokio::test]
    async fn a_batch_alone_whose_amount_movement_does_not_hold_fails_and_writes_nothing() {
        let (_pg, store) = postgres().await;
        let mut batch = Batch::default();
        batch.push(new_merchant("m1"));
        batch.push(rename(
            "nobody",
            Expect::Amount("more than was captured".into()),
        ));
        batch.push(new_merchant("m2"));
        let refused = alone(&store, &batch).await;
        assert!(
            matches!(&refused, Err(StoreError::AmountInvariant(m)) if m == "more than was captured"),
            "{refused:?}"
        );
        assert_eq!(
            merchants(&store, "m1").await + merchants(&store, "m2").await,
            0
        );
    }

    /// A lazy batch's `synchronous_commit = off` is its own statement's: the pooled
    /// connection's next commit, a money write's, waits for the disk again.
    #[tokio::test]
    async fn a_lazy_batch_commits_and_its_setting_ends_with_its_statement() {
        let (_pg, store) = postgres().await;
        let mut batch = Batch::default();
        batch.push(new_merchant("m1"));
        batch.push(new_merchant("m2"));
        batch.commit_lazily();
        let mut conn = store.writer.acquire().await.unwrap();
        assert_eq!(
            batch.run_alone(&mut conn).await.unwrap(),
            Outcome::Done(vec![])
        );
        let setting: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(setting, "on");
        drop(conn);
        assert_eq!(
            merchants(&store, "m1").await + merchants(&store, "m2").await,
            2
        );
    }

    /// Two writes of one row would each apply to the row as it was; a batch that may
    /// do that is several statements and needs a transaction.
    #[tokio::test]
    async fn a_batch_of_several_statements_is_refused_outside_a_transaction() {
        let (_pg, store) = postgres().await;
        let mut batch = Batch::default();
        batch.push(new_merchant("m1"));
        batch.push(rename("m1", Expect::OneRow));
        batch.one_by_one();
        assert!(batch.needs_transaction());
        assert!(alone(&store, &batch).await.is_err());
        assert_eq!(merchants(&store, "m1").await, 0);
    }

    /// The door's check of an order that a decision does not change, as a
    /// share lock on a merchant named `id` (`name` standing in for the version).
    fn lock(id: &str, name: &str) -> Write {
        Write {
            sql: "SELECT 0::BIGINT AS id FROM merchants WHERE id = $1 AND name = $2 FOR SHARE"
                .into(),
            binds: vec![id.into(), name.into()],
            expect: Expect::LockedRow,
        }
    }

    async fn insert_merchant(store: &crate::Store, id: &str) {
        let mut batch = Batch::default();
        batch.push(new_merchant(id));
        assert_eq!(alone(store, &batch).await.unwrap(), Outcome::Done(vec![]));
    }

    /// The row's version as PostgreSQL keeps it: a new one for every write.
    async fn row_version(store: &crate::Store, id: &str) -> String {
        sqlx::query_scalar("SELECT xmin::TEXT FROM merchants WHERE id = $1")
            .bind(id)
            .fetch_one(store.pool())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_lock_that_holds_lets_the_batch_commit_and_writes_no_new_version_of_its_row() {
        let (_pg, store) = postgres().await;
        insert_merchant(&store, "m1").await;
        let before = row_version(&store, "m1").await;
        let mut batch = Batch::default();
        batch.push(lock("m1", "m"));
        batch.push(new_merchant("m2"));
        assert_eq!(alone(&store, &batch).await.unwrap(), Outcome::Done(vec![]));
        assert_eq!(merchants(&store, "m2").await, 1);
        assert_eq!(
            row_version(&store, "m1").await,
            before,
            "the lock wrote no row version"
        );
    }

    #[tokio::test]
    async fn a_lock_of_a_row_another_writer_moved_misses_and_the_batch_writes_nothing() {
        let (_pg, store) = postgres().await;
        insert_merchant(&store, "m1").await;
        let mut batch = Batch::default();
        batch.push(new_merchant("m2"));
        batch.push(lock("m1", "the name it had when the decision was taken"));
        assert_eq!(alone(&store, &batch).await.unwrap(), Outcome::Retry);
        assert_eq!(merchants(&store, "m2").await, 0);
    }

    /// A writer of the locked row waits for the lock's commit: here it gives up at
    /// its own `lock_timeout` while the lock's transaction is open, and
    /// succeeds once it committed.
    #[tokio::test]
    async fn a_locked_row_refuses_writers_until_the_lock_commits() {
        let (_pg, store) = postgres().await;
        insert_merchant(&store, "m1").await;
        let mut tx = store.writer.begin().await.unwrap();
        let mut batch = Batch::default();
        batch.push(lock("m1", "m"));
        batch.push(new_merchant("m2"));
        let held = batch.run(&mut tx, Backend::Postgres).await.unwrap();
        assert_eq!(held, Outcome::Done(vec![]));
        let mut writer = store.writer.acquire().await.unwrap();
        sqlx::query("SET lock_timeout = '100ms'")
            .execute(&mut *writer)
            .await
            .unwrap();
        let rename = "UPDATE merchants SET name = 'renamed' WHERE id = 'm1'";
        let refused = sqlx::query(rename).execute(&mut *writer).await;
        let code = refused
            .expect_err("the row is locked")
            .as_database_error()
            .and_then(|e| e.code().map(|c| c.into_owned()));
        assert_eq!(code.as_deref(), Some("55P03"), "lock_not_available");
        tx.commit().await.unwrap();
        sqlx::query(rename).execute(&mut *writer).await.unwrap();
    }

    /// A writer that came first: the lock waits for it, then reads the row's
    /// latest version, which no longer matches, as a compare-and-set would.
    #[tokio::test]
    async fn a_lock_behind_an_uncommitted_writer_waits_and_then_misses() {
        let (_pg, store) = postgres().await;
        insert_merchant(&store, "m1").await;
        let mut first = store.writer.begin().await.unwrap();
        sqlx::query("UPDATE merchants SET name = 'moved' WHERE id = 'm1'")
            .execute(&mut *first)
            .await
            .unwrap();
        let locking = {
            let store = store.clone();
            tokio::spawn(async move {
                let mut batch = Batch::default();
                batch.push(lock("m1", "m"));
                batch.push(new_merchant("m2"));
                alone(&store, &batch).await
            })
        };
        let waiting = "SELECT COUNT(*) FROM pg_stat_activity \
                       WHERE wait_event_type = 'Lock' AND datname = current_database()";
        sluice_test_support::eventually(
            std::time::Duration::from_secs(10),
            "the lock waits",
            || async {
                let n: i64 = sqlx::query_scalar(waiting)
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                (n == 1).then_some(())
            },
        )
        .await;
        first.commit().await.unwrap();
        assert_eq!(locking.await.unwrap().unwrap(), Outcome::Retry);
        assert_eq!(merchants(&store, "m2").await, 0);
    }

    /// A migrated SQLite store in a directory of its own.
    async fn sqlite() -> (tempfile::TempDir, crate::Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/batch.db", dir.path().display());
        let store = crate::Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        (dir, store)
    }

    /// `batch` in a write transaction of `store`, committed only when it held.
    async fn in_tx(store: &crate::Store, batch: &Batch) -> Result<Outcome, StoreError> {
        let mut tx = store.begin_write().await.unwrap();
        let outcome = batch.run(&mut tx, store.backend).await;
        if matches!(outcome, Ok(Outcome::Done(_))) {
            tx.commit().await.unwrap();
        }
        outcome
    }

    fn numbered(v: &str) -> Write {
        Write {
            sql: "INSERT INTO numbered (v) VALUES ($1), ($2)".into(),
            binds: vec![
                format!("{v}.1").as_str().into(),
                format!("{v}.2").as_str().into(),
            ],
            expect: Expect::Ids(2),
        }
    }

    #[tokio::test]
    async fn a_script_on_sqlite_runs_each_write_with_its_own_parameters_and_returns_ids_in_order() {
        let (_dir, store) = sqlite().await;
        sqlx::query("CREATE TABLE numbered (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .execute(&store.writer)
            .await
            .unwrap();
        let mut batch = Batch::default();
        batch.push(new_merchant("m1"));
        batch.push(numbered("a"));
        // The same row twice: each statement sees the one before.
        batch.push(rename("m1", Expect::OneRow));
        batch.push(numbered("b"));
        batch.push(new_merchant("m2"));
        assert_eq!(
            in_tx(&store, &batch).await.unwrap(),
            Outcome::Done(vec![1, 2, 3, 4])
        );
        let rows: Vec<(i64, String)> = sqlx::query_as("SELECT id, v FROM numbered ORDER BY id")
            .fetch_all(&store.writer)
            .await
            .unwrap();
        let values: Vec<&str> = rows.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(
            values,
            ["a.1", "a.2", "b.1", "b.2"],
            "each write its own binds"
        );
        let renamed: String = sqlx::query_scalar("SELECT name FROM merchants WHERE id = 'm1'")
            .fetch_one(&store.writer)
            .await
            .unwrap();
        assert_eq!(renamed, "renamed");
        assert_eq!(merchants(&store, "m2").await, 1);
    }

    #[tokio::test]
    async fn a_script_whose_compare_and_set_misses_on_sqlite_is_retried_and_writes_nothing() {
        let (_dir, store) = sqlite().await;
        let mut batch = Batch::default();
        batch.push(new_merchant("m1"));
        batch.push(rename("nobody", Expect::OneRow));
        batch.push(new_merchant("m2"));
        assert_eq!(in_tx(&store, &batch).await.unwrap(), Outcome::Retry);
        assert_eq!(
            merchants(&store, "m1").await + merchants(&store, "m2").await,
            0
        );
    }

    /// One by one, the first write that did not hold ends the batch before a
    /// later write could fail; the script runs that later write too, and must
    /// still answer with the first one's outcome, not the later one's error.
    #[tokio::test]
    async fn a_script_on_sqlite_answers_for_the_first_write_that_did_not_hold_not_a_later_error() {
        let (_dir, store) = sqlite().await;
        let mut amount_then_error = Batch::default();
        amount_then_error.push(rename("nobody", Expect::Amount("too much".into())));
        amount_then_error.push(new_merchant("m1"));
        amount_then_error.push(new_merchant("m1"));
        let refused = in_tx(&store, &amount_then_error).await;
        assert!(
            matches!(&refused, Err(StoreError::AmountInvariant(m)) if m == "too much"),
            "{refused:?}"
        );
        let mut miss_then_error = Batch::default();
        miss_then_error.push(rename("nobody", Expect::OneRow));
        miss_then_error.push(new_merchant("m1"));
        miss_then_error.push(new_merchant("m1"));
        assert_eq!(
            in_tx(&store, &miss_then_error).await.unwrap(),
            Outcome::Retry
        );
        let mut held_then_error = Batch::default();
        held_then_error.push(new_merchant("m1"));
        held_then_error.push(new_merchant("m1"));
        let failed = in_tx(&store, &held_then_error).await;
        assert!(
            matches!(&failed, Err(e) if e.is_unique_violation()),
            "the later write's own error when every write before it held: {failed:?}"
        );
        assert_eq!(merchants(&store, "m1").await, 0);
    }

    #[test]
    fn the_first_write_that_does_not_hold_decides_the_outcome() {
        let cas = Write {
            sql: String::new(),
            binds: vec![],
            expect: Expect::OneRow,
        };
        let amount = Write {
            expect: Expect::Amount("too much".into()),
            ..cas.clone()
        };
        assert_eq!(check(&cas, 1).unwrap(), None);
        assert_eq!(check(&cas, 0).unwrap(), Some(Outcome::Retry));
        assert!(
            matches!(check(&amount, 0), Err(StoreError::AmountInvariant(m)) if m == "too much")
        );
        let ids = Write {
            expect: Expect::Ids(3),
            ..cas
        };
        assert!(check(&ids, 2).is_err());
        assert_eq!(check(&ids, 3).unwrap(), None);
    }
}
