//! The `Orchestrator` handle and what every entry point shares: resolving a
//! connector account to an adapter and a call budget, and putting events
//! through the store's one door.

use std::collections::BTreeMap;
use std::sync::Arc;

use sluice_adapter_runtime::{AdapterRuntime, ConnectorAccountScope, Keyring};
use sluice_core::{route_event, Aggregate, CaptureMode, PaymentEvent};
use sluice_store::{
    AccountScope, Applied, ApplyEvent, Clock, DecisionKind, EventTarget, NewScopeRefusal,
    Provenance, RefusalSource, Store, StoreError,
};

use crate::call::{budget_for, CallOutcome, Connector};
use crate::config::{ConnectorRecovery, OrchestratorConfig};
use crate::convert::OperationSpec;
use crate::error::OrchestratorError;
use crate::transport::PspTransport;

/// What woke `advance`: the same function serves every entry point, and the
/// trigger only tunes how eager it is (see [`crate::advance`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// A merchant API call (confirm, capture, refund, ...).
    Api,
    /// The inbox processor, after it applied a webhook event.
    Webhook,
    /// The recovery scanner.
    Scanner,
    /// An operator asked for it explicitly.
    Operator,
}

impl Trigger {
    pub fn as_str(&self) -> &'static str {
        match self {
            Trigger::Api => "api",
            Trigger::Webhook => "webhook",
            Trigger::Scanner => "scanner",
            Trigger::Operator => "operator",
        }
    }

    /// The actor recorded in history for events this trigger produces.
    pub(crate) fn actor(&self) -> &'static str {
        match self {
            Trigger::Api => "system:api",
            Trigger::Webhook => "system:webhook",
            Trigger::Scanner => "system:scanner",
            Trigger::Operator => "system:operator",
        }
    }
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The aggregate `advance` works on, by its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(tag = "type", content = "id", rename_all = "snake_case")]
pub enum Target {
    Attempt(String),
    Capture(String),
    Refund(String),
}

impl Target {
    pub fn id(&self) -> &str {
        match self {
            Target::Attempt(id) | Target::Capture(id) | Target::Refund(id) => id,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Target::Attempt(_) => "attempt",
            Target::Capture(_) => "capture",
            Target::Refund(_) => "refund",
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind(), self.id())
    }
}

