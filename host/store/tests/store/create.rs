//! A payment created with its first attempt in one transaction (a create with
//! `confirm`): the same rows and history as the two steps, all or nothing.

use crate::common::*;
use sluice_core::{AttemptState, CaptureMode, EventKind, EvidenceSource, OrderState};
use sluice_store::{
    AdapterPin, ApplyEvent, AttemptHead, CreatedPayment, DecisionKind, FirstSend, NewAttempt,
    NewPayment, SentCall, Store, StoreError,
};
use sluice_test_support::door::{declined, event, new_payment, on_attempt};

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

/// A create with `confirm` without a first send's record: the payment and
/// its first attempt as committed.
async fn create_with_attempt(
    store: &Store,
    id: &str,
    new: &NewPayment,
    attempt: &NewAttempt,
) -> Result<AttemptHead, StoreError> {
    let fresh = store.fresh_payment(id, new, attempt).await?;
    let created = store
        .create_payment_with_attempt(&fresh, &sys(), None)
        .await?;
    assert!(created.sent.is_none());
    Ok(created.head)
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
        let head = create_with_attempt(store, &id, &new, &first_attempt(&id, &fx.account.id))
            .await
            .unwrap();
        assert_eq!(store.get_attempt_head(&head.attempt.id).await.unwrap(), head,
            "the rows returned are the rows stored, amounts included");
        let (order, attempt) = (head.order, head.attempt);

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
            async move { create_with_attempt(&store, &id, &new, &attempt).await }
        };
        let (a, b) = tokio::join!(create(store.mint_payment_id()), create(store.mint_payment_id()));
        let results = [&a, &b];
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{a:?} {b:?}");
        assert!(results.iter().any(|r| matches!(r, Err(StoreError::Conflict(_)))), "{a:?} {b:?}");
        assert_eq!(rows_of(store, &fx.merchant.id).await, (1, 1));
        let winner = &a.as_ref().or(b.as_ref()).unwrap().order;
        assert_eq!(store.timeline(&winner.id).await.unwrap().len(), 3);
    }
}

dual_test! {
    async fn a_payment_for_a_merchant_that_does_not_exist_creates_nothing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let id = store.mint_payment_id();
        let new = new_payment("mer_nobody", "GHOST-1", 500, CaptureMode::Automatic);
        let refused = create_with_attempt(store, &id, &new, &first_attempt(&id, &fx.account.id))
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
        let again = create_with_attempt(store, &id, &new, &first_attempt(&id, &fx.account.id))
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
        let refused = create_with_attempt(store, &id, &new, &first_attempt(&id, &victim.account.id))
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
        let refused = create_with_attempt(store, &id, &new, &first_attempt(&id, &fx.account.id))
            .await;
        assert!(matches!(refused, Err(StoreError::Unapplicable(_))), "{refused:?}");
        assert_eq!(rows_of(store, &fx.merchant.id).await, (0, 0));
    }
}

/// A payment created with `confirm` by `merchant_order_no`, as its rows stand.
async fn created(store: &Store, fx: &Fixture, merchant_order_no: &str) -> AttemptHead {
    let id = store.mint_payment_id();
    let new = new_payment(
        &fx.merchant.id,
        merchant_order_no,
        500,
        CaptureMode::Automatic,
    );
    create_with_attempt(store, &id, &new, &first_attempt(&id, &fx.account.id))
        .await
        .unwrap()
}

/// The record of the first send, decided from `known` rows when given.
async fn record_send(
    store: &Store,
    attempt: &AttemptHead,
    known: Option<&AttemptHead>,
) -> sluice_store::Applied {
    let submitted = event(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse);
    let sent = SentCall {
        pin: None,
        known: known.cloned(),
    };
    store
        .apply_sent(&on_attempt(&attempt.attempt, submitted), &sent)
        .await
        .unwrap()
}

dual_test! {
    async fn a_send_recorded_from_the_rows_its_create_wrote_is_decided_once_from_them(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let head = created(store, &fx, "KNOWN-1").await;

        let recorded = record_send(store, &head, Some(&head)).await;

        assert_eq!((recorded.decision, recorded.tries), (DecisionKind::Applied, 1), "{recorded:?}");
        let after = store.get_attempt_head(&head.attempt.id).await.unwrap();
        assert_eq!(after.attempt.state, AttemptState::Submitted);
        assert_eq!(after.order.version, head.order.version + 1);
    }
}

