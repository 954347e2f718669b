//! Secrets at rest over real HTTP (issue 11 §5): a gateway on the real Stripe-format
//! adapter, a connector account whose webhook secret is rolled through the admin API.
//! A webhook signed with the old secret verifies inside the rotation window and is
//! refused after it; bad rotation requests get a JSON 4xx and change nothing; the
//! database never holds a secret in clear, and each verified body is kept sealed.

use reqwest::Method;
use serde_json::{json, Value};
use sluice_sandbox_psp::{stripe_signature_header, DEFAULT_STRIPE_API_KEY};
use sluice_server::server::RunningServer;
use sluice_store::{LocalSecretBox, MasterKey, Store, StoreOptions};
use sqlx::Row;
use std::sync::Arc;

use crate::common::{self, ADMIN_TOKEN, TEST_MASTER_KEY};
use crate::pg::TestDatabase;
use crate::system::{call_ok, real_adapters};

const OLD_SECRET: &str = "whsec_rotation_old_0123456789";
const NEW_SECRET: &str = "whsec_rotation_new_9876543210";

struct Gateway {
    server: RunningServer,
    http: reqwest::Client,
    merchant: String,
    account: String,
    _data: tempfile::TempDir,
    _adapters: tempfile::TempDir,
    _pg: Option<TestDatabase>,
}

impl Gateway {
    async fn start(pg: Option<TestDatabase>) -> Gateway {
        let data = tempfile::tempdir().expect("data dir");
        let adapters = real_adapters();
        let mut config = common::config(data.path(), Some(adapters.path().to_path_buf()));
        if let Some(pg) = &pg {
            config.database_url = sluice_server::config::Secret::new(pg.url.clone());
        }
        // The window is ended below by another writer on the database, which a
        // gateway sees after its account cache's time; this one reads every time.
        config.database.account_cache_ttl_ms = Some(0);
        let server = common::start(&config).await;
        let http = reqwest::Client::new();
        let url = format!("{}/admin/merchants", server.url());
        let merchant = call_ok(
            &http,
            Method::POST,
            &url,
            ADMIN_TOKEN,
            Some(json!({"name": "R"})),
        );
        let merchant = merchant.await["id"].as_str().expect("id").to_owned();
        let account = call_ok(
            &http,
            Method::POST,
            &format!("{url}/{merchant}/connector_accounts"),
            ADMIN_TOKEN,
            Some(json!({"adapter": "stripe", "label": "main",
                "config": {"base_url": "http://127.0.0.1:9"},
                "secrets": {"api_key": DEFAULT_STRIPE_API_KEY, "webhook_secret": OLD_SECRET}})),
        )
        .await;
        Gateway {
            account: account["id"].as_str().expect("id").to_owned(),
            merchant,
            server,
            http,
            _data: data,
            _adapters: adapters,
            _pg: pg,
        }
    }

    /// An operator reads a raw body back over the admin API (admin token + own key).
    async fn operator_reads_raw_body(&self, inbox_id: &str) -> Value {
        let operator = call_ok(
            &self.http,
            Method::POST,
            &format!("{}/admin/operators", self.server.url()),
            ADMIN_TOKEN,
            Some(json!({"name": "auditor"})),
        )
        .await;
        let key = operator["key"].as_str().expect("operator key");
        let url = format!(
            "{}/admin/review/webhooks/{inbox_id}/raw_body",
            self.server.url()
        );
        let without_key = self
            .http
            .get(&url)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(
            without_key.status().as_u16(),
            401,
            "the operator's own key is required"
        );
        let missing = self
            .http
            .get(format!(
                "{}/admin/review/webhooks/inb_nope/raw_body",
                self.server.url()
            ))
            .bearer_auth(ADMIN_TOKEN)
            .header("sluice-operator-key", key)
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status().as_u16(), 404);
        let response = self
            .http
            .get(&url)
            .bearer_auth(ADMIN_TOKEN)
            .header("sluice-operator-key", key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        response.json().await.unwrap()
    }

    fn store(&self) -> &Store {
        self.server.services().orchestrator.store()
    }

