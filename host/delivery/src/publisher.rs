//! The publisher: turns committed outbox events into deliveries and delivers
//! them, at least once, to merchant webhooks and (optionally) JetStream.
//!
//! Three stages, each safe to crash at any point:
//!
//! 1. **Fan-out.** Claim outbox events (a lease; `FOR UPDATE SKIP LOCKED` on
//!    PostgreSQL), and in one transaction per event insert one delivery row
//!    per matching enabled endpoint (and one for the JetStream stream), then
//!    mark the outbox row `sent`. A crash before the commit leaves the outbox
//!    row pending; its lease runs out and the fan-out runs again; the rows are
//!    unique per (event, sink, target), so nothing is doubled.
//! 2. **Webhooks** and 3. **JetStream**, independently: claim due deliveries of
//!    the sink (a lease and a claim token), send, and only then mark `sent`. A
//!    crash between the send and the mark leaves the row claimed; when the
//!    lease runs out it is sent again with the same event id (at least once;
//!    consumers dedupe on the id, JetStream on `Nats-Msg-Id`). A failed try is
//!    rescheduled by the core's outbox retry schedule (jittered, more than
//!    three days) and dead-lettered after it; an operator can replay it.
//!
//! Per-payment order: a delivery is not claimed while an earlier event of the
//! same payment is still pending for the same target (for its first
//! `order_hold_attempts` tries), nor while an earlier event of the payment has
//! not been fanned out. Past that, order yields to progress: every event
//! carries `payment_version` so consumers can drop what they already know.

use crate::db::{begin_write, commit_write, opt_int};
use crate::deliveries::{
    self, ClaimRequest, Claimed, EventEnvelope, FailureOutcome, NewDelivery, Sink,
};
use crate::endpoints::{self, matches_event_type};
use crate::metrics::DeliveryMetrics;
use crate::nats::{NatsSink, NatsSinkConfig};
use crate::webhook::{HttpWebhookTransport, SendOutcome, WebhookSender, WebhookTransport};
use crate::DeliveryError;
use sluice_core::recovery::OutboxRetryPolicy;
use sluice_store::{OutboxMessage, Store};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

/// How the publisher works. The defaults suit production.
#[derive(Debug, Clone, PartialEq)]
pub struct PublisherConfig {
    /// Most events (or deliveries) claimed per pass.
    pub batch_size: i64,
    /// How long a fan-out claim on an outbox event lasts.
    pub outbox_lease: Duration,
    /// How long a delivery claim lasts: must exceed the HTTP and PubAck
    /// timeouts, or a slow send would be re-sent by another instance.
    pub delivery_lease: Duration,
    /// Whole-request timeout of a webhook POST.
    pub http_timeout: Duration,
    /// Sleep between passes that found nothing to do.
    pub poll_interval: Duration,
    /// The redelivery schedule: the core's default spans more than three days.
    pub retry_policy: OutboxRetryPolicy,
    /// An earlier pending event of the same payment holds later ones back for
    /// a target until it has used this many tries.
    pub order_hold_attempts: i64,
    /// Most sends in flight at once per sink.
    pub max_in_flight: usize,
    /// The JetStream sink; `None` delivers to merchant webhooks only.
    pub nats: Option<NatsSinkConfig>,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            batch_size: 100,
            outbox_lease: Duration::from_secs(30),
            delivery_lease: Duration::from_secs(60),
            http_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(500),
            retry_policy: OutboxRetryPolicy::default(),
            order_hold_attempts: 5,
            max_in_flight: 16,
            nats: None,
        }
    }
}

