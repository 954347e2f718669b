//! Merchants, API keys, connector accounts and merchant-scoped reads.

use crate::common::*;
use sluice_core::CaptureMode;
use sluice_store::{ApiKeyPepper, StoreError};

dual_test! {
    async fn api_keys_are_stored_as_keyed_hashes_authenticate_and_can_be_revoked(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let pepper = ApiKeyPepper::new(b"a-server-side-pepper-of-32-bytes".to_vec()).unwrap();
        let issued = store.issue_api_key(&fx.merchant.id, "ci", &pepper).await.unwrap();
        assert!(issued.plaintext.starts_with("sk_sluice_"));
        assert!(!format!("{issued:?}").contains(&issued.plaintext), "Debug never shows the key");
        let stored: Vec<String> = sqlx::query("SELECT key_hash FROM api_keys")
            .fetch_all(store.pool())
            .await
            .unwrap()
            .iter()
            .map(|r| sqlx::Row::try_get::<String, _>(r, 0).unwrap())
            .collect();
        assert_eq!(stored, vec![pepper.hash(&issued.plaintext)]);
        assert!(!stored[0].contains(&issued.plaintext[10..]));

        let (merchant, key) = store.authenticate_api_key(&issued.plaintext, &pepper).await.unwrap().unwrap();
        assert_eq!((merchant.id.as_str(), key.id.as_str()), (fx.merchant.id.as_str(), issued.record.id.as_str()));
        let other_pepper = ApiKeyPepper::new(b"another-pepper-another-pepper!!".to_vec()).unwrap();
        assert!(store.authenticate_api_key(&issued.plaintext, &other_pepper).await.unwrap().is_none());
        assert!(store.authenticate_api_key("sk_sluice_guess", &pepper).await.unwrap().is_none());

        store.revoke_api_key(&fx.merchant.id, &issued.record.id).await.unwrap();
        assert!(store.authenticate_api_key(&issued.plaintext, &pepper).await.unwrap().is_none());
        assert!(store.list_api_keys(&fx.merchant.id).await.unwrap()[0].revoked_at.is_some());

        let second = store.issue_api_key(&fx.merchant.id, "ci-2", &pepper).await.unwrap();
        store.update_merchant(&fx.merchant.id, None, Some("disabled")).await.unwrap();
        assert!(store.authenticate_api_key(&second.plaintext, &pepper).await.unwrap().is_none(), "disabled merchants cannot authenticate");
        assert!(ApiKeyPepper::new(b"short".to_vec()).is_err());
    }
}

dual_test! {
    async fn connector_secrets_are_only_returned_by_the_internal_accessor(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let listed = store.list_connector_accounts(&fx.merchant.id).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(!format!("{listed:?}").contains("sk_test_secret"));
        let fetched = store.get_connector_account(&fx.account.id, Some(&fx.merchant.id)).await.unwrap();
        assert_eq!(fetched.config["base_url"], "http://127.0.0.1:9");
        let hidden = store.get_connector_account(&fx.account.id, Some("mer_other")).await;
        assert!(matches!(hidden, Err(StoreError::NotFound { .. })));

        let credentials = store.connector_credentials(&fx.account.id).await.unwrap();
        assert_eq!(credentials.secrets["api_key"], "sk_test_secret");
        assert!(!format!("{credentials:?}").contains("sk_test_secret"), "Debug redacts secrets");

        let rotated = serde_json::json!({"api_key": "sk_test_rotated"});
        store.update_connector_account(&fx.account.id, None, Some(&rotated), None).await.unwrap();
        assert_eq!(store.connector_credentials(&fx.account.id).await.unwrap().secrets, rotated);
        let duplicate = store
            .create_connector_account(&sluice_store::NewConnectorAccount {
                merchant_id: fx.merchant.id.clone(),
                adapter: "sandbox".into(),
                label: "main".into(),
                config: serde_json::json!({}),
                secrets: serde_json::json!({}),
            })
            .await;
        assert!(matches!(duplicate, Err(StoreError::Conflict(_))), "{duplicate:?}");
    }
}

