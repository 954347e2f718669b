//! Two gateway instances publishing from one database at the same time.

use crate::common::*;
use sluice_delivery::{DeliveryMetrics, PublisherConfig, Sink};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const PAYMENTS: usize = 30;

dual_test! {
    async fn two_publishers_at_once_deliver_every_event_at_least_once_and_count_the_duplicates(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        fx.endpoint(store, &merchant.url, &["*"]).await;
        let stream = TestStream::new().await;
        let config = PublisherConfig { nats: Some(stream.config.clone()), batch_size: 7, ..test_config() };
        let first = publisher(store, config.clone());
        let second_store = db.second_store().await;
        let second = publisher(&second_store, config);

        let (stop, stopped) = tokio::sync::watch::channel(false);
        let run = |p: sluice_delivery::Publisher| {
            let mut stopped = stopped.clone();
            tokio::spawn(async move { p.run(async move { let _ = stopped.changed().await; }).await })
        };
        let runs = [run(first.clone()), run(second.clone())];
        // Events keep arriving while both run.
        for n in 0..PAYMENTS {
            fx.refunded(store, &format!("CC-{n}")).await;
        }
        let expected = PAYMENTS * 3;
        let started = Instant::now();
        loop {
            let pending = count(store, "SELECT COUNT(*) FROM event_deliveries WHERE status = $1", "pending").await
                + count(store, "SELECT COUNT(*) FROM outbox WHERE status = $1", "pending").await;
            let unique: HashSet<String> = merchant.event_ids().into_iter().collect();
            if pending == 0 && unique.len() == expected {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(90), "not converged: {pending} pending, {} unique", unique.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = stop.send(true);
        for handle in runs {
            handle.await.unwrap().unwrap();
        }

        let events = outbox_event_ids(store).await;
        assert_eq!(events.len(), expected);
        let ids = merchant.event_ids();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for id in &ids {
            *seen.entry(id.as_str()).or_default() += 1;
        }
        let lost: Vec<&String> = events.iter().filter(|id| !seen.contains_key(id.as_str())).collect();
        assert!(lost.is_empty(), "lost events: {lost:?}");
        let duplicates = ids.len() - seen.len();
        let nats_messages = stream.message_count().await;
        assert_eq!(nats_messages, expected as u64, "one JetStream message per event");
        let by = |p: &sluice_delivery::Publisher, sink| DeliveryMetrics::count(&p.metrics().delivered, sink);
        println!(
            "two publishers ({:?}): events={expected} webhook_requests={} duplicates={duplicates} \
             nats_messages={nats_messages} webhooks_by_instance=({}, {}) nats_by_instance=({}, {}) fanned_out_by_instance=({}, {})",
            db.backend,
            ids.len(),
            by(&first, Sink::Webhook),
            by(&second, Sink::Webhook),
            by(&first, Sink::Nats),
            by(&second, Sink::Nats),
            first.metrics().fanned_out.get(),
            second.metrics().fanned_out.get(),
        );
        // Leases (and SKIP LOCKED on PostgreSQL) keep the instances off each
        // other's work while nobody crashes: no event is sent twice.
        assert_eq!(duplicates, 0, "duplicates without a crash");
        assert_eq!(by(&first, Sink::Webhook) + by(&second, Sink::Webhook), expected as u64);
        stream.delete().await;
        second_store.close().await;
    }
}