impl PublisherConfig {
    fn validate(&self) -> Result<(), DeliveryError> {
        let bad = |msg: &str| Err(DeliveryError::Config(format!("publisher: {msg}")));
        if self.batch_size < 1 || self.max_in_flight < 1 {
            return bad("batch_size and max_in_flight must be at least 1");
        }
        if self.outbox_lease.is_zero() || self.poll_interval.is_zero() {
            return bad("outbox_lease and poll_interval must be positive");
        }
        let slowest_send = match &self.nats {
            Some(nats) => self.http_timeout.max(nats.ack_timeout),
            None => self.http_timeout,
        };
        if self.delivery_lease <= slowest_send * 2 {
            return bad("delivery_lease must be more than twice the HTTP and PubAck timeouts");
        }
        if self.retry_policy.max_deliveries < 1 {
            return bad("the retry policy must allow at least one delivery");
        }
        Ok(())
    }
}

/// Identifies a send that just succeeded, for [`PublisherHooks::after_send`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentDelivery {
    pub delivery_id: String,
    pub event_id: String,
    pub sink: Sink,
}

/// What a hook tells the publisher to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookAction {
    Continue,
    /// Stop at once, writing nothing more, as a killed process would.
    Crash,
}

pub type AfterSendHook = Arc<dyn Fn(&SentDelivery) -> HookAction + Send + Sync>;
pub type JitterSource = Arc<dyn Fn() -> f64 + Send + Sync>;

/// Seams for fault-injection tests and the simulator. Production leaves
/// all three `None`.
#[derive(Clone, Default)]
pub struct PublisherHooks {
    /// Called after a sink accepted a delivery and before it is marked sent.
    pub after_send: Option<AfterSendHook>,
    /// Jitter in [0, 1) for the retry schedule; random when `None`.
    pub jitter: Option<JitterSource>,
    /// What carries merchant webhooks; HTTP ([`HttpWebhookTransport`] with
    /// the configured timeout) when `None`.
    pub webhook_transport: Option<Arc<dyn WebhookTransport>>,
}

impl std::fmt::Debug for PublisherHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherHooks")
            .field("after_send", &self.after_send.is_some())
            .field("jitter", &self.jitter.is_some())
            .field("webhook_transport", &self.webhook_transport.is_some())
            .finish()
    }
}

/// What one pass over a sink did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkReport {
    pub claimed: usize,
    pub delivered: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    /// Sends whose claim had been taken over by the time they finished.
    pub lost_claims: usize,
    /// Sends the sink reported as duplicates (JetStream).
    pub duplicates: usize,
    /// Why the sink was skipped this pass (NATS unreachable).
    pub unavailable: Option<String>,
}

/// What one [`Publisher::publish_once`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Outbox events handed to the sinks.
    pub fanned_out: usize,
    /// Delivery rows those events produced.
    pub deliveries_created: usize,
    pub webhook: SinkReport,
    /// `None` when no JetStream sink is configured.
    pub nats: Option<SinkReport>,
}

impl PublishReport {
    /// Did the pass do anything?
    pub fn did_work(&self) -> bool {
        self.fanned_out > 0
            || self.webhook.claimed > 0
            || self.nats.as_ref().is_some_and(|n| n.claimed > 0)
    }
}

/// The outbox publisher. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    config: PublisherConfig,
    webhooks: WebhookSender,
    nats: Option<NatsSink>,
    metrics: DeliveryMetrics,
    hooks: PublisherHooks,
    nats_was_up: AtomicBool,
}

/// One delivery's outcome inside a pass.
enum Outcome {
    Delivered { duplicate: bool },
    Retried,
    Dead,
    LostClaim,
}

/// A successful send, before it is marked.
struct Accepted {
    response_status: Option<i64>,
    duplicate: bool,
}

impl Publisher {
    pub fn new(
        store: Store,
        config: PublisherConfig,
        metrics: DeliveryMetrics,
    ) -> Result<Publisher, DeliveryError> {
        Publisher::with_hooks(store, config, metrics, PublisherHooks::default())
    }