dual_test! {
    async fn payments_are_scoped_to_their_merchant_unique_per_order_number_and_listed_by_cursor(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let other = Fixture::new(store, "Acme").await;
        let mut created = Vec::new();
        for n in 0..5 {
            created.push(fx.payment(store, &format!("L-{n}"), 100 + n, CaptureMode::Automatic).await);
        }
        let foreign = other.payment(store, "L-0", 100, CaptureMode::Automatic).await;
        assert_ne!(foreign.id, created[0].id, "order numbers are unique per merchant only");

        let reused = store
            .create_payment(
                &sluice_store::NewPayment {
                    merchant_id: fx.merchant.id.clone(),
                    merchant_order_no: "L-0".into(),
                    amount: eur(1),
                    capture_mode: CaptureMode::Automatic,
                    payment_method_token: None,
                    return_url: None,
                    description: None,
                    metadata: serde_json::json!({}),
                    fulfillment: Default::default(),
                },
                &sys(),
            )
            .await;
        assert!(matches!(reused, Err(StoreError::Conflict(_))), "{reused:?}");

        assert!(matches!(store.get_payment(Some(&other.merchant.id), &created[0].id).await, Err(StoreError::NotFound { .. })));
        let mine = store.get_payment(Some(&fx.merchant.id), &created[0].id).await.unwrap();
        assert_eq!(mine, created[0]);
        assert_eq!(store.get_payment_by_order_no(&fx.merchant.id, "L-3").await.unwrap().id, created[3].id);

        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = store.list_payments(&fx.merchant.id, 2, cursor.as_deref()).await.unwrap();
            seen.extend(page.items.iter().map(|p| p.id.clone()));
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let mut expected: Vec<String> = created.iter().map(|p| p.id.clone()).collect();
        expected.reverse();
        assert_eq!(seen, expected, "newest first, every payment once, none of another merchant's");

        let details = store.payment_details(Some(&fx.merchant.id), &created[0].id).await.unwrap();
        assert_eq!(details.order, created[0]);
        assert!(details.attempts.is_empty() && details.refunds.is_empty() && details.captures.is_empty());
        assert_eq!(details.amounts.amount_minor, 100);
    }
}

dual_test! {
    async fn a_routing_configuration_is_stored_versioned_and_only_over_the_merchants_own_accounts(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let other = Fixture::new(store, "Acme").await;
        assert_eq!(store.routing_config(&fx.merchant.id).await.unwrap(), None);
        let mut config = sluice_core::RoutingConfig {
            rules: vec![sluice_core::RouteRule {
                id: "eur".into(),
                when: sluice_core::RouteConditions { currencies: vec!["EUR".into()], ..Default::default() },
                accounts: vec![sluice_core::WeightedAccount { connector_account: fx.account.id.clone(), weight: 1 }],
            }],
            ..Default::default()
        };
        let first = store.put_routing_config(&fx.merchant.id, &config).await.unwrap();
        assert_eq!((first.version, &first.config), (1, &config));
        config.fallback = vec![fx.account.id.clone()];
        let second = store.put_routing_config(&fx.merchant.id, &config).await.unwrap();
        assert_eq!(second.version, 2);
        assert_eq!(store.routing_config(&fx.merchant.id).await.unwrap().unwrap().config, config);

        // Another merchant's account is refused, and so is a malformed configuration.
        config.fallback = vec![other.account.id.clone()];
        let refused = store.put_routing_config(&fx.merchant.id, &config).await.unwrap_err();
        assert!(matches!(refused, StoreError::InvalidRequest(ref m) if m.contains(&other.account.id)), "{refused:?}");
        config.fallback.clear();
        config.rules[0].accounts[0].weight = 0;
        assert!(matches!(store.put_routing_config(&fx.merchant.id, &config).await, Err(StoreError::InvalidRequest(_))));
        assert_eq!(store.routing_config(&fx.merchant.id).await.unwrap().unwrap().version, 2, "nothing written");
        assert_eq!(store.routing_config(&other.merchant.id).await.unwrap(), None);
        assert!(matches!(store.put_routing_config("mer_nobody", &sluice_core::RoutingConfig::default()).await, Err(StoreError::NotFound { .. })));
    }
}

dual_test! {
    async fn a_pause_and_a_resume_are_stored_with_their_reason_in_the_accounts_append_only_history(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        assert_eq!(fx.account.paused, None);
        let paused = store.pause_connector_account(&fx.account.id, "PSP incident 42", "op_alice").await.unwrap();
        let pause = paused.paused.expect("paused");
        assert_eq!(pause.reason, "PSP incident 42");
        let listed = store.list_connector_accounts(&fx.merchant.id).await.unwrap();
        assert_eq!(listed[0].paused.as_ref().map(|p| p.reason.as_str()), Some("PSP incident 42"));
        store.record_breaker_transition(&fx.account.id, "closed -> open: credentials refused").await.unwrap();
        let resumed = store.resume_connector_account(&fx.account.id, "op_bob").await.unwrap();
        assert_eq!(resumed.paused, None);
        // Resuming again changes nothing and writes nothing.
        store.resume_connector_account(&fx.account.id, "op_bob").await.unwrap();
        let events = store.connector_account_events(&fx.account.id).await.unwrap();
        let kinds: Vec<(&str, &str)> = events.iter().map(|e| (e.kind.as_str(), e.actor.as_str())).collect();
        assert_eq!(kinds, [("resumed", "op_bob"), ("breaker", "breaker"), ("paused", "op_alice")]);
        assert_eq!(events[2].detail, "PSP incident 42");

        let rewrite = sqlx::query("UPDATE connector_account_events SET detail = 'nothing happened'")
            .execute(store.pool())
            .await;
        assert!(rewrite.is_err(), "history is append-only");
        let erase = sqlx::query("DELETE FROM connector_account_events").execute(store.pool()).await;
        assert!(erase.is_err(), "history is append-only");
        let missing = store.pause_connector_account("ca_missing", "x", "op_alice").await;
        assert!(matches!(missing, Err(StoreError::NotFound { .. })));
    }
}
