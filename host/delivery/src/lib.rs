//! Outbox delivery for Sluice: every committed state change reaches its
//! subscribers at least once, as a signed merchant webhook and, optionally,
//! as a NATS JetStream message.
//!
//! - [`Publisher`] fans outbox events out into per-(event, sink, target)
//!   delivery rows, delivers them, retries them on the core's schedule
//!   (jittered, over more than three days) and dead-letters what never
//!   arrives. See the `publisher` module docs for the crash-safety argument.
//! - [`endpoints`]: merchant webhook endpoints with per-endpoint secrets.
//! - [`signature`]: `Sluice-Signature` signing and verification.
//! - [`deliveries`]: delivery rows, dead letters, [`replay_dead_letter`].
//! - [`admin_router`]: the admin HTTP routes for all of the above.
//! - [`DeliveryMetrics`]: Prometheus counters and lag gauges.

mod admin;
mod db;
mod error;
mod metrics;
mod nats;
mod publisher;
mod webhook;

pub mod deliveries;
pub mod endpoints;
pub mod signature;

pub use admin::{admin_openapi, admin_router, DeliveryAdmin, ListBody, MAX_DEAD_LIMIT};
pub use deliveries::{
    deliveries_for_event, deliveries_for_payment, get_delivery, list_dead, replay_dead_letter,
    Delivery, EventEnvelope, Sink,
};
pub use endpoints::{
    create_endpoint, list_endpoints, set_endpoint_enabled, CreatedEndpoint, EndpointPolicy,
    NewWebhookEndpoint, WebhookEndpoint,
};
pub use error::DeliveryError;
pub use metrics::DeliveryMetrics;
pub use nats::{NatsSink, NatsSinkConfig, MSG_ID_HEADER};
pub use publisher::{
    AfterSendHook, HookAction, JitterSource, PublishReport, Publisher, PublisherConfig,
    PublisherHooks, SentDelivery, SinkReport,
};
pub use webhook::{HttpWebhookTransport, WebhookPost, WebhookTransport, DELIVERY_ID_HEADER};
