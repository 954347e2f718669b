//! The circuit breakers of one gateway process (issue 13): one per
//! connector account, the core's pure [`Breaker`] fed with the outcome of
//! every PSP call through it, and the adapter's health across its accounts
//! derived from theirs; both asked before routing a new attempt. In memory: a restarted process starts with
//! closed breakers and learns again within one window; an operator's pause
//! is the durable switch (stored, see `Store::pause_connector_account`).
//! Queries of attempts already at the PSP are never held back by them.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use sluice_core::{Breaker, BreakerPolicy, BreakerState, BreakerTransition, CallHealth};

use crate::call::CallOutcome;

/// Most breakers one process keeps; accounts beyond it are not tracked
/// (TIGER_STYLE: a limit on everything).
const MAX_BREAKERS: usize = 10_000;

#[derive(Debug)]
pub(crate) struct Breakers {
    policy: BreakerPolicy,
    /// By connector account: its adapter and its breaker.
    map: Mutex<HashMap<String, (String, Breaker)>>,
}

/// The adapter counts as failing across accounts when at least this many of
/// its accounts' breakers are open, and at least half of those it has seen.
/// Derived from the accounts rather than fed by every call, so that one
/// merchant's broken account, however busy, never closes the adapter for
/// every other merchant.
const ADAPTER_MIN_OPEN_ACCOUNTS: usize = 3;

/// What the admin API shows of one breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerHealth {
    pub state: BreakerState,
    /// Calls and unanswered calls in the current window.
    pub window_calls: usize,
    pub window_unanswered: usize,
}

/// What the admin API shows of the adapter across its accounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterHealth {
    /// Accounts of the adapter this process has called, and how many of
    /// them refuse new attempts now.
    pub accounts: usize,
    pub open_accounts: usize,
    /// Why the adapter refuses new attempts on every account, if it does.
    pub refusal: Option<String>,
}