    pub fn with_hooks(
        store: Store,
        config: PublisherConfig,
        metrics: DeliveryMetrics,
        hooks: PublisherHooks,
    ) -> Result<Publisher, DeliveryError> {
        config.validate()?;
        let nats = config.nats.clone().map(NatsSink::new).transpose()?;
        let transport: Arc<dyn WebhookTransport> = match &hooks.webhook_transport {
            Some(transport) => Arc::clone(transport),
            None => Arc::new(HttpWebhookTransport::new(config.http_timeout)?),
        };
        let webhooks = WebhookSender::new(transport);
        Ok(Publisher {
            inner: Arc::new(Inner {
                store,
                config,
                webhooks,
                nats,
                metrics,
                hooks,
                nats_was_up: AtomicBool::new(true),
            }),
        })
    }

    pub fn config(&self) -> &PublisherConfig {
        &self.inner.config
    }

    pub fn metrics(&self) -> &DeliveryMetrics {
        &self.inner.metrics
    }

    pub fn nats_sink(&self) -> Option<&NatsSink> {
        self.inner.nats.as_ref()
    }

    /// One pass of every stage: fan-out, webhooks, JetStream, lag gauges.
    /// The sinks run one after the other here; [`Publisher::run`] runs them
    /// side by side.
    pub async fn publish_once(&self) -> Result<PublishReport, DeliveryError> {
        let (fanned_out, deliveries_created) = self.fan_out_once().await?;
        let webhook = self.deliver_once(Sink::Webhook).await?;
        let nats = match self.inner.nats {
            Some(_) => Some(self.deliver_once(Sink::Nats).await?),
            None => None,
        };
        self.update_lag().await?;
        Ok(PublishReport {
            fanned_out,
            deliveries_created,
            webhook,
            nats,
        })
    }

    /// Run until `shutdown` completes: fan-out, webhooks and JetStream each in
    /// their own loop, so a slow or unreachable sink never holds up another.
    /// A pass in progress finishes before this returns.
    pub async fn run<F>(&self, shutdown: F) -> Result<(), DeliveryError>
    where
        F: Future<Output = ()> + Send,
    {
        let (stop, stopped) = watch::channel(false);
        let mut loops = JoinSet::new();
        loops.spawn(self.clone().stage_loop(Stage::FanOut, stopped.clone()));
        loops.spawn(
            self.clone()
                .stage_loop(Stage::Deliver(Sink::Webhook), stopped.clone()),
        );
        if self.inner.nats.is_some() {
            loops.spawn(self.clone().stage_loop(Stage::Deliver(Sink::Nats), stopped));
        }
        let early = tokio::select! {
            () = shutdown => None,
            ended = loops.join_next() => ended,
        };
        let _ = stop.send(true);
        let mut result = match early {
            Some(ended) => flatten(ended),
            None => Ok(()),
        };
        while let Some(ended) = loops.join_next().await {
            if let Err(e) = flatten(ended) {
                result = result.and(Err(e));
            }
        }
        result
    }

    async fn stage_loop(self, stage: Stage, mut stopped: watch::Receiver<bool>) -> LoopResult {
        loop {
            if *stopped.borrow() {
                return Ok(());
            }
            let busy = match self.stage_pass(stage).await {
                Ok(busy) => busy,
                Err(e @ DeliveryError::SimulatedCrash { .. }) => return Err(e),
                Err(e) => {
                    tracing::warn!(stage = stage.name(), error = %e, "publisher pass failed; retrying");
                    false
                }
            };
            if !busy {
                tokio::select! {
                    _ = stopped.changed() => {}
                    () = tokio::time::sleep(self.inner.config.poll_interval) => {}
                }
            }
        }
    }

    /// One pass of a stage; true when it found a full batch (more may wait).
    async fn stage_pass(&self, stage: Stage) -> Result<bool, DeliveryError> {
        let full = usize::try_from(self.inner.config.batch_size).unwrap_or(usize::MAX);
        match stage {
            Stage::FanOut => {
                let (fanned, _) = self.fan_out_once().await?;
                self.update_lag().await?;
                Ok(fanned >= full)
            }
            Stage::Deliver(sink) => Ok(self.deliver_once(sink).await?.claimed >= full),
        }
    }

