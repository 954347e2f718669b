//! Test harness: every store test body runs against SQLite (a temp file) and
//! PostgreSQL (a fresh database per test). PostgreSQL being unreachable is a
//! test failure, never a skip.

use sluice_core::{
    CaptureMode, Currency, EventKind, EvidenceSource, Failure, FailureCategory, Money, PaymentEvent,
};
use sluice_store::{
    ApplyEvent, Backend, Clock, ConnectorAccount, EventTarget, ManualClock, Merchant, NewAttempt,
    NewConnectorAccount, NewPayment, PaymentAttempt, PaymentOrder, Provenance, Store, StoreOptions,
    SystemClock,
};
use std::sync::Arc;

pub use sluice_store::Clock as _;
use sqlx::Connection;

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A migrated store on a throwaway database, dropped afterwards.
pub struct TestDb {
    pub store: Store,
    pub backend: Backend,
    /// The store's clock: starts at the wall clock, moves only when told.
    pub clock: ManualClock,
    _sqlite_dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

/// Run one async test body against both backends (two `#[tokio::test]`s).
#[macro_export]
macro_rules! dual_test {
    ($(#[$meta:meta])* async fn $name:ident($db:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($db: &$crate::common::TestDb) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_sqlite() {
                let db = $crate::common::TestDb::sqlite().await;
                run(&db).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_postgres() {
                let db = $crate::common::TestDb::postgres().await;
                run(&db).await;
            }
        }
    };
}

impl TestDb {
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/sluice.db", dir.path().display());
        let clock = ManualClock::new(SystemClock.now_ms());
        let store = Store::connect_with(&url, options(&clock))
            .await
            .expect("open SQLite store");
        store.migrate().await.expect("migrate SQLite");
        TestDb {
            store,
            backend: Backend::Sqlite,
            clock,
            _sqlite_dir: Some(dir),
            pg: None,
        }
    }

    pub async fn postgres() -> TestDb {
        sqlx::any::install_default_drivers();
        let admin_url =
            std::env::var("SLUICE_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
        let mut admin = sqlx::AnyConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is required by the store tests and is unreachable at {admin_url}: {e}. \
                     Start PostgreSQL or point SLUICE_TEST_DATABASE_URL at one."
                )
            });
        let name = format!("sluice_test_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create test database");
        admin.close().await.ok();
        let url = database_url(&admin_url, &name);
        let clock = ManualClock::new(SystemClock.now_ms());
        let store = Store::connect_with(&url, options(&clock))
            .await
            .expect("open PostgreSQL store");
        store.migrate().await.expect("migrate PostgreSQL");
        TestDb {
            store,
            backend: Backend::Postgres,
            clock,
            _sqlite_dir: None,
            pg: Some((admin_url, name)),
        }
    }

    /// A second, independent store on the same database (another "instance").
    pub async fn second_store(&self) -> Store {
        self.store_with(options(&self.clock)).await
    }

    /// Another store on the same database, opened with `options` (e.g. another
    /// master key).
    pub async fn store_with(&self, options: StoreOptions) -> Store {
        let url = match &self.pg {
            Some((admin_url, name)) => database_url(admin_url, name),
            None => {
                let dir = self._sqlite_dir.as_ref().expect("sqlite dir");
                format!("sqlite://{}/sluice.db", dir.path().display())
            }
        };
        Store::connect_with(&url, options)
            .await
            .expect("another store on the test database")
    }

    /// Store options on this database's clock with `secret_box`.
    pub fn options_with_box(&self, secret_box: Arc<dyn sluice_store::SecretBox>) -> StoreOptions {
        StoreOptions {
            secret_box,
            ..options(&self.clock)
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((admin_url, name)) = self.pg.take() else {
            return;
        };
        // Async drop does not exist: drop the database from a helper thread
        // with its own runtime. FORCE ends the pool's open connections.
        let dropper = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(mut admin) = sqlx::AnyConnection::connect(&admin_url).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut admin)
                        .await;
                }
            });
        });
        let _ = dropper.join();
    }
}

fn options(clock: &ManualClock) -> StoreOptions {
    StoreOptions {
        clock: Arc::new(clock.clone()),
        ..StoreOptions::default()
    }
}

