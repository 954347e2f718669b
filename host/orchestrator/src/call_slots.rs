//! The PSP call bulkhead (issue 13; seed 001 §9): a concurrency limit per
//! connector account on the host's PSP HTTP calls, so that one account whose
//! PSP hangs cannot tie up every call the host can make, and recovery after
//! an outage cannot flood it.
//!
//! Each account has `max_concurrent_calls` slots, of which
//! `reserved_query_calls` only queries may use: new work (a first send, a
//! capture, a void, a refund, a re-send) holds at most the rest, so queries,
//! which are how UNKNOWN converges, are never starved by new attempts.
//!
//! A slot is taken *before* anything is recorded as sent and released once
//! the HTTP exchange is over. A call that cannot get a slot within the
//! account's `call_slot_wait_ms` is shed ([`Shed`]): it provably never left
//! the host and nothing was recorded for it, so the aggregate stays as it was
//! (a CREATED attempt, capture or refund stays CREATED and is sent later by
//! whoever advances it next; a query changes nothing) and is never a failure.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Most accounts one process keeps slots for; an account beyond it gets a
/// fresh set per call (unbounded memory is worse than a looser limit).
const MAX_ACCOUNTS: usize = 10_000;
/// Highest `max_concurrent_calls` an account may set.
const MAX_SLOTS: usize = 4_096;
/// Longest `call_slot_wait_ms` an account may set.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// What a PSP call does to the PSP, for the slot it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// Asks for the current truth (query payment, query refund).
    Query,
    /// Anything that may move money or start something at the PSP.
    Send,
}

impl CallKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Query => "query",
            CallKind::Send => "send",
        }
    }
}

/// One account's limits: the defaults (`[psp_calls]` in `sluice.toml`)
/// with the connector account's own config keys on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Calls in flight at once through the account (`max_concurrent_calls`).
    pub max_concurrent: usize,
    /// Of those, how many only queries may use (`reserved_query_calls`).
    /// At most `max_concurrent - 1`, so new work always has one.
    pub reserved_for_queries: usize,
    /// How long a call waits for a slot before it is shed (`call_slot_wait_ms`).
    pub wait: Duration,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            max_concurrent: 32,
            reserved_for_queries: 8,
            wait: Duration::from_secs(2),
        }
    }
}

impl CallLimits {
    /// `defaults` with the account's `max_concurrent_calls`,
    /// `reserved_query_calls` and `call_slot_wait_ms` on top, within bounds.
    /// Without its own reserve an account reserves a quarter of its slots.
    pub fn for_account(defaults: &CallLimits, config: &BTreeMap<String, String>) -> CallLimits {
        let key = |name: &str| config.get(name).and_then(|v| v.trim().parse::<u64>().ok());
        let own_max = key("max_concurrent_calls").map(|n| usize::try_from(n).unwrap_or(MAX_SLOTS));
        let max_concurrent = own_max
            .unwrap_or(defaults.max_concurrent)
            .clamp(1, MAX_SLOTS);
        let reserved = match key("reserved_query_calls") {
            Some(n) => usize::try_from(n).unwrap_or(MAX_SLOTS),
            None if own_max.is_some() => max_concurrent / 4,
            None => defaults.reserved_for_queries,
        };
        let wait = key("call_slot_wait_ms")
            .map(Duration::from_millis)
            .unwrap_or(defaults.wait)
            .min(MAX_WAIT);
        CallLimits {
            max_concurrent,
            reserved_for_queries: reserved.min(max_concurrent - 1),
            wait,
        }
    }

    /// The gateway-wide defaults as written in `sluice.toml`'s `[psp_calls]`:
    /// unset fields keep the built-in ones (with `max_concurrent_calls` alone,
    /// a quarter of it is reserved for queries, as for an account). Values out
    /// of bounds are refused, not clamped: a typo must not quietly become the
    /// limit every account runs with.
    pub fn from_settings(
        max_concurrent_calls: Option<u64>,
        reserved_query_calls: Option<u64>,
        call_slot_wait_ms: Option<u64>,
    ) -> Result<CallLimits, CallLimitsError> {
        let defaults = CallLimits::default();
        let max_concurrent = match max_concurrent_calls {
            Some(n) => bounded("max_concurrent_calls", n, 1, MAX_SLOTS as u64)? as usize,
            None => defaults.max_concurrent,
        };
        let reserved_for_queries = match reserved_query_calls {
            Some(n) => {
                let most = max_concurrent as u64 - 1;
                bounded("reserved_query_calls", n, 0, most)? as usize
            }
            None if max_concurrent_calls.is_some() => max_concurrent / 4,
            None => defaults.reserved_for_queries.min(max_concurrent - 1),
        };
        let wait = match call_slot_wait_ms {
            Some(ms) => {
                let most = MAX_WAIT.as_millis() as u64;
                Duration::from_millis(bounded("call_slot_wait_ms", ms, 0, most)?)
            }
            None => defaults.wait,
        };
        Ok(CallLimits {
            max_concurrent,
            reserved_for_queries,
            wait,
        })
    }

