//! Signed merchant webhooks: signature, envelope, filters, per-payment order,
//! idempotent fan-out, lag gauges.

use crate::common::*;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use sluice_delivery::DeliveryMetrics;
use sluice_delivery::{deliveries_for_event, deliveries_for_payment, set_endpoint_enabled, Sink};

/// The merchant's side, written from the documentation, not with the crate's
/// own `verify`: HMAC-SHA256(secret, "{t}.{body}") in hex, any v1 may match.
fn merchant_verifies(secret: &str, header: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut v1 = Vec::new();
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = Some(value.to_owned()),
            Some(("v1", value)) => v1.push(value.to_owned()),
            _ => {}
        }
    }
    let Some(t) = t else { return false };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    let expected = hex::encode(mac.finalize().into_bytes());
    v1.contains(&expected)
}

dual_test! {
    async fn a_succeeded_payment_reaches_the_merchant_signed_with_the_endpoint_secret_and_its_stable_event_id(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        let endpoint = fx.endpoint(store, &merchant.url, &["*"]).await;
        assert!(endpoint.secret.starts_with("whsec_") && endpoint.secret.len() > 40);
        let payment = fx.succeeded(store, "WH-1", 1_250).await;
        let outbox = store.outbox_for_payment(&payment.id).await.unwrap();
        assert_eq!(outbox.len(), 1);

        let publisher = publisher(store, test_config());
        let report = publisher.publish_once().await.unwrap();
        assert_eq!((report.fanned_out, report.deliveries_created, report.webhook.delivered), (1, 1, 1));

        let received = merchant.received();
        assert_eq!(received.len(), 1);
        let request = &received[0];
        let signature = request.header("Sluice-Signature");
        assert!(merchant_verifies(&endpoint.secret, &signature, &request.body), "signature {signature} must verify");
        assert!(!merchant_verifies("whsec_wrong", &signature, &request.body));
        let mut tampered = request.body.to_vec();
        tampered[10] ^= 1;
        assert!(!merchant_verifies(&endpoint.secret, &signature, &tampered));
        let t: i64 = signature.trim_start_matches("t=").split(',').next().unwrap().parse().unwrap();
        assert_eq!(t, db.clock.now_ms() / 1000, "t is the send time in unix seconds");

        let event = &outbox[0];
        assert_eq!(request.event_id(), event.event_id);
        assert_eq!(request.header("content-type"), "application/json");
        let body = &request.json;
        assert_eq!(body["id"], event.event_id.as_str());
        assert_eq!(body["type"], "payment.succeeded");
        assert_eq!(body["created"], event.created_at / 1000);
        assert_eq!(body["payment_id"], payment.id.as_str());
        assert_eq!(body["payment_version"], event.payment_version);
        assert_eq!(body["data"], event.payload);
        assert_eq!(body["data"]["amount_minor"], 1_250);
        let keys: Vec<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 6, "exactly id, type, created, payment_id, payment_version, data: {keys:?}");

        let rows = deliveries_for_event(store, &event.event_id).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].status.as_str(), rows[0].attempts, rows[0].last_response_status), ("sent", 1, Some(200)));
        assert_eq!(request.header("Sluice-Delivery-Id"), rows[0].id);
        assert_eq!(store.outbox_for_payment(&payment.id).await.unwrap()[0].status, "sent");
        assert_eq!(DeliveryMetrics::count(&publisher.metrics().delivered, Sink::Webhook), 1);

        // Nothing left: a second pass sends nothing.
        let again = publisher.publish_once().await.unwrap();
        assert!(!again.did_work(), "{again:?}");
        assert_eq!(merchant.received().len(), 1);
    }
}

dual_test! {
    async fn events_reach_only_the_merchants_own_enabled_endpoints_whose_event_types_match(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let other = Fixture::new(store, "Other").await;
        let payments_hook = TestMerchant::start().await;
        let refunds_hook = TestMerchant::start().await;
        let disabled_hook = TestMerchant::start().await;
        let foreign_hook = TestMerchant::start().await;
        fx.endpoint(store, &payments_hook.url, &["payment.*"]).await;
        fx.endpoint(store, &refunds_hook.url, &["refund.succeeded", "refund.requested"]).await;
        let disabled = fx.endpoint(store, &disabled_hook.url, &["*"]).await;
        set_endpoint_enabled(store, &disabled.endpoint.id, false).await.unwrap();
        other.endpoint(store, &foreign_hook.url, &["*"]).await;

        fx.refunded(store, "WH-F").await;
        let publisher = publisher(store, test_config());
        while publisher.publish_once().await.unwrap().did_work() {}

        let types = |hook: &TestMerchant| -> Vec<String> {
            hook.received().iter().map(|r| r.json["type"].as_str().unwrap().to_owned()).collect()
        };
        assert_eq!(types(&payments_hook), vec!["payment.succeeded"]);
        assert_eq!(types(&refunds_hook), vec!["refund.requested", "refund.succeeded"]);
        assert!(disabled_hook.received().is_empty());
        assert!(foreign_hook.received().is_empty());
    }
}