    /// Posts a Stripe-format event signed with `secret`; the HTTP status.
    async fn webhook(&self, event_id: &str, secret: &str) -> (u16, Vec<u8>) {
        let body = json!({"id": event_id, "object": "event", "type": "payment_intent.succeeded",
            "created": 1_700_000_000, "data": {"object": {"id": "pi_rotation", "object": "payment_intent",
            "status": "succeeded", "amount": 1000, "currency": "eur", "metadata": {}}}});
        let bytes = serde_json::to_vec(&body).expect("json");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs() as i64;
        let status = self
            .http
            .post(format!(
                "{}/webhooks/stripe/{}",
                self.server.url(),
                self.account
            ))
            .header("content-type", "application/json")
            .header(
                "stripe-signature",
                stripe_signature_header(secret, now, &bytes),
            )
            .body(bytes.clone())
            .send()
            .await
            .expect("webhook post")
            .status()
            .as_u16();
        (status, bytes)
    }

    async fn rotate(&self, name: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!(
            "{}/admin/merchants/{}/connector_accounts/{}/secrets/{name}/rotate",
            self.server.url(),
            self.merchant,
            self.account
        );
        let mut request = self.http.post(url).bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("rotate");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn raw_secrets(&self) -> String {
        let row = sqlx::query("SELECT secrets_json FROM connector_accounts WHERE id = $1")
            .bind(&self.account)
            .fetch_one(self.store().pool())
            .await
            .expect("account row");
        row.try_get(0).expect("secrets_json")
    }

    /// The end of the rotation window, without waiting for it: every stored
    /// `valid_until` is moved into the past, through the same master key.
    async fn end_rotation_window(&self) {
        let key = MasterKey::parse(TEST_MASTER_KEY).expect("test key");
        let sealer = Store::connect_with(
            &self.store_url(),
            StoreOptions {
                secret_box: Arc::new(LocalSecretBox::new(&key, &[])),
                ..StoreOptions::default()
            },
        )
        .await
        .expect("second store");
        let context = sluice_store::secrets::secret_context(
            "connector_accounts",
            "secrets_json",
            &self.account,
        );
        let mut secrets: Value = serde_json::from_str(
            &sealer
                .open_secret_text(&context, &self.raw_secrets().await)
                .unwrap(),
        )
        .unwrap();
        for version in secrets["webhook_secret"]["versions"]
            .as_array_mut()
            .unwrap()
        {
            if !version["valid_until"].is_null() {
                version["valid_until"] = json!(1);
            }
        }
        let sealed = sealer
            .seal_secret(&context, secrets.to_string().as_bytes())
            .unwrap();
        sqlx::query("UPDATE connector_accounts SET secrets_json = $1 WHERE id = $2")
            .bind(sealed)
            .bind(&self.account)
            .execute(sealer.pool())
            .await
            .unwrap();
        sealer.close().await;
    }

    fn store_url(&self) -> String {
        match &self._pg {
            Some(pg) => pg.url.clone(),
            None => format!("sqlite://{}/sluice.db", self._data.path().display()),
        }
    }

    /// Every stored text that could carry a secret or a webhook body.
    async fn raw_rows(&self) -> Vec<String> {
        let mut out = Vec::new();
        for sql in [
            "SELECT secrets_json FROM connector_accounts",
            "SELECT config_json FROM connector_accounts",
            "SELECT sealed_body FROM webhook_bodies",
        ] {
            for row in sqlx::query(sql)
                .fetch_all(self.store().pool())
                .await
                .unwrap()
            {
                out.push(row.try_get::<String, _>(0).unwrap());
            }
        }
        out
    }
}

async fn rotation_over_http(pg: Option<TestDatabase>) {
    let gw = Gateway::start(pg).await;
    assert_eq!(gw.webhook("evt_before", OLD_SECRET).await.0, 200);

    let before = gw.raw_secrets().await;
    for (name, body, status) in [
        (
            "webhook_secret",
            Some(json!({"value": NEW_SECRET, "window_ms": -1})),
            400,
        ),
        (
            "webhook_secret",
            Some(json!({"value": NEW_SECRET, "window_ms": 2_678_400_001_i64})),
            400,
        ),
        (
            "webhook_secret",
            Some(json!({"value": "", "window_ms": 1000})),
            400,
        ),
        (
            "webhook_secret",
            Some(json!({"value": "a\nb", "window_ms": 1000})),
            400,
        ),
        ("webhook_secret", Some(json!({"value": NEW_SECRET})), 400),
        (
            "webhook_secret",
            Some(json!({"value": NEW_SECRET, "window_ms": 1, "x": 1})),
            400,
        ),
        ("webhook_secret", None, 400),
        (
            "webhook_secret",
            Some(json!({"value": OLD_SECRET, "window_ms": 1000})),
            409,
        ),
        (
            "no_such_secret",
            Some(json!({"value": NEW_SECRET, "window_ms": 1000})),
            404,
        ),
        (
            "Webhook-Secret",
            Some(json!({"value": NEW_SECRET, "window_ms": 1000})),
            404,
        ),
    ] {
        let (got, error) = gw.rotate(name, body.clone()).await;
        assert_eq!(got, status, "{name} {body:?}: {error}");
        assert!(
            error["error"]["code"].is_string(),
            "a JSON error body: {error}"
        );
        assert!(!error.to_string().contains(NEW_SECRET), "{error}");
        assert_eq!(
            gw.raw_secrets().await,
            before,
            "a refused rotation changes nothing"
        );
    }

    let (status, rotation) = gw
        .rotate(
            "webhook_secret",
            Some(json!({"value": NEW_SECRET, "window_ms": 3_600_000.0})),
        )
        .await;
    assert_eq!(status, 200, "{rotation}");
    assert_eq!(
        rotation["versions"][0],
        json!({"current": true, "valid_until": null})
    );
    assert!(
        rotation["versions"][1]["valid_until"].as_i64().is_some(),
        "{rotation}"
    );
    assert!(!rotation.to_string().contains("whsec_"), "{rotation}");

    assert_eq!(
        gw.webhook("evt_old_in_window", OLD_SECRET).await.0,
        200,
        "the old secret verifies inside the window"
    );
    let (status, new_body) = gw.webhook("evt_new_in_window", NEW_SECRET).await;
    assert_eq!(status, 200);

    gw.end_rotation_window().await;
    let (refused, _) = gw.webhook("evt_old_after_window", OLD_SECRET).await;
    assert!(
        (400..500).contains(&refused),
        "the old secret is refused after the window: {refused}"
    );
    assert_eq!(gw.webhook("evt_new_after_window", NEW_SECRET).await.0, 200);

    for row in gw.raw_rows().await {
        for secret in [
            OLD_SECRET,
            NEW_SECRET,
            DEFAULT_STRIPE_API_KEY,
            "evt_new_in_window",
        ] {
            assert!(
                !row.contains(secret),
                "{secret} is in the database in clear: {row}"
            );
        }
    }
    let inbox =
        sqlx::query("SELECT id FROM webhook_inbox WHERE provider_event_id = 'evt_new_in_window'")
            .fetch_one(gw.store().pool())
            .await
            .unwrap();
    let inbox_id: String = inbox.try_get(0).unwrap();
    let evidence = gw.store().inbox_raw_body(&inbox_id).await.unwrap();
    assert_eq!(
        evidence.as_deref(),
        Some(new_body.as_slice()),
        "the verified body reads back through the box"
    );
    let read = gw.operator_reads_raw_body(&inbox_id).await;
    assert_eq!(
        read["body_text"].as_str().map(str::as_bytes),
        Some(new_body.as_slice()),
        "{read}"
    );
    assert_eq!(read["connector_account_id"], gw.account.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_webhook_secret_verifies_the_old_version_only_inside_its_window_on_sqlite() {
    rotation_over_http(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_webhook_secret_verifies_the_old_version_only_inside_its_window_on_postgres() {
    rotation_over_http(Some(TestDatabase::create().await)).await;
}
