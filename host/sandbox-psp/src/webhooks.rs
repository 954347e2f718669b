//! Webhook delivery: signing, duplicates, delay, reordering, retries and a log of
//! the latest attempts with the gateway's answer.
//!
//! One dispatcher task takes first attempts in order (after an optional shuffle of
//! a window) and, with one sender (the default), sends each before taking the
//! next; with [`HubSetup::senders`] above one, up to that many requests are in
//! flight at once, as a PSP that delivers concurrently sends them, and they may
//! arrive in any order. An attempt the gateway does not acknowledge with 2xx is
//! retried by its own task so one failing endpoint does not hold up the rest.
//! The log of attempts keeps the latest [`MAX_DELIVERY_RECORDS`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};
use tokio::time::Instant;

use crate::config::{DeliveryFaults, Format, RetryPolicy, SandboxClock, WebhookTarget};
use crate::notices::{AdyenItem, Notice};
use crate::signing::{adyen_hmac_signature, stripe_signature_header, AdyenSignedFields};
use crate::util::{lock, Ids};

/// How many delivery attempts the log keeps (the oldest go first): a demo
/// that runs for hours, or a benchmark's hundreds of thousands of webhooks, would
/// otherwise keep every body it ever sent.
pub const MAX_DELIVERY_RECORDS: usize = 10_000;

/// The most webhook requests [`HubSetup::senders`] lets be in flight at once.
pub const MAX_SENDERS: usize = 64;

/// One event inside a delivered request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeliveredEvent {
    /// Stripe: the `evt_...` id. Adyen: the item's `pspReference`.
    pub id: String,
    /// Stripe: the event type. Adyen: `eventCode`.
    pub kind: String,
    /// Adyen: the item's `success`; Stripe: always true.
    pub success: bool,
}

/// One HTTP attempt to deliver a webhook, and what the gateway answered.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryRecord {
    /// Order in which attempts finished.
    pub seq: u64,
    pub connector: String,
    pub format: Format,
    pub url: String,
    pub events: Vec<DeliveredEvent>,
    /// 1 for the original, 2.. for configured duplicates.
    pub copy: u32,
    /// 1 for the first try, 2.. for retries.
    pub attempt: u32,
    pub body: String,
    /// The gateway's HTTP status; None when the request failed (see `error`).
    pub status: Option<u16>,
    /// The gateway's answer body, cut to 2 KiB.
    pub response_body: Option<String>,
    pub error: Option<String>,
    /// The gateway answered 2xx.
    pub acknowledged: bool,
    pub sent_at_unix_ms: i64,
}

/// A signed webhook request kept for the caller instead of being sent
/// ([`crate::SandboxConfig::capture_webhooks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedWebhook {
    /// The connector name the target was installed under.
    pub connector: String,
    pub url: String,
    /// The headers a real delivery carries (content type, signature, user agent).
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub events: Vec<DeliveredEvent>,
}

/// Fires its sender when the last clone is dropped: "every request of one emit is done".
struct EmitDone(Mutex<Option<oneshot::Sender<()>>>);

impl Drop for EmitDone {
    fn drop(&mut self) {
        if let Some(tx) = lock(&self.0).take() {
            // The waiter may have gone away (client disconnected); nothing to do then.
            let _ = tx.send(());
        }
    }
}

/// Counts a job as pending until every copy and retry of it is finished.
struct PendingToken(Arc<Inner>);

