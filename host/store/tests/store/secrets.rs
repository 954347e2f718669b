//! Secrets at rest (issue 11 §5): what the database holds is sealed, legacy plaintext
//! rows are read and then sealed at start-up, a wrong master key is a typed error, and
//! a rotated connector secret has two valid versions during its window only.

use crate::common::*;
use sluice_store::{
    LocalSecretBox, MasterKey, NewConnectorAccount, SecretBox, SecretBoxError, Store, StoreError,
};
use sqlx::Row;
use std::sync::Arc;

const API_KEY: &str = "sk_live_plaintext_api_key_4242";
const WEBHOOK_SECRET: &str = "whsec_plaintext_webhook_secret_77";
const ENDPOINT_SECRET: &str = "whsec_endpoint_secret_in_clear_99";
const FULFILLMENT_SECRET: &str = "fulfillment_secret_in_clear_55";
const BODY: &str = r#"{"id":"evt_body_marker_31337","type":"payment_intent.succeeded"}"#;
const EVERY_SECRET: [&str; 5] = [
    API_KEY,
    WEBHOOK_SECRET,
    ENDPOINT_SECRET,
    FULFILLMENT_SECRET,
    "evt_body_marker_31337",
];

fn local_box(byte: u8, previous: &[u8]) -> Arc<dyn SecretBox> {
    let key = |b: u8| MasterKey::from_bytes([b; 32]);
    let previous: Vec<MasterKey> = previous.iter().map(|b| key(*b)).collect();
    Arc::new(LocalSecretBox::new(&key(byte), &previous))
}

/// Every text column that holds (or may hold) a secret, as the database has it.
async fn raw_secret_columns(store: &Store) -> Vec<String> {
    let mut out = Vec::new();
    for sql in [
        "SELECT secrets_json, config_json FROM connector_accounts",
        "SELECT secret, url FROM webhook_endpoints",
        "SELECT secret, url FROM merchant_fulfillment_endpoints",
        "SELECT sealed_body, payload_digest FROM webhook_bodies",
    ] {
        for row in sqlx::query(sql).fetch_all(store.pool()).await.unwrap() {
            out.push(row.try_get::<String, _>(0).unwrap());
            out.push(row.try_get::<String, _>(1).unwrap());
        }
    }
    out
}

async fn assert_nothing_in_clear(store: &Store) {
    let raw = raw_secret_columns(store).await;
    assert!(!raw.is_empty());
    for column in &raw {
        for secret in EVERY_SECRET {
            assert!(
                !column.contains(secret),
                "{secret} is stored in clear: {column}"
            );
        }
    }
}

/// An account with an api key and a webhook secret, a fulfillment endpoint and a
/// webhook body, all written through the store.
async fn sealed_fixture(store: &Store) -> (String, String, String) {
    let merchant = store.create_merchant("Sealed").await.unwrap();
    let account = store
        .create_connector_account(&NewConnectorAccount {
            merchant_id: merchant.id.clone(),
            adapter: "stripe".into(),
            label: "main".into(),
            config: serde_json::json!({"base_url": "http://127.0.0.1:9"}),
            secrets: serde_json::json!({"api_key": API_KEY, "webhook_secret": WEBHOOK_SECRET}),
        })
        .await
        .unwrap();
    store
        .set_fulfillment_endpoint(&sluice_store::FulfillmentEndpoint {
            merchant_id: merchant.id.clone(),
            url: "http://127.0.0.1:9/fulfil".into(),
            secret: FULFILLMENT_SECRET.into(),
            timeout_ms: 1000,
        })
        .await
        .unwrap();
    let body_id = store
        .keep_webhook_body(&account.id, "sha256:body", BODY.as_bytes())
        .await
        .unwrap();
    (merchant.id, account.id, body_id)
}

/// A webhook endpoint row as a gateway before encryption wrote it: secret in clear.
async fn legacy_endpoint(store: &Store, merchant_id: &str) {
    sqlx::query(
        "INSERT INTO webhook_endpoints (id, merchant_id, url, description, event_types, secret, \
            enabled, created_at, updated_at) VALUES ('we_legacy', $1, 'http://127.0.0.1:9/h', '', \
            '[\"*\"]', $2, 1, 0, 0)",
    )
    .bind(merchant_id)
    .bind(ENDPOINT_SECRET)
    .execute(store.pool())
    .await
    .unwrap();
}

dual_test! {
    async fn every_secret_the_store_writes_is_sealed_in_the_raw_rows_and_opens_for_its_reader(&db) {
        let store = &db.store;
        let (merchant_id, account_id, body_id) = sealed_fixture(store).await;
        assert_nothing_in_clear(store).await;
        let raw = raw_secret_columns(store).await;
        assert!(raw[0].starts_with("sbx1:mk_"), "{}", raw[0]);

        let credentials = store.connector_credentials(&account_id).await.unwrap();
        assert_eq!(credentials.secrets["api_key"], API_KEY);
        assert_eq!(credentials.secrets["webhook_secret"], WEBHOOK_SECRET);
        let endpoint = store.fulfillment_endpoint(&merchant_id).await.unwrap().unwrap();
        assert_eq!(endpoint.secret, FULFILLMENT_SECRET);
        let again = store.keep_webhook_body(&account_id, "sha256:body", BODY.as_bytes()).await.unwrap();
        assert_eq!(again, body_id, "the same body is kept once");
    }
}

