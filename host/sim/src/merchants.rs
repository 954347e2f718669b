//! The merchants' side of event delivery: each honest merchant's webhook
//! endpoint, reached through the real outbox publisher with the network's
//! faults, and what each of them received.
//!
//! The publisher is the real one (`sluice_delivery::Publisher`); only its
//! transport is simulated ([`SimMerchants`], its `WebhookTransport`). A send
//! may be lost before the merchant sees it, answered 503, or received with
//! the answer lost (the merchant has it; we must send it again, and it
//! dedupes on the event id); with crashes on, the gateway may die after the
//! merchant's 2xx and before the delivery is marked sent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sluice_delivery::signature::EVENT_ID_HEADER;
use sluice_delivery::{
    DeliveryError, DeliveryMetrics, HookAction, PublishReport, Publisher, PublisherConfig,
    PublisherHooks, WebhookPost, WebhookTransport,
};
use sluice_store::Store;

use crate::net::{Crash, NetMode};
use crate::rng::SimRng;
use crate::trace::Trace;

/// What a merchant's endpoint does with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Accept,
    /// Lost on the way: the merchant never saw it.
    Lost,
    /// The merchant's load balancer answered 503 without passing it on.
    Unavailable,
    /// The merchant took it; its 2xx never came back.
    AnswerLost,
}

/// Every event id each endpoint URL received, however often.
pub type Received = BTreeMap<String, BTreeMap<String, u32>>;

/// The honest merchants' endpoints. Outlives gateway incarnations: what a
/// merchant received stays received when our process dies.
#[derive(Clone)]
pub struct SimMerchants {
    rng: SimRng,
    mode: Arc<Mutex<NetMode>>,
    trace: Trace,
    received: Arc<Mutex<Received>>,
}

impl SimMerchants {
    pub fn new(rng: SimRng, mode: Arc<Mutex<NetMode>>, trace: Trace) -> Self {
        SimMerchants {
            rng,
            mode,
            trace,
            received: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    fn mode(&self) -> NetMode {
        *self.mode.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What every endpoint received so far.
    pub fn received(&self) -> Received {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn fate(&self) -> Fate {
        if !self.rng.chance(self.mode().fault_per_mille) {
            return Fate::Accept;
        }
        match self.rng.below(3) {
            0 => Fate::Lost,
            1 => Fate::Unavailable,
            _ => Fate::AnswerLost,
        }
    }

    fn record(&self, url: &str, event_id: &str) {
        let mut received = self.received.lock().unwrap_or_else(|p| p.into_inner());
        *received
            .entry(url.to_owned())
            .or_default()
            .entry(event_id.to_owned())
            .or_default() += 1;
    }

    /// The publisher of one incarnation: the real one, sending through these
    /// endpoints, one send at a time (the order of concurrent sends would
    /// depend on thread timing), with seeded jitter, and killed after a
    /// merchant's 2xx and before the mark when the world's crashes are on.
    pub fn publisher(&self, store: Store, crash: Crash) -> Result<Publisher, DeliveryError> {
        let config = PublisherConfig {
            max_in_flight: 1,
            ..PublisherConfig::default()
        };
        let jitter_rng = self.rng.clone();
        let crash_rng = self.rng.clone();
        let mode = self.mode.clone();
        let kill = crash.clone();
        let hooks = PublisherHooks {
            jitter: Some(Arc::new(move || jitter_rng.below(1_000) as f64 / 1_000.0)),
            after_send: Some(Arc::new(move |_sent| {
                let crashes = mode.lock().unwrap_or_else(|p| p.into_inner()).crashes;
                if !(crashes && crash_rng.chance(30)) {
                    return HookAction::Continue;
                }
                // The whole process dies, not just this send: the next send
                // the publisher starts before it notices finds it dead.
                kill.kill();
                HookAction::Crash
            })),
            webhook_transport: Some(Arc::new(Endpoints {
                merchants: self.clone(),
                crash,
            })),
        };
        // A registry of its own: the simulator exposes no metrics.
        let metrics = DeliveryMetrics::register(&prometheus::Registry::new())
            .map_err(|e| DeliveryError::Config(format!("metrics: {e}")))?;
        Publisher::with_hooks(store, config, metrics, hooks)
    }
}

/// The merchants as one gateway incarnation reaches them: nothing leaves a
/// killed process.
struct Endpoints {
    merchants: SimMerchants,
    crash: Crash,
}

#[async_trait]
impl WebhookTransport for Endpoints {
    async fn post(&self, post: WebhookPost) -> Result<u16, String> {
        if self.crash.is_dead() {
            std::future::pending::<()>().await;
        }
        let event_id = post
            .headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(EVENT_ID_HEADER))
            .map(|(_, value)| value.clone())
            .unwrap_or_default();
        let merchants = &self.merchants;
        let fate = merchants.fate();
        merchants
            .trace
            .line(format!("net merchant webhook -> {fate:?}"));
        match fate {
            Fate::Accept => {
                merchants.record(&post.url, &event_id);
                Ok(200)
            }
            Fate::Lost => Err("could not connect".to_owned()),
            Fate::Unavailable => Ok(503),
            Fate::AnswerLost => {
                merchants.record(&post.url, &event_id);
                Err("timed out".to_owned())
            }
        }
    }
}

/// A publisher pass as one trace line.
pub fn report_line(report: &PublishReport) -> String {
    let w = &report.webhook;
    format!(
        "fanned out {} delivered {} retried {} dead {} lost claims {}",
        report.fanned_out, w.delivered, w.retried, w.dead_lettered, w.lost_claims
    )
}

/// Delivery rows after convergence: every event of an honest merchant was
/// received by its endpoint at least once, or is a dead letter with its
/// tries on record; nothing marked sent that the merchant never received.
pub fn delivery_violations(
    rows: &[(String, String, String, String)],
    received: &Received,
) -> Vec<String> {
    let mut found = Vec::new();
    for (event_id, event_type, url, status) in rows {
        let got = received
            .get(url)
            .and_then(|events| events.get(event_id))
            .copied()
            .unwrap_or(0);
        match status.as_str() {
            "sent" if got == 0 => found.push(format!(
                "a {event_type} event is marked delivered but the merchant never received it"
            )),
            "sent" => {}
            // Given up on after the retry schedule (days of failures), kept as
            // a dead letter an operator can replay: explained, not lost.
            "dead" => {}
            other => found.push(format!(
                "a {event_type} event is still {other} after convergence (received {got} times)"
            )),
        }
    }
    found
}

/// Per delivery target of every outbox event of a merchant with an endpoint:
/// (event id, event type, endpoint URL, delivery status or why there is none).
pub const DELIVERIES: &str = "
SELECT o.event_id, o.event_type, e.url,
       COALESCE(d.status, 'without a delivery row (outbox ' || o.status || ')')
    FROM outbox o
    JOIN webhook_endpoints e ON e.merchant_id = o.merchant_id AND e.enabled = 1
    LEFT JOIN event_deliveries d ON d.event_id = o.event_id AND d.endpoint_id = e.id
    ORDER BY o.seq";