impl Drop for PendingToken {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// One HTTP request's worth of webhook for one target.
#[derive(Clone)]
struct Job {
    connector: String,
    target: WebhookTarget,
    body: Arc<String>,
    events: Vec<DeliveredEvent>,
    due: Instant,
    _done: Arc<EmitDone>,
    _pending: Arc<PendingToken>,
}

struct Inner {
    targets: Mutex<BTreeMap<String, WebhookTarget>>,
    faults: Mutex<DeliveryFaults>,
    retry: RetryPolicy,
    records: Mutex<VecDeque<DeliveryRecord>>,
    /// Some when more than one request may be in flight: one permit each.
    senders: Option<Arc<Semaphore>>,
    seq: AtomicU64,
    pending: AtomicUsize,
    idle: Notify,
    ids: Arc<Ids>,
    clock: SandboxClock,
    /// Some: capture mode; signed requests wait here instead of being sent.
    captured: Option<Mutex<Vec<CapturedWebhook>>>,
    client: reqwest::Client,
    shutdown: watch::Receiver<bool>,
}

/// How the hub is set up.
pub struct HubSetup {
    pub faults: DeliveryFaults,
    pub retry: RetryPolicy,
    pub targets: BTreeMap<String, WebhookTarget>,
    pub ids: Arc<Ids>,
    pub clock: SandboxClock,
    pub capture: bool,
    /// How many webhook requests may be in flight at once (1..=[`MAX_SENDERS`],
    /// clamped): 1 sends them one after another in order.
    pub senders: usize,
}

/// The webhook sender. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
    tx: mpsc::UnboundedSender<Job>,
}

impl Hub {
    pub fn start(setup: HubSetup, shutdown: watch::Receiver<bool>) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(setup.retry.request_timeout)
            .build()?;
        let inner = Arc::new(Inner {
            targets: Mutex::new(setup.targets),
            faults: Mutex::new(setup.faults),
            retry: setup.retry,
            records: Mutex::new(VecDeque::new()),
            senders: match setup.senders.clamp(1, MAX_SENDERS) {
                1 => None,
                n => Some(Arc::new(Semaphore::new(n))),
            },
            seq: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            idle: Notify::new(),
            ids: setup.ids,
            clock: setup.clock,
            captured: setup.capture.then(|| Mutex::new(Vec::new())),
            client,
            shutdown,
        });
        let (tx, rx) = mpsc::unbounded_channel();
        if inner.captured.is_none() {
            tokio::spawn(dispatch(inner.clone(), rx));
        }
        Ok(Self { inner, tx })
    }

    /// Capture mode: the signed requests kept so far, oldest first.
    pub fn take_captured(&self) -> Vec<CapturedWebhook> {
        self.inner
            .captured
            .as_ref()
            .map(|captured| std::mem::take(&mut *lock(captured)))
            .unwrap_or_default()
    }

    /// Queues `notices` for every matching target. The receiver resolves once all
    /// of them were acknowledged or gave up (immediately when nothing matched).
    pub fn emit(&self, notices: Vec<Notice>) -> oneshot::Receiver<()> {
        let (done_tx, done_rx) = oneshot::channel();
        let done = Arc::new(EmitDone(Mutex::new(Some(done_tx))));
        let delay = lock(&self.inner.faults).delay;
        let batch = lock(&self.inner.faults).adyen_batch;
        let targets = lock(&self.inner.targets).clone();
        for notice in notices {
            for (connector, target) in &targets {
                for (body, events) in self.render(&notice, target, batch) {
                    if let Some(captured) = &self.inner.captured {
                        let headers = signed_headers(&self.inner, target, &body);
                        lock(captured).push(CapturedWebhook {
                            connector: connector.clone(),
                            url: target.url.clone(),
                            headers,
                            body,
                            events,
                        });
                        continue;
                    }
                    self.inner.pending.fetch_add(1, Ordering::SeqCst);
                    let job = Job {
                        connector: connector.clone(),
                        target: target.clone(),
                        body: Arc::new(body),
                        events,
                        due: Instant::now() + delay,
                        _done: done.clone(),
                        _pending: Arc::new(PendingToken(self.inner.clone())),
                    };
                    // A closed queue means the sandbox is shutting down; the job is
                    // dropped, which releases its tokens.
                    let _ = self.tx.send(job);
                }
            }
        }
        done_rx
    }

    /// The request bodies `notice` becomes for `target` (empty when it does not match).
    fn render(
        &self,
        notice: &Notice,
        target: &WebhookTarget,
        adyen_batch: bool,
    ) -> Vec<(String, Vec<DeliveredEvent>)> {
        match notice {
            Notice::Stripe {
                api_key,
                event_type,
                object,
                idempotency_key,
            } if target.format == Format::Stripe && key_matches(target, api_key) => {
                let id = self.inner.ids.stripe("evt");
                let body = json!({
                    "id": id,
                    "object": "event",
                    "api_version": "2024-06-20",
                    "created": self.inner.clock.now_secs(),
                    "data": { "object": object },
                    "livemode": false,
                    "pending_webhooks": 1,
                    "request": { "id": null, "idempotency_key": idempotency_key },
                    "type": event_type,
                });
                let event = DeliveredEvent {
                    id,
                    kind: (*event_type).to_owned(),
                    success: true,
                };
                vec![(body.to_string(), vec![event])]
            }
            Notice::Adyen { api_key, items }
                if target.format == Format::Adyen && key_matches(target, api_key) =>
            {
                let groups: Vec<&[AdyenItem]> = if adyen_batch {
                    vec![items.as_slice()]
                } else {
                    items.chunks(1).collect()
                };
                groups
                    .into_iter()
                    .filter_map(|group| adyen_body(&target.secret, group))
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    pub fn set_target(&self, connector: String, target: WebhookTarget) {
        lock(&self.inner.targets).insert(connector, target);
    }

    pub fn remove_target(&self, connector: &str) -> bool {
        lock(&self.inner.targets).remove(connector).is_some()
    }

    pub fn targets(&self) -> BTreeMap<String, WebhookTarget> {
        lock(&self.inner.targets).clone()
    }

    pub fn set_faults(&self, faults: DeliveryFaults) {
        *lock(&self.inner.faults) = faults;
    }

    pub fn faults(&self) -> DeliveryFaults {
        lock(&self.inner.faults).clone()
    }

    pub fn records(&self) -> Vec<DeliveryRecord> {
        lock(&self.inner.records).iter().cloned().collect()
    }

    /// Waits until no webhook is queued, being sent or waiting for a retry.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.inner.idle.notified();
            if self.inner.pending.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.inner.pending.load(Ordering::SeqCst) == 0;
            }
        }
    }
}

