//! Webhook ingestion: `POST /webhooks/{adapter}/{connector_account}`.
//!
//! 1. The adapter and the connector account must exist and belong together
//!    (otherwise `NotFound`, whatever the body says).
//! 2. The adapter verifies and normalises the request in its sandbox, with
//!    only that account's settings and secrets.
//! 3. Every verified event is inserted into the inbox, durably (each insert
//!    commits on its own), before this returns the adapter's ack; the HTTP
//!    layer sends the ack only after that. A failure here returns an error,
//!    so the PSP gets no 2xx and delivers again.
//! 4. A redelivery finds its provider event id in the inbox: same ack,
//!    nothing applied twice.
//!
//! Nothing here logs headers or the body: they carry signatures.

use sha2::{Digest, Sha256};
use sluice_adapter_runtime::{HttpResponse, WebhookRejection, WebhookRequest};
use sluice_core::{EvidenceSource, PaymentEvent};
use sluice_store::{AcceptedWebhook, InboxInsert, NewInboxEvent, StoreError};
use tracing::Instrument;

use crate::call::Connector;
use crate::convert;
use crate::error::OrchestratorError;
use crate::orchestrator::Orchestrator;

/// Why a webhook was refused. Maps to 401 (signature, timestamp) or 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    BadSignature,
    StaleTimestamp,
    Malformed,
    Unsupported,
}

impl RejectionKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectionKind::BadSignature => "bad_signature",
            RejectionKind::StaleTimestamp => "stale_timestamp",
            RejectionKind::Malformed => "malformed",
            RejectionKind::Unsupported => "unsupported",
        }
    }

    /// What the HTTP layer answers.
    pub fn http_status(&self) -> u16 {
        match self {
            RejectionKind::BadSignature | RejectionKind::StaleTimestamp => 401,
            RejectionKind::Malformed | RejectionKind::Unsupported => 400,
        }
    }
}

/// One verified event of an accepted webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxReceipt {
    pub inbox_id: String,
    pub provider_event_id: String,
    /// Already in the inbox from an earlier delivery; nothing new written.
    pub duplicate: bool,
}

/// What the webhook route answers.
#[derive(Debug, Clone, PartialEq)]
pub enum WebhookOutcome {
    /// Verified, and every event is durably in the inbox: send `ack` as is.
    Accepted {
        ack: HttpResponse,
        receipts: Vec<InboxReceipt>,
    },
    /// Refused by the adapter (or unusable); nothing reached the state
    /// machine. `detail` carries no secret and no signature.
    Rejected {
        kind: RejectionKind,
        detail: String,
        /// The inbox row keeping the refusal as evidence.
        evidence_id: Option<String>,
    },
    /// No such adapter, or no such connector account for it.
    NotFound,
}

/// What the inbox keeps of a verified event: the event and who normalised it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct InboxPayload {
    pub event: PaymentEvent,
    pub adapter_version: String,
    pub adapter_digest: String,
}

impl Orchestrator {
    /// Verify, normalise and durably record a PSP webhook.
    pub async fn ingest_webhook(
        &self,
        adapter_name: &str,
        connector_account_id: &str,
        request: WebhookRequest,
    ) -> Result<WebhookOutcome, OrchestratorError> {
        let span = tracing::info_span!(
            "webhook",
            adapter = adapter_name,
            connector_account = connector_account_id
        );
        self.ingest(adapter_name, connector_account_id, request)
            .instrument(span)
            .await
    }

    async fn ingest(
        &self,
        adapter_name: &str,
        connector_account_id: &str,
        request: WebhookRequest,
    ) -> Result<WebhookOutcome, OrchestratorError> {
        if self.runtime().active(adapter_name).is_none() {
            return Ok(WebhookOutcome::NotFound);
        }
        let connector = match self.connector(connector_account_id).await {
            Ok(connector) => connector,
            Err(OrchestratorError::NotFound { .. }) => return Ok(WebhookOutcome::NotFound),
            Err(OrchestratorError::AdapterNotLoaded(_)) => return Ok(WebhookOutcome::NotFound),
            Err(error) => return Err(error),
        };
        if connector.adapter.identity().name != adapter_name {
            return Ok(WebhookOutcome::NotFound);
        }
        let digest = hex::encode(Sha256::digest(&request.body));
        let raw_body = request.body.clone();
        let adapter = &connector.adapter;
        let shadow_input = connector.shadow.as_ref().map(|_| request.clone());
        let verdict = adapter.handle_webhook(&connector.scope, request).await?;
        if let (Some(tap), Some(input)) = (&connector.shadow, shadow_input) {
            tap.repeat_handle_webhook(&connector, input, &verdict);
        }
        let acceptance = match verdict {
            Ok(acceptance) => acceptance,
            Err(rejection) => {
                let (kind, detail) = rejection_parts(rejection);
                return self
                    .reject(adapter_name, connector_account_id, &digest, kind, detail)
                    .await;
            }
        };
        let events = match convert::payment_events(&acceptance.events, EvidenceSource::Webhook) {
            Ok(events) => events,
            Err(error) => {
                return self
                    .reject(
                        adapter_name,
                        connector_account_id,
                        &digest,
                        RejectionKind::Malformed,
                        format!("verified, but the adapter's events are unusable: {error}"),
                    )
                    .await
            }
        };
        // The verified body is kept sealed, as evidence, with its events.
        let receipts = self
            .record_events(
                &connector,
                adapter_name,
                connector_account_id,
                &digest,
                &raw_body,
                events,
            )
            .await?;
        Ok(WebhookOutcome::Accepted {
            ack: acceptance.ack,
            receipts,
        })
    }