    fn sends(&self) -> usize {
        self.max_concurrent - self.reserved_for_queries
    }
}

/// A `[psp_calls]` setting out of its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("psp_calls.{name} = {value}: must be between {least} and {most}")]
pub struct CallLimitsError {
    pub name: &'static str,
    pub value: u64,
    pub least: u64,
    pub most: u64,
}

fn bounded(name: &'static str, value: u64, least: u64, most: u64) -> Result<u64, CallLimitsError> {
    if (least..=most).contains(&value) {
        Ok(value)
    } else {
        Err(CallLimitsError {
            name,
            value,
            least,
            most,
        })
    }
}

/// A call that got no slot in time: nothing was sent, nothing recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("connector account {account}: all {limit} PSP call slots for {kind} calls busy for {waited_ms} ms; not sent")]
pub struct Shed {
    pub account: String,
    pub kind: &'static str,
    pub limit: usize,
    pub waited_ms: u64,
}

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct CallSlot {
    _total: OwnedSemaphorePermit,
    _send: Option<OwnedSemaphorePermit>,
}

/// One account's semaphores: `total` bounds every call; `sends` bounds new
/// work below the total, which leaves the reserve to queries.
#[derive(Debug)]
struct AccountSlots {
    limits: CallLimits,
    total: Arc<Semaphore>,
    sends: Arc<Semaphore>,
}

impl AccountSlots {
    fn new(limits: CallLimits) -> Arc<AccountSlots> {
        Arc::new(AccountSlots {
            limits,
            total: Arc::new(Semaphore::new(limits.max_concurrent)),
            sends: Arc::new(Semaphore::new(limits.sends())),
        })
    }
}

/// The call slots of every connector account this process calls.
#[derive(Debug, Default)]
pub(crate) struct CallSlots {
    accounts: Mutex<HashMap<String, Arc<AccountSlots>>>,
}

impl CallSlots {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<AccountSlots>>> {
        // Entries are only ever inserted or replaced whole: a panic elsewhere
        // cannot leave one half-built.
        self.accounts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The account's semaphores for these limits. Changed limits (the
    /// account's config was edited) start a fresh set; calls holding slots
    /// of the old one finish on it.
    fn slots(&self, account: &str, limits: CallLimits) -> Arc<AccountSlots> {
        let mut map = self.lock();
        match map.get(account) {
            Some(slots) if slots.limits == limits => slots.clone(),
            _ if map.len() >= MAX_ACCOUNTS && !map.contains_key(account) => {
                AccountSlots::new(limits)
            }
            _ => {
                let fresh = AccountSlots::new(limits);
                map.insert(account.to_owned(), fresh.clone());
                fresh
            }
        }
    }

    /// A slot for one call through `account`, waiting at most `limits.wait`.
    pub async fn acquire(
        &self,
        account: &str,
        limits: CallLimits,
        kind: CallKind,
    ) -> Result<CallSlot, Shed> {
        let slots = self.slots(account, limits);
        let shed = || Shed {
            account: account.to_owned(),
            kind: kind.as_str(),
            limit: match kind {
                CallKind::Query => limits.max_concurrent,
                CallKind::Send => limits.sends(),
            },
            waited_ms: u64::try_from(limits.wait.as_millis()).unwrap_or(u64::MAX),
        };
        let deadline = tokio::time::Instant::now() + limits.wait;
        let send = match kind {
            CallKind::Query => None,
            CallKind::Send => Some(permit(&slots.sends, deadline).await.ok_or_else(shed)?),
        };
        let total = permit(&slots.total, deadline).await.ok_or_else(shed)?;
        Ok(CallSlot {
            _total: total,
            _send: send,
        })
    }
}

/// A permit now, or by `deadline`. The free case takes no timer at all, so
/// an uncontended call (the simulator's, always) never touches time.
async fn permit(
    semaphore: &Arc<Semaphore>,
    deadline: tokio::time::Instant,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(permit) = semaphore.clone().try_acquire_owned() {
        return Some(permit);
    }
    // The semaphores are never closed, so an error here cannot happen; it
    // would mean "no slot", which sheds the call.
    match tokio::time::timeout_at(deadline, semaphore.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Some(permit),
        _ => None,
    }
}

impl crate::Orchestrator {
    /// A slot for one call of `operation` through the connector's account,
    /// taken before anything about the call is recorded. A shed call is
    /// logged and counted; the caller changes nothing and returns
    /// [`crate::Action::Shed`].
    pub(crate) async fn call_slot(
        &self,
        connector: &crate::call::Connector,
        operation: crate::convert::Operation,
    ) -> Result<CallSlot, Shed> {
        use crate::convert::Operation;
        let kind = match operation {
            Operation::QueryPayment | Operation::QueryRefund => CallKind::Query,
            _ => CallKind::Send,
        };
        let acquired = self
            .inner
            .call_slots
            .acquire(&connector.account_id, connector.limits, kind)
            .await;
        if let Err(shed) = &acquired {
            let adapter = connector.adapter.identity().name.as_str();
            crate::metrics::psp_call_shed(adapter, &connector.account_id, kind.as_str());
            tracing::warn!(connector_account = %connector.account_id, adapter, %operation,
                reason = %shed, "PSP call shed: nothing sent, nothing recorded");
        }
        acquired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, reserved: usize) -> CallLimits {
        CallLimits {
            max_concurrent: max,
            reserved_for_queries: reserved,
            wait: Duration::ZERO,
        }
    }

