//! The circuit breakers of one gateway process (issue 13): one per
//! connector account and one per adapter across its accounts, each the
//! core's pure [`Breaker`] fed with the outcome of every PSP call and asked
//! before routing a new attempt. In memory: a restarted process starts with
//! closed breakers and learns again within one window; an operator's pause
//! is the durable switch (stored, see `Store::pause_connector_account`).
//! Queries of attempts already at the PSP are never held back by them.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use sluice_core::{Breaker, BreakerPolicy, BreakerState, BreakerTransition, CallHealth};

use crate::call::CallOutcome;

/// Most breakers one process keeps (accounts + adapters); beyond it the
/// oldest-unused is not tracked (TIGER_STYLE: a limit on everything).
const MAX_BREAKERS: usize = 10_000;

#[derive(Debug)]
pub(crate) struct Breakers {
    policy: BreakerPolicy,
    map: Mutex<HashMap<String, Breaker>>,
}

/// What the admin API shows of one breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerHealth {
    pub state: BreakerState,
    /// Calls and unanswered calls in the current window.
    pub window_calls: usize,
    pub window_unanswered: usize,
}

fn account_key(account: &str) -> String {
    format!("account:{account}")
}

fn adapter_key(adapter: &str) -> String {
    format!("adapter:{adapter}")
}

/// What one call says about the PSP's health.
pub(crate) fn health_of(outcome: &CallOutcome) -> CallHealth {
    match outcome {
        CallOutcome::Unknown { .. } => CallHealth::Unanswered,
        CallOutcome::Answered(events) => {
            let refused = events.iter().any(|e| {
                e.failure
                    .as_ref()
                    .is_some_and(|f| f.code == sluice_core::CREDENTIALS_REFUSED_CODE)
            });
            if refused {
                CallHealth::CredentialsRefused
            } else {
                CallHealth::Answered
            }
        }
    }
}

