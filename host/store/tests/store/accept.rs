//! A verified webhook kept in one commit: its sealed body and its events'
//! inbox rows (`Store::accept_webhook`), on both backends.

use crate::common::*;
use sluice_store::{AcceptedWebhook, InboxInsert, NewInboxEvent};

const BODY: &[u8] = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;

fn event_of(account: &str, provider_event_id: &str) -> NewInboxEvent {
    NewInboxEvent {
        adapter: "stripe".into(),
        connector_account_id: account.to_owned(),
        provider_event_id: provider_event_id.to_owned(),
        payload_digest: "d1".into(),
        event: serde_json::json!({"kind": "payment_succeeded"}),
        raw_body_id: None,
    }
}

fn webhook<'a>(
    account: &'a str,
    digest: &'a str,
    body: &'a [u8],
    ids: &[&str],
) -> AcceptedWebhook<'a> {
    AcceptedWebhook {
        connector_account_id: account,
        payload_digest: digest,
        body,
        events: ids.iter().map(|id| event_of(account, id)).collect(),
    }
}

fn inserted(outcome: &InboxInsert) -> &str {
    match outcome {
        InboxInsert::Inserted { id } => id,
        InboxInsert::Duplicate { .. } => panic!("expected a new inbox row, got {outcome:?}"),
    }
}

dual_test! {
    async fn a_verified_webhook_keeps_its_body_and_queues_its_event_naming_it(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let account = fx.account.id.as_str();

        let (body_id, outcomes) = store.accept_webhook(webhook(account, "d1", BODY, &["evt_1"])).await.unwrap();

        assert_eq!(outcomes.len(), 1);
        let entry = store.inbox_get(inserted(&outcomes[0])).await.unwrap();
        assert_eq!(entry.raw_body_id.as_deref(), Some(body_id.as_str()));
        assert_eq!((entry.status.as_str(), entry.provider_event_id.as_deref()), ("pending", Some("evt_1")));
        assert_eq!(store.inbox_raw_body(&entry.id).await.unwrap().as_deref(), Some(BODY), "the body opens as it came");
    }
}

dual_test! {
    async fn the_same_webhook_again_is_a_duplicate_and_writes_nothing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let account = fx.account.id.as_str();
        let (body_id, first) = store.accept_webhook(webhook(account, "d1", BODY, &["evt_1"])).await.unwrap();
        let bodies = count(store, "SELECT COUNT(*) FROM webhook_bodies WHERE connector_account_id = $1", account).await;

        let (again_body, again) = store.accept_webhook(webhook(account, "d1", BODY, &["evt_1"])).await.unwrap();

        assert_eq!(again_body, body_id, "the body is kept once per account and digest");
        let first_id = inserted(&first[0]).to_owned();
        assert_eq!(again, vec![InboxInsert::Duplicate { id: first_id, status: "pending".into() }]);
        assert_eq!(count(store, "SELECT COUNT(*) FROM webhook_bodies WHERE connector_account_id = $1", account).await, bodies);
        assert_eq!(count(store, "SELECT COUNT(*) FROM webhook_inbox WHERE connector_account_id = $1", account).await, 1);
    }
}

dual_test! {
    async fn a_redelivery_with_another_body_keeps_that_body_but_does_not_queue_the_event_again(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let account = fx.account.id.as_str();
        store.accept_webhook(webhook(account, "d1", BODY, &["evt_1"])).await.unwrap();

        let other = br#"{"id":"evt_1","type":"payment_intent.succeeded","attempt":2}"#;
        let (body_id, again) = store.accept_webhook(webhook(account, "d2", other, &["evt_1"])).await.unwrap();

        assert!(matches!(&again[0], InboxInsert::Duplicate { .. }), "{again:?}");
        assert_eq!(count(store, "SELECT COUNT(*) FROM webhook_bodies WHERE id = $1", &body_id).await, 1, "the second body is evidence too");
        assert_eq!(count(store, "SELECT COUNT(*) FROM webhook_inbox WHERE connector_account_id = $1", account).await, 1);
    }
}

