//! Each seed's database, on either store: a fresh copy of one migrated
//! template, made before the seed and removed after it.
//!
//! - **SQLite** (the default): the template is a file in memory-backed
//!   temporary storage, migrated once per simulator; a seed gets a copy of
//!   the file.
//! - **PostgreSQL** (`--store postgres`): the template is a database migrated
//!   once per simulator, and a seed gets `CREATE DATABASE … TEMPLATE` of it,
//!   dropped after the seed (or kept, [`KeepDb`]). Names carry the process id
//!   and a per-process simulator number, so parallel jobs and concurrent
//!   simulator processes never meet; a new simulator drops what dead
//!   simulator processes left behind. The databases are made through the
//!   test-support crate's [`PgDatabase`], as every PostgreSQL test makes
//!   its own.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_store::{Store, StoreOptions};
use sluice_test_support::db::{drop_database, PgDatabase};
use sqlx::Connection;

use crate::SimError;

/// Which store the gateway of every seed runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StoreKind {
    /// A SQLite file per seed (the default).
    #[default]
    Sqlite,
    /// A PostgreSQL database per seed on the server at `server_url` (a URL of
    /// any database there, e.g. `postgres://postgres@127.0.0.1:5432/postgres`).
    Postgres { server_url: String },
}

impl StoreKind {
    pub fn label(&self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres { .. } => "postgres",
        }
    }
}

/// Whether a seed's database outlives the seed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeepDb {
    /// Every seed's database is removed after it.
    #[default]
    No,
    /// SQLite: a copy of each seed's database (and its WAL) at this path;
    /// meant for replaying one seed.
    CopyTo(PathBuf),
    /// PostgreSQL: a failing seed's database stays on the server under the
    /// name its report gives (`SeedReport::kept_db`); with `always`, a
    /// passing seed's too (replaying one seed).
    OnServer { always: bool },
}

/// Databases of simulators made by this process so far (a part of each name).
static SIMULATORS: AtomicU64 = AtomicU64::new(0);

/// The prefix of every database the simulator makes on PostgreSQL.
const PG_PREFIX: &str = "sluice_sim_";

/// What a simulator keeps across seeds: the migrated template.
pub(crate) enum Template {
    Sqlite {
        dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres {
        server_url: String,
        /// `sluice_sim_<pid>_<simulator>`: this simulator's databases.
        prefix: String,
        db: PgDatabase,
        /// Seeds run so far: a seed run twice gets two databases.
        runs: AtomicU64,
        dropper: Dropper,
    },
}

/// One seed's database.
pub(crate) enum SeedDb {
    Sqlite { path: PathBuf },
    Postgres { db: PgDatabase },
}

impl Template {
    /// Migrates the template of `kind` (on PostgreSQL, after dropping what
    /// dead simulator processes left).
    pub(crate) async fn make(kind: &StoreKind) -> Result<Template, SimError> {
        match kind {
            StoreKind::Sqlite => {
                let dir = tempfile::Builder::new()
                    .prefix("sluice-sim")
                    .tempdir_in(tmp_root())?;
                let path = dir.path().join("template.db");
                migrate_sqlite_template(&path).await?;
                Ok(Template::Sqlite { dir, path })
            }
            StoreKind::Postgres { server_url } => {
                drop_stale(server_url).await?;
                let serial = SIMULATORS.fetch_add(1, Ordering::SeqCst);
                let prefix = format!("{PG_PREFIX}{}_{serial}", std::process::id());
                let name = format!("{prefix}_template");
                let db = PgDatabase::create_on(server_url, &name, None).await?;
                let url = without_commit_flush(&db.url);
                let store = Store::connect_with(&url, one_connection()).await?;
                store.migrate().await?;
                // Nobody may be connected to a template while it is copied.
                store.close().await;
                Ok(Template::Postgres {
                    server_url: server_url.clone(),
                    prefix,
                    db,
                    runs: AtomicU64::new(0),
                    dropper: Dropper::start()?,
                })
            }
        }
    }

    /// Whether a seed's runtime needs an I/O driver (PostgreSQL is a socket;
    /// SQLite's connections are threads of this process).
    pub(crate) fn needs_io(&self) -> bool {
        matches!(self, Template::Postgres { .. })
    }