impl Breakers {
    pub fn new(policy: BreakerPolicy) -> Breakers {
        Breakers {
            policy,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Breaker>> {
        // A panic while holding the lock cannot leave a breaker half-updated
        // in a way that matters more than losing it: keep using the map.
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Why a new attempt may not go to `account` now, if it may not.
    pub fn refusal(&self, account: &str, adapter: &str, now_ms: i64) -> Option<String> {
        let map = self.lock();
        for (key, label) in [
            (adapter_key(adapter), "adapter"),
            (account_key(account), "account"),
        ] {
            if let Some(Err(why)) = map.get(&key).map(|b| b.check(now_ms)) {
                return Some(format!("{label} {why}"));
            }
        }
        None
    }

    /// A new attempt is sent to `account`: while half-open it is a probe.
    pub fn admit(
        &self,
        account: &str,
        adapter: &str,
        now_ms: i64,
    ) -> Vec<(String, BreakerTransition)> {
        let mut map = self.lock();
        let mut moved = Vec::new();
        for key in [adapter_key(adapter), account_key(account)] {
            if let Some(Ok(Some(t))) = map.get_mut(&key).map(|b| b.admit(now_ms)) {
                moved.push((key, t));
            }
        }
        moved
    }

    /// The outcome of one PSP call through `account`.
    pub fn record(
        &self,
        account: &str,
        adapter: &str,
        now_ms: i64,
        health: CallHealth,
    ) -> Vec<(String, BreakerTransition)> {
        let mut map = self.lock();
        let mut moved = Vec::new();
        // A refusal of one account's credentials says nothing about the
        // PSP: for the adapter's breaker it is an answer.
        let for_adapter = match health {
            CallHealth::CredentialsRefused => CallHealth::Answered,
            other => other,
        };
        for (key, health) in [
            (adapter_key(adapter), for_adapter),
            (account_key(account), health),
        ] {
            if !map.contains_key(&key) && map.len() >= MAX_BREAKERS {
                continue;
            }
            let breaker = map
                .entry(key.clone())
                .or_insert_with(|| Breaker::new(self.policy));
            if let Some(t) = breaker.record(now_ms, health) {
                moved.push((key, t));
            }
        }
        moved
    }

    /// The account's and its adapter's breakers (closed when never fed).
    pub fn health(&self, account: &str, adapter: &str, now_ms: i64) -> [BreakerHealth; 2] {
        let map = self.lock();
        [account_key(account), adapter_key(adapter)].map(|key| match map.get(&key) {
            Some(b) => {
                let (calls, bad) = b.window_counts(now_ms);
                BreakerHealth {
                    state: b.state(now_ms),
                    window_calls: calls,
                    window_unanswered: bad,
                }
            }
            None => BreakerHealth {
                state: BreakerState::Closed,
                window_calls: 0,
                window_unanswered: 0,
            },
        })
    }
}

/// A connector account's health for the admin API: the operator's pause,
/// the account's and its adapter's breakers, and the account's history.
#[derive(Debug, Clone)]
pub struct AccountHealth {
    pub account: sluice_store::ConnectorAccount,
    pub breaker: BreakerHealth,
    pub adapter_breaker: BreakerHealth,
    /// Newest first, at most `sluice_store::MAX_ACCOUNT_EVENTS`.
    pub history: Vec<sluice_store::AccountEvent>,
    /// Whether routing may give the account a new attempt now, and if not why.
    pub refusal: Option<String>,
}

impl crate::Orchestrator {
    /// One PSP call, its outcome fed to the account's and adapter's breakers.
    pub(crate) async fn perform(
        &self,
        connector: &crate::call::Connector,
        spec: &crate::convert::OperationSpec,
        request: &crate::transport::CheckedRequest,
    ) -> CallOutcome {
        let outcome =
            crate::call::perform(self.inner.transport.as_ref(), connector, spec, request).await;
        let adapter = connector.adapter.identity().name.clone();
        let moved = self.inner.breakers.record(
            &connector.account_id,
            &adapter,
            self.now_ms(),
            health_of(&outcome),
        );
        self.note_transitions(&connector.account_id, moved).await;
        outcome
    }

    /// A new attempt is about to be sent: a probe while half-open.
    pub(crate) async fn admit_new_attempt(&self, connector: &crate::call::Connector) {
        let adapter = connector.adapter.identity().name.clone();
        let moved = self
            .inner
            .breakers
            .admit(&connector.account_id, &adapter, self.now_ms());
        self.note_transitions(&connector.account_id, moved).await;
    }

    /// Log, count and write to the account's history every transition. A
    /// history row that cannot be written is logged: the breaker itself is
    /// in memory and already moved.
    async fn note_transitions(&self, account_id: &str, moved: Vec<(String, BreakerTransition)>) {
        for (key, t) in moved {
            tracing::warn!(breaker = %key, from = t.from, to = t.to, reason = %t.reason,
                "circuit breaker moved");
            crate::metrics::breaker_moved(&key, t.to);
            let detail = format!("{key}: {} -> {}: {}", t.from, t.to, t.reason);
            if let Err(error) = self
                .store()
                .record_breaker_transition(account_id, &detail)
                .await
            {
                tracing::error!(breaker = %key, error = %error, "breaker transition not written to history");
            }
        }
    }

    /// Why routing may not give `account` a new attempt now (paused,
    /// breaker open), if it may not.
    pub(crate) fn new_attempt_refusal(
        &self,
        account: &sluice_store::ConnectorAccount,
    ) -> Option<String> {
        if let Some(pause) = &account.paused {
            return Some(format!("paused by an operator: {}", pause.reason));
        }
        self.inner
            .breakers
            .refusal(&account.id, &account.adapter, self.now_ms())
    }

    /// The account's health (`merchant_id`: only if it is that merchant's).
    pub async fn account_health(
        &self,
        merchant_id: &str,
        account_id: &str,
    ) -> Result<AccountHealth, crate::OrchestratorError> {
        let account = self
            .store()
            .get_connector_account(account_id, Some(merchant_id))
            .await?;
        let [breaker, adapter_breaker] =
            self.inner
                .breakers
                .health(&account.id, &account.adapter, self.now_ms());
        Ok(AccountHealth {
            history: self.store().connector_account_events(&account.id).await?,
            refusal: self.new_attempt_refusal(&account),
            account,
            breaker,
            adapter_breaker,
        })
    }

    /// Pause the merchant's account for new attempts; its open attempts
    /// keep converging (queries and webhooks are never paused).
    pub async fn pause_account(
        &self,
        merchant_id: &str,
        account_id: &str,
        reason: &str,
        actor: &str,
    ) -> Result<AccountHealth, crate::OrchestratorError> {
        self.store()
            .get_connector_account(account_id, Some(merchant_id))
            .await?;
        self.store()
            .pause_connector_account(account_id, reason, actor)
            .await?;
        tracing::warn!(connector_account = %account_id, actor, %reason, "connector account paused for new attempts");
        self.account_health(merchant_id, account_id).await
    }

    /// Take new attempts on the merchant's account again.
    pub async fn resume_account(
        &self,
        merchant_id: &str,
        account_id: &str,
        actor: &str,
    ) -> Result<AccountHealth, crate::OrchestratorError> {
        self.store()
            .get_connector_account(account_id, Some(merchant_id))
            .await?;
        self.store()
            .resume_connector_account(account_id, actor)
            .await?;
        tracing::info!(connector_account = %account_id, actor, "connector account resumed");
        self.account_health(merchant_id, account_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_credentials_open_the_accounts_breaker_and_never_the_adapters() {
        let breakers = Breakers::new(BreakerPolicy::default());
        let moved = breakers.record("ca_typo", "stripe", 0, CallHealth::CredentialsRefused);
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].0, "account:ca_typo");
        assert!(breakers.refusal("ca_typo", "stripe", 1).is_some());
        assert_eq!(
            breakers.refusal("ca_other", "stripe", 1),
            None,
            "other accounts of the adapter still route"
        );
    }

    #[test]
    fn an_adapter_that_stops_answering_on_every_account_opens_the_adapters_breaker() {
        let policy = BreakerPolicy::default();
        let breakers = Breakers::new(policy);
        for n in 0..policy.min_calls {
            let account = format!("ca_{}", n % 7);
            breakers.record(&account, "adyen", i64::from(n), CallHealth::Unanswered);
        }
        let why = breakers
            .refusal("ca_never_called", "adyen", 100)
            .expect("adapter open");
        assert!(why.starts_with("adapter breaker open"), "{why}");
        assert_eq!(breakers.refusal("ca_never_called", "stripe", 100), None);
    }
}