dual_test! {
    async fn every_event_of_a_webhook_is_queued_with_the_one_body(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let account = fx.account.id.as_str();

        let (body_id, outcomes) = store
            .accept_webhook(webhook(account, "d1", BODY, &["evt_1", "evt_1#1", "evt_2"]))
            .await
            .unwrap();

        assert_eq!(outcomes.len(), 3);
        for outcome in &outcomes {
            let entry = store.inbox_get(inserted(outcome)).await.unwrap();
            assert_eq!(entry.raw_body_id.as_deref(), Some(body_id.as_str()));
        }
    }
}

dual_test! {
    async fn another_account_posting_the_same_body_and_event_id_gets_its_own_rows(&db) {
        let store = &db.store;
        let victim = Fixture::new(store, "Victim").await;
        let attacker = Fixture::new(store, "Attacker").await;
        let (victim_body, victim_rows) = store
            .accept_webhook(webhook(&victim.account.id, "d1", BODY, &["evt_1"]))
            .await
            .unwrap();

        let (body_id, outcomes) = store
            .accept_webhook(webhook(&attacker.account.id, "d1", BODY, &["evt_1"]))
            .await
            .unwrap();

        assert_ne!(body_id, victim_body, "a body is never shared across accounts");
        let entry = store.inbox_get(inserted(&outcomes[0])).await.unwrap();
        assert_eq!(entry.connector_account_id, attacker.account.id);
        assert_eq!(entry.raw_body_id.as_deref(), Some(body_id.as_str()));
        let victim_entry = store.inbox_get(inserted(&victim_rows[0])).await.unwrap();
        assert_eq!(victim_entry.raw_body_id.as_deref(), Some(victim_body.as_str()), "the victim's row is untouched");
    }
}

/// PostgreSQL's one-statement path cannot see a body that a concurrent
/// transaction is inserting: its insert waits for that transaction, then
/// finds the body kept but not in its snapshot. It must neither queue the
/// event without its body nor lose it.
#[tokio::test]
async fn on_postgres_a_body_kept_by_a_concurrent_transaction_is_found_and_the_event_names_it() {
    let db: sluice_test_support::TestDb =
        sluice_test_support::TestDb::open(sluice_store::Backend::Postgres).await;
    let store = db.store.clone();
    let fx = Fixture::new(&store, "Acme").await;
    let account = fx.account.id.clone();
    let other = hold_body(&store, &account, "whb_concurrent", "d1").await;

    let accepting = {
        let (store, account) = (store.clone(), account.clone());
        tokio::spawn(async move {
            store
                .accept_webhook(webhook(&account, "d1", BODY, &["evt_1"]))
                .await
        })
    };
    sluice_test_support::eventually(
        std::time::Duration::from_secs(10),
        "the insert to wait on the other transaction",
        || {
            let store = store.clone();
            async move {
                let waiting = count(
                    &store,
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE $1",
                    "WITH input%",
                )
                .await;
                (waiting == 1).then_some(())
            }
        },
    )
    .await;
    other.commit().await.unwrap();

    let (body_id, outcomes) = accepting.await.unwrap().unwrap();
    assert_eq!(body_id, "whb_concurrent");
    let entry = store.inbox_get(inserted(&outcomes[0])).await.unwrap();
    assert_eq!(
        entry.raw_body_id.as_deref(),
        Some("whb_concurrent"),
        "the event names the body kept"
    );
    assert_eq!(inbox_rows(&store, &account).await, 1);
}