dual_test! {
    async fn a_payments_events_reach_an_endpoint_in_version_order_even_when_the_first_must_be_retried(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        fx.endpoint(store, &merchant.url, &["*"]).await;
        let payment = fx.refunded(store, "WH-O").await;
        merchant.respond_with(503);

        let publisher = publisher(store, test_config());
        let first = publisher.publish_once().await.unwrap();
        assert_eq!(first.fanned_out, 3);
        assert_eq!(first.webhook.claimed, 1, "later events of the payment wait for the first: {first:?}");
        assert_eq!(first.webhook.retried, 1);
        let held = publisher.publish_once().await.unwrap();
        assert_eq!(held.webhook.claimed, 0, "the first is not due and the others stay behind it");

        merchant.respond_with(200);
        let rows = deliveries_for_payment(store, &payment.id).await.unwrap();
        db.clock.set(rows[0].next_attempt_at);
        while publisher.publish_once().await.unwrap().did_work() {}

        let received = merchant.received();
        let versions: Vec<i64> = received.iter().map(|r| r.json["payment_version"].as_i64().unwrap()).collect();
        let types: Vec<&str> = received.iter().map(|r| r.json["type"].as_str().unwrap()).collect();
        assert_eq!(types, vec!["payment.succeeded", "payment.succeeded", "refund.requested", "refund.succeeded"]);
        assert!(versions.windows(2).all(|w| w[0] <= w[1]), "versions in order: {versions:?}");
        assert!(versions[3] > versions[0]);
        let rows = deliveries_for_payment(store, &payment.id).await.unwrap();
        assert!(rows.iter().all(|d| d.status == "sent"), "{rows:?}");
    }
}

dual_test! {
    async fn order_yields_after_the_hold_attempts_so_one_refused_event_does_not_block_its_payment_for_days(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        fx.endpoint(store, &merchant.url, &["*"]).await;
        let payment = fx.refunded(store, "WH-P").await;
        merchant.fail_event_type("payment.succeeded", true);

        let config = sluice_delivery::PublisherConfig { order_hold_attempts: 2, ..test_config() };
        let publisher = publisher(store, config);
        let first = publisher.publish_once().await.unwrap();
        assert_eq!((first.webhook.claimed, first.webhook.retried), (1, 1));
        let poisoned = deliveries_for_payment(store, &payment.id).await.unwrap()[0].clone();
        db.clock.set(poisoned.next_attempt_at);
        let second = publisher.publish_once().await.unwrap();
        assert_eq!((second.webhook.claimed, second.webhook.retried), (1, 1), "still held on the 2nd try");
        // Two tries spent: the later events no longer wait for it.
        let third = publisher.publish_once().await.unwrap();
        assert_eq!(third.webhook.delivered, 1, "{third:?}");
        publisher.publish_once().await.unwrap();
        let statuses: Vec<(String, String)> = deliveries_for_payment(store, &payment.id)
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.status, d.last_error.unwrap_or_default()))
            .collect();
        assert_eq!(statuses[0], ("pending".to_owned(), "endpoint answered HTTP 500".to_owned()));
        assert_eq!(statuses[1].0, "sent");
        assert_eq!(statuses[2].0, "sent");
    }
}

dual_test! {
    async fn fanning_out_the_same_event_twice_creates_its_deliveries_once(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        fx.endpoint(store, &merchant.url, &["*"]).await;
        fx.endpoint(store, &format!("{}?second", merchant.url), &["*"]).await;
        fx.succeeded(store, "WH-I", 100).await;
        let claimed = store.outbox_claim(10, 30_000).await.unwrap();
        assert_eq!(claimed.len(), 1);

        let publisher = publisher(store, test_config());
        assert_eq!(publisher.fan_out(&claimed[0]).await.unwrap(), 2);
        // A publisher that crashed before learning its fan-out committed runs it again.
        assert_eq!(publisher.fan_out(&claimed[0]).await.unwrap(), 0);
        assert_eq!(deliveries_for_event(store, &claimed[0].event_id).await.unwrap().len(), 2);
        assert_eq!(count(store, "SELECT COUNT(*) FROM outbox WHERE status = $1", "sent").await, 1);
        while publisher.publish_once().await.unwrap().did_work() {}
        assert_eq!(merchant.received().len(), 2, "one per endpoint");
    }
}