/// The orchestrator. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Orchestrator {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub store: Store,
    pub runtime: AdapterRuntime,
    pub transport: Arc<dyn PspTransport>,
    pub clock: Arc<dyn Clock>,
    pub config: OrchestratorConfig,
    pub breakers: crate::breakers::Breakers,
    pub call_slots: crate::call_slots::CallSlots,
    pub canary_watch: crate::releases::CanaryWatch,
    pub shadows: Arc<crate::shadow::Shadows>,
    pub keyrings: crate::keyrings::Keyrings,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator")
            .field("transport", &self.inner.transport)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Orchestrator {
    pub fn new(
        store: Store,
        runtime: AdapterRuntime,
        transport: Arc<dyn PspTransport>,
        clock: Arc<dyn Clock>,
        config: OrchestratorConfig,
    ) -> Self {
        Orchestrator {
            inner: Arc::new(Inner {
                store,
                runtime,
                transport,
                clock,
                breakers: crate::breakers::Breakers::new(config.breaker),
                call_slots: crate::call_slots::CallSlots::default(),
                canary_watch: crate::releases::CanaryWatch::default(),
                shadows: Arc::default(),
                keyrings: Default::default(),
                config,
            }),
        }
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn runtime(&self) -> &AdapterRuntime {
        &self.inner.runtime
    }

    pub fn config(&self) -> &OrchestratorConfig {
        &self.inner.config
    }

    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// Resolve a connector account: the active version of its adapter, its
    /// own settings and secrets (nobody else's), its call budget.
    pub(crate) async fn connector(&self, account_id: &str) -> Result<Connector, OrchestratorError> {
        let credentials = self
            .inner
            .store
            .connector_credentials_cached(account_id)
            .await?;
        let adapter = self
            .inner
            .runtime
            .active(&credentials.adapter)
            .ok_or_else(|| OrchestratorError::AdapterNotLoaded(credentials.adapter.clone()))?;
        let scope = ConnectorAccountScope {
            account_id: credentials.connector_account_id.clone(),
            config: string_map(&credentials.config),
            secrets: self
                .inner
                .keyrings
                .get(&credentials.connector_account_id, &credentials.secrets),
        };
        let config = &self.inner.config;
        let budget = budget_for(&scope.config, config.psp_timeout, config.max_response_bytes);
        let recovery = ConnectorRecovery::for_account(
            config.adapter_recovery.get(&credentials.adapter),
            &scope.config,
        );
        let limits = crate::CallLimits::for_account(&config.call_limits, &scope.config);
        let shadow = self
            .inner
            .runtime
            .shadow(&credentials.adapter)
            .map(|handle| crate::shadow::ShadowTap {
                handle,
                shadows: Arc::clone(&self.inner.shadows),
                store: self.inner.store.clone(),
            });
        Ok(Connector {
            shadow,
            account_id: credentials.connector_account_id,
            adapter,
            scope,
            budget,
            recovery,
            limits,
        })
    }

    /// What recovery may rely on for a connector account (the scanner's
    /// authorization-validity watch); needs no loaded adapter.
    pub async fn connector_recovery(
        &self,
        account_id: &str,
    ) -> Result<ConnectorRecovery, OrchestratorError> {
        let credentials = self
            .inner
            .store
            .connector_credentials_cached(account_id)
            .await?;
        Ok(ConnectorRecovery::for_account(
            self.inner.config.adapter_recovery.get(&credentials.adapter),
            &string_map(&credentials.config),
        ))
    }

    pub(crate) fn provenance(connector: &Connector, trigger: Trigger) -> Provenance {
        let identity = connector.adapter.identity();
        Provenance {
            actor: Some(trigger.actor().to_owned()),
            ..Provenance::adapter(&identity.name, &identity.version, &identity.digest)
        }
    }

    /// Put the events of one PSP answer through the door. Each event goes to
    /// the aggregate the call was about when the core routes it there, and
    /// otherwise to whatever its own references name, within the connector
    /// account the call went through: an untrusted adapter's answer never
    /// reaches another tenant's payment.
    pub(crate) async fn apply_outcome(
        &self,
        connector: &Connector,
        own: &OwnAggregate,
        spec: &OperationSpec,
        outcome: CallOutcome,
        provenance: &Provenance,
        mut known: Option<sluice_store::AttemptHead>,
    ) -> Result<Vec<Applied>, OrchestratorError> {
        let scope = AccountScope::new(&connector.account_id, adapter_of(provenance));
        let mut applied = Vec::new();
        for event in outcome.into_events(spec) {
            let target = own.target_for(&event, &scope);
            let from_event = matches!(target, EventTarget::FromEvent { .. });
            let input = ApplyEvent::new(target, event, provenance.clone());
            // Each event starts from the rows the one before it left, if any
            // (the store uses them only for an event about that attempt).
            let result = self.apply_from(input, known.take()).await;
            match result {
                Ok(done) => {
                    known = done.after.clone();
                    applied.push(done);
                }
                // An extra event about something this host does not know (e.g.
                // a capture report without a capture in flight), or about
                // another account's aggregate (refused and recorded by
                // `apply`), is never a reason to lose the others.
                Err(OrchestratorError::NotFound { entity, id }) if from_event => {
                    tracing::warn!(
                        entity,
                        id,
                        "event from the PSP matched nothing; not applied"
                    );
                }
                Err(OrchestratorError::OutOfScope(_)) if from_event => {}
                Err(error) => return Err(error),
            }
        }
        Ok(applied)
    }

    /// Put one event through the door. An event that names another
    /// connector account's aggregate changes nothing: it is kept as
    /// evidence, counted, and refused with [`OrchestratorError::OutOfScope`].
    pub(crate) async fn apply(&self, input: ApplyEvent) -> Result<Applied, OrchestratorError> {
        let applied = self.inner.store.apply_event(&input).await;
        self.scoped(input, applied).await
    }

    /// [`Self::apply`] starting from `known` rows of the attempt.
    async fn apply_from(
        &self,
        input: ApplyEvent,
        known: Option<sluice_store::AttemptHead>,
    ) -> Result<Applied, OrchestratorError> {
        let applied = self
            .inner
            .store
            .apply_event_from(&input, known.as_ref())
            .await;
        self.scoped(input, applied).await
    }

    /// [`Self::apply`] for the record of a call about to be sent.
    pub(crate) async fn apply_sent(
        &self,
        input: ApplyEvent,
        sent: &sluice_store::SentCall,
    ) -> Result<Applied, OrchestratorError> {
        let applied = self.inner.store.apply_sent(&input, sent).await;
        self.scoped(input, applied).await
    }

    /// A door answer, with an out-of-scope refusal kept as evidence.
    async fn scoped(
        &self,
        input: ApplyEvent,
        applied: Result<Applied, StoreError>,
    ) -> Result<Applied, OrchestratorError> {
        match applied {
            Ok(applied) => Ok(applied),
            Err(StoreError::OutOfScope {
                entity,
                key,
                account,
            }) => Err(self
                .refuse_out_of_scope(&input, entity, &key, &account)
                .await),
            Err(error) => Err(error.into()),
        }
    }

    async fn refuse_out_of_scope(
        &self,
        input: &ApplyEvent,
        entity: &'static str,
        key: &str,
        account: &str,
    ) -> OrchestratorError {
        let adapter = adapter_of(&input.provenance);
        let scope = match &input.target {
            EventTarget::FromEvent { scope } | EventTarget::PspReference { scope, .. } => {
                scope.clone()
            }
            _ => AccountScope::new(account, &adapter),
        };
        let source = match input.inbox_id {
            Some(_) => RefusalSource::Webhook,
            None => RefusalSource::Response,
        };
        crate::metrics::scope_refused(&adapter, source.as_str());
        let refusal = NewScopeRefusal {
            source,
            scope: &scope,
            inbox_id: input.inbox_id.as_deref(),
            entity,
            reference: key,
            event: &input.event,
        };
        let recorded = self.inner.store.record_scope_refusal(&refusal).await;
        let message = format!(
            "the event names {entity} {key}, which is not an aggregate of connector account \
             {account}; refused"
        );
        match recorded {
            Ok(id) => tracing::warn!(refusal_id = %id, account, adapter = %adapter,
                inbox_id = input.inbox_id.as_deref(), entity, reference = key,
                "event outside its connector account refused"),
            Err(error) => tracing::error!(error = %error, account, adapter = %adapter,
                "event outside its connector account refused; recording the evidence failed"),
        }
        OrchestratorError::OutOfScope(message)
    }
}

fn adapter_of(provenance: &Provenance) -> String {
    provenance
        .adapter
        .as_ref()
        .map(|a| a.name.clone())
        .unwrap_or_default()
}

/// The aggregate a PSP call was about, by its stable reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OwnAggregate {
    Attempt {
        reference: String,
        mode: CaptureMode,
    },
    Capture {
        reference: String,
        mode: CaptureMode,
    },
    Refund {
        reference: String,
        mode: CaptureMode,
    },
}

