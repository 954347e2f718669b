//! The JetStream sink: subjects per event type, Nats-Msg-Id, and independence
//! from the webhook sink in both directions.

use crate::common::*;
use sluice_delivery::{
    deliveries_for_payment, DeliveryMetrics, NatsSinkConfig, PublisherConfig, Sink,
};
use std::time::{Duration, Instant};

dual_test! {
    async fn events_are_published_on_a_subject_per_event_type_with_the_event_id_as_nats_msg_id(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let payment = fx.refunded(store, "NA-1").await;
        let stream = TestStream::new().await;
        let config = PublisherConfig { nats: Some(stream.config.clone()), ..test_config() };
        let publisher = publisher(store, config);
        while publisher.publish_once().await.unwrap().did_work() {}

        let outbox = store.outbox_for_payment(&payment.id).await.unwrap();
        let messages = stream.messages().await;
        assert_eq!(messages.len(), 3);
        let prefix = &stream.config.subject_prefix;
        for (event, (subject, msg_id, json)) in outbox.iter().zip(&messages) {
            assert_eq!(*subject, format!("{prefix}.{}", event.event_type));
            assert_eq!(*msg_id, event.event_id);
            assert_eq!(json["id"], event.event_id.as_str());
            assert_eq!(json["payment_version"], event.payment_version);
            assert_eq!(json["data"], event.payload);
        }
        assert_eq!(messages[0].0, format!("{prefix}.payment.succeeded"));
        let rows = deliveries_for_payment(store, &payment.id).await.unwrap();
        assert_eq!(rows.len(), 3, "no webhook endpoint: JetStream only");
        assert!(rows.iter().all(|d| d.sink == Sink::Nats && d.status == "sent" && d.target == stream.config.stream));
        assert_eq!(publisher.metrics().sink_up.with_label_values(&["nats"]).get(), 1);
        stream.delete().await;
    }
}

dual_test! {
    async fn nats_down_does_not_block_webhooks_and_its_deliveries_wait_without_spending_tries(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        fx.endpoint(store, &merchant.url, &["*"]).await;
        let payment = fx.succeeded(store, "NA-2", 100).await;
        let stream = TestStream::new().await;
        let down = NatsSinkConfig {
            url: format!("nats://127.0.0.1:{}", closed_port().await),
            ..stream.config.clone()
        };
        let publisher = publisher(store, PublisherConfig { nats: Some(down), ..test_config() });
        let report = publisher.publish_once().await.unwrap();
        assert_eq!(report.webhook.delivered, 1, "{report:?}");
        let nats = report.nats.unwrap();
        assert!(nats.unavailable.as_deref().is_some_and(|r| r.contains("NATS connect")), "{nats:?}");
        assert_eq!(merchant.received().len(), 1);
        assert_eq!(publisher.metrics().sink_up.with_label_values(&["nats"]).get(), 0);
        let rows = deliveries_for_payment(store, &payment.id).await.unwrap();
        let nats_row = rows.iter().find(|d| d.sink == Sink::Nats).unwrap();
        assert_eq!((nats_row.status.as_str(), nats_row.attempts), ("pending", 0));

        // NATS is back (the same stream, now reachable): the event is not lost.
        let back = publisher_for_stream(store, &stream);
        let report = back.publish_once().await.unwrap();
        assert_eq!(report.nats.unwrap().delivered, 1);
        assert_eq!(stream.message_count().await, 1);
        assert_eq!(merchant.received().len(), 1, "the webhook is not sent again");
        stream.delete().await;
    }
}

fn publisher_for_stream(
    store: &sluice_store::Store,
    stream: &TestStream,
) -> sluice_delivery::Publisher {
    publisher(
        store,
        PublisherConfig {
            nats: Some(stream.config.clone()),
            ..test_config()
        },
    )
}

dual_test! {
    async fn a_failing_webhook_endpoint_does_not_hold_back_jetstream(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        merchant.respond_with(500);
        fx.endpoint(store, &merchant.url, &["*"]).await;
        fx.refunded(store, "NA-3").await;
        let stream = TestStream::new().await;
        let publisher = publisher_for_stream(store, &stream);
        while publisher.publish_once().await.unwrap().did_work() {}
        assert_eq!(stream.message_count().await, 3, "all three events on JetStream");
        assert_eq!(merchant.received().len(), 1, "the webhook's first event is being retried, the rest wait behind it");
        assert_eq!(DeliveryMetrics::count(&publisher.metrics().delivered, Sink::Nats), 3);
        assert_eq!(DeliveryMetrics::count(&publisher.metrics().retried, Sink::Webhook), 1);
        stream.delete().await;
    }
}

dual_test! {
    async fn a_nats_server_that_never_answers_does_not_delay_webhooks_while_the_publisher_runs(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        fx.endpoint(store, &merchant.url, &["*"]).await;
        // Accepts TCP connections and never says a word.
        let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = black_hole.local_addr().unwrap().port();
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = black_hole.accept().await {
                held.push(socket);
            }
        });
        let silent = NatsSinkConfig {
            url: format!("nats://127.0.0.1:{port}"),
            connect_timeout: Duration::from_secs(5),
            ..TestStream::new().await.config
        };
        let publisher = publisher(store, PublisherConfig { nats: Some(silent), ..test_config() });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = {
            let publisher = publisher.clone();
            tokio::spawn(async move { publisher.run(async { let _ = stopped.await; }).await })
        };
        let payment = fx.succeeded(store, "NA-4", 100).await;
        let started = Instant::now();
        while merchant.received().is_empty() {
            assert!(started.elapsed() < Duration::from_secs(4), "the webhook must not wait for NATS");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let waited = started.elapsed();
        let _ = stop.send(());
        running.await.unwrap().unwrap();
        holder.abort();
        let rows = deliveries_for_payment(store, &payment.id).await.unwrap();
        assert!(rows.iter().any(|d| d.sink == Sink::Webhook && d.status == "sent"));
        assert!(rows.iter().any(|d| d.sink == Sink::Nats && d.status == "pending" && d.attempts == 0));
        println!("webhook delivered {waited:?} after the payment while NATS hung");
    }
}
