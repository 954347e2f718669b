//! A migrated store on a throwaway database, on either backend.

use std::sync::Arc;

use sluice_store::{Backend, ManualClock, Store, StoreOptions};
use sqlx::Connection;

use crate::clock::TestClock;

/// Where PostgreSQL is when `SLUICE_TEST_DATABASE_URL` does not say.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A migrated store on a throwaway database, dropped afterwards: a SQLite file
/// in a temp directory, or a fresh PostgreSQL database.
pub struct TestDb<C: TestClock = ManualClock> {
    pub store: Store,
    pub backend: Backend,
    /// The store's clock (hand it to whatever else must share the store's time).
    pub clock: C,
    /// The database's URL, for another instance on the same data.
    pub url: String,
    /// The options the store was opened with (`clock` is [`TestDb::clock`]).
    base: StoreOptions,
    _sqlite_dir: Option<tempfile::TempDir>,
    _pg: Option<PgDatabase>,
}

impl<C: TestClock> TestDb<C> {
    /// A store with default options on `backend`.
    pub async fn open(backend: Backend) -> Self {
        Self::open_with(backend, StoreOptions::default()).await
    }

    /// A store on `backend` opened with `base` and a fresh clock of type `C`.
    pub async fn open_with(backend: Backend, base: StoreOptions) -> Self {
        crate::init_tracing();
        let clock = C::start();
        let base = StoreOptions {
            clock: Arc::new(clock.clone()),
            ..base
        };
        let (url, sqlite_dir, pg) = match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}/sluice.db", dir.path().display());
                (url, Some(dir), None)
            }
            Backend::Postgres => {
                let pg = PgDatabase::create().await;
                (pg.url.clone(), None, Some(pg))
            }
        };
        let store = Store::connect_with(&url, base.clone())
            .await
            .unwrap_or_else(|e| panic!("open the {backend:?} test store: {e}"));
        store.migrate().await.expect("migrate the test database");
        TestDb {
            store,
            backend,
            clock,
            url,
            base,
            _sqlite_dir: sqlite_dir,
            _pg: pg,
        }
    }

    /// The options the store was opened with, on this database's clock.
    pub fn options(&self) -> StoreOptions {
        self.base.clone()
    }

    /// A second, independent store on the same database (another instance).
    pub async fn second_store(&self) -> Store {
        self.store_with(self.options()).await
    }

    /// Another store on the same database, opened with `options` (e.g. another
    /// master key).
    pub async fn store_with(&self, options: StoreOptions) -> Store {
        Store::connect_with(&self.url, options)
            .await
            .expect("another store on the test database")
    }

    /// Store options on this database's clock with `secret_box`.
    pub fn options_with_box(&self, secret_box: Arc<dyn sluice_store::SecretBox>) -> StoreOptions {
        StoreOptions {
            secret_box,
            ..self.options()
        }
    }
}

/// The PostgreSQL server the tests (and the simulator's `--store postgres`)
/// make their databases on: `SLUICE_TEST_DATABASE_URL`, else [`DEFAULT_PG_URL`].
pub fn server_url() -> String {
    std::env::var("SLUICE_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into())
}

/// A PostgreSQL database made for one test (on `SLUICE_TEST_DATABASE_URL`) and
/// dropped with it, for tests that hand a database to a process of their own.
pub struct PgDatabase {
    admin_url: String,
    name: String,
    /// The new database's URL.
    pub url: String,
    dropped: bool,
}

impl PgDatabase {
    pub async fn create() -> PgDatabase {
        let admin_url = server_url();
        let name = format!("sluice_test_{}", uuid::Uuid::new_v4().simple());
        PgDatabase::create_on(&admin_url, &name, None)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is required by the tests and is unreachable at {admin_url}, \
                     or refused to make a database there: {e}. \
                     Start PostgreSQL or point SLUICE_TEST_DATABASE_URL at one."
                )
            })
    }

    /// The database `name` on the server at `admin_url` (a URL of any database
    /// there), empty or, with `template`, a copy of that database (nobody may
    /// be connected to it meanwhile). Dropped with the value unless kept.
    pub async fn create_on(
        admin_url: &str,
        name: &str,
        template: Option<&str>,
    ) -> Result<PgDatabase, sqlx::Error> {
        sqlx::any::install_default_drivers();
        let mut admin = sqlx::AnyConnection::connect(admin_url).await?;
        let sql = match template {
            Some(template) => format!("CREATE DATABASE {name} TEMPLATE {template}"),
            None => format!("CREATE DATABASE {name}"),
        };
        let created = sqlx::query(&sql).execute(&mut admin).await;
        admin.close().await.ok();
        created?;
        Ok(PgDatabase {
            admin_url: admin_url.to_owned(),
            name: name.to_owned(),
            url: database_url(admin_url, name),
            dropped: false,
        })
    }

    /// The database's name on its server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Drops the database now, disconnecting whoever uses it.
    pub async fn drop_now(mut self) {
        drop_database(&self.admin_url, &self.name).await;
        self.dropped = true;
    }

    /// Leaves the database on the server (to inspect it); returns its name.
    pub fn keep(mut self) -> String {
        self.dropped = true;
        std::mem::take(&mut self.name)
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        // Async drop does not exist, and Drop runs inside the test's runtime:
        // drop the database from a helper thread with its own runtime.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(drop_database(&admin_url, &name));
            }
        })
        .join();
    }
}

/// FORCE ends the open connections of whoever still uses the database.
/// Best effort: a database left behind is a leak, not a failure.
pub async fn drop_database(admin_url: &str, name: &str) {
    sqlx::any::install_default_drivers();
    if let Ok(mut admin) = sqlx::AnyConnection::connect(admin_url).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await;
        admin.close().await.ok();
    }
}

/// `admin_url` with its database name replaced by `name` (query string kept).
pub fn database_url(admin_url: &str, name: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (admin_url, None),
    };
    let prefix = match base.rsplit_once('/') {
        Some((prefix, _)) if prefix.contains("://") && prefix.len() > "postgres://".len() => prefix,
        _ => base,
    };
    match query {
        Some(q) => format!("{prefix}/{name}?{q}"),
        None => format!("{prefix}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn the_database_name_is_replaced_and_the_query_string_kept() {
        assert_eq!(
            database_url("postgres://u@h:5432/postgres?sslmode=disable", "t1"),
            "postgres://u@h:5432/t1?sslmode=disable"
        );
        assert_eq!(
            database_url("postgres://u@h:5432", "t1"),
            "postgres://u@h:5432/t1"
        );
    }
}
