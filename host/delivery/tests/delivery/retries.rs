//! The redelivery schedule, dead letters and replay.

use crate::common::*;
use sluice_core::recovery::{outbox_retry_delay, OutboxRetryPolicy};
use sluice_delivery::{
    deliveries_for_payment, get_delivery, list_dead, replay_dead_letter, DeliveryError,
    DeliveryMetrics, PublisherConfig, PublisherHooks, Sink,
};
use std::sync::Arc;

const THREE_DAYS_MS: i64 = 3 * 24 * 3_600_000;

#[test]
fn the_production_publisher_uses_the_cores_schedule_which_spans_more_than_three_days() {
    let policy = PublisherConfig::default().retry_policy;
    assert_eq!(policy, OutboxRetryPolicy::default());
    for attempt in 1..30u32 {
        for jitter in [0.0, 0.5, 0.999] {
            assert_eq!(
                policy.delay(attempt, jitter),
                outbox_retry_delay(attempt, jitter)
            );
        }
    }
    assert!(
        policy.total_span_ms(0.0) > THREE_DAYS_MS,
        "{} ms",
        policy.total_span_ms(0.0)
    );
}

dual_test! {
    async fn a_failing_endpoint_is_retried_on_the_production_schedule_for_over_three_days_then_dead_lettered_and_replayable(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        merchant.respond_with(503);
        fx.endpoint(store, &merchant.url, &["*"]).await;
        let payment = fx.succeeded(store, "RT-1", 100).await;
        let hooks = PublisherHooks { jitter: Some(Arc::new(|| 0.5)), ..PublisherHooks::default() };
        let publisher = publisher_with_hooks(store, test_config(), hooks);

        let policy = OutboxRetryPolicy::default();
        let mut send_times = Vec::new();
        loop {
            send_times.push(db.clock.now_ms());
            let report = publisher.publish_once().await.unwrap();
            assert_eq!(report.webhook.claimed, 1, "due exactly when scheduled (try {})", send_times.len());
            let delivery = deliveries_for_payment(store, &payment.id).await.unwrap().remove(0);
            if delivery.status == "dead" {
                break;
            }
            assert_eq!(delivery.status, "pending");
            let waited = delivery.next_attempt_at - db.clock.now_ms();
            let attempt = u32::try_from(delivery.attempts).unwrap();
            assert_eq!(Some(waited), outbox_retry_delay(attempt, 0.5), "try {attempt}");
            // Not a moment early.
            db.clock.set(delivery.next_attempt_at - 1);
            assert_eq!(publisher.publish_once().await.unwrap().webhook.claimed, 0);
            db.clock.set(delivery.next_attempt_at);
        }
        let tries = send_times.len();
        assert_eq!(tries, policy.max_deliveries as usize);
        assert_eq!(merchant.received().len(), tries, "one HTTP request per try");
        let span = send_times[tries - 1] - send_times[0];
        assert!(span > THREE_DAYS_MS, "retried over {} h", span / 3_600_000);
        assert!(merchant.event_ids().iter().all(|id| *id == merchant.event_ids()[0]), "same event id on every try");

        let dead = list_dead(store, 10).await.unwrap();
        assert_eq!(dead.len(), 1);
        let dead = &dead[0];
        assert_eq!((dead.status.as_str(), dead.attempts), ("dead", tries as i64));
        assert_eq!(dead.last_error.as_deref(), Some("endpoint answered HTTP 503"));
        assert_eq!(dead.last_response_status, Some(503));
        assert!(dead.dead_at.is_some());
        let metrics = publisher.metrics();
        assert_eq!(DeliveryMetrics::count(&metrics.retried, Sink::Webhook), tries as u64 - 1);
        assert_eq!(DeliveryMetrics::count(&metrics.dead_lettered, Sink::Webhook), 1);
        db.clock.advance(THREE_DAYS_MS);
        assert!(!publisher.publish_once().await.unwrap().did_work(), "dead stays dead");

        // The merchant fixed its endpoint; the operator replays.
        merchant.respond_with(200);
        let replayed = replay_dead_letter(store, &dead.id).await.unwrap();
        assert_eq!((replayed.status.as_str(), replayed.attempts, replayed.replays), ("pending", 0, 1));
        assert!(list_dead(store, 10).await.unwrap().is_empty());
        let again = replay_dead_letter(store, &dead.id).await;
        assert!(matches!(again, Err(DeliveryError::InvalidState { .. })), "{again:?}");
        let report = publisher.publish_once().await.unwrap();
        assert_eq!(report.webhook.delivered, 1);
        let delivered = get_delivery(store, &dead.id).await.unwrap();
        assert_eq!((delivered.status.as_str(), delivered.last_response_status), ("sent", Some(200)));
        assert_eq!(merchant.received().len(), tries + 1);
        assert_eq!(merchant.event_ids()[tries], merchant.event_ids()[0], "the replay carries the same event id");

        let missing = replay_dead_letter(store, "dlv_missing").await;
        assert!(matches!(missing, Err(DeliveryError::NotFound { .. })), "{missing:?}");
        let sent = replay_dead_letter(store, &dead.id).await;
        assert!(matches!(sent, Err(DeliveryError::InvalidState { .. })), "a sent delivery is not replayed: {sent:?}");
    }
}

dual_test! {
    async fn an_unreachable_endpoint_is_a_failed_try_with_the_transport_error_recorded(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let port = closed_port().await;
        fx.endpoint(store, &format!("http://127.0.0.1:{port}/hooks?token=secret-in-url"), &["*"]).await;
        let payment = fx.succeeded(store, "RT-2", 100).await;
        let short = PublisherConfig {
            retry_policy: OutboxRetryPolicy { first_delay_ms: 10, max_delay_ms: 10, max_deliveries: 2 },
            ..test_config()
        };
        let publisher = publisher(store, short);
        let first = publisher.publish_once().await.unwrap();
        assert_eq!(first.webhook.retried, 1);
        let delivery = deliveries_for_payment(store, &payment.id).await.unwrap().remove(0);
        let error = delivery.last_error.clone().unwrap();
        assert!(error.starts_with("could not connect"), "{error}");
        assert!(!error.contains("secret-in-url"), "the URL never reaches the error: {error}");
        assert_eq!(delivery.last_response_status, None);
        db.clock.advance(1_000);
        let second = publisher.publish_once().await.unwrap();
        assert_eq!(second.webhook.dead_lettered, 1, "a short test schedule of two tries: {second:?}");
    }
}