dual_test! {
    async fn a_send_recorded_from_rows_another_caller_moved_is_decided_again_from_the_stored_ones(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let head = created(store, &fx, "KNOWN-2").await;
        // Another caller records the same send first.
        let first = record_send(store, &head, None).await;
        assert_eq!(first.decision, DecisionKind::Applied);

        let late = record_send(store, &head, Some(&head)).await;

        assert_ne!(late.decision, DecisionKind::Applied, "only one caller owns the send: {late:?}");
        assert_eq!(late.tries, 2, "the stale rows cost one try, the next one read");
        let submitted = store.timeline(&head.order.id).await.unwrap().into_iter()
            .filter(|h| h.to_state == "SUBMITTED" && h.decision == "applied").count();
        assert_eq!(submitted, 1, "one record of the send");
    }
}

dual_test! {
    async fn rows_known_for_another_attempt_are_never_used_for_this_one(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let other = created(store, &fx, "KNOWN-3").await;
        let this = created(store, &fx, "KNOWN-4").await;

        let recorded = record_send(store, &this, Some(&other)).await;

        assert_eq!(recorded.decision, DecisionKind::Applied);
        assert_eq!(recorded.aggregate_id, this.attempt.id);
        let untouched = store.get_attempt_head(&other.attempt.id).await.unwrap();
        assert_eq!(untouched, other, "the other payment's rows did not move");
        let moved = store.get_attempt_head(&this.attempt.id).await.unwrap();
        assert_eq!(moved.attempt.state, AttemptState::Submitted);
    }
}

dual_test! {
    async fn the_rows_a_decision_about_an_attempt_leaves_are_the_rows_it_stored(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let head = created(store, &fx, "AFTER-1").await;
        let pin = sluice_store::AdapterPin { version: "1.2.0".into(), digest: "sha256:ccc".into() };
        let submitted = event(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse);
        let sent = SentCall { pin: Some(pin), known: Some(head.clone()) };
        db.clock.advance(10);
        let recorded = store.apply_sent(&on_attempt(&head.attempt, submitted), &sent).await.unwrap();
        let mut processing = event(EventKind::PaymentProcessing, EvidenceSource::SyncResponse);
        processing.psp_reference = Some("pi_AFTER1".into());
        let mut action = event(EventKind::CustomerActionRequired, EvidenceSource::Webhook);
        action.next_action_url = Some("https://psp.test/3ds/AFTER1".into());
        let mut steps = vec![recorded];
        for next in [processing, action, declined(EvidenceSource::Webhook)] {
            db.clock.advance(10);
            let known = steps.last().and_then(|applied| applied.after.clone());
            steps.push(store.apply_event_from(&on_attempt(&head.attempt, next), known.as_ref()).await.unwrap());
        }

        let stored = store.get_attempt_head(&head.attempt.id).await.unwrap();
        assert_eq!(stored.attempt.state, AttemptState::Failed);
        assert!(stored.attempt.adapter_pin.is_some() && stored.attempt.failure.is_some());
        assert!(stored.attempt.psp_reference.is_some() && stored.attempt.next_action_url.is_some());
        assert_eq!(steps.last().unwrap().after.as_ref(), Some(&stored), "the last decision's rows are the stored ones");
        for applied in &steps {
            assert_eq!((applied.decision, applied.tries), (DecisionKind::Applied, 1), "{applied:?}");
            let after = applied.after.as_ref().expect("nothing but the order and the attempt moved");
            assert_eq!(after.attempt.version, applied.aggregate_version);
            assert_eq!(after.order.version, applied.payment_version);
        }
    }
}

dual_test! {
    async fn a_decision_that_moves_money_leaves_the_amounts_it_stored(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let head = created(store, &fx, "AFTER-2").await;
        let recorded = record_send(store, &head, Some(&head)).await;
        let mut succeeded = event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse);
        succeeded.psp_reference = Some("pi_AFTER2".into());

        let applied = store.apply_event_from(&on_attempt(&head.attempt, succeeded), recorded.after.as_ref()).await.unwrap();

        assert_eq!((applied.decision, applied.tries), (DecisionKind::Applied, 1), "{applied:?}");
        let stored = store.get_attempt_head(&head.attempt.id).await.unwrap();
        assert_eq!((stored.amounts.authorized_minor, stored.amounts.captured_minor), (500, 500));
        assert_eq!(applied.after.as_ref(), Some(&stored), "the rows it left, amounts moved, are the stored ones");
    }
}

