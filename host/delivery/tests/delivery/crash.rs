//! A publisher that dies after sending and before marking: the event is sent
//! again once the lease runs out, with the same event id, and nothing is lost.

use crate::common::*;
use sluice_delivery::{
    deliveries_for_event, DeliveryError, DeliveryMetrics, HookAction, PublisherConfig,
    PublisherHooks, SentDelivery, Sink,
};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A hook that crashes the publisher after the first successful send to `sink`.
fn crash_once_after(sink: Sink) -> (PublisherHooks, Arc<AtomicBool>) {
    let crashed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&crashed);
    let hook = move |sent: &SentDelivery| {
        if sent.sink == sink && !flag.swap(true, Ordering::SeqCst) {
            HookAction::Crash
        } else {
            HookAction::Continue
        }
    };
    let hooks = PublisherHooks {
        after_send: Some(Arc::new(hook)),
        ..PublisherHooks::default()
    };
    (hooks, crashed)
}

dual_test! {
    async fn a_crash_after_the_http_send_and_before_the_mark_resends_the_same_event_id_after_the_lease(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        fx.endpoint(store, &merchant.url, &["*"]).await;
        fx.succeeded(store, "CR-1", 100).await;
        fx.succeeded(store, "CR-2", 200).await;
        let (hooks, crashed) = crash_once_after(Sink::Webhook);
        let config = PublisherConfig { max_in_flight: 1, ..test_config() };
        let doomed = publisher_with_hooks(store, config, hooks);

        let died = doomed.publish_once().await;
        assert!(matches!(died, Err(DeliveryError::SimulatedCrash { .. })), "{died:?}");
        assert!(crashed.load(Ordering::SeqCst));
        let first_sent = merchant.event_ids();
        assert_eq!(first_sent.len(), 1, "the merchant got the event before the crash");

        // The restarted instance: the dead one's claims hold until their lease ends.
        let restarted = publisher(store, test_config());
        let early = restarted.publish_once().await.unwrap();
        assert_eq!(early.webhook.claimed, 0, "leased deliveries are not sent twice at once: {early:?}");
        db.clock.advance(TEST_LEASE_MS + 1);
        while restarted.publish_once().await.unwrap().did_work() {}

        let ids = merchant.event_ids();
        let unique: HashSet<&String> = ids.iter().collect();
        let events = outbox_event_ids(store).await;
        assert_eq!(unique.len(), events.len(), "every event arrived: {ids:?}");
        assert!(events.iter().all(|id| unique.contains(id)));
        let duplicates = ids.len() - unique.len();
        assert_eq!(duplicates, 1, "exactly the crashed send is seen twice");
        assert_eq!(ids.iter().filter(|id| **id == first_sent[0]).count(), 2, "the resend carries the same event id");
        for event_id in &events {
            let rows = deliveries_for_event(store, event_id).await.unwrap();
            assert!(rows.iter().all(|d| d.status == "sent"), "{rows:?}");
        }
        println!("crash test: events={} requests={} duplicates={duplicates}", events.len(), ids.len());
    }
}

dual_test! {
    async fn the_same_event_published_twice_is_one_message_in_the_stream_because_jetstream_dedupes_on_nats_msg_id(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        fx.succeeded(store, "CR-N", 100).await;
        let stream = TestStream::new().await;
        let config = PublisherConfig { nats: Some(stream.config.clone()), ..test_config() };
        let (hooks, _) = crash_once_after(Sink::Nats);
        let doomed = publisher_with_hooks(store, config.clone(), hooks);
        let died = doomed.publish_once().await;
        assert!(matches!(died, Err(DeliveryError::SimulatedCrash { .. })), "{died:?}");
        assert_eq!(stream.message_count().await, 1, "published and acknowledged before the crash");

        db.clock.advance(TEST_LEASE_MS + 1);
        let restarted = publisher(store, config);
        let report = restarted.publish_once().await.unwrap();
        let nats = report.nats.unwrap();
        assert_eq!((nats.delivered, nats.duplicates), (1, 1), "JetStream acknowledged the resend as a duplicate");
        assert_eq!(stream.message_count().await, 1, "one message for the event published twice");
        assert_eq!(DeliveryMetrics::count(&restarted.metrics().duplicates, Sink::Nats), 1);
        let event_id = outbox_event_ids(store).await.remove(0);
        let messages = stream.messages().await;
        assert_eq!(messages[0].1, event_id);
        assert_eq!(deliveries_for_event(store, &event_id).await.unwrap()[0].status, "sent");
        stream.delete().await;
    }
}
