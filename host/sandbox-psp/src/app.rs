//! Shared state and the execution path every money-moving request takes:
//! idempotency claim → (fault) → execute under the ledger lock → save the answer →
//! webhooks → (fault) → answer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{Format, SandboxConfig};
use crate::faults::{Transport, GARBAGE_BODY};
use crate::idempotency::{Claim, Fingerprint, IdempotencyStore, SlotKey, StoredResponse};
use crate::model::{Changed, Ledger, Payment, Refund};
use crate::notices::{notices_for, Notice};
use crate::util::{lock, Ids};
use crate::webhooks::Hub;

pub struct App {
    pub config: SandboxConfig,
    /// `http://127.0.0.1:<port>`.
    pub root_url: String,
    pub ids: Arc<Ids>,
    pub ledger: Mutex<Ledger>,
    pub idempotency: Mutex<IdempotencyStore>,
    pub hub: Hub,
    pub shutdown: watch::Receiver<bool>,
    /// Every lookup of a payment, with when it started and ended.
    pub queries: Mutex<Vec<QueryRecord>>,
    /// Per account (API key, or Adyen merchant account): the decline every
    /// otherwise approved payment gets there.
    pub account_declines: Mutex<std::collections::BTreeMap<String, crate::faults::Decline>>,
    /// Per account (named as for declines): latency, 5xx, hang.
    pub account_faults: Mutex<crate::account_faults::FaultMap>,
}

/// One lookup of a payment (Stripe retrieve or search of a PaymentIntent):
/// which attempt reference it was about and when it started and ended, so
/// tests can show that two gateway instances never query one attempt at the
/// same moment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueryRecord {
    /// The attempt reference (`metadata[sluice_attempt_reference]`), or the
    /// PaymentIntent id when a retrieve named an unknown one.
    pub reference: String,
    /// `retrieve` or `search`.
    pub kind: String,
    pub started_unix_ms: i64,
    pub ended_unix_ms: i64,
}

/// An HTTP answer before format-specific headers are added.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    /// False only for the garbage fault.
    pub json: bool,
    /// Served from the idempotency store.
    pub replayed: bool,
}

impl Answer {
    pub fn json(status: u16, body: &serde_json::Value) -> Self {
        Self {
            status,
            body: body.to_string(),
            json: true,
            replayed: false,
        }
    }

    pub fn replay(saved: StoredResponse) -> Self {
        Self {
            status: saved.status,
            body: saved.body,
            json: true,
            replayed: true,
        }
    }
}

/// The result of executing an operation: its answer and the webhooks it causes.
pub struct Executed {
    pub answer: Answer,
    pub notices: Vec<Notice>,
}

/// An operation ready to run once its key is claimed.
pub struct Operation {
    pub transport: Transport,
    /// Answer for `Transport::ServerError` (format-specific 500 body).
    pub server_error: Answer,
    pub execute: Execute,
}

/// The body of an operation: runs once, under no lock, and takes the ledger lock itself.
pub type Execute = Box<dyn FnOnce(&Arc<App>) -> Executed + Send>;