/// Sends `webhooks` at once (each its own task, so on PostgreSQL those that
/// arrive while the group commit's statements are busy share the next one).
async fn accept_all(
    store: &sluice_store::Store,
    webhooks: Vec<(String, String, Vec<u8>, String)>,
) -> Vec<(String, InboxInsert)> {
    let tasks: Vec<_> = webhooks
        .into_iter()
        .map(|(account, digest, body, event_id)| {
            let store = store.clone();
            tokio::spawn(async move {
                let (body_id, mut outcomes) = store
                    .accept_webhook(webhook(&account, &digest, &body, &[event_id.as_str()]))
                    .await
                    .unwrap();
                (body_id, outcomes.remove(0))
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

dual_test! {
    async fn webhooks_accepted_at_once_each_keep_their_body_and_their_event_exactly_once(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let account = fx.account.id.clone();
        let mut webhooks = Vec::new();
        for n in 0..40 {
            webhooks.push((account.clone(), format!("d{n}"), format!("body {n}").into_bytes(), format!("evt_{n}")));
        }
        // The same delivery three times, and one event id in two bodies.
        for _ in 0..3 {
            webhooks.push((account.clone(), "same".into(), b"same body".to_vec(), "evt_same".into()));
        }
        webhooks.push((account.clone(), "first".into(), b"first body".to_vec(), "evt_twice".into()));
        webhooks.push((account.clone(), "second".into(), b"second body".to_vec(), "evt_twice".into()));

        let answers = accept_all(store, webhooks).await;

        for (n, (body_id, outcome)) in answers.iter().take(40).enumerate() {
            let entry = store.inbox_get(inserted(outcome)).await.unwrap();
            assert_eq!(entry.provider_event_id.as_deref(), Some(format!("evt_{n}").as_str()));
            assert_eq!(entry.raw_body_id.as_deref(), Some(body_id.as_str()));
            assert_eq!(store.inbox_raw_body(&entry.id).await.unwrap(), Some(format!("body {n}").into_bytes()));
        }
        let same = &answers[40..43];
        assert!(same.iter().all(|(body, _)| *body == same[0].0), "one body for one delivery: {same:?}");
        let first_rows: Vec<_> = same.iter().filter(|(_, o)| matches!(o, InboxInsert::Inserted { .. })).collect();
        assert_eq!(first_rows.len(), 1, "queued once: {same:?}");
        let queued = inserted(&first_rows[0].1);
        for (_, outcome) in same {
            if let InboxInsert::Duplicate { id, .. } = outcome {
                assert_eq!(id, queued, "a duplicate names the row queued");
            }
        }
        let twice = &answers[43..];
        assert_ne!(twice[0].0, twice[1].0, "each body is evidence");
        assert_eq!(twice.iter().filter(|(_, o)| matches!(o, InboxInsert::Inserted { .. })).count(), 1, "{twice:?}");
        assert_eq!(count(store, "SELECT COUNT(*) FROM webhook_inbox WHERE connector_account_id = $1", &account).await, 42);
        assert_eq!(count(store, "SELECT COUNT(*) FROM webhook_bodies WHERE connector_account_id = $1", &account).await, 43);
    }
}

async fn inbox_rows(store: &sluice_store::Store, account: &str) -> i64 {
    count(
        store,
        "SELECT COUNT(*) FROM webhook_inbox WHERE connector_account_id = $1",
        account,
    )
    .await
}

/// Holds a body insert of `digest` open in a transaction of its own, so a
/// statement keeping the same body waits for it.
async fn hold_body<'a>(
    store: &'a sluice_store::Store,
    account: &str,
    id: &str,
    digest: &str,
) -> sqlx::Transaction<'a, sqlx::Any> {
    let context = sluice_store::secrets::secret_context("webhook_bodies", "sealed_body", id);
    let sealed = store.seal_secret(&context, BODY).unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(
        "INSERT INTO webhook_bodies (id, connector_account_id, payload_digest, sealed_body, received_at) \
         VALUES ($1, $2, $3, $4, 0)",
    )
    .bind(id)
    .bind(account)
    .bind(digest)
    .bind(&sealed)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

/// Waits until a statement keeping webhooks waits on a lock with exactly
/// `rows` webhooks in it (8 parameters each, after the one for the time).
async fn batch_waiting(store: &sluice_store::Store, rows: usize) {
    let last = format!("%${})%", 1 + 8 * rows);
    let beyond = format!("%${}%", 2 + 8 * rows);
    sluice_test_support::eventually(
        std::time::Duration::from_secs(10),
        "a webhook statement waiting on a lock",
        || {
            let (store, last, beyond) = (store.clone(), last.clone(), beyond.clone());
            async move {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND wait_event_type = 'Lock' AND query LIKE 'WITH input%' \
                     AND query LIKE $1 AND query NOT LIKE $2",
                )
                .bind(last)
                .bind(beyond)
                .fetch_one(store.pool())
                .await
                .unwrap();
                (waiting == 1).then_some(())
            }
        },
    )
    .await;
}

/// The group commit on PostgreSQL: with one statement allowed at a time,
/// the ten webhooks that arrive while it waits are kept by the next
/// statement together, and each of them, the two whose bodies a concurrent
/// transaction held included, ends up queued once, naming its body.
#[tokio::test]
async fn on_postgres_webhooks_that_arrive_while_the_statement_is_busy_share_the_next_one() {
    let db: sluice_test_support::TestDb =
        sluice_test_support::TestDb::open(sluice_store::Backend::Postgres).await;
    let options = sluice_store::StoreOptions {
        ingest_group: sluice_store::group_commit::GroupLimits {
            max_batch: 64,
            max_in_flight: 1,
        },
        ..db.options()
    };
    let store = db.store_with(options).await;
    let fx = Fixture::new(&store, "Acme").await;
    let account = fx.account.id.clone();
    let first_hold = hold_body(&store, &account, "whb_held_1", "held_1").await;
    let second_hold = hold_body(&store, &account, "whb_held_2", "held_2").await;

    let lead = {
        let (store, account) = (store.clone(), account.clone());
        tokio::spawn(async move {
            accept_all(
                &store,
                vec![(account, "held_1".into(), BODY.to_vec(), "evt_held_1".into())],
            )
            .await
        })
    };
    batch_waiting(&store, 1).await;
    let mut later: Vec<_> = (0..9)
        .map(|n| {
            (
                account.clone(),
                format!("d{n}"),
                format!("body {n}").into_bytes(),
                format!("evt_{n}"),
            )
        })
        .collect();
    later.push((
        account.clone(),
        "held_2".into(),
        BODY.to_vec(),
        "evt_held_2".into(),
    ));
    let queued = {
        let store = store.clone();
        tokio::spawn(async move { accept_all(&store, later).await })
    };
    // Let the ten reach the queue (a current-thread runtime runs every task
    // spawned before the test's task again).
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    first_hold.commit().await.unwrap();
    batch_waiting(&store, 10).await;
    second_hold.commit().await.unwrap();

    let mut answers = lead.await.unwrap();
    answers.extend(queued.await.unwrap());
    let expected_bodies: Vec<Option<&str>> = std::iter::once(Some("whb_held_1"))
        .chain((0..9).map(|_| None))
        .chain(std::iter::once(Some("whb_held_2")))
        .collect();
    for ((body_id, outcome), expected) in answers.iter().zip(expected_bodies) {
        let entry = store.inbox_get(inserted(outcome)).await.unwrap();
        assert_eq!(entry.raw_body_id.as_deref(), Some(body_id.as_str()));
        if let Some(held) = expected {
            assert_eq!(
                body_id, held,
                "the event names the body the other transaction kept"
            );
        }
    }
    assert_eq!(inbox_rows(&store, &account).await, 11);
}

dual_test! {
    async fn two_accounts_sending_the_same_body_and_event_id_at_once_each_get_their_own_rows(&db) {
        let store = &db.store;
        let victim = Fixture::new(store, "Victim").await.account.id;
        let attacker = Fixture::new(store, "Attacker").await.account.id;
        // Interleaved, so that on PostgreSQL both accounts' webhooks share batches.
        let mut webhooks = Vec::new();
        for n in 0..10 {
            for account in [&victim, &attacker] {
                webhooks.push((account.clone(), format!("d{n}"), format!("body {n}").into_bytes(), format!("evt_{n}")));
            }
        }

        let answers = accept_all(store, webhooks.clone()).await;

        for ((account, _, _, event_id), (body_id, outcome)) in webhooks.iter().zip(&answers) {
            let entry = store.inbox_get(inserted(outcome)).await.unwrap();
            assert_eq!(&entry.connector_account_id, account, "the row is its own account's");
            assert_eq!(entry.provider_event_id.as_deref(), Some(event_id.as_str()));
            assert_eq!(entry.raw_body_id.as_deref(), Some(body_id.as_str()));
        }
        let bodies: std::collections::BTreeSet<_> = answers.iter().map(|(body, _)| body).collect();
        assert_eq!(bodies.len(), 20, "a body is never shared across accounts");
        for account in [&victim, &attacker] {
            assert_eq!(inbox_rows(store, account).await, 10);
            let own_bodies = count(
                store,
                "SELECT COUNT(*) FROM webhook_inbox i JOIN webhook_bodies b ON b.id = i.raw_body_id \
                 WHERE i.connector_account_id = $1 AND b.connector_account_id = i.connector_account_id",
                account,
            )
            .await;
            assert_eq!(own_bodies, 10, "each row names a body of its own account");
        }
    }
}
