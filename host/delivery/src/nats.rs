//! The NATS JetStream sink: one message per event on
//! `<subject_prefix>.<event type>`, with `Nats-Msg-Id` = the event id so that
//! JetStream drops a resend within its duplicate window. A delivery counts as
//! sent only once the stream acknowledged it (PubAck).

use crate::deliveries::EventEnvelope;
use crate::DeliveryError;
use async_nats::jetstream::{self, stream, Context};
use async_nats::{Client, HeaderMap};
use std::time::Duration;
use tokio::sync::Mutex;

/// Header JetStream dedupes on.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Where and how to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsSinkConfig {
    /// e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The stream name, e.g. `SLUICE_EVENTS`.
    pub stream: String,
    /// Subjects are `<subject_prefix>.<event type>`, e.g.
    /// `sluice.events.payment.succeeded`; the stream captures `<prefix>.>`.
    pub subject_prefix: String,
    /// Create the stream when it does not exist. An existing stream is used
    /// as it is configured.
    pub create_stream: bool,
    /// JetStream's dedupe window for a created stream. Must exceed the
    /// delivery lease, so that a resend after a crashed publisher is dropped.
    pub duplicate_window: Duration,
    /// How long a created stream keeps messages.
    pub max_age: Duration,
    pub connect_timeout: Duration,
    /// How long to wait for the PubAck before the try counts as failed.
    pub ack_timeout: Duration,
}

impl Default for NatsSinkConfig {
    fn default() -> Self {
        NatsSinkConfig {
            url: "nats://127.0.0.1:4222".into(),
            stream: "SLUICE_EVENTS".into(),
            subject_prefix: "sluice.events".into(),
            create_stream: true,
            duplicate_window: Duration::from_secs(10 * 60),
            max_age: Duration::from_secs(7 * 24 * 3600),
            connect_timeout: Duration::from_secs(2),
            ack_timeout: Duration::from_secs(5),
        }
    }
}

impl NatsSinkConfig {
    fn validate(&self) -> Result<(), DeliveryError> {
        let bad = |msg: &str| Err(DeliveryError::Config(format!("NATS sink: {msg}")));
        if self.stream.is_empty()
            || !self
                .stream
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return bad("stream name must be letters, digits, '_' or '-'");
        }
        if self.subject_prefix.is_empty()
            || self.subject_prefix.split('.').any(|t| !is_subject_token(t))
        {
            return bad("subject prefix must be dot-separated tokens without wildcards");
        }
        if self.duplicate_window.is_zero() || self.ack_timeout.is_zero() {
            return bad("duplicate window and ack timeout must be positive");
        }
        Ok(())
    }
}

fn is_subject_token(token: &str) -> bool {
    !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A lazily connected JetStream publisher. A NATS that is down is reported as
/// unavailable, never as an error of the publisher as a whole.
#[derive(Debug)]
pub struct NatsSink {
    config: NatsSinkConfig,
    connection: Mutex<Option<(Client, Context)>>,
}

impl NatsSink {
    pub fn new(config: NatsSinkConfig) -> Result<NatsSink, DeliveryError> {
        config.validate()?;
        Ok(NatsSink {
            config,
            connection: Mutex::new(None),
        })
    }

    pub fn config(&self) -> &NatsSinkConfig {
        &self.config
    }

    /// The stream name, which is also the delivery rows' target.
    pub fn stream(&self) -> &str {
        &self.config.stream
    }

    /// `<prefix>.<event type>`; characters a subject token cannot hold become `_`.
    pub fn subject_for(&self, event_type: &str) -> String {
        let tokens: Vec<String> = event_type
            .split('.')
            .map(|t| {
                let clean: String = t
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                if clean.is_empty() {
                    "_".to_owned()
                } else {
                    clean
                }
            })
            .collect();
        format!("{}.{}", self.config.subject_prefix, tokens.join("."))
    }

    /// A JetStream context on a live connection, connecting (and creating the
    /// stream) on first use. `Err` says why NATS cannot be used right now.
    pub(crate) async fn ready(&self) -> Result<Context, String> {
        let mut connection = self.connection.lock().await;
        if let Some((client, context)) = connection.as_ref() {
            return match client.connection_state() {
                async_nats::connection::State::Connected => Ok(context.clone()),
                state => Err(format!("NATS connection is {state:?}; reconnecting")),
            };
        }
        let (client, context) = self.connect().await?;
        *connection = Some((client, context.clone()));
        Ok(context)
    }

    async fn connect(&self) -> Result<(Client, Context), String> {
        let options = async_nats::ConnectOptions::new()
            .connection_timeout(self.config.connect_timeout)
            .name("sluice-publisher");
        let client = tokio::time::timeout(
            self.config.connect_timeout,
            options.connect(self.config.url.as_str()),
        )
        .await
        .map_err(|_| "NATS connect timed out".to_owned())?
        .map_err(|e| format!("NATS connect failed: {e}"))?;
        let mut context = jetstream::new(client.clone());
        context.set_timeout(self.config.ack_timeout);
        if self.config.create_stream {
            let config = stream::Config {
                name: self.config.stream.clone(),
                subjects: vec![format!("{}.>", self.config.subject_prefix)],
                duplicate_window: self.config.duplicate_window,
                max_age: self.config.max_age,
                storage: stream::StorageType::File,
                ..Default::default()
            };
            tokio::time::timeout(
                self.config.ack_timeout,
                context.get_or_create_stream(config),
            )
            .await
            .map_err(|_| "JetStream stream lookup timed out".to_owned())?
            .map_err(|e| format!("JetStream stream {}: {e}", self.config.stream))?;
        }
        tracing::info!(stream = %self.config.stream, "connected to NATS JetStream");
        Ok((client, context))
    }

    /// Publish one event and wait for the stream's acknowledgement.
    pub(crate) async fn publish(
        &self,
        context: &Context,
        envelope: &EventEnvelope,
    ) -> Result<jetstream::publish::PublishAck, String> {
        let body =
            serde_json::to_vec(envelope).map_err(|e| format!("cannot encode the event: {e}"))?;
        let mut headers = HeaderMap::new();
        headers.insert(MSG_ID_HEADER, envelope.id.as_str());
        headers.insert("Sluice-Event-Type", envelope.event_type.as_str());
        headers.insert("Sluice-Payment-Id", envelope.payment_id.as_str());
        headers.insert(
            "Sluice-Payment-Version",
            envelope.payment_version.to_string().as_str(),
        );
        let subject = self.subject_for(&envelope.event_type);
        let ack = context
            .publish_with_headers(subject, headers, body.into())
            .await
            .map_err(|e| format!("JetStream publish failed: {e}"))?;
        let ack = tokio::time::timeout(self.config.ack_timeout, ack)
            .await
            .map_err(|_| "JetStream PubAck timed out".to_owned())?
            .map_err(|e| format!("JetStream PubAck: {e}"))?;
        if ack.stream != self.config.stream {
            return Err(format!(
                "subject {} is captured by stream {}, not {}",
                self.subject_for(&envelope.event_type),
                ack.stream,
                self.config.stream
            ));
        }
        Ok(ack)
    }
}
