//! A payment created with its first attempt in one transaction (a create with
//! `confirm`): the same rows and history as the two steps, all or nothing.

use crate::common::*;
use sluice_core::{AttemptState, CaptureMode, OrderState};
use sluice_store::{NewAttempt, StoreError};
use sluice_test_support::door::new_payment;

fn first_attempt(payment_id: &str, account_id: &str) -> NewAttempt {
    NewAttempt {
        payment_id: payment_id.to_owned(),
        connector_account_id: account_id.to_owned(),
        payment_method_type: Some("card".into()),
        next_retry_time: Some(1_000),
        route_reason: Some("the merchant's only active account".into()),
        ..NewAttempt::default()
    }
}

/// What a payment's history says, without ids and times.
async fn story(store: &sluice_store::Store, payment_id: &str) -> Vec<String> {
    store
        .timeline(payment_id)
        .await
        .unwrap()
        .iter()
        .map(|h| {
            format!(
                "{} {:?}->{} v{:?}->{} {} {} {} {:?} {:?} {} {:?} {:?}",
                h.aggregate_type,
                h.from_state,
                h.to_state,
                h.from_version,
                h.to_version,
                h.event_kind,
                h.decision,
                h.reason,
                h.amount_minor,
                h.currency,
                h.evidence_source,
                h.actor,
                h.trace_id
            )
        })
        .collect()
}

async fn rows_of(store: &sluice_store::Store, merchant_id: &str) -> (i64, i64) {
    let orders = count(
        store,
        "SELECT COUNT(*) FROM payment_orders WHERE merchant_id = $1",
        merchant_id,
    )
    .await;
    let attempts = count(
        store,
        "SELECT COUNT(*) FROM payment_attempts a JOIN payment_orders o ON o.id = a.payment_id WHERE o.merchant_id = $1",
        merchant_id,
    )
    .await;
    (orders, attempts)
}

dual_test! {
    async fn a_payment_created_with_its_first_attempt_has_the_rows_and_history_of_the_two_steps(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        // The two steps, as a create without confirm and a later confirm do them.
        let apart = fx.payment(store, "TWO-1", 500, CaptureMode::Automatic).await;
        let apart_attempt = store
            .create_attempt(&first_attempt(&apart.id, &fx.account.id), &sys())
            .await
            .unwrap();
        // One transaction.
        let id = store.mint_payment_id();
        let new = new_payment(&fx.merchant.id, "ONE-1", 500, CaptureMode::Automatic);
        let (order, attempt) = store
            .create_payment_with_attempt(&id, &new, &first_attempt(&id, &fx.account.id), &sys())
            .await
            .unwrap();

        assert_eq!(order.id, id);
        let stored = store.get_payment(Some(&fx.merchant.id), &id).await.unwrap();
        assert_eq!(stored, order, "the order returned is the order stored");
        assert_eq!((stored.state, stored.version), (OrderState::Processing, 1));
        let stored_attempt = store.get_attempt(&attempt.id).await.unwrap();
        assert_eq!(stored_attempt, attempt, "the attempt returned is the attempt stored");
        assert_eq!((attempt.state, attempt.attempt_no), (AttemptState::Created, 1));
        assert_eq!(attempt.reference, format!("{id}_a1"));
        assert_eq!(
            (attempt.adapter.as_str(), attempt.connector_account_id.as_str(), attempt.amount),
            (apart_attempt.adapter.as_str(), apart_attempt.connector_account_id.as_str(), apart_attempt.amount)
        );
        let amounts = store.payment_amounts(&id).await.unwrap();
        assert_eq!(amounts, store.payment_amounts(&apart.id).await.unwrap());
        assert_eq!(story(store, &id).await, story(store, &apart.id).await);
        assert_eq!(story(store, &id).await.len(), 3, "created, the order's move, the attempt's creation");
        let recorded: Vec<i64> = store.timeline(&id).await.unwrap().iter().map(|h| h.recorded_at).collect();
        assert_eq!(recorded, vec![attempt.created_at; 3], "one instant for the one transaction");
    }
}

