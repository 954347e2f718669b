//! Adapter releases on the payment path (issue 15): which version serves an attempt,
//! and the canary watch that stops a canary doing worse than the active version.
//!
//! An attempt is pinned to the version that builds its first request
//! ([`sluice_adapter_runtime::AdapterRuntime::for_new_attempt`]: the canary when its
//! rollout takes the attempt's reference); every later call about the attempt (its
//! queries, re-sends, captures, voids and refunds) goes through that version while it is
//! loaded, so an attempt started on a canary keeps converging on it after the canary is
//! stopped. Versions are never unloaded, so a pin only falls back to the active version
//! when the gateway restarted without the pinned component (logged).
//!
//! The watch counts the first sends of new attempts per version while a canary runs and
//! stops the canary ([`verdict`]) when its UNKNOWN, error or decline rate exceeds the
//! active version's by more than the canary policy allows over at least its minimum
//! sample: in memory per process, each instance judging what it sent; the stop is
//! written to the adapter's release history and counted.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use sluice_adapter_runtime::{CanaryPolicy, CanaryStatus};
use sluice_core::{AttemptState, EventKind};
use sluice_store::{AdapterEventKind, AdapterPin, PaymentAttempt};

use crate::call::{CallOutcome, Connector};
use crate::convert::Operation;
use crate::{Orchestrator, OrchestratorError};

/// How the first send of a new attempt went, as the canary watch counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstSend {
    Answered,
    Declined,
    /// No usable answer: the payment's outcome is unknown.
    Unknown,
    /// The adapter itself failed (it refused to build the request, trapped, or
    /// answered something the host could not use).
    Error,
}

impl FirstSend {
    pub(crate) fn of(outcome: &CallOutcome) -> FirstSend {
        match outcome {
            CallOutcome::Unknown { code, .. }
                if code == "adapter_error" || code == "unusable_answer" =>
            {
                FirstSend::Error
            }
            CallOutcome::Unknown { .. } => FirstSend::Unknown,
            CallOutcome::Answered(events)
                if events
                    .first()
                    .is_some_and(|e| e.kind == EventKind::PaymentFailed) =>
            {
                FirstSend::Declined
            }
            CallOutcome::Answered(_) => FirstSend::Answered,
        }
    }
}

/// First sends of one version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub total: u32,
    pub unknown: u32,
    pub error: u32,
    pub declined: u32,
}

impl Tally {
    fn add(&mut self, send: FirstSend) {
        self.total = self.total.saturating_add(1);
        let counter = match send {
            FirstSend::Answered => return,
            FirstSend::Declined => &mut self.declined,
            FirstSend::Unknown => &mut self.unknown,
            FirstSend::Error => &mut self.error,
        };
        *counter = counter.saturating_add(1);
    }

    /// `count` of `total` in basis points (0 with no sample).
    fn rate_bp(&self, count: u32) -> u64 {
        if self.total == 0 {
            return 0;
        }
        u64::from(count) * 10_000 / u64::from(self.total)
    }
}

/// Why the canary must stop, if it must: the first of its UNKNOWN, error and decline
/// rates that exceeds the active version's by more than `max_excess_pct` points, once
/// the canary has `min_sample` first sends. The active version's rate over whatever
/// sample it has (none counts as 0%).
pub(crate) fn verdict(policy: &CanaryPolicy, canary: &Tally, active: &Tally) -> Option<String> {
    if canary.total < policy.min_sample {
        return None;
    }
    let allowed = u64::from(policy.max_excess_pct) * 100;
    let rates = [
        ("UNKNOWN", canary.unknown, active.unknown),
        ("error", canary.error, active.error),
        ("decline", canary.declined, active.declined),
    ];
    rates.into_iter().find_map(|(name, c, a)| {
        let (c_bp, a_bp) = (canary.rate_bp(c), active.rate_bp(a));
        (c_bp > a_bp + allowed).then(|| {
            format!(
                "{name} rate {}.{:02}% over {} attempts against the active version's {}.{:02}% \
                 over {}; at most {} points more allowed",
                c_bp / 100,
                c_bp % 100,
                canary.total,
                a_bp / 100,
                a_bp % 100,
                active.total,
                policy.max_excess_pct
            )
        })
    })
}

/// The first sends of the canary and the active version since the canary started.
#[derive(Debug, Default)]
struct Epoch {
    canary_digest: String,
    canary: Tally,
    active: Tally,
}

/// Per adapter, the current canary's epoch.
#[derive(Debug, Default)]
pub(crate) struct CanaryWatch {
    epochs: Mutex<BTreeMap<String, Epoch>>,
}

impl CanaryWatch {
    /// Counts one first send by version `digest` and says whether the canary must stop.
    fn count(
        &self,
        adapter: &str,
        canary: &CanaryStatus,
        versions: (&str, &str),
        send: FirstSend,
    ) -> Option<String> {
        let (active_digest, digest) = versions;
        let mut epochs = self.epochs.lock().unwrap_or_else(PoisonError::into_inner);
        let epoch = epochs.entry(adapter.to_owned()).or_default();
        if epoch.canary_digest != canary.digest {
            *epoch = Epoch {
                canary_digest: canary.digest.clone(),
                ..Epoch::default()
            };
        }
        if digest == canary.digest {
            epoch.canary.add(send);
        } else if digest == active_digest {
            epoch.active.add(send);
        } else {
            return None;
        }
        verdict(&canary.policy, &epoch.canary, &epoch.active)
    }