fn key_matches(target: &WebhookTarget, api_key: &str) -> bool {
    target.api_key.as_deref().is_none_or(|k| k == api_key)
}

/// An Adyen notification request carrying `items`, each signed with `hex_key`.
/// None when the key is not hex (the target is misconfigured; nothing is sent).
fn adyen_body(hex_key: &str, items: &[AdyenItem]) -> Option<(String, Vec<DeliveredEvent>)> {
    let mut json_items = Vec::with_capacity(items.len());
    for item in items {
        let fields = AdyenSignedFields {
            psp_reference: &item.psp_reference,
            original_reference: item.original_reference.as_deref().unwrap_or(""),
            merchant_account_code: &item.merchant_account,
            merchant_reference: &item.merchant_reference,
            value: item.value,
            currency: &item.currency,
            event_code: item.event_code,
            success: item.success,
        };
        match adyen_hmac_signature(hex_key, &fields) {
            Ok(sig) => json_items.push(item.to_json(&sig)),
            Err(e) => {
                tracing::warn!(error = %e, "adyen webhook target has an unusable HMAC key; notification not sent");
                return None;
            }
        }
    }
    let events = items
        .iter()
        .map(|i| DeliveredEvent {
            id: i.psp_reference.clone(),
            kind: i.event_code.to_owned(),
            success: i.success,
        })
        .collect();
    let body = json!({ "live": "false", "notificationItems": json_items });
    Some((body.to_string(), events))
}