dual_test! {
    async fn two_creates_racing_with_one_order_number_make_one_payment_with_one_attempt(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let create = |id: String| {
            let store = store.clone();
            let new = new_payment(&fx.merchant.id, "RACE-1", 500, CaptureMode::Automatic);
            let attempt = first_attempt(&id, &fx.account.id);
            async move { store.create_payment_with_attempt(&id, &new, &attempt, &sys()).await }
        };
        let (a, b) = tokio::join!(create(store.mint_payment_id()), create(store.mint_payment_id()));
        let results = [&a, &b];
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{a:?} {b:?}");
        assert!(results.iter().any(|r| matches!(r, Err(StoreError::Conflict(_)))), "{a:?} {b:?}");
        assert_eq!(rows_of(store, &fx.merchant.id).await, (1, 1));
        let (winner, _) = a.as_ref().or(b.as_ref()).unwrap();
        assert_eq!(store.timeline(&winner.id).await.unwrap().len(), 3);
    }
}

dual_test! {
    async fn a_payment_for_a_merchant_that_does_not_exist_creates_nothing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let id = store.mint_payment_id();
        let new = new_payment("mer_nobody", "GHOST-1", 500, CaptureMode::Automatic);
        let refused = store
            .create_payment_with_attempt(&id, &new, &first_attempt(&id, &fx.account.id), &sys())
            .await;
        assert!(matches!(refused, Err(StoreError::NotFound { .. })), "{refused:?}");
        assert_eq!(rows_of(store, &fx.merchant.id).await, (0, 0));
        assert!(store.timeline(&id).await.unwrap().is_empty());
    }
}

dual_test! {
    async fn a_used_order_number_creates_neither_a_payment_nor_an_attempt(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        fx.payment(store, "USED-1", 500, CaptureMode::Automatic).await;
        let before = rows_of(store, &fx.merchant.id).await;

        let id = store.mint_payment_id();
        let new = new_payment(&fx.merchant.id, "USED-1", 500, CaptureMode::Automatic);
        let again = store
            .create_payment_with_attempt(&id, &new, &first_attempt(&id, &fx.account.id), &sys())
            .await;

        assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
        assert_eq!(rows_of(store, &fx.merchant.id).await, before);
        assert!(store.timeline(&id).await.unwrap().is_empty(), "no history for a payment never created");
    }
}

dual_test! {
    async fn a_first_attempt_at_another_merchants_account_creates_nothing(&db) {
        let store = &db.store;
        let victim = Fixture::new(store, "Victim").await;
        let attacker = Fixture::new(store, "Attacker").await;

        let id = store.mint_payment_id();
        let new = new_payment(&attacker.merchant.id, "STEAL-1", 500, CaptureMode::Automatic);
        let refused = store
            .create_payment_with_attempt(&id, &new, &first_attempt(&id, &victim.account.id), &sys())
            .await;

        assert!(matches!(refused, Err(StoreError::NotFound { .. })), "{refused:?}");
        assert_eq!(rows_of(store, &attacker.merchant.id).await, (0, 0));
        assert_eq!(rows_of(store, &victim.merchant.id).await, (0, 0));
    }
}

dual_test! {
    async fn a_payment_of_no_amount_is_refused_before_anything_is_written(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let id = store.mint_payment_id();
        let new = new_payment(&fx.merchant.id, "ZERO-1", 0, CaptureMode::Automatic);
        let refused = store
            .create_payment_with_attempt(&id, &new, &first_attempt(&id, &fx.account.id), &sys())
            .await;
        assert!(matches!(refused, Err(StoreError::Unapplicable(_))), "{refused:?}");
        assert_eq!(rows_of(store, &fx.merchant.id).await, (0, 0));
    }
}