    /// Claim a batch of outbox events and fan them out, in one transaction.
    /// Returns the events fanned out and the delivery rows created.
    pub async fn fan_out_once(&self) -> Result<(usize, usize), DeliveryError> {
        let lease_ms = millis(self.inner.config.outbox_lease);
        let claimed = self
            .inner
            .store
            .outbox_claim(self.inner.config.batch_size, lease_ms)
            .await?;
        if claimed.len() <= 1 {
            return Ok(self.fan_out_each(&claimed).await);
        }
        match self.fan_out_batch(&claimed).await {
            Ok(created) => Ok((claimed.len(), created)),
            Err(e) => {
                // Nothing of the batch was written: one event that cannot be
                // fanned out must not hold the others back, so each goes alone.
                tracing::warn!(events = claimed.len(), error = %e,
                    "batched fan-out failed; fanning the events out one by one");
                Ok(self.fan_out_each(&claimed).await)
            }
        }
    }

    /// Fan each event out in a transaction of its own.
    async fn fan_out_each(&self, claimed: &[OutboxMessage]) -> (usize, usize) {
        let mut fanned = 0;
        let mut created = 0;
        for message in claimed {
            match self.fan_out(message).await {
                Ok(rows) => {
                    fanned += 1;
                    created += rows;
                }
                // The lease runs out and the event is fanned out again later.
                Err(e) => tracing::warn!(
                    event_id = %message.event_id,
                    payment_id = %message.partition_key,
                    error = %e,
                    "fan-out failed; the event will be retried when its lease expires"
                ),
            }
        }
        (fanned, created)
    }

    /// Turn one outbox event into its delivery rows and mark it handed over,
    /// in one transaction. Idempotent: running it twice for the same event
    /// creates nothing new. Returns the rows created.
    pub async fn fan_out(&self, message: &OutboxMessage) -> Result<usize, DeliveryError> {
        self.fan_out_batch(std::slice::from_ref(message)).await
    }

    /// [`Self::fan_out`] for several events in one transaction: each
    /// merchant's endpoints read once, every event marked handed over by one
    /// statement. A fan-out a claim's batch took four statements per event.
    async fn fan_out_batch(&self, messages: &[OutboxMessage]) -> Result<usize, DeliveryError> {
        let store = &self.inner.store;
        let mut tx = begin_write(store).await?;
        let now = store.now_ms();
        let mut endpoints_of = std::collections::BTreeMap::new();
        let mut created = 0;
        for message in messages {
            let merchant = message.merchant_id.as_str();
            if !endpoints_of.contains_key(merchant) {
                let endpoints = endpoints::enabled_endpoints(&mut tx, merchant).await?;
                endpoints_of.insert(merchant, endpoints);
            }
            let endpoints = endpoints_of.get(merchant).map(Vec::as_slice);
            created += self
                .insert_deliveries(&mut tx, message, endpoints.unwrap_or_default(), now)
                .await?;
        }
        // The store's outbox_mark_sent, inside this transaction: an outbox row
        // is done once every sink has its own row.
        let marked = mark_sent(&mut tx, store.backend(), messages, now).await?;
        commit_write(store, tx).await?;
        self.inner.metrics.fanned_out.inc_by(marked);
        for message in messages {
            tracing::debug!(event_id = %message.event_id, payment_id = %message.partition_key,
                event_type = %message.event_type, "outbox event fanned out");
        }
        Ok(created)
    }

    /// One event's delivery rows: one per matching endpoint, one for NATS.
    async fn insert_deliveries(
        &self,
        tx: &mut sqlx::AnyConnection,
        message: &OutboxMessage,
        endpoints: &[endpoints::WebhookEndpoint],
        now: i64,
    ) -> Result<usize, DeliveryError> {
        let mut targets: Vec<(Sink, &str)> = endpoints
            .iter()
            .filter(|e| matches_event_type(&e.event_types, &message.event_type))
            .map(|e| (Sink::Webhook, e.id.as_str()))
            .collect();
        if let Some(nats) = &self.inner.nats {
            targets.push((Sink::Nats, nats.stream()));
        }
        let mut created = 0;
        for (sink, target) in targets {
            let new = NewDelivery {
                event_id: &message.event_id,
                event_seq: message.seq,
                event_created_at: message.created_at,
                partition_key: &message.partition_key,
                payment_version: message.payment_version,
                merchant_id: &message.merchant_id,
                sink,
                target,
            };
            if deliveries::insert(tx, self.inner.store.env(), &new, now).await? {
                created += 1;
            }
        }
        Ok(created)
    }