impl App {
    /// Runs a claimed operation to its answer, applying its transport fault. The
    /// work runs in its own task so a client that hangs up does not undo a commit.
    pub async fn perform(self: &Arc<App>, slot: Option<SlotKey>, op: Operation) -> Answer {
        if op.transport == Transport::ServerError {
            self.release(slot.as_ref());
            return op.server_error;
        }
        let app = self.clone();
        let transport = op.transport;
        let work = tokio::spawn(async move {
            if transport == Transport::Slow {
                app.sleep_unless_shutdown(app.config.slow_delay).await;
            }
            let executed = (op.execute)(&app);
            if let Some(slot) = &slot {
                lock(&app.idempotency).complete(
                    slot,
                    StoredResponse {
                        status: executed.answer.status,
                        body: executed.answer.body.clone(),
                    },
                );
            }
            let delivered = app.hub.emit(executed.notices);
            if transport == Transport::WebhookBeforeResponse {
                // Resolves when every webhook was acknowledged or gave up.
                let _ = delivered.await;
            }
            executed.answer
        });
        let answer = match work.await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::error!(error = %e, "sandbox operation task failed");
                return op.server_error;
            }
        };
        match transport {
            Transport::CommitThenTimeout => {
                self.sleep_unless_shutdown(self.config.timeout_hold).await;
                answer
            }
            Transport::Garbage => Answer {
                status: 200,
                body: GARBAGE_BODY.to_owned(),
                json: false,
                replayed: false,
            },
            _ => answer,
        }
    }

    /// Claims `key` for a request to `endpoint` with canonical `params`.
    /// Ok(None) when the request carries no key; Err for every answer other than "go ahead".
    pub fn claim(
        &self,
        format: Format,
        api_key: &str,
        endpoint: &str,
        key: Option<&str>,
        params: String,
    ) -> Result<Option<SlotKey>, Claim> {
        let Some(key) = key else {
            return Ok(None);
        };
        let slot = SlotKey::new(
            self.config.idempotency_scope,
            format,
            api_key,
            endpoint,
            key,
        );
        let fingerprint = Fingerprint {
            endpoint: endpoint.to_owned(),
            params,
        };
        match lock(&self.idempotency).claim(&slot, &fingerprint) {
            Claim::Proceed => Ok(Some(slot)),
            other => Err(other),
        }
    }

    pub fn release(&self, slot: Option<&SlotKey>) {
        if let Some(slot) = slot {
            lock(&self.idempotency).release(slot);
        }
    }

    pub async fn sleep_unless_shutdown(&self, d: Duration) {
        let mut shutdown = self.shutdown.clone();
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = shutdown.changed() => {}
        }
    }

    pub fn action_url(&self, payment_id: &str) -> String {
        format!("{}/_sandbox/3ds/{payment_id}", self.root_url)
    }

    /// Settles a pending payment or refund after the configured delay.
    pub fn schedule_settle(self: &Arc<App>, what: Pending) {
        let Some(delay) = self.config.late_webhook_delay else {
            return;
        };
        let app = self.clone();
        tokio::spawn(async move {
            let mut shutdown = app.shutdown.clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => return,
            }
            let notices = match what {
                Pending::Payment(id) => app.settle_payment(&id),
                Pending::Refund(id) => app.settle_refund(&id),
            };
            drop(app.hub.emit(notices.unwrap_or_default()));
        });
    }

    fn settle_payment(&self, id: &str) -> Option<Vec<Notice>> {
        let changed = lock(&self.ledger).settle_payment(&self.ids, id)?;
        Some(notices_of(self.config.clock.now_secs(), &changed))
    }

    fn settle_refund(&self, id: &str) -> Option<Vec<Notice>> {
        let (p, r, h) = lock(&self.ledger).settle_refund(id)?;
        Some(notices_for(self.config.clock.now_secs(), &p, &[r], &[h]))
    }

    /// A settlement report of one account and period from the ledger.
    pub fn settlement_report(
        &self,
        format: Format,
        request: &crate::reports::ReportRequest,
    ) -> String {
        let (payments, refunds) = {
            let ledger = lock(&self.ledger);
            (ledger.all_payments(), ledger.all_refunds())
        };
        match format {
            Format::Stripe => crate::reports::stripe_report(request, &payments, &refunds),
            Format::Adyen => crate::reports::adyen_report(request, &payments, &refunds),
        }
    }

    /// Settles every pending payment and refund now; returns how many settled.
    pub fn settle_all_pending(&self) -> usize {
        let (payments, refunds) = {
            let ledger = lock(&self.ledger);
            (ledger.pending_payment_ids(), ledger.pending_refund_ids())
        };
        let settled: Vec<Vec<Notice>> = payments
            .iter()
            .filter_map(|id| self.settle_payment(id))
            .chain(refunds.iter().filter_map(|id| self.settle_refund(id)))
            .collect();
        let count = settled.len();
        drop(self.hub.emit(settled.into_iter().flatten().collect()));
        count
    }

    /// The customer finishes the 3-D Secure step. None when the payment does not
    /// exist or is not waiting for it.
    pub fn complete_action(&self, id: &str, authenticated: bool) -> Option<Payment> {
        let changed = lock(&self.ledger).complete_action(&self.ids, id, authenticated)?;
        drop(
            self.hub
                .emit(notices_of(self.config.clock.now_secs(), &changed)),
        );
        Some(changed.0)
    }

    pub fn find_payment(&self, id: &str) -> Option<Payment> {
        lock(&self.ledger).any_payment(id).cloned()
    }

    pub fn find_refund(&self, id: &str) -> Option<Refund> {
        lock(&self.ledger).any_refund(id).cloned()
    }

    /// The behaviour of a new payment at an account: the token's, with the
    /// account's decline applied (`faults::outcome_at_account`).
    pub fn behaviour_at(
        &self,
        account: &str,
        token: &str,
    ) -> (crate::faults::CardOutcome, crate::faults::Transport) {
        let (outcome, transport) = crate::faults::behaviour_for(token);
        let decline = lock(&self.account_declines).get(account).copied();
        (
            crate::faults::outcome_at_account(outcome, decline),
            transport,
        )
    }

    pub fn accepts_key(&self, format: Format, key: &str) -> bool {
        let keys = match format {
            Format::Stripe => &self.config.stripe_api_keys,
            Format::Adyen => &self.config.adyen_api_keys,
        };
        keys.iter().any(|k| k == key)
    }
}

/// Work that finishes later.
pub enum Pending {
    Payment(String),
    Refund(String),
}

pub fn notices_of(now_secs: i64, changed: &Changed) -> Vec<Notice> {
    notices_for(now_secs, &changed.0, &[], &changed.1)
}

/// Builds the HTTP response for `answer` with extra headers.
pub fn respond(answer: Answer, headers: &[(&'static str, String)]) -> axum::response::Response {
    use axum::http::{header, HeaderValue, StatusCode};
    use axum::response::IntoResponse;

    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if answer.json {
        "application/json"
    } else {
        "text/html"
    };
    let mut response = (status, answer.body).into_response();
    let map = response.headers_mut();
    map.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            map.insert(*name, value);
        }
    }
    response
}