dual_test! {
    async fn one_pass_fans_out_two_merchants_events_each_to_its_own_merchants_endpoints_only(&db) {
        let store = &db.store;
        let (acme, globex) = (Fixture::new(store, "Acme").await, Fixture::new(store, "Globex").await);
        let receiver = TestMerchant::start().await;
        let acme_endpoint = acme.endpoint(store, &format!("{}?acme", receiver.url), &["*"]).await;
        let globex_endpoint = globex.endpoint(store, &format!("{}?globex", receiver.url), &["*"]).await;
        let acme_payment = acme.refunded(store, "WH-B1").await;
        let globex_payment = globex.succeeded(store, "WH-B2", 100).await;

        let publisher = publisher(store, test_config());
        let (fanned, created) = publisher.fan_out_once().await.unwrap();

        assert_eq!((fanned, created), (4, 4), "one pass, one delivery per event");
        assert_eq!(count(store, "SELECT COUNT(*) FROM outbox WHERE status = $1", "sent").await, 4);
        for (payment, own) in [(&acme_payment, &acme_endpoint), (&globex_payment, &globex_endpoint)] {
            let targets: Vec<String> = deliveries_for_payment(store, &payment.id).await.unwrap()
                .into_iter().map(|d| d.target).collect();
            assert!(!targets.is_empty() && targets.iter().all(|t| *t == own.endpoint.id),
                "{} went only to its merchant's endpoint: {targets:?}", payment.id);
        }
        assert_eq!(publisher.fan_out_once().await.unwrap(), (0, 0), "nothing left to fan out");
    }
}

dual_test! {
    async fn the_lag_gauges_report_the_age_of_the_oldest_event_not_yet_delivered(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        merchant.respond_with(500);
        fx.endpoint(store, &merchant.url, &["*"]).await;
        fx.succeeded(store, "WH-L", 100).await;
        let publisher = publisher(store, test_config());
        db.clock.advance(7_000);
        publisher.update_lag().await.unwrap();
        let metrics = publisher.metrics();
        assert_eq!(metrics.outbox_lag_seconds.get(), 7.0);

        publisher.publish_once().await.unwrap();
        assert_eq!(metrics.outbox_lag_seconds.get(), 0.0, "fanned out");
        let lag = metrics.delivery_lag_seconds.with_label_values(&["webhook"]).get();
        assert_eq!(lag, 7.0, "the delivery is still pending");
        db.clock.advance(60_000);
        merchant.respond_with(200);
        publisher.publish_once().await.unwrap();
        assert_eq!(metrics.delivery_lag_seconds.with_label_values(&["webhook"]).get(), 0.0);
        assert_eq!(DeliveryMetrics::count(&metrics.retried, Sink::Webhook), 1);
        assert_eq!(DeliveryMetrics::count(&metrics.delivered, Sink::Webhook), 1);
    }
}

dual_test! {
    async fn a_later_event_fanned_out_first_by_another_instance_waits_for_the_earlier_one(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        fx.endpoint(store, &merchant.url, &["*"]).await;
        let payment = fx.refunded(store, "WH-X").await;
        let claimed = store.outbox_claim(10, 30_000).await.unwrap();
        assert_eq!(claimed.len(), 3);
        let publisher = publisher(store, test_config());
        // Instance B fans out the last event while instance A still holds the first two.
        publisher.fan_out(&claimed[2]).await.unwrap();
        let report = publisher.publish_once().await.unwrap();
        assert_eq!(report.webhook.claimed, 0, "refund.succeeded waits for the events before it: {report:?}");
        assert!(merchant.received().is_empty());

        publisher.fan_out(&claimed[0]).await.unwrap();
        publisher.fan_out(&claimed[1]).await.unwrap();
        while publisher.publish_once().await.unwrap().did_work() {}
        let types: Vec<String> = merchant.received().iter().map(|r| r.json["type"].as_str().unwrap().to_owned()).collect();
        assert_eq!(types, vec!["payment.succeeded", "refund.requested", "refund.succeeded"]);
        assert_eq!(deliveries_for_payment(store, &payment.id).await.unwrap().len(), 3);
    }
}

/// On PostgreSQL a fan-out's transaction commits without waiting for the WAL flush
/// (`synchronous_commit` off until its end). That must end with it: a pooled connection
/// that kept it would commit the next money write lazily too. One connection, so every
/// statement runs where the check looks.
#[tokio::test]
async fn on_postgres_a_fan_outs_lazy_commit_never_outlives_its_own_transaction() {
    let base = sluice_store::StoreOptions {
        max_connections: 1,
        ..sluice_store::StoreOptions::default()
    };
    let db: TestDb = TestDb::open_with(sluice_store::Backend::Postgres, base).await;
    let store = &db.store;
    let fx = Fixture::new(store, "Acme").await;
    let merchant = TestMerchant::start().await;
    fx.endpoint(store, &merchant.url, &["*"]).await;
    fx.succeeded(store, "WH-LAZY", 100).await;
    let claimed = store.outbox_claim(10, 30_000).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let publisher = publisher(store, test_config());
    assert_eq!(publisher.fan_out(&claimed[0]).await.unwrap(), 1);
    let setting: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(setting, "on", "after the fan-out committed");
    assert_eq!(
        count(
            store,
            "SELECT COUNT(*) FROM outbox WHERE status = $1",
            "sent"
        )
        .await,
        1
    );
    while publisher.publish_once().await.unwrap().did_work() {}
    assert_eq!(merchant.received().len(), 1, "its delivery is sent");
}
