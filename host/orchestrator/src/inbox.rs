//! The asynchronous inbox processor: applies verified webhook events through
//! the one door, retries what cannot be applied yet (a webhook that overtook
//! the API response names a PSP reference not recorded yet), and quarantines
//! what keeps failing, with its reason, for an operator to replay.
//!
//! Each event is applied with its inbox id, so the door marks the row
//! processed in the same transaction as the state change: a crash between
//! the two is impossible, and a row applied twice is a recorded duplicate.

use tokio::sync::watch;
use tracing::Instrument;

use sluice_store::{
    AccountScope, AdapterIdentity, Applied, ApplyEvent, DecisionKind, EventTarget, InboxEntry,
    Provenance,
};

use crate::config::millis;
use crate::error::OrchestratorError;
use crate::orchestrator::{Orchestrator, Target, Trigger};
use crate::webhook::InboxPayload;

/// What one processor round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboxRound {
    pub claimed: usize,
    /// Decisions taken through the door (any kind: applied, ignored, ...).
    pub decided: usize,
    pub applied: usize,
    /// Set aside for a later try.
    pub retried: usize,
    pub quarantined: usize,
}

/// What replaying a quarantined event did.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    pub inbox_id: String,
    pub applied: Applied,
}

/// Why an inbox event could not be applied this time.
#[derive(Debug)]
enum Failure {
    /// Try again later (e.g. the aggregate is not known yet).
    Retry(String),
    /// Never retry automatically.
    Poison(String),
}

impl Orchestrator {
    /// Claim a batch of due inbox rows and apply them. For tests and for
    /// [`Orchestrator::run_inbox_processor`].
    pub async fn process_inbox_once(&self) -> Result<InboxRound, OrchestratorError> {
        let config = &self.config().inbox;
        let entries = self
            .store()
            .inbox_claim(config.batch_size, millis(config.lease))
            .await?;
        let mut round = InboxRound {
            claimed: entries.len(),
            ..InboxRound::default()
        };
        for entry in entries {
            let span = tracing::info_span!("inbox", inbox_id = %entry.id, adapter = %entry.adapter,
                event_id = entry.provider_event_id.as_deref().unwrap_or("-"),
                tries = entry.attempts);
            self.process_entry(entry, &mut round)
                .instrument(span)
                .await?;
        }
        Ok(round)
    }

    /// Run the processor until `shutdown` turns true (or its sender is gone).
    pub async fn run_inbox_processor(&self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!("inbox processor started");
        loop {
            if *shutdown.borrow() {
                break;
            }
            let idle = match self.process_inbox_once().await {
                Ok(round) => round.claimed == 0,
                Err(error) => {
                    tracing::warn!(error = %error, "inbox round failed");
                    true
                }
            };
            if idle {
                let pause = tokio::time::sleep(self.config().inbox.idle_poll);
                tokio::select! {
                    _ = pause => {}
                    changed = shutdown.changed() => {
                        if changed.is_err() {
                            break;
                        }
                    }
                }
            }
        }
        tracing::info!("inbox processor stopped");
    }

    /// Apply a quarantined event again, on an operator's request. On success
    /// the row is processed (in the door's transaction); on failure it stays
    /// quarantined and the error is returned to the operator.
    pub async fn replay_quarantined(
        &self,
        inbox_id: &str,
        actor: &str,
    ) -> Result<Replayed, OrchestratorError> {
        let entry = self.store().inbox_get(inbox_id).await?;
        if entry.status != "quarantined" || entry.verification != "verified" {
            return Err(OrchestratorError::InvalidState(format!(
                "inbox entry {inbox_id} is {} ({}); only quarantined verified events can be replayed",
                entry.status, entry.verification
            )));
        }
        let payload = decode(&entry).map_err(OrchestratorError::InvalidState)?;
        tracing::info!(inbox_id, actor, "replaying a quarantined inbox event");
        match self.apply_inbox_event(&entry, &payload, actor).await {
            Ok(applied) => Ok(Replayed {
                inbox_id: inbox_id.to_owned(),
                applied,
            }),
            Err(Failure::Retry(reason) | Failure::Poison(reason)) => {
                Err(OrchestratorError::InvalidState(format!(
                    "replay of {inbox_id} failed again: {reason}"
                )))
            }
        }
    }