    /// One pass over a sink: claim due deliveries and send them.
    async fn deliver_once(&self, sink: Sink) -> Result<SinkReport, DeliveryError> {
        let nats = match sink {
            Sink::Webhook => None,
            Sink::Nats => match self.nats_ready().await {
                Ok(ready) => Some(ready),
                Err(reason) => {
                    return Ok(SinkReport {
                        unavailable: Some(reason),
                        ..SinkReport::default()
                    })
                }
            },
        };
        let request = ClaimRequest {
            sink,
            target: self
                .inner
                .nats
                .as_ref()
                .filter(|_| sink == Sink::Nats)
                .map(NatsSink::stream),
            limit: self.inner.config.batch_size,
            lease_ms: millis(self.inner.config.delivery_lease),
            order_hold_attempts: self.inner.config.order_hold_attempts,
        };
        let claimed = deliveries::claim(&self.inner.store, &request).await?;
        let mut report = SinkReport {
            claimed: claimed.len(),
            ..SinkReport::default()
        };
        if claimed.is_empty() {
            return Ok(report);
        }
        let limit = Arc::new(Semaphore::new(self.inner.config.max_in_flight));
        let mut sends = JoinSet::new();
        for one in claimed {
            let publisher = self.clone();
            let limit = Arc::clone(&limit);
            let nats = nats.clone();
            sends.spawn(async move {
                // The semaphore is closed only by a simulated crash (below).
                let Ok(_permit) = Arc::clone(&limit).acquire_owned().await else {
                    let delivery_id = one.delivery.id.clone();
                    return Err(DeliveryError::SimulatedCrash { delivery_id });
                };
                let outcome = publisher.deliver_one(sink, one, nats.as_ref()).await;
                if matches!(outcome, Err(DeliveryError::SimulatedCrash { .. })) {
                    // A dead process sends nothing more: the sends still waiting
                    // must not take this permit before the batch is aborted.
                    limit.close();
                }
                outcome
            });
        }
        while let Some(done) = sends.join_next().await {
            match flatten_outcome(done) {
                Ok(Outcome::Delivered { duplicate }) => {
                    report.delivered += 1;
                    report.duplicates += usize::from(duplicate);
                }
                Ok(Outcome::Retried) => report.retried += 1,
                Ok(Outcome::Dead) => report.dead_lettered += 1,
                Ok(Outcome::LostClaim) => report.lost_claims += 1,
                Err(e @ DeliveryError::SimulatedCrash { .. }) => {
                    // A dead process sends nothing more.
                    sends.abort_all();
                    return Err(e);
                }
                // The claim stays until its lease runs out; then it is retried.
                Err(e) => tracing::warn!(sink = sink.as_str(), error = %e, "delivery failed"),
            }
        }
        Ok(report)
    }

    async fn nats_ready(&self) -> Result<async_nats::jetstream::Context, String> {
        let Some(nats) = &self.inner.nats else {
            return Err("no NATS sink is configured".into());
        };
        let ready = nats.ready().await;
        let up = ready.is_ok();
        self.inner.metrics.sink_up(Sink::Nats, up);
        let was_up = self.inner.nats_was_up.swap(up, Ordering::Relaxed);
        match (&ready, was_up) {
            (Err(reason), true) => {
                tracing::warn!(stream = nats.stream(), reason = %reason, "NATS sink unavailable; its deliveries wait")
            }
            (Ok(_), false) => tracing::info!(stream = nats.stream(), "NATS sink available again"),
            _ => {}
        }
        ready
    }