impl OwnAggregate {
    fn target_for(&self, event: &PaymentEvent, scope: &AccountScope) -> EventTarget {
        let (aggregate, reference, mode) = match self {
            OwnAggregate::Attempt { reference, mode } => (Aggregate::Attempt, reference, mode),
            OwnAggregate::Capture { reference, mode } => (Aggregate::Capture, reference, mode),
            OwnAggregate::Refund { reference, mode } => (Aggregate::Refund, reference, mode),
        };
        if route_event(event, *mode) != aggregate {
            return EventTarget::FromEvent {
                scope: scope.clone(),
            };
        }
        match aggregate {
            Aggregate::Capture => EventTarget::Capture(reference.clone()),
            Aggregate::Refund => EventTarget::Refund(reference.clone()),
            Aggregate::Attempt | Aggregate::Order => EventTarget::Attempt(reference.clone()),
        }
    }
}

/// How many of a call's decisions were applied, ignored or refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DecisionTally {
    pub applied: usize,
    pub ignored: usize,
    pub rejected: usize,
    pub needs_reconciliation: usize,
}

impl DecisionTally {
    pub(crate) fn of(applied: &[Applied]) -> Self {
        let mut tally = DecisionTally::default();
        for a in applied {
            match a.decision {
                DecisionKind::Applied => tally.applied += 1,
                DecisionKind::IgnoredDuplicate | DecisionKind::IgnoredStale => tally.ignored += 1,
                DecisionKind::Rejected => tally.rejected += 1,
                DecisionKind::NeedsReconciliation => tally.needs_reconciliation += 1,
            }
        }
        tally
    }
}