/// What one call of `operation` says about the PSP's health. An answer the
/// adapter could only read as "outcome unknown" (a 5xx, a PSP saying it
/// failed to process) to new work is no answer for the breaker either:
/// counting it as answered let an account answering 500 to every new
/// payment keep its breaker closed. A query's such answer stays an answer:
/// it is about one payment asked again and again on its backoff, and a few
/// stuck payments would otherwise fill the window and close the account for
/// everyone (the kill test's permanent-500 payments did); a query with no
/// answer at all (timeout, connection) still counts as unanswered.
pub(crate) fn health_of(outcome: &CallOutcome, operation: crate::convert::Operation) -> CallHealth {
    use crate::convert::Operation;
    let query = matches!(operation, Operation::QueryPayment | Operation::QueryRefund);
    match outcome {
        CallOutcome::Unknown { .. } => CallHealth::Unanswered,
        CallOutcome::Answered(events) if !query && events.iter().all(tells_nothing) => {
            CallHealth::Unanswered
        }
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

/// An event that reports no outcome of the PSP's (and is no proof of
/// absence either).
fn tells_nothing(event: &sluice_core::PaymentEvent) -> bool {
    use sluice_core::EventKind;
    matches!(
        event.kind,
        EventKind::ResultUnknown | EventKind::RefundUnknown
    ) && !event.proves_absence()
        && event
            .failure
            .as_ref()
            .is_none_or(|f| f.category != sluice_core::FailureCategory::Configuration)
}

type Map = HashMap<String, (String, Breaker)>;

impl Breakers {
    pub fn new(policy: BreakerPolicy) -> Breakers {
        Breakers {
            policy,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Map> {
        // A panic while holding the lock cannot leave a breaker half-updated
        // in a way that matters more than losing it: keep using the map.
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The adapter across the accounts this process has called. A breaker
    /// opened by refused credentials is that account's alone: not counted.
    fn adapter_health(map: &Map, adapter: &str, now_ms: i64) -> AdapterHealth {
        let mut accounts = 0;
        let mut open_accounts = 0;
        for (a, breaker) in map.values() {
            if a != adapter {
                continue;
            }
            accounts += 1;
            let own = matches!(breaker.state(now_ms), BreakerState::Open { ref reason, .. }
                if reason != "credentials refused");
            open_accounts += usize::from(own);
        }
        let failing = open_accounts >= ADAPTER_MIN_OPEN_ACCOUNTS && open_accounts * 2 >= accounts;
        AdapterHealth {
            accounts,
            open_accounts,
            refusal: failing.then(|| {
                format!("adapter {adapter} failing: breakers open on {open_accounts} of its {accounts} accounts")
            }),
        }
    }

    /// Why a new attempt may not go to `account` now, if it may not.
    pub fn refusal(&self, account: &str, adapter: &str, now_ms: i64) -> Option<String> {
        let map = self.lock();
        if let Some(Err(why)) = map.get(account).map(|(_, b)| b.check(now_ms)) {
            return Some(format!("account {why}"));
        }
        Self::adapter_health(&map, adapter, now_ms).refusal
    }

    /// A new attempt is sent to `account`: while half-open it is a probe.
    pub fn admit(&self, account: &str, now_ms: i64) -> Option<BreakerTransition> {
        let mut map = self.lock();
        match map.get_mut(account).map(|(_, b)| b.admit(now_ms)) {
            Some(Ok(moved)) => moved,
            _ => None,
        }
    }

    /// The outcome of one PSP call through `account`.
    pub fn record(
        &self,
        account: &str,
        adapter: &str,
        now_ms: i64,
        health: CallHealth,
    ) -> Option<BreakerTransition> {
        let mut map = self.lock();
        if !map.contains_key(account) && map.len() >= MAX_BREAKERS {
            return None;
        }
        let (_, breaker) = map
            .entry(account.to_owned())
            .or_insert_with(|| (adapter.to_owned(), Breaker::new(self.policy)));
        breaker.record(now_ms, health)
    }

    /// The account's breaker (closed when never fed) and its adapter's health.
    pub fn health(
        &self,
        account: &str,
        adapter: &str,
        now_ms: i64,
    ) -> (BreakerHealth, AdapterHealth) {
        let map = self.lock();
        let own = match map.get(account) {
            Some((_, b)) => {
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
        };
        (own, Self::adapter_health(&map, adapter, now_ms))
    }
}

/// A connector account's health for the admin API: the operator's pause,
/// the account's and its adapter's breakers, and the account's history.
#[derive(Debug, Clone)]
pub struct AccountHealth {
    pub account: sluice_store::ConnectorAccount,
    pub breaker: BreakerHealth,
    pub adapter: AdapterHealth,
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
        slot: crate::call_slots::CallSlot,
    ) -> CallOutcome {
        let outcome = crate::call::perform(
            self.inner.transport.as_ref(),
            connector,
            spec,
            request,
            slot,
        )
        .await;
        let adapter = connector.adapter.identity().name.clone();
        let moved = self.inner.breakers.record(
            &connector.account_id,
            &adapter,
            self.now_ms(),
            health_of(&outcome, spec.operation),
        );
        self.note_transition(&connector.account_id, moved).await;
        let send = crate::releases::FirstSend::of(&outcome);
        self.watch_canary(connector, spec.operation, send).await;
        outcome
    }

    /// A new attempt is about to be sent: a probe while half-open.
    pub(crate) async fn admit_new_attempt(&self, connector: &crate::call::Connector) {
        let moved = self
            .inner
            .breakers
            .admit(&connector.account_id, self.now_ms());
        self.note_transition(&connector.account_id, moved).await;
    }

    /// Log, count and write to the account's history a transition. A
    /// history row that cannot be written is logged: the breaker itself is
    /// in memory and already moved.
    async fn note_transition(&self, account_id: &str, moved: Option<BreakerTransition>) {
        let Some(t) = moved else {
            return;
        };
        tracing::warn!(connector_account = %account_id, from = t.from, to = t.to, reason = %t.reason,
            "circuit breaker moved");
        crate::metrics::breaker_moved(account_id, t.to);
        let detail = format!("{} -> {}: {}", t.from, t.to, t.reason);
        if let Err(error) = self
            .store()
            .record_breaker_transition(account_id, &detail)
            .await
        {
            tracing::error!(connector_account = %account_id, error = %error,
                "breaker transition not written to history");
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
        let (breaker, adapter) =
            self.inner
                .breakers
                .health(&account.id, &account.adapter, self.now_ms());
        Ok(AccountHealth {
            history: self.store().connector_account_events(&account.id).await?,
            refusal: self.new_attempt_refusal(&account),
            account,
            breaker,
            adapter,
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

    fn open_account(breakers: &Breakers, account: &str, adapter: &str, health: CallHealth) {
        let policy = BreakerPolicy::default();
        for n in 0..policy.min_calls {
            breakers.record(account, adapter, i64::from(n), health);
        }
    }

    #[test]
    fn a_5xx_to_new_work_counts_as_unanswered_and_a_querys_5xx_or_not_found_as_answered() {
        use crate::convert::Operation;
        use sluice_core::{EventKind, EvidenceSource, Failure, FailureCategory, PaymentEvent};
        let unknown = |category, code: &str, evidence| PaymentEvent {
            failure: Some(Failure {
                category,
                code: code.into(),
                message: String::new(),
            }),
            ..PaymentEvent::new(EventKind::ResultUnknown, evidence)
        };
        let server_error = unknown(
            FailureCategory::Retryable,
            "api_error",
            EvidenceSource::SyncResponse,
        );
        assert_eq!(
            health_of(
                &CallOutcome::Answered(vec![server_error.clone()]),
                Operation::Sale
            ),
            CallHealth::Unanswered
        );
        assert_eq!(
            health_of(
                &CallOutcome::Answered(vec![server_error]),
                Operation::QueryPayment
            ),
            CallHealth::Answered
        );
        let lost = CallOutcome::Unknown {
            code: "transport_timeout".into(),
            message: String::new(),
        };
        assert_eq!(
            health_of(&lost, Operation::QueryPayment),
            CallHealth::Unanswered
        );
        let absent = unknown(
            FailureCategory::Unknown,
            sluice_core::NOT_FOUND_CODE,
            EvidenceSource::Query,
        );
        assert_eq!(
            health_of(
                &CallOutcome::Answered(vec![absent]),
                Operation::QueryPayment
            ),
            CallHealth::Answered
        );
        let misconfigured = unknown(
            FailureCategory::Configuration,
            "auth",
            EvidenceSource::Query,
        );
        assert_eq!(
            health_of(
                &CallOutcome::Answered(vec![misconfigured]),
                Operation::Capture
            ),
            CallHealth::Answered
        );
        let declined = PaymentEvent::new(EventKind::PaymentFailed, EvidenceSource::SyncResponse);
        assert_eq!(
            health_of(&CallOutcome::Answered(vec![declined]), Operation::Sale),
            CallHealth::Answered
        );
    }

    #[test]
    fn refused_credentials_open_the_accounts_breaker_and_never_count_against_the_adapter() {
        let breakers = Breakers::new(BreakerPolicy::default());
        for account in ["ca_1", "ca_2", "ca_3"] {
            let moved = breakers.record(account, "stripe", 0, CallHealth::CredentialsRefused);
            assert_eq!(moved.map(|t| t.to), Some("open"));
        }
        assert!(breakers.refusal("ca_1", "stripe", 1).is_some());
        assert_eq!(
            breakers.refusal("ca_other", "stripe", 1),
            None,
            "other accounts still route"
        );
    }

    #[test]
    fn one_busy_broken_account_never_closes_the_adapter_for_the_others() {
        let breakers = Breakers::new(BreakerPolicy::default());
        open_account(&breakers, "ca_broken", "adyen", CallHealth::Unanswered);
        assert!(breakers.refusal("ca_broken", "adyen", 100).is_some());
        assert_eq!(breakers.refusal("ca_healthy", "adyen", 100), None);
        let (_, adapter) = breakers.health("ca_healthy", "adyen", 100);
        assert_eq!(
            (adapter.accounts, adapter.open_accounts, adapter.refusal),
            (1, 1, None)
        );
    }

    #[test]
    fn an_adapter_failing_on_most_of_its_accounts_refuses_new_attempts_on_all_of_them() {
        let breakers = Breakers::new(BreakerPolicy::default());
        for account in ["ca_1", "ca_2", "ca_3"] {
            open_account(&breakers, account, "adyen", CallHealth::Unanswered);
        }
        open_account(&breakers, "ca_4", "adyen", CallHealth::Answered);
        let why = breakers
            .refusal("ca_4", "adyen", 100)
            .expect("the adapter is failing");
        assert!(why.contains("3 of its 4 accounts"), "{why}");
        assert_eq!(
            breakers.refusal("ca_9", "stripe", 100),
            None,
            "other adapters route"
        );
    }
}