async fn dispatch(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut shutdown = inner.shutdown.clone();
    loop {
        let first = tokio::select! {
            job = rx.recv() => match job { Some(job) => job, None => return },
            _ = shutdown.changed() => return,
        };
        let faults = lock(&inner.faults).clone();
        let mut window = vec![first];
        if faults.reorder_window > 1 {
            let flush_at = Instant::now() + faults.reorder_flush;
            while window.len() < faults.reorder_window {
                tokio::select! {
                    job = rx.recv() => match job { Some(job) => window.push(job), None => break },
                    _ = tokio::time::sleep_until(flush_at) => break,
                    _ = shutdown.changed() => return,
                }
            }
            inner.ids.shuffle(&mut window);
        }
        for job in window {
            tokio::select! {
                _ = tokio::time::sleep_until(job.due) => {}
                _ = shutdown.changed() => return,
            }
            let Some(senders) = inner.senders.clone() else {
                deliver(&inner, &job, faults.duplicates).await;
                continue;
            };
            let permit = tokio::select! {
                permit = senders.acquire_owned() => permit,
                _ = shutdown.changed() => return,
            };
            // The semaphore is never closed, so a permit always comes; were it
            // closed, the job would be dropped as at shutdown.
            let Ok(permit) = permit else { return };
            let (inner, duplicates) = (inner.clone(), faults.duplicates);
            tokio::spawn(async move {
                deliver(&inner, &job, duplicates).await;
                drop(permit);
            });
        }
    }
}

/// The first attempt of each copy of `job`; a copy not acknowledged is retried
/// by a task of its own.
async fn deliver(inner: &Arc<Inner>, job: &Job, duplicates: u32) {
    for copy in 1..=duplicates.max(1) {
        if !send(inner, job, copy, 1).await && inner.retry.max_attempts > 1 {
            tokio::spawn(retry(inner.clone(), job.clone(), copy));
        }
    }
}

async fn retry(inner: Arc<Inner>, job: Job, copy: u32) {
    let mut shutdown = inner.shutdown.clone();
    for attempt in 2..=inner.retry.max_attempts {
        let wait = inner.retry.backoff * (attempt - 1);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
        if send(&inner, &job, copy, attempt).await {
            return;
        }
    }
}

/// The headers of one delivery of `body` to `target`, signed now.
fn signed_headers(inner: &Inner, target: &WebhookTarget, body: &str) -> Vec<(String, String)> {
    let mut headers = vec![(
        "content-type".to_owned(),
        "application/json; charset=utf-8".to_owned(),
    )];
    if target.format == Format::Stripe {
        let signature =
            stripe_signature_header(&target.secret, inner.clock.now_secs(), body.as_bytes());
        headers.push(("stripe-signature".to_owned(), signature));
        headers.push((
            "user-agent".to_owned(),
            "Stripe/1.0 (+https://stripe.com/docs/webhooks)".to_owned(),
        ));
    } else {
        headers.push(("user-agent".to_owned(), "Adyen HttpClient 1.0".to_owned()));
    }
    headers
}

/// One HTTP attempt; records it and says whether the gateway acknowledged it.
async fn send(inner: &Inner, job: &Job, copy: u32, attempt: u32) -> bool {
    let mut request = inner
        .client
        .post(&job.target.url)
        .body(job.body.as_bytes().to_vec());
    for (name, value) in signed_headers(inner, &job.target, &job.body) {
        request = request.header(name, value);
    }
    let sent_at = inner.clock.now_ms();
    let (status, response_body, error) = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            (Some(status), Some(truncate(text, 2048)), None)
        }
        Err(e) => (None, None, Some(e.to_string())),
    };
    let acknowledged = status.is_some_and(|s| (200..300).contains(&s));
    let event_kinds: Vec<&str> = job.events.iter().map(|e| e.kind.as_str()).collect();
    tracing::debug!(
        connector = %job.connector,
        events = ?event_kinds,
        copy,
        attempt,
        status = ?status,
        acknowledged,
        "webhook delivery attempt"
    );
    let record = DeliveryRecord {
        seq: inner.seq.fetch_add(1, Ordering::SeqCst),
        connector: job.connector.clone(),
        format: job.target.format,
        url: job.target.url.clone(),
        events: job.events.clone(),
        copy,
        attempt,
        body: job.body.as_ref().clone(),
        status,
        response_body,
        error,
        acknowledged,
        sent_at_unix_ms: sent_at,
    };
    let mut records = lock(&inner.records);
    if records.len() >= MAX_DELIVERY_RECORDS {
        records.pop_front();
    }
    records.push_back(record);
    drop(records);
    acknowledged
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