dual_test! {
    async fn legacy_plaintext_rows_are_read_as_they_are_and_the_start_up_reseal_seals_them(&db) {
        let store = &db.store;
        let (merchant_id, account_id, _) = sealed_fixture(store).await;
        legacy_endpoint(store, &merchant_id).await;
        let legacy = serde_json::json!({"api_key": API_KEY, "webhook_secret": [WEBHOOK_SECRET, "whsec_older_version"]});
        sqlx::query("UPDATE connector_accounts SET secrets_json = $1 WHERE id = $2")
            .bind(legacy.to_string())
            .bind(&account_id)
            .execute(store.pool())
            .await
            .unwrap();
        let credentials = store.connector_credentials(&account_id).await.unwrap();
        assert_eq!(credentials.secrets, legacy, "a legacy row reads as it is");

        let report = store.reseal_secrets().await.unwrap();
        assert_eq!(report.total(), 2, "{report:?}");
        assert_nothing_in_clear(store).await;
        assert!(!raw_secret_columns(store).await.iter().any(|c| c.contains("whsec_older_version")));
        assert_eq!(store.connector_credentials(&account_id).await.unwrap().secrets, legacy);
        let context = sluice_store::secrets::webhook_endpoint_context("we_legacy");
        let row = sqlx::query("SELECT secret FROM webhook_endpoints WHERE id = 'we_legacy'")
            .fetch_one(store.pool()).await.unwrap();
        let sealed: String = row.try_get(0).unwrap();
        assert_eq!(store.open_secret_text(&context, &sealed).unwrap(), ENDPOINT_SECRET);
        assert_eq!(store.reseal_secrets().await.unwrap().total(), 0, "a second start-up has nothing to do");
    }
}

dual_test! {
    async fn a_wrong_master_key_is_a_typed_error_and_a_new_key_reseals_with_the_previous_one(&db) {
        let first = db.store_with(db.options_with_box(local_box(1, &[]))).await;
        let (_, account_id, _) = sealed_fixture(&first).await;
        let first_key = MasterKey::from_bytes([1; 32]).id().to_owned();

        let wrong = db.store_with(db.options_with_box(local_box(2, &[]))).await;
        let err = wrong.connector_credentials(&account_id).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Secret(SecretBoxError::UnknownKey { key_id }) if *key_id == first_key),
            "{err:?}"
        );
        assert!(!err.to_string().contains(API_KEY));
        assert!(matches!(wrong.reseal_secrets().await, Err(StoreError::Secret(SecretBoxError::UnknownKey { .. }))));
        assert!(raw_secret_columns(&wrong).await[0].contains(&first_key), "a refused reseal writes nothing");

        let rotated = db.store_with(db.options_with_box(local_box(2, &[1]))).await;
        assert_eq!(rotated.reseal_secrets().await.unwrap().total(), 3);
        assert_eq!(rotated.connector_credentials(&account_id).await.unwrap().secrets["api_key"], API_KEY);
        assert_nothing_in_clear(&rotated).await;
        assert!(matches!(
            first.connector_credentials(&account_id).await,
            Err(StoreError::Secret(SecretBoxError::UnknownKey { .. }))
        ), "after the reseal the old key alone opens nothing");
        let moved = raw_secret_columns(&rotated).await;
        // [secrets_json, config_json, fulfillment secret, url, sealed body, digest]
        let body = moved[4].clone();
        assert!(body.starts_with("sbx1:"));
        sqlx::query("UPDATE connector_accounts SET secrets_json = $1 WHERE id = $2")
            .bind(&body).bind(&account_id).execute(rotated.pool()).await.unwrap();
        assert!(matches!(
            rotated.connector_credentials(&account_id).await,
            Err(StoreError::Secret(_))
        ), "a sealed value copied onto another row does not open");
    }
}

dual_test! {
    async fn a_rotated_secret_has_both_versions_during_its_window_and_then_only_the_new_one(&db) {
        let store = &db.store;
        let (_, account_id, _) = sealed_fixture(store).await;
        let before = raw_secret_columns(store).await;
        for (name, value, window) in [
            ("no_such_secret", "whsec_new_value_123", 1000),
            ("webhook_secret", WEBHOOK_SECRET, 1000),
            ("webhook_secret", "", 1000),
            ("webhook_secret", "whsec_new_value_123", -1),
            ("webhook_secret", "whsec_new_value_123", 31 * 24 * 3_600_000),
        ] {
            assert!(store.rotate_connector_secret(&account_id, name, value, window).await.is_err(), "{name} {window}");
        }
        assert_eq!(raw_secret_columns(store).await, before, "a refused rotation changes nothing");

        let rotation = store.rotate_connector_secret(&account_id, "webhook_secret", "whsec_new_value_123", 60_000).await.unwrap();
        let now = db.clock.now_ms();
        assert_eq!(rotation.versions, vec![None, Some(now + 60_000)]);
        let secrets = store.connector_credentials(&account_id).await.unwrap().secrets;
        assert_eq!(secrets["webhook_secret"], serde_json::json!(["whsec_new_value_123", WEBHOOK_SECRET]));
        assert_eq!(secrets["api_key"], API_KEY);
        assert!(!raw_secret_columns(store).await.iter().any(|c| c.contains("whsec_new_value_123")));

        db.clock.advance(60_000);
        let secrets = store.connector_credentials(&account_id).await.unwrap().secrets;
        assert_eq!(secrets["webhook_secret"], "whsec_new_value_123");
    }
}

#[test]
fn debug_output_of_a_fulfillment_endpoint_never_shows_its_secret() {
    let endpoint = sluice_store::FulfillmentEndpoint {
        merchant_id: "m_1".into(),
        url: "https://shop.example/f".into(),
        secret: FULFILLMENT_SECRET.into(),
        timeout_ms: 1000,
    };
    let printed = format!("{endpoint:?}");
    assert!(
        printed.contains("m_1") && !printed.contains(FULFILLMENT_SECRET),
        "{printed}"
    );
}