    /// The tallies of `canary`'s epoch (canary, active), for reports.
    pub(crate) fn tallies(&self, adapter: &str, canary: &CanaryStatus) -> (Tally, Tally) {
        let epochs = self.epochs.lock().unwrap_or_else(PoisonError::into_inner);
        match epochs.get(adapter) {
            Some(epoch) if epoch.canary_digest == canary.digest => (epoch.canary, epoch.active),
            _ => (Tally::default(), Tally::default()),
        }
    }
}

impl Orchestrator {
    /// The connector for a call about `attempt`, through the version pinned to it. An
    /// attempt not sent yet is pinned here, to the version that will build its request.
    pub(crate) async fn attempt_connector(
        &self,
        attempt: &PaymentAttempt,
    ) -> Result<Connector, OrchestratorError> {
        let mut connector = self.connector(&attempt.connector_account_id).await?;
        let Some(pin) = self.pin_of(attempt, &connector).await? else {
            return Ok(connector);
        };
        if pin.digest == connector.adapter.identity().digest {
            return Ok(connector);
        }
        let name = connector.adapter.identity().name.clone();
        match self.runtime().version(&name, &pin.digest) {
            Some(pinned) => connector.adapter = pinned,
            None => tracing::warn!(adapter = %name, attempt_id = %attempt.id,
                pinned = %pin.digest, "the attempt's adapter version is not loaded; \
                the active version serves it"),
        }
        Ok(connector)
    }

    async fn pin_of(
        &self,
        attempt: &PaymentAttempt,
        connector: &Connector,
    ) -> Result<Option<AdapterPin>, OrchestratorError> {
        if let Some(pin) = &attempt.adapter_pin {
            return Ok(Some(pin.clone()));
        }
        // An attempt that left the host before pins were recorded follows the active
        // version: a canary takes new attempts only.
        if attempt.state != AttemptState::Created {
            return Ok(None);
        }
        let name = &connector.adapter.identity().name;
        let chosen = self
            .runtime()
            .for_new_attempt(name, &attempt.connector_account_id, &attempt.reference)
            .unwrap_or_else(|| connector.adapter.clone());
        // Recorded with the attempt's first send (`record_sent`), in the
        // same transaction: until then nothing has left the host, and a later
        // try chooses again.
        let id = chosen.identity();
        Ok(Some(AdapterPin {
            version: id.version.clone(),
            digest: id.digest.clone(),
        }))
    }

    /// Counts the first send of a new attempt for the adapter's canary, if one runs,
    /// and stops the canary when the watch says so.
    pub(crate) async fn watch_canary(
        &self,
        connector: &Connector,
        operation: Operation,
        send: FirstSend,
    ) {
        if !matches!(operation, Operation::Authorize | Operation::Sale) {
            return;
        }
        let identity = connector.adapter.identity();
        let Some(canary) = self.runtime().canary(&identity.name) else {
            return;
        };
        let Some(active) = self.runtime().active(&identity.name) else {
            return;
        };
        let active_digest = active.identity().digest.clone();
        let versions = (active_digest.as_str(), identity.digest.as_str());
        let Some(reason) = self
            .inner
            .canary_watch
            .count(&identity.name, &canary, versions, send)
        else {
            return;
        };
        self.roll_back_canary(&identity.name, &canary, &reason)
            .await;
    }

    async fn roll_back_canary(&self, adapter: &str, canary: &CanaryStatus, reason: &str) {
        match self.runtime().stop_canary(adapter, Some(&canary.digest)) {
            Ok(Some(_)) => {}
            // Another call stopped it first, or it was replaced: nothing to record.
            Ok(None) => return,
            Err(error) => {
                tracing::error!(adapter, error = %error, "canary could not be stopped");
                return;
            }
        }
        tracing::warn!(adapter, digest = %canary.digest, version = %canary.version, reason,
            "canary rolled back: it takes no new attempts; its attempts keep converging on it");
        crate::metrics::canary_rolled_back(adapter);
        if let Err(error) = self
            .store()
            .record_adapter_event(
                adapter,
                &canary.digest,
                AdapterEventKind::CanaryRolledBack,
                reason,
                "gateway",
            )
            .await
        {
            tracing::error!(adapter, error = %error, "canary rollback not written to history");
        }
    }

    /// The canary of `adapter` and its tallies since it started (canary, active).
    pub fn canary_report(&self, adapter: &str) -> Option<(CanaryStatus, Tally, Tally)> {
        let canary = self.runtime().canary(adapter)?;
        let (c, a) = self.inner.canary_watch.tallies(adapter, &canary);
        Some((canary, c, a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(total: u32, unknown: u32, error: u32, declined: u32) -> Tally {
        Tally {
            total,
            unknown,
            error,
            declined,
        }
    }

    #[test]
    fn a_canary_below_its_minimum_sample_is_never_stopped() {
        let policy = CanaryPolicy {
            min_sample: 20,
            max_excess_pct: 10,
        };
        assert_eq!(
            verdict(&policy, &tally(19, 19, 0, 0), &tally(100, 0, 0, 0)),
            None
        );
    }

    #[test]
    fn a_canary_whose_unknown_rate_exceeds_the_active_ones_by_more_than_the_margin_is_stopped() {
        let policy = CanaryPolicy {
            min_sample: 20,
            max_excess_pct: 10,
        };
        let reason = verdict(&policy, &tally(20, 5, 0, 0), &tally(100, 10, 0, 0));
        assert!(reason.is_some_and(|r| r.starts_with("UNKNOWN rate 25.00%")));
    }

    #[test]
    fn a_canary_within_the_margin_keeps_running() {
        let policy = CanaryPolicy {
            min_sample: 20,
            max_excess_pct: 10,
        };
        // 20% declines against the active version's 15%: five points, within ten.
        assert_eq!(
            verdict(&policy, &tally(20, 0, 0, 4), &tally(100, 0, 0, 15)),
            None
        );
    }
}