    async fn process_entry(
        &self,
        entry: InboxEntry,
        round: &mut InboxRound,
    ) -> Result<(), OrchestratorError> {
        let payload = match decode(&entry) {
            Ok(payload) => payload,
            Err(reason) => {
                return self.give_up(&entry, &reason, round).await;
            }
        };
        match self
            .apply_inbox_event(&entry, &payload, Trigger::Webhook.actor())
            .await
        {
            Ok(applied) => {
                round.decided += 1;
                if applied.decision == DecisionKind::Applied {
                    round.applied += 1;
                }
                self.wake(&applied).await;
                Ok(())
            }
            Err(Failure::Poison(reason)) => self.give_up(&entry, &reason, round).await,
            Err(Failure::Retry(reason)) => {
                let config = &self.config().inbox;
                if entry.attempts >= config.max_tries {
                    let reason = format!("gave up after {} tries: {reason}", entry.attempts);
                    return self.give_up(&entry, &reason, round).await;
                }
                let retry_at = self
                    .now_ms()
                    .saturating_add(millis(config.retry_delay(entry.attempts)));
                tracing::info!(reason = %reason, retry_at, "inbox event not applied yet; will retry");
                self.store()
                    .inbox_mark_failed(&entry.id, &reason, retry_at)
                    .await?;
                round.retried += 1;
                Ok(())
            }
        }
    }

    async fn give_up(
        &self,
        entry: &InboxEntry,
        reason: &str,
        round: &mut InboxRound,
    ) -> Result<(), OrchestratorError> {
        tracing::warn!(reason, "inbox event quarantined for an operator");
        self.store().inbox_quarantine(&entry.id, reason).await?;
        round.quarantined += 1;
        Ok(())
    }

    async fn apply_inbox_event(
        &self,
        entry: &InboxEntry,
        payload: &InboxPayload,
        actor: &str,
    ) -> Result<Applied, Failure> {
        let provenance = Provenance {
            adapter: Some(AdapterIdentity {
                name: entry.adapter.clone(),
                version: payload.adapter_version.clone(),
                digest: payload.adapter_digest.clone(),
            }),
            actor: Some(actor.to_owned()),
            trace_id: None,
        };
        let input = ApplyEvent {
            // The tenant boundary: the event was verified with this
            // account's secrets, so it may only touch this account's aggregates.
            target: EventTarget::FromEvent {
                scope: AccountScope::new(&entry.connector_account_id, &entry.adapter),
            },
            event: payload.event.clone(),
            provenance,
            inbox_id: Some(entry.id.clone()),
            next_retry_time: None,
        };
        self.apply(input).await.map_err(|error| match error {
            // Not known yet (the webhook overtook the API response), a CAS
            // race, the database: all worth another try.
            OrchestratorError::NotFound { .. }
            | OrchestratorError::Busy(_)
            | OrchestratorError::Conflict(_)
            | OrchestratorError::Store(_) => Failure::Retry(error.to_string()),
            other => Failure::Poison(other.to_string()),
        })
    }

    /// A webhook is a wake-up call (seed 000 §6): if the aggregate is still
    /// UNKNOWN after it, query now rather than at the scanner's next round.
    async fn wake(&self, applied: &Applied) {
        if applied.to_state != "UNKNOWN" {
            return;
        }
        let target = match applied.aggregate {
            sluice_core::Aggregate::Attempt => Target::Attempt(applied.aggregate_id.clone()),
            sluice_core::Aggregate::Capture => Target::Capture(applied.aggregate_id.clone()),
            sluice_core::Aggregate::Refund => Target::Refund(applied.aggregate_id.clone()),
            sluice_core::Aggregate::Order => return,
        };
        if let Err(error) = self.advance(target, Trigger::Webhook).await {
            tracing::warn!(error = %error, "wake-up query after a webhook failed");
        }
    }
}

fn decode(entry: &InboxEntry) -> Result<InboxPayload, String> {
    let value = entry
        .event
        .clone()
        .ok_or_else(|| "the inbox row holds no event".to_owned())?;
    serde_json::from_value(value).map_err(|e| format!("the stored event cannot be decoded: {e}"))
}