    async fn deliver_one(
        &self,
        sink: Sink,
        claimed: Claimed,
        nats: Option<&async_nats::jetstream::Context>,
    ) -> Result<Outcome, DeliveryError> {
        let d = &claimed.delivery;
        let span = tracing::info_span!(
            "deliver",
            delivery_id = %d.id,
            event_id = %d.event_id,
            payment_id = %d.payment_id,
            sink = sink.as_str(),
            target = %d.target,
            attempt = d.attempts,
        );
        async {
            let envelope = deliveries::load_envelope(&self.inner.store, &d.event_id).await?;
            let sent = match sink {
                Sink::Webhook => self.send_webhook(&claimed, &envelope).await?,
                Sink::Nats => self.send_nats(nats, &envelope).await,
            };
            match sent {
                Ok(accepted) => self.after_accepted(sink, &claimed, accepted).await,
                Err((error, status)) => self.after_failure(sink, &claimed, &error, status).await,
            }
        }
        .instrument(span)
        .await
    }

    async fn send_webhook(
        &self,
        claimed: &Claimed,
        envelope: &EventEnvelope,
    ) -> Result<Result<Accepted, (String, Option<i64>)>, DeliveryError> {
        let store = &self.inner.store;
        let endpoint_id = claimed.delivery.target.as_str();
        let endpoint = endpoints::signing_endpoint(store, endpoint_id).await?;
        if !endpoint.endpoint.enabled {
            return Ok(Err(("endpoint is disabled".into(), None)));
        }
        let now_unix = store.now_ms().div_euclid(1000);
        let outcome = self
            .inner
            .webhooks
            .send(&endpoint, envelope, &claimed.delivery.id, now_unix)
            .await;
        Ok(match outcome {
            SendOutcome::Delivered { status } => Ok(Accepted {
                response_status: Some(status),
                duplicate: false,
            }),
            SendOutcome::Failed { error, status } => Err((error, status)),
        })
    }

    async fn send_nats(
        &self,
        context: Option<&async_nats::jetstream::Context>,
        envelope: &EventEnvelope,
    ) -> Result<Accepted, (String, Option<i64>)> {
        let (Some(nats), Some(context)) = (&self.inner.nats, context) else {
            return Err(("no NATS sink is configured".into(), None));
        };
        match nats.publish(context, envelope).await {
            Ok(ack) => Ok(Accepted {
                response_status: None,
                duplicate: ack.duplicate,
            }),
            Err(error) => Err((error, None)),
        }
    }

    async fn after_accepted(
        &self,
        sink: Sink,
        claimed: &Claimed,
        accepted: Accepted,
    ) -> Result<Outcome, DeliveryError> {
        let d = &claimed.delivery;
        if let Some(hook) = &self.inner.hooks.after_send {
            let sent = SentDelivery {
                delivery_id: d.id.clone(),
                event_id: d.event_id.clone(),
                sink,
            };
            if hook(&sent) == HookAction::Crash {
                return Err(DeliveryError::SimulatedCrash {
                    delivery_id: d.id.clone(),
                });
            }
        }
        if accepted.duplicate {
            self.inner.metrics.duplicate(sink);
        }
        if !deliveries::mark_sent(&self.inner.store, &d.id, accepted.response_status).await? {
            return Ok(Outcome::LostClaim);
        }
        self.inner.metrics.delivered(sink);
        tracing::debug!("event delivered");
        Ok(Outcome::Delivered {
            duplicate: accepted.duplicate,
        })
    }