/// Connector settings and secrets are JSON objects of strings; other JSON
/// values are passed on in their JSON text form, and a non-object is empty.
pub(crate) fn string_map(value: &serde_json::Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|object| {
            object
                .iter()
                .map(|(k, v)| {
                    let text = match v {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (k.clone(), text)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Connector secrets are a JSON object: a string is one version of the secret; an
/// array of strings is its valid versions, newest first (a rotation window: the
/// keyring verifies with each and signs and authenticates with the first). Anything
/// else is not a usable secret and is left out.
pub(crate) fn keyring(value: &serde_json::Value) -> Keyring {
    let mut keyring = Keyring::default();
    for (name, secret) in value.as_object().into_iter().flatten() {
        let versions = match secret {
            serde_json::Value::String(s) => vec![s.clone()],
            serde_json::Value::Array(items) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => continue,
        };
        keyring.insert_versions(name.clone(), versions);
    }
    keyring
}

/// Merchant metadata (a JSON object) as the adapter contract's key/value list.
pub(crate) fn metadata_pairs(value: &serde_json::Value) -> Vec<(String, String)> {
    string_map(value).into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{EventKind, EvidenceSource};

    #[test]
    fn connector_settings_become_strings_and_non_objects_are_empty() {
        let map = string_map(&serde_json::json!({"base_url": "http://x", "timeout_ms": 2500}));
        assert_eq!(map["base_url"], "http://x");
        assert_eq!(map["timeout_ms"], "2500");
        assert!(string_map(&serde_json::json!(["a"])).is_empty());
    }

    #[test]
    fn a_secret_is_a_string_or_its_versions_newest_first() {
        let keyring = keyring(&serde_json::json!({
            "api_key": "sk_1",
            "webhook_secret": ["whsec_new", "whsec_old"],
            "odd": 5,
        }));
        assert_eq!(keyring.current("api_key"), Some("sk_1"));
        assert_eq!(keyring.current("webhook_secret"), Some("whsec_new"));
        assert!(!keyring.contains("odd"));
        let macs = keyring
            .hmac(
                "webhook_secret",
                sluice_adapter_runtime::HmacHash::Sha256,
                sluice_adapter_runtime::KeyText::Utf8,
                b"x",
            )
            .unwrap();
        assert_eq!(macs.len(), 2);
    }

    #[test]
    fn events_go_to_the_called_aggregate_only_when_the_core_routes_them_there() {
        let own = OwnAggregate::Capture {
            reference: "capref_1".into(),
            mode: CaptureMode::Manual,
        };
        let scope = AccountScope::new("ca_1", "a");
        let captured = PaymentEvent {
            action_reference: Some("capref_1".into()),
            ..PaymentEvent::new(EventKind::PaymentCaptured, EvidenceSource::SyncResponse)
        };
        assert_eq!(
            own.target_for(&captured, &scope),
            EventTarget::Capture("capref_1".into())
        );
        let succeeded = PaymentEvent::new(EventKind::PaymentSucceeded, EvidenceSource::Query);
        assert_eq!(
            own.target_for(&succeeded, &scope),
            EventTarget::FromEvent {
                scope: scope.clone()
            }
        );
        let refund = OwnAggregate::Refund {
            reference: "rfdref_1".into(),
            mode: CaptureMode::Automatic,
        };
        let refunded = PaymentEvent::new(EventKind::RefundSucceeded, EvidenceSource::SyncResponse);
        assert_eq!(
            refund.target_for(&refunded, &scope),
            EventTarget::Refund("rfdref_1".into())
        );
    }
}