fn database_url(admin_url: &str, name: &str) -> String {
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

pub fn eur(amount_minor: i64) -> Money {
    Money {
        amount_minor,
        currency: Currency::parse("EUR").expect("EUR"),
    }
}

pub fn sys() -> Provenance {
    Provenance::actor("system:test").with_trace("trace-test")
}

pub fn adapter_provenance() -> Provenance {
    Provenance::adapter("sandbox", "0.1.0", "sha256:abc").with_trace("trace-webhook")
}

/// A merchant with one connector account on adapter `sandbox`.
pub struct Fixture {
    pub merchant: Merchant,
    pub account: ConnectorAccount,
}

impl Fixture {
    pub async fn new(store: &Store) -> Fixture {
        let merchant = store.create_merchant("Acme").await.expect("merchant");
        let account = store
            .create_connector_account(&NewConnectorAccount {
                merchant_id: merchant.id.clone(),
                adapter: "sandbox".into(),
                label: "main".into(),
                config: serde_json::json!({"base_url": "http://127.0.0.1:9"}),
                secrets: serde_json::json!({"api_key": "sk_test_secret"}),
            })
            .await
            .expect("connector account");
        Fixture { merchant, account }
    }

    /// The tenant boundary of events that come through this fixture's account.
    pub fn scope(&self) -> sluice_store::AccountScope {
        sluice_store::AccountScope::new(&self.account.id, "sandbox")
    }

    pub async fn payment(
        &self,
        store: &Store,
        order_no: &str,
        amount: i64,
        mode: CaptureMode,
    ) -> PaymentOrder {
        store
            .create_payment(
                &NewPayment {
                    merchant_id: self.merchant.id.clone(),
                    merchant_order_no: order_no.into(),
                    amount: eur(amount),
                    capture_mode: mode,
                    payment_method_token: Some("pm_card_visa".into()),
                    return_url: None,
                    description: None,
                    metadata: serde_json::json!({}),
                    fulfillment: Default::default(),
                },
                &sys(),
            )
            .await
            .expect("payment")
    }

    pub async fn attempt(&self, store: &Store, payment: &PaymentOrder) -> PaymentAttempt {
        store
            .create_attempt(
                &NewAttempt {
                    payment_id: payment.id.clone(),
                    connector_account_id: self.account.id.clone(),
                    ..NewAttempt::default()
                },
                &sys(),
            )
            .await
            .expect("attempt")
    }

    /// A payment with one attempt, already submitted to the PSP.
    pub async fn submitted(
        &self,
        store: &Store,
        order_no: &str,
        amount: i64,
        mode: CaptureMode,
    ) -> (PaymentOrder, PaymentAttempt) {
        let payment = self.payment(store, order_no, amount, mode).await;
        let attempt = self.attempt(store, &payment).await;
        store
            .apply_event(&on_attempt(
                &attempt,
                event(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse),
            ))
            .await
            .expect("submitted");
        (payment, attempt)
    }

    /// A succeeded automatic-capture payment of `amount` (captured = amount).
    pub async fn succeeded(
        &self,
        store: &Store,
        order_no: &str,
        amount: i64,
    ) -> (PaymentOrder, PaymentAttempt) {
        let (payment, attempt) = self
            .submitted(store, order_no, amount, CaptureMode::Automatic)
            .await;
        let mut ev = event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse);
        ev.psp_reference = Some(format!("pi_{order_no}"));
        store
            .apply_event(&on_attempt(&attempt, ev))
            .await
            .expect("succeeded");
        (payment, attempt)
    }
}

pub fn event(kind: EventKind, evidence: EvidenceSource) -> PaymentEvent {
    let mut ev = PaymentEvent::new(kind, evidence);
    ev.raw_status = kind.as_str().to_lowercase();
    ev
}

pub fn declined(evidence: EvidenceSource) -> PaymentEvent {
    let mut ev = event(EventKind::PaymentFailed, evidence);
    ev.failure = Some(Failure {
        category: FailureCategory::Declined,
        code: "card_declined".into(),
        message: "Your card was declined.".into(),
    });
    ev
}

pub fn on_attempt(attempt: &PaymentAttempt, event: PaymentEvent) -> ApplyEvent {
    ApplyEvent {
        target: EventTarget::Attempt(attempt.reference.clone()),
        event,
        provenance: adapter_provenance(),
        inbox_id: None,
        next_retry_time: None,
    }
}

pub fn on_refund(reference: &str, event: PaymentEvent) -> ApplyEvent {
    ApplyEvent {
        target: EventTarget::Refund(reference.to_owned()),
        event,
        provenance: adapter_provenance(),
        inbox_id: None,
        next_retry_time: None,
    }
}

pub fn on_capture(reference: &str, event: PaymentEvent) -> ApplyEvent {
    ApplyEvent {
        target: EventTarget::Capture(reference.to_owned()),
        event,
        provenance: adapter_provenance(),
        inbox_id: None,
        next_retry_time: None,
    }
}

/// Count rows with a raw query (tests only read raw; they never write state raw
/// except to prove the database refuses it).
pub async fn count(store: &Store, sql: &str, arg: &str) -> i64 {
    use sqlx::Row;
    let row = sqlx::query(sql)
        .bind(arg)
        .fetch_one(store.pool())
        .await
        .expect("count query");
    row.try_get::<i64, _>(0).expect("count")
}