    /// A fresh copy of the template for `seed`.
    pub(crate) async fn seed_db(&self, seed: u64) -> Result<SeedDb, SimError> {
        match self {
            Template::Sqlite { dir, path } => {
                let copy = dir.path().join(format!("seed-{seed}.db"));
                std::fs::copy(path, &copy)?;
                Ok(SeedDb::Sqlite { path: copy })
            }
            Template::Postgres {
                server_url,
                prefix,
                db,
                runs,
                ..
            } => {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                let name = format!("{prefix}_s{seed}_{run}");
                let started = std::time::Instant::now();
                let copy = PgDatabase::create_on(server_url, &name, Some(db.name())).await?;
                tracing::debug!(
                    target: "sluice_sim::seed_db",
                    "seed {seed}: {name} made in {} ms",
                    started.elapsed().as_millis()
                );
                Ok(SeedDb::Postgres { db: copy })
            }
        }
    }
}

impl SeedDb {
    /// The URL the seed's gateway instances open.
    pub(crate) fn url(&self) -> String {
        match self {
            SeedDb::Sqlite { path } => format!("sqlite://{}", path.display()),
            SeedDb::Postgres { db } => without_commit_flush(&db.url),
        }
    }
}

impl Template {
    /// After the seed: its database removed, or kept as `keep` says; returns
    /// where a kept database is (a path, or a database's name on the server).
    pub(crate) async fn finish(
        &self,
        db: SeedDb,
        seed: u64,
        passed: bool,
        keep: &KeepDb,
    ) -> Result<Option<String>, SimError> {
        let db = match (db, self) {
            (SeedDb::Sqlite { path }, _) => return finish_sqlite(&path, keep),
            (SeedDb::Postgres { db }, _) => db,
        };
        if let KeepDb::OnServer { always } = keep {
            if *always || !passed {
                let url = db.url.clone();
                let name = db.keep();
                mark_kept(&url, &name, seed).await?;
                return Ok(Some(name));
            }
        }
        match self {
            Template::Postgres { dropper, .. } => dropper.drop_later(db),
            // Never so: a seed's database is made from its simulator's template.
            Template::Sqlite { .. } => db.drop_now().await,
        }
        Ok(None)
    }
}

fn finish_sqlite(path: &Path, keep: &KeepDb) -> Result<Option<String>, SimError> {
    let mut kept = None;
    if let KeepDb::CopyTo(to) = keep {
        copy_sqlite(path, to)?;
        kept = Some(to.display().to_string());
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(kept)
}

/// Drops the finished seeds' databases on a thread of its own, in batches.
/// PostgreSQL's `DROP DATABASE` asks for a checkpoint and waits for it,
/// which writes out every page the seeds since the last one dirtied (a new
/// database alone is some 9 MB): 0.1 to 1 s a drop, longer than many seeds
/// take. Drops in flight together share a checkpoint (20 dropped one by
/// one took 4.5 s, all at once 1.5 s), so a batch is dropped at once, while
/// the seeds' jobs go on. Dropping the dropper waits for every drop it was
/// given.
pub(crate) struct Dropper {
    queue: Option<tokio::sync::mpsc::UnboundedSender<PgDatabase>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Databases dropped together (connections to the server at once, besides
/// the seeds' own: well below PostgreSQL's default 100).
const DROP_BATCH: usize = 16;

impl Dropper {
    fn start() -> Result<Dropper, SimError> {
        let (queue, rx) = tokio::sync::mpsc::unbounded_channel::<PgDatabase>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("sim-db-dropper".into())
            .spawn(move || runtime.block_on(drop_in_batches(rx)))?;
        Ok(Dropper {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    fn drop_later(&self, db: PgDatabase) {
        if let Some(queue) = &self.queue {
            // Refused only when the dropper's thread is gone; the database
            // then drops itself where it is (`PgDatabase`'s `Drop`).
            let _ = queue.send(db);
        }
    }
}

/// Until the queue closes: waits for a batch (or what is left at the end)
/// and drops it, all at once.
async fn drop_in_batches(mut rx: tokio::sync::mpsc::UnboundedReceiver<PgDatabase>) {
    let mut batch = Vec::with_capacity(DROP_BATCH);
    loop {
        let room = DROP_BATCH - batch.len();
        let open = rx.recv_many(&mut batch, room).await > 0;
        if batch.len() < DROP_BATCH && open {
            continue;
        }
        let started = std::time::Instant::now();
        let dropped = batch.len();
        let mut drops = tokio::task::JoinSet::new();
        for db in batch.drain(..) {
            drops.spawn(db.drop_now());
        }
        while drops.join_next().await.is_some() {}
        tracing::debug!(
            target: "sluice_sim::seed_db",
            "{dropped} databases dropped in {} ms",
            started.elapsed().as_millis()
        );
        if !open {
            return;
        }
    }
}

impl Drop for Dropper {
    fn drop(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Commits do not wait for the WAL to reach the disk (`synchronous_commit =
/// off`): the simulator kills the gateway, never the server, so what a seed
/// sees is the same, as with the SQLite mode's `synchronous = NORMAL` in
/// memory-backed storage; only the wait for the disk goes.
fn without_commit_flush(url: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20synchronous_commit%3Doff")
}

/// A kept database says so, and stale-database clean-up leaves it alone.
async fn mark_kept(url: &str, name: &str, seed: u64) -> Result<(), SimError> {
    let mut conn = sqlx::AnyConnection::connect(url).await?;
    sqlx::query(&format!(
        "COMMENT ON DATABASE {name} IS 'kept by sluice-sim: seed {seed}'"
    ))
    .execute(&mut conn)
    .await?;
    conn.close().await?;
    Ok(())
}

/// Drops the simulator databases of processes that are gone (a run that was
/// interrupted), except kept ones. Where this process cannot tell whether a
/// process lives (no `/proc`), it drops nothing.
async fn drop_stale(server_url: &str) -> Result<(), SimError> {
    if !Path::new("/proc/self").exists() {
        return Ok(());
    }
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(server_url).await?;
    let names: Vec<(String,)> = sqlx::query_as(
        "SELECT datname::text FROM pg_database \
         WHERE starts_with(datname::text, $1) \
           AND shobj_description(oid, 'pg_database') IS NULL \
         ORDER BY datname",
    )
    .bind(PG_PREFIX)
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    for (name,) in names {
        if owner_is_gone(&name) {
            drop_database(server_url, &name).await;
        }
    }
    Ok(())
}

/// Whether the process whose id a simulator database's name carries is gone.
fn owner_is_gone(name: &str) -> bool {
    let pid = name
        .strip_prefix(PG_PREFIX)
        .and_then(|rest| rest.split('_').next())
        .and_then(|pid| pid.parse::<u32>().ok());
    match pid {
        Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
        None => false,
    }
}

fn one_connection() -> StoreOptions {
    StoreOptions {
        max_connections: 1,
        ..StoreOptions::default()
    }
}

fn copy_sqlite(path: &Path, to: &Path) -> Result<(), SimError> {
    // The WAL holds the latest pages: keep it beside the file.
    std::fs::copy(path, to)?;
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    if wal.exists() {
        std::fs::copy(&wal, format!("{}-wal", to.display()))?;
    }
    Ok(())
}

/// Where SQLite seed databases live: memory-backed when the machine has it.
fn tmp_root() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

async fn migrate_sqlite_template(path: &Path) -> Result<(), SimError> {
    // One connection: a checkpoint waits for every other reader.
    let store =
        Store::connect_with(&format!("sqlite://{}", path.display()), one_connection()).await?;
    store.migrate().await?;
    // Fold the WAL into the file so a plain copy carries the whole schema.
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(store.pool())
        .await?;
    store.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_is_stale_only_when_the_process_its_name_carries_is_gone() {
        let mine = format!("{PG_PREFIX}{}_0_s7_0", std::process::id());
        assert!(!owner_is_gone(&mine));
        assert!(owner_is_gone(&format!("{PG_PREFIX}4294967295_0_template")));
        assert!(!owner_is_gone(&format!("{PG_PREFIX}x_0_template")));
    }

    #[test]
    fn the_seed_url_turns_off_the_commit_flush_and_keeps_the_query() {
        assert_eq!(
            without_commit_flush("postgres://p@h/db"),
            "postgres://p@h/db?options=-c%20synchronous_commit%3Doff"
        );
        assert_eq!(
            without_commit_flush("postgres://p@h/db?sslmode=disable"),
            "postgres://p@h/db?sslmode=disable&options=-c%20synchronous_commit%3Doff"
        );
    }
}