    #[test]
    fn sluice_toml_defaults_keep_unset_fields_and_refuse_values_out_of_bounds() {
        assert_eq!(
            CallLimits::from_settings(None, None, None),
            Ok(CallLimits::default())
        );
        let set = CallLimits::from_settings(Some(100), None, Some(250)).unwrap();
        assert_eq!(
            (set.max_concurrent, set.reserved_for_queries),
            (100, 25),
            "a quarter for queries"
        );
        assert_eq!(set.wait, Duration::from_millis(250));
        let one = CallLimits::from_settings(Some(1), None, None).unwrap();
        assert_eq!(one.reserved_for_queries, 0, "new work always keeps a slot");
        for (max, reserved, wait, field) in [
            (Some(0), None, None, "max_concurrent_calls"),
            (Some(4_097), None, None, "max_concurrent_calls"),
            (Some(4), Some(4), None, "reserved_query_calls"),
            (None, None, Some(30_001), "call_slot_wait_ms"),
        ] {
            let refused = CallLimits::from_settings(max, reserved, wait).unwrap_err();
            assert_eq!(refused.name, field, "{refused}");
        }
        let err = CallLimits::from_settings(Some(4), Some(9), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "psp_calls.reserved_query_calls = 9: must be between 0 and 3"
        );
    }

    #[tokio::test]
    async fn new_work_never_takes_the_slots_reserved_for_queries() {
        let slots = CallSlots::default();
        let l = limits(3, 1);
        let a = slots.acquire("ca_1", l, CallKind::Send).await.unwrap();
        let b = slots.acquire("ca_1", l, CallKind::Send).await.unwrap();
        let shed = slots.acquire("ca_1", l, CallKind::Send).await.unwrap_err();
        assert_eq!((shed.kind, shed.limit), ("send", 2));
        let q = slots.acquire("ca_1", l, CallKind::Query).await.unwrap();
        assert!(
            slots.acquire("ca_1", l, CallKind::Query).await.is_err(),
            "the total is the limit"
        );
        drop(a);
        assert!(
            slots.acquire("ca_1", l, CallKind::Query).await.is_ok(),
            "a free slot serves a query"
        );
        drop((b, q));
    }

    #[tokio::test]
    async fn one_accounts_busy_slots_never_limit_another_account() {
        let slots = CallSlots::default();
        let l = limits(1, 0);
        let _held = slots.acquire("ca_busy", l, CallKind::Send).await.unwrap();
        assert!(slots.acquire("ca_busy", l, CallKind::Send).await.is_err());
        assert!(slots.acquire("ca_other", l, CallKind::Send).await.is_ok());
    }

    #[tokio::test]
    async fn a_call_waits_for_a_slot_freed_within_its_wait() {
        let slots = Arc::new(CallSlots::default());
        let l = CallLimits {
            wait: Duration::from_secs(30),
            ..limits(1, 0)
        };
        let held = slots.acquire("ca_1", l, CallKind::Send).await.unwrap();
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire("ca_1", l, CallKind::Send).await.is_ok() })
        };
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished(), "it waits while the slot is held");
        drop(held);
        assert!(
            waiter.await.unwrap(),
            "the freed slot went to the waiting call"
        );
    }

    #[test]
    fn an_account_sets_its_own_limits_within_bounds() {
        let defaults = CallLimits::default();
        let mut config = BTreeMap::new();
        assert_eq!(CallLimits::for_account(&defaults, &config), defaults);
        config.insert("max_concurrent_calls".into(), "8".into());
        let own = CallLimits::for_account(&defaults, &config);
        assert_eq!((own.max_concurrent, own.reserved_for_queries), (8, 2));
        config.insert("reserved_query_calls".into(), "50".into());
        config.insert("call_slot_wait_ms".into(), "999999999".into());
        let own = CallLimits::for_account(&defaults, &config);
        assert_eq!(
            own.reserved_for_queries, 7,
            "new work always keeps one slot"
        );
        assert_eq!(own.wait, MAX_WAIT);
        config.insert("max_concurrent_calls".into(), "0".into());
        let own = CallLimits::for_account(&defaults, &config);
        assert_eq!((own.max_concurrent, own.reserved_for_queries), (1, 0));
    }
}
