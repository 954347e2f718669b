//! The payment path's connector-account cache (issue 17): a write through the
//! store is seen by the next read at once, another instance's write within
//! the cache's time, a rotation window's end on the first read after it, and
//! one merchant's accounts never answer for another's.

use crate::common::*;
use sluice_store::{NewConnectorAccount, Store, StoreError, StoreOptions};
use std::time::Duration;

const TTL_MS: i64 = 1_000;

async fn account(store: &Store, merchant: &str, label: &str) -> String {
    store
        .create_connector_account(&NewConnectorAccount {
            merchant_id: merchant.to_owned(),
            adapter: "stripe".into(),
            label: label.into(),
            config: serde_json::json!({"base_url": "http://127.0.0.1:9", "label": label}),
            secrets: serde_json::json!({"api_key": "sk_one", "webhook_secret": "whsec_one"}),
        })
        .await
        .unwrap()
        .id
}

fn options(db: &TestDb) -> StoreOptions {
    StoreOptions {
        account_cache_ttl: Duration::from_millis(TTL_MS as u64),
        ..db.options()
    }
}

/// A row changed behind every store's back, as another instance would.
async fn set_config_behind(store: &Store, account_id: &str, config: serde_json::Value) {
    sqlx::query("UPDATE connector_accounts SET config_json = $1 WHERE id = $2")
        .bind(config.to_string())
        .bind(account_id)
        .execute(store.pool())
        .await
        .unwrap();
}

dual_test! {
    async fn a_change_through_the_store_is_seen_by_the_next_cached_read_at_once(&db) {
        let store = db.store_with(options(db)).await;
        let merchant = store.create_merchant("Cached").await.unwrap();
        let id = account(&store, &merchant.id, "main").await;
        assert_eq!(store.connector_credentials_cached(&id).await.unwrap().config["label"], "main");
        assert_eq!(store.list_connector_accounts_cached(&merchant.id).await.unwrap()[0].status, "active");

        let config = serde_json::json!({"base_url": "http://127.0.0.1:9", "label": "changed"});
        store.update_connector_account(&id, Some(&config), None, Some("disabled")).await.unwrap();
        assert_eq!(store.connector_credentials_cached(&id).await.unwrap().config["label"], "changed");
        assert_eq!(store.list_connector_accounts_cached(&merchant.id).await.unwrap()[0].status, "disabled");

        store.pause_connector_account(&id, "maintenance", "op_1").await.unwrap();
        let paused = store.connector_account_cached(&id, &merchant.id).await.unwrap();
        assert!(paused.paused.is_some(), "a pause is seen at once");

        let second = account(&store, &merchant.id, "second").await;
        let listed = store.list_connector_accounts_cached(&merchant.id).await.unwrap();
        assert!(listed.iter().any(|a| a.id == second), "a new account is listed at once");
    }
}

dual_test! {
    async fn another_instances_change_is_seen_once_the_cache_time_has_passed(&db) {
        let store = db.store_with(options(db)).await;
        let merchant = store.create_merchant("Cached").await.unwrap();
        let id = account(&store, &merchant.id, "main").await;
        assert_eq!(store.connector_credentials_cached(&id).await.unwrap().config["label"], "main");

        set_config_behind(&store, &id, serde_json::json!({"label": "elsewhere"})).await;
        db.clock.advance(TTL_MS - 1);
        assert_eq!(
            store.connector_credentials_cached(&id).await.unwrap().config["label"], "main",
            "within the cache time the entry stands (the documented staleness)"
        );
        assert_eq!(store.connector_credentials(&id).await.unwrap().config["label"], "elsewhere",
            "the uncached read is never stale");
        db.clock.advance(1);
        assert_eq!(store.connector_credentials_cached(&id).await.unwrap().config["label"], "elsewhere");
    }
}

dual_test! {
    async fn a_zero_cache_time_reads_the_row_every_time(&db) {
        let store = db
            .store_with(StoreOptions { account_cache_ttl: Duration::ZERO, ..db.options() })
            .await;
        let merchant = store.create_merchant("Uncached").await.unwrap();
        let id = account(&store, &merchant.id, "main").await;
        assert_eq!(store.connector_credentials_cached(&id).await.unwrap().config["label"], "main");
        set_config_behind(&store, &id, serde_json::json!({"label": "elsewhere"})).await;
        assert_eq!(store.connector_credentials_cached(&id).await.unwrap().config["label"], "elsewhere");
    }
}

dual_test! {
    async fn a_rotation_windows_end_applies_to_a_cached_entry_on_the_first_read_after_it(&db) {
        let store = db.store_with(options(db)).await;
        let merchant = store.create_merchant("Rotating").await.unwrap();
        let id = account(&store, &merchant.id, "main").await;
        store.rotate_connector_secret(&id, "webhook_secret", "whsec_two", 500).await.unwrap();
        let during = store.connector_credentials_cached(&id).await.unwrap().secrets;
        assert_eq!(during["webhook_secret"], serde_json::json!(["whsec_two", "whsec_one"]));

        db.clock.advance(500);
        let after = store.connector_credentials_cached(&id).await.unwrap().secrets;
        assert_eq!(after["webhook_secret"], "whsec_two", "the old version ends with its window, not with the entry");
    }
}

dual_test! {
    async fn one_merchants_cached_accounts_never_answer_for_another_merchant(&db) {
        let store = db.store_with(options(db)).await;
        let mine = store.create_merchant("Mine").await.unwrap();
        let theirs = store.create_merchant("Theirs").await.unwrap();
        let my_account = account(&store, &mine.id, "main").await;
        let their_account = account(&store, &theirs.id, "main").await;
        store.list_connector_accounts_cached(&theirs.id).await.unwrap();
        store.list_connector_accounts_cached(&mine.id).await.unwrap();

        assert!(store.connector_account_cached(&my_account, &mine.id).await.is_ok());
        let refused = store.connector_account_cached(&their_account, &mine.id).await;
        assert!(matches!(refused, Err(StoreError::NotFound { .. })), "{refused:?}");
        let listed = store.list_connector_accounts_cached(&mine.id).await.unwrap();
        assert_eq!(listed.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), vec![my_account.as_str()]);
    }
}