    /// One inbox row per event of a verified webhook (a duplicate is reported, not
    /// queued again), each naming the sealed raw body kept in the same commit.
    async fn record_events(
        &self,
        connector: &Connector,
        adapter_name: &str,
        connector_account_id: &str,
        digest: &str,
        raw_body: &[u8],
        events: Vec<PaymentEvent>,
    ) -> Result<Vec<InboxReceipt>, OrchestratorError> {
        let identity = connector.adapter.identity();
        let mut keys: Vec<String> = Vec::with_capacity(events.len());
        let mut rows = Vec::with_capacity(events.len());
        for (index, event) in events.into_iter().enumerate() {
            let provider_event_id = inbox_key(&event, index, &keys);
            let kind = event.kind;
            let payload = InboxPayload {
                event,
                adapter_version: identity.version.clone(),
                adapter_digest: identity.digest.clone(),
            };
            let json = serde_json::to_value(&payload).map_err(|e| {
                OrchestratorError::Store(StoreError::Unapplicable(format!(
                    "cannot encode the inbox payload: {e}"
                )))
            })?;
            rows.push((
                kind,
                NewInboxEvent {
                    adapter: adapter_name.to_owned(),
                    connector_account_id: connector_account_id.to_owned(),
                    provider_event_id: provider_event_id.clone(),
                    payload_digest: digest.to_owned(),
                    event: json,
                    raw_body_id: None,
                },
            ));
            keys.push(provider_event_id);
        }
        let (kinds, events): (Vec<_>, Vec<_>) = rows.into_iter().unzip();
        let (_, outcomes) = self
            .store()
            .accept_webhook(AcceptedWebhook {
                connector_account_id,
                payload_digest: digest,
                body: raw_body,
                events,
            })
            .await?;
        let receipts = outcomes
            .into_iter()
            .zip(keys)
            .zip(kinds)
            .map(|((outcome, provider_event_id), kind)| {
                let (inbox_id, duplicate) = match outcome {
                    InboxInsert::Inserted { id } => (id, false),
                    InboxInsert::Duplicate { id, .. } => (id, true),
                };
                tracing::info!(event_id = %provider_event_id, inbox_id = %inbox_id,
                    duplicate, kind = %kind, "webhook event recorded");
                InboxReceipt {
                    inbox_id,
                    provider_event_id,
                    duplicate,
                }
            })
            .collect();
        Ok(receipts)
    }

    async fn reject(
        &self,
        adapter: &str,
        account: &str,
        digest: &str,
        kind: RejectionKind,
        detail: String,
    ) -> Result<WebhookOutcome, OrchestratorError> {
        tracing::warn!(reason = kind.as_str(), detail = %detail, "webhook refused");
        let evidence_id = self
            .store()
            .inbox_record_rejected(
                adapter,
                account,
                digest,
                &format!("{}: {detail}", kind.as_str()),
            )
            .await?;
        Ok(WebhookOutcome::Rejected {
            kind,
            detail,
            evidence_id: Some(evidence_id),
        })
    }
}

fn rejection_parts(rejection: WebhookRejection) -> (RejectionKind, String) {
    match rejection {
        WebhookRejection::BadSignature(detail) => (RejectionKind::BadSignature, detail),
        WebhookRejection::StaleTimestamp(detail) => (RejectionKind::StaleTimestamp, detail),
        WebhookRejection::Malformed(detail) => (RejectionKind::Malformed, detail),
        WebhookRejection::Unsupported(detail) => (RejectionKind::Unsupported, detail),
    }
}

/// The inbox's dedupe key for an event: the PSP's notification id, or a
/// digest of the normalised event when the PSP gives none (so a redelivery
/// still collides). Two events of one delivery sharing an id are told apart
/// by their position, which a redelivery of the same body repeats.
fn inbox_key(event: &PaymentEvent, index: usize, earlier: &[String]) -> String {
    let base = match &event.provider_event_id {
        Some(id) => id.clone(),
        None => {
            let canonical = serde_json::to_vec(event).unwrap_or_default();
            format!("sha256:{}", hex::encode(Sha256::digest(canonical)))
        }
    };
    if earlier.contains(&base) {
        format!("{base}#{index}")
    } else {
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::EventKind;

    #[test]
    fn an_event_without_a_provider_id_is_keyed_by_its_digest() {
        let event = PaymentEvent::new(EventKind::PaymentSucceeded, EvidenceSource::Webhook);
        let key = inbox_key(&event, 0, &[]);
        assert!(key.starts_with("sha256:"));
        assert_eq!(key, inbox_key(&event.clone(), 0, &[]));
        let other = PaymentEvent {
            psp_reference: Some("p_2".into()),
            ..event
        };
        assert_ne!(key, inbox_key(&other, 0, &[]));
    }

    #[test]
    fn two_events_of_one_delivery_with_the_same_id_get_distinct_keys() {
        let event = PaymentEvent {
            provider_event_id: Some("evt_1".into()),
            ..PaymentEvent::new(EventKind::RefundSucceeded, EvidenceSource::Webhook)
        };
        let first = InboxReceipt {
            inbox_id: "inb_1".into(),
            provider_event_id: inbox_key(&event, 0, &[]),
            duplicate: false,
        };
        assert_eq!(first.provider_event_id, "evt_1");
        assert_eq!(inbox_key(&event, 1, &[first.provider_event_id]), "evt_1#1");
    }

    #[test]
    fn signature_and_timestamp_refusals_are_401_and_the_rest_400() {
        assert_eq!(RejectionKind::BadSignature.http_status(), 401);
        assert_eq!(RejectionKind::StaleTimestamp.http_status(), 401);
        assert_eq!(RejectionKind::Malformed.http_status(), 400);
        assert_eq!(RejectionKind::Unsupported.http_status(), 400);
    }
}
