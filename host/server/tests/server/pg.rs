//! Throw-away PostgreSQL databases on the test server (SLUICE_TEST_DATABASE_URL).

use sqlx::Connection;

const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub struct TestDatabase {
    admin_url: String,
    name: String,
    pub url: String,
    dropped: bool,
}

impl TestDatabase {
    pub async fn create() -> TestDatabase {
        sqlx::any::install_default_drivers();
        let admin_url =
            std::env::var("SLUICE_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
        let mut admin = sqlx::AnyConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is required by these tests and is unreachable at {admin_url}: {e}. \
                     Start PostgreSQL or point SLUICE_TEST_DATABASE_URL at one."
                )
            });
        let name = format!("sluice_server_test_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create test database");
        admin.close().await.ok();
        let url = with_database(&admin_url, &name);
        TestDatabase {
            admin_url,
            name,
            url,
            dropped: false,
        }
    }

    /// Drops the database now, disconnecting whoever uses it.
    pub async fn drop_now(mut self) {
        drop_database(&self.admin_url, &self.name).await;
        self.dropped = true;
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        // Drop runs inside the test's runtime; clean up from a thread with its own.
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

async fn drop_database(admin_url: &str, name: &str) {
    if let Ok(mut admin) = sqlx::AnyConnection::connect(admin_url).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await;
        admin.close().await.ok();
    }
}

/// `admin_url` with its database path replaced by `name`.
fn with_database(admin_url: &str, name: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (admin_url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}