    async fn after_failure(
        &self,
        sink: Sink,
        claimed: &Claimed,
        error: &str,
        status: Option<i64>,
    ) -> Result<Outcome, DeliveryError> {
        let store = &self.inner.store;
        let attempt = u32::try_from(claimed.delivery.attempts.max(1)).unwrap_or(u32::MAX);
        let jitter = match &self.inner.hooks.jitter {
            Some(source) => source(),
            None => store.env().entropy.unit(),
        };
        let next = self
            .inner
            .config
            .retry_policy
            .delay(attempt, jitter)
            .map(|delay| store.now_ms().saturating_add(delay));
        let outcome = deliveries::record_failure(store, claimed, error, status, next).await?;
        Ok(match outcome {
            FailureOutcome::Retry { at } => {
                self.inner.metrics.retried(sink);
                tracing::info!(
                    error,
                    next_attempt_at = at,
                    "delivery failed; retry scheduled"
                );
                Outcome::Retried
            }
            FailureOutcome::Dead => {
                self.inner.metrics.dead_lettered(sink);
                tracing::warn!(error, "delivery failed for the last time; dead-lettered");
                Outcome::Dead
            }
            FailureOutcome::LostClaim => Outcome::LostClaim,
        })
    }

    /// Refresh the lag gauges: the oldest event not yet fanned out, and the
    /// oldest pending delivery per sink.
    pub async fn update_lag(&self) -> Result<(), DeliveryError> {
        let store = &self.inner.store;
        let now = store.now_ms();
        let row =
            sqlx::query("SELECT MIN(created_at) AS oldest FROM outbox WHERE status = 'pending'")
                .fetch_one(store.pool())
                .await?;
        let oldest = opt_int(&row, "oldest")?;
        self.inner
            .metrics
            .outbox_lag(oldest.map_or(0, |at| now.saturating_sub(at)));
        let mut sinks = vec![Sink::Webhook];
        if self.inner.nats.is_some() {
            sinks.push(Sink::Nats);
        }
        for sink in sinks {
            let oldest = deliveries::oldest_pending_event(store, sink).await?;
            self.inner
                .metrics
                .delivery_lag(sink, oldest.map_or(0, |at| now.saturating_sub(at)));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Stage {
    FanOut,
    Deliver(Sink),
}

impl Stage {
    fn name(&self) -> &'static str {
        match self {
            Stage::FanOut => "fan_out",
            Stage::Deliver(sink) => sink.as_str(),
        }
    }
}

type LoopResult = Result<(), DeliveryError>;

fn flatten(ended: Result<LoopResult, tokio::task::JoinError>) -> LoopResult {
    ended.map_err(|e| DeliveryError::Task(e.to_string()))?
}

fn flatten_outcome(
    done: Result<Result<Outcome, DeliveryError>, tokio::task::JoinError>,
) -> Result<Outcome, DeliveryError> {
    done.map_err(|e| DeliveryError::Task(e.to_string()))?
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The outbox row marked handed over, last write of a fan-out's transaction.
/// On PostgreSQL that transaction commits without waiting for the WAL flush
/// (`synchronous_commit` off until its end): a crash that loses it leaves the
/// event pending, and its next claim fans it out again to the same rows
/// (each sink and target has one row an event), so what is lost is redone and
/// the merchant may get the event twice under its one id, as after a crash
/// between a send and its mark.
/// Mark `messages` handed over, in one statement; how many were still pending.
/// On PostgreSQL without waiting for the WAL flush: a crash that loses it
/// fans the events out again, which creates nothing new.
async fn mark_sent(
    tx: &mut sqlx::AnyConnection,
    backend: sluice_store::Backend,
    messages: &[OutboxMessage],
    now: i64,
) -> Result<u64, DeliveryError> {
    let lazy = match backend {
        sluice_store::Backend::Sqlite => "",
        sluice_store::Backend::Postgres => {
            "FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit "
        }
    };
    let ids: Vec<String> = (0..messages.len()).map(|i| format!("${}", i + 2)).collect();
    let sql = format!(
        "UPDATE outbox SET status = 'sent', sent_at = $1, claimed_until = NULL {lazy}\
         WHERE event_id IN ({}) AND status = 'pending'",
        ids.join(", ")
    );
    let mut query = sqlx::query(&sql).bind(now);
    for message in messages {
        query = query.bind(&message.event_id);
    }
    Ok(query.execute(tx).await?.rows_affected())
}