dual_test! {
    async fn a_decision_from_rows_an_earlier_decision_left_behind_is_taken_again_from_the_stored_ones(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let head = created(store, &fx, "AFTER-3").await;
        let recorded = record_send(store, &head, Some(&head)).await;
        let mut processing = event(EventKind::PaymentProcessing, EvidenceSource::Webhook);
        processing.psp_reference = Some("pi_AFTER3".into());
        store.apply_event(&on_attempt(&head.attempt, processing)).await.unwrap();

        // The answer to the send, decided from the rows the record left: stale.
        let late = event(EventKind::PaymentProcessing, EvidenceSource::SyncResponse);
        let applied = store.apply_event_from(&on_attempt(&head.attempt, late), recorded.after.as_ref()).await.unwrap();

        assert_eq!(applied.decision, DecisionKind::IgnoredDuplicate, "{applied:?}");
        assert_eq!(applied.tries, 2, "the stale rows cost one try");
        let stored = store.get_attempt_head(&head.attempt.id).await.unwrap();
        assert_eq!(stored.attempt.state, AttemptState::Processing);
        assert_eq!(stored.order.version, recorded.payment_version + 1, "nothing written from the stale rows");
    }
}

/// The record of a fresh attempt's first send, as the orchestrator makes it.
fn first_send(head: &AttemptHead, pin: &AdapterPin, next_look: i64) -> FirstSend {
    let submitted = event(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse);
    FirstSend {
        input: ApplyEvent {
            next_retry_time: Some(next_look),
            ..on_attempt(&head.attempt, submitted)
        },
        sent: SentCall {
            pin: Some(pin.clone()),
            known: None,
        },
    }
}

/// A create with `confirm` whose first send is recorded with it, through
/// `record`, which gets the rows the create is about to insert.
async fn create_sent(
    store: &Store,
    new: &NewPayment,
    attempt: impl FnOnce(&str) -> NewAttempt,
    record: impl FnOnce(&AttemptHead) -> FirstSend,
) -> Result<CreatedPayment, StoreError> {
    let id = store.mint_payment_id();
    let fresh = store.fresh_payment(&id, new, &attempt(&id)).await?;
    let head = fresh.head().expect("a plain start");
    let first = record(&head);
    store
        .create_payment_with_attempt(&fresh, &sys(), Some(&first))
        .await
}

/// An attempt's row without what names it, for comparing two payments.
fn unnamed(head: &AttemptHead) -> (sluice_store::PaymentAttempt, sluice_store::PaymentOrder) {
    let attempt = sluice_store::PaymentAttempt {
        id: String::new(),
        payment_id: String::new(),
        reference: String::new(),
        ..head.attempt.clone()
    };
    let order = sluice_store::PaymentOrder {
        id: String::new(),
        merchant_order_no: String::new(),
        ..head.order.clone()
    };
    (attempt, order)
}

dual_test! {
    async fn a_payment_created_with_its_first_send_recorded_has_the_rows_history_and_events_of_the_record_made_after_it(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let pin = AdapterPin { version: "1.2.0".into(), digest: "sha256:ccc".into() };
        // Apart: the create, then the record through the door, at one instant.
        let apart = created(store, &fx, "APART-1").await;
        let record = first_send(&apart, &pin, 31_000);
        let recorded = store.apply_sent(&record.input, &record.sent).await.unwrap();
        assert_eq!(recorded.decision, DecisionKind::Applied);
        let apart_rows = store.get_attempt_head(&apart.attempt.id).await.unwrap();

        let new = new_payment(&fx.merchant.id, "WITH-1", 500, CaptureMode::Automatic);
        let created = create_sent(store, &new, |id| first_attempt(id, &fx.account.id),
            |head| first_send(head, &pin, 31_000)).await.unwrap();

        let sent = created.sent.clone().expect("the record went with the create");
        let stored = store.get_attempt_head(&created.head.attempt.id).await.unwrap();
        assert_eq!(created.head, stored, "the rows returned are the rows stored");
        assert_eq!(sent.after.as_ref(), Some(&stored), "the record's rows are the stored ones");
        assert_eq!(stored.attempt.state, AttemptState::Submitted);
        assert_eq!(stored.attempt.adapter_pin.as_ref(), Some(&pin));
        assert_eq!(stored.attempt.last_psp_call_at, Some(stored.attempt.created_at));
        assert_eq!(unnamed(&stored), unnamed(&apart_rows), "the same rows as the two steps leave");
        assert_eq!(stored.amounts, apart_rows.amounts);
        assert_eq!(story(store, &stored.order.id).await, story(store, &apart.order.id).await);
        let (ours, theirs) = (&sent, &recorded);
        assert_eq!(
            (ours.from_state.as_str(), ours.to_state.as_str(), ours.aggregate_version, ours.payment_version, ours.order_state),
            (theirs.from_state.as_str(), theirs.to_state.as_str(), theirs.aggregate_version, theirs.payment_version, theirs.order_state)
        );
        let timeline = store.timeline(&stored.order.id).await.unwrap();
        let record_rows: Vec<i64> = timeline.iter().filter(|h| h.to_state == "SUBMITTED").map(|h| h.id).collect();
        assert_eq!(sent.history_ids, record_rows, "the record's history ids are its rows'");
        let events = |payment: String| async move {
            count(store, "SELECT COUNT(*) FROM outbox WHERE partition_key = $1", &payment).await
        };
        assert_eq!(events(stored.order.id.clone()).await, events(apart.order.id.clone()).await);
        assert_eq!(sent.outbox_event_ids.len() as i64, events(stored.order.id.clone()).await);
    }
}