dual_test! {
    async fn a_routing_configuration_replaced_through_the_store_is_seen_by_the_next_cached_read(&db) {
        let store = db.store_with(options(db)).await;
        let merchant = store.create_merchant("Routed").await.unwrap();
        let id = account(&store, &merchant.id, "main").await;
        assert_eq!(store.routing_config_cached(&merchant.id).await.unwrap(), None);
        let config = sluice_core::RoutingConfig { fallback: vec![id.clone()], ..Default::default() };
        store.put_routing_config(&merchant.id, &config).await.unwrap();
        let cached = store.routing_config_cached(&merchant.id).await.unwrap().unwrap();
        assert_eq!((cached.version, &cached.config), (1, &config), "the absence was not kept past the write");

        sqlx::query("UPDATE routing_configs SET version = 7 WHERE merchant_id = $1")
            .bind(&merchant.id).execute(store.pool()).await.unwrap();
        assert_eq!(store.routing_config_cached(&merchant.id).await.unwrap().unwrap().version, 1);
        db.clock.advance(TTL_MS);
        assert_eq!(store.routing_config_cached(&merchant.id).await.unwrap().unwrap().version, 7,
            "another instance's replacement is seen once the cache time has passed");
    }
}

/// A key's revocation set or cleared behind every store's back, as another instance would.
async fn set_revoked_behind(store: &Store, key_id: &str, revoked_at: Option<i64>) {
    sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2")
        .bind(revoked_at)
        .bind(key_id)
        .execute(store.pool())
        .await
        .unwrap();
}

fn pepper() -> sluice_store::ApiKeyPepper {
    sluice_store::ApiKeyPepper::new(b"the-cache-tests-pepper-0123456789".to_vec()).unwrap()
}

dual_test! {
    async fn a_key_revoked_or_a_merchant_disabled_through_the_store_is_refused_by_the_next_request(&db) {
        let store = db.store_with(options(db)).await;
        let pepper = pepper();
        let acme = store.create_merchant("Acme").await.unwrap();
        let other = store.create_merchant("Other").await.unwrap();
        let acme_key = store.issue_api_key(&acme.id, "ci", &pepper).await.unwrap();
        let other_key = store.issue_api_key(&other.id, "ci", &pepper).await.unwrap();
        let who = |key: &str| {
            let (store, pepper, key) = (store.clone(), pepper.clone(), key.to_owned());
            async move { store.authenticate_api_key_cached(&key, &pepper).await.unwrap().map(|(m, _)| m.id) }
        };
        assert_eq!(who(&acme_key.plaintext).await.as_deref(), Some(acme.id.as_str()));
        assert_eq!(who(&other_key.plaintext).await.as_deref(), Some(other.id.as_str()), "each key answers for its own merchant");
        assert_eq!(who(&acme_key.plaintext).await.as_deref(), Some(acme.id.as_str()), "from the cache, still its own");

        store.revoke_api_key(&acme.id, &acme_key.record.id).await.unwrap();
        assert_eq!(who(&acme_key.plaintext).await, None, "a revocation is seen at once");
        assert_eq!(who(&other_key.plaintext).await.as_deref(), Some(other.id.as_str()));

        store.update_merchant(&other.id, None, Some("disabled")).await.unwrap();
        assert_eq!(who(&other_key.plaintext).await, None, "a disabled merchant is seen at once");
    }
}

dual_test! {
    async fn a_key_revoked_by_another_instance_is_refused_once_the_cache_time_has_passed(&db) {
        let store = db.store_with(options(db)).await;
        let pepper = pepper();
        let merchant = store.create_merchant("Acme").await.unwrap();
        let key = store.issue_api_key(&merchant.id, "ci", &pepper).await.unwrap();
        assert!(store.authenticate_api_key_cached(&key.plaintext, &pepper).await.unwrap().is_some());

        set_revoked_behind(&store, &key.record.id, Some(1)).await;
        db.clock.advance(TTL_MS - 1);
        assert!(store.authenticate_api_key_cached(&key.plaintext, &pepper).await.unwrap().is_some(),
            "within the cache time the entry stands (the documented staleness)");
        assert!(store.authenticate_api_key(&key.plaintext, &pepper).await.unwrap().is_none(),
            "the uncached read is never stale");
        db.clock.advance(1);
        assert!(store.authenticate_api_key_cached(&key.plaintext, &pepper).await.unwrap().is_none());
    }
}

dual_test! {
    async fn a_key_that_did_not_authenticate_is_never_remembered(&db) {
        let store = db.store_with(options(db)).await;
        let pepper = pepper();
        let merchant = store.create_merchant("Acme").await.unwrap();
        let key = store.issue_api_key(&merchant.id, "ci", &pepper).await.unwrap();
        set_revoked_behind(&store, &key.record.id, Some(1)).await;
        assert!(store.authenticate_api_key_cached(&key.plaintext, &pepper).await.unwrap().is_none());
        assert!(store.authenticate_api_key_cached("sk_sluice_guess", &pepper).await.unwrap().is_none());

        // Reinstated behind the store's back: a refusal was not kept, so the next read sees it.
        set_revoked_behind(&store, &key.record.id, None).await;
        assert!(store.authenticate_api_key_cached(&key.plaintext, &pepper).await.unwrap().is_some());
    }
}