dual_test! {
    async fn a_first_send_naming_another_payments_attempt_is_not_written_with_the_create_and_moves_nothing(&db) {
        let store = &db.store;
        let victim = Fixture::new(store, "Victim").await;
        let attacker = Fixture::new(store, "Attacker").await;
        let theirs = created(store, &victim, "THEIRS-1").await;
        let pin = AdapterPin { version: "1.2.0".into(), digest: "sha256:ccc".into() };

        let new = new_payment(&attacker.merchant.id, "MINE-1", 500, CaptureMode::Automatic);
        let created = create_sent(store, &new, |id| first_attempt(id, &attacker.account.id),
            |_| first_send(&theirs, &pin, 31_000)).await.unwrap();

        assert!(created.sent.is_none(), "a record names the fresh attempt or is not written: {:?}", created.sent);
        assert_eq!(created.head.attempt.state, AttemptState::Created);
        let stored = store.get_attempt_head(&created.head.attempt.id).await.unwrap();
        assert_eq!(created.head, stored);
        assert_eq!(store.get_attempt_head(&theirs.attempt.id).await.unwrap(), theirs,
            "the other merchant's payment did not move");
        assert_eq!(story(store, &theirs.order.id).await.len(), 3);
    }
}

dual_test! {
    async fn a_first_send_of_a_payment_whose_fulfillment_follows_it_is_recorded_through_the_door_instead(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let pin = AdapterPin { version: "1.2.0".into(), digest: "sha256:ccc".into() };
        let mut new = new_payment(&fx.merchant.id, "FULFIL-1", 500, CaptureMode::Automatic);
        new.fulfillment.mode = Some("push".into());
        new.fulfillment.biz_key = Some("order-FULFIL-1".into());
        new.fulfillment.deadline = Some(86_400_000);

        let created = create_sent(store, &new, |id| first_attempt(id, &fx.account.id),
            |head| first_send(head, &pin, 31_000)).await.unwrap();

        assert!(created.sent.is_none(), "its fulfillment moves in the same commit: the door's");
        assert_eq!(created.head.attempt.state, AttemptState::Created);
        let record = first_send(&created.head, &pin, 31_000);
        let sent = SentCall { known: Some(created.head.clone()), ..record.sent.clone() };
        let recorded = store.apply_sent(&record.input, &sent).await.unwrap();
        assert_eq!((recorded.decision, recorded.tries), (DecisionKind::Applied, 1), "{recorded:?}");
    }
}

dual_test! {
    async fn a_used_order_number_writes_neither_the_payment_nor_its_first_sends_record(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        fx.payment(store, "USED-2", 500, CaptureMode::Automatic).await;
        let before = rows_of(store, &fx.merchant.id).await;
        let pin = AdapterPin { version: "1.2.0".into(), digest: "sha256:ccc".into() };

        let new = new_payment(&fx.merchant.id, "USED-2", 500, CaptureMode::Automatic);
        let again = create_sent(store, &new, |id| first_attempt(id, &fx.account.id),
            |head| first_send(head, &pin, 31_000)).await;

        assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
        assert_eq!(rows_of(store, &fx.merchant.id).await, before);
        let records = count(store, "SELECT COUNT(*) FROM state_history WHERE to_state = $1", "SUBMITTED").await;
        assert_eq!(records, 0);
    }
}
