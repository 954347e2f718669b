//! Routing (issue 13): which connector account a payment's attempt goes to,
//! and after a definitive failure, whether and where the next attempt goes.
//! Pure: the caller reads the configuration, the attempts and the clock and
//! passes them in; nothing here does IO, reads a clock or draws randomness.
//!
//! - [`RoutingConfig`]: a merchant's ordered rules (currency, amount range,
//!   payment method type, metadata), each with weighted accounts, a fallback
//!   chain, and the merchant's failure-table overrides. [`RoutingConfig::validate`]
//!   refuses what cannot be meant.
//! - [`plan_route`]: config + payment → [`RoutingPlan`], the ordered list of
//!   accounts to try, each with the reason it is there. The volume split is
//!   deterministic: the bucket is a hash of the payment id, so the same
//!   payment always gets the same first account, and no global RNG is used.
//! - [`next_step`]: the payment's attempts + the plan + the eligibility of
//!   each account + now → [`NextStep`]. Seed 001 §9's hard rule is its first
//!   check: while any attempt is unresolved (CREATED, SUBMITTED, PROCESSING,
//!   UNKNOWN), nothing new is started; a REQUIRES_ACTION waits for the
//!   customer, never for another account. Only a FAILED attempt whose code
//!   the failure table marks as cascadable leads to another account, one
//!   that has not been tried for this payment and is eligible, before the
//!   deadline.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::failure_table::{classify_failure, FailureClass, FailureOverride};
use crate::money::{Currency, Money};
use crate::state::{AttemptState, OrderState};

/// One account of a rule, with its share of the rule's volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightedAccount {
    pub connector_account: String,
    /// Relative share of first attempts; 0: only ever a failover target.
    pub weight: u32,
}

/// When a rule applies; every condition that is set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteConditions {
    /// ISO 4217 codes; empty: any currency.
    #[serde(default)]
    pub currencies: Vec<String>,
    /// Inclusive bounds in minor units.
    #[serde(default)]
    pub min_amount_minor: Option<i64>,
    #[serde(default)]
    pub max_amount_minor: Option<i64>,
    /// E.g. "card"; empty: any type.
    #[serde(default)]
    pub payment_method_types: Vec<String>,
    /// Metadata keys whose values must be equal.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// One routing rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteRule {
    /// The merchant's name for the rule, recorded in the attempt's history.
    pub id: String,
    #[serde(default)]
    pub when: RouteConditions,
    pub accounts: Vec<WeightedAccount>,
}

/// A merchant's routing configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingConfig {
    /// Tried in order; the first whose conditions hold chooses.
    #[serde(default)]
    pub rules: Vec<RouteRule>,
    /// Accounts tried after the chosen rule's, in order (also when no rule holds).
    #[serde(default)]
    pub fallback: Vec<String>,
    /// The merchant's own reading of failure codes.
    #[serde(default)]
    pub failure_overrides: Vec<FailureOverride>,
    /// How long after the first attempt a failover may still start.
    #[serde(default = "default_failover_window_ms")]
    pub failover_window_ms: i64,
}

/// Default time within which a failover may start: one minute.
///
/// `RoutingConfig::default()` and a deserialised `{}` both use it.
pub const DEFAULT_FAILOVER_WINDOW_MS: i64 = 60_000;

fn default_failover_window_ms() -> i64 {
    DEFAULT_FAILOVER_WINDOW_MS
}

impl Default for RoutingConfig {
    /// No rules, no fallback, no overrides, the default failover window
    /// (the same as a deserialised `{}`).
    fn default() -> Self {
        RoutingConfig {
            rules: Vec::new(),
            fallback: Vec::new(),
            failure_overrides: Vec::new(),
            failover_window_ms: DEFAULT_FAILOVER_WINDOW_MS,
        }
    }
}

/// The most rules and accounts one configuration may hold.
pub const MAX_RULES: usize = 64;
pub const MAX_ACCOUNTS_PER_LIST: usize = 16;

/// Why a routing configuration is refused; each names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingConfigError {
    #[error("at most {MAX_RULES} rules")]
    TooManyRules,
    #[error("rule {index}: the id must be 1 to 64 characters")]
    BadRuleId { index: usize },
    #[error("rule {0}: the id is used twice")]
    DuplicateRuleId(String),
    #[error("rule {0}: 1 to {MAX_ACCOUNTS_PER_LIST} accounts, each once")]
    BadAccounts(String),
    #[error("rule {0}: the weights sum to 0, or to more than 1000000")]
    BadWeights(String),
    #[error("rule {0}: the amount range is empty or negative")]
    BadAmountRange(String),
    #[error("rule {rule}: {currency} is not an ISO 4217 currency code")]
    BadCurrency { rule: String, currency: String },
    #[error("the fallback lists at most {MAX_ACCOUNTS_PER_LIST} accounts, each once")]
    BadFallback,
    #[error("failover_window_ms must be between 0 and 3600000")]
    BadWindow,
    #[error("failure override {0}: adapter and code must be set, each once")]
    BadOverride(usize),
}

impl RoutingConfig {
    /// Check the shape of the configuration (the caller checks that the
    /// accounts exist and are the merchant's: see [`RoutingConfig::accounts`]).
    pub fn validate(&self) -> Result<(), RoutingConfigError> {
        if self.rules.len() > MAX_RULES {
            return Err(RoutingConfigError::TooManyRules);
        }
        let mut ids = BTreeSet::new();
        for (index, rule) in self.rules.iter().enumerate() {
            if rule.id.is_empty() || rule.id.chars().count() > 64 {
                return Err(RoutingConfigError::BadRuleId { index });
            }
            if !ids.insert(rule.id.as_str()) {
                return Err(RoutingConfigError::DuplicateRuleId(rule.id.clone()));
            }
            validate_rule(rule)?;
        }
        if !distinct_within_limit(self.fallback.iter()) {
            return Err(RoutingConfigError::BadFallback);
        }
        if !(0..=3_600_000).contains(&self.failover_window_ms) {
            return Err(RoutingConfigError::BadWindow);
        }
        let mut overrides = BTreeSet::new();
        for (index, o) in self.failure_overrides.iter().enumerate() {
            if o.adapter.is_empty() || o.code.is_empty() || !overrides.insert((&o.adapter, &o.code))
            {
                return Err(RoutingConfigError::BadOverride(index));
            }
        }
        Ok(())
    }

    /// Every account the configuration names, once.
    pub fn accounts(&self) -> BTreeSet<&str> {
        self.rules
            .iter()
            .flat_map(|r| r.accounts.iter().map(|a| a.connector_account.as_str()))
            .chain(self.fallback.iter().map(String::as_str))
            .collect()
    }
}

fn distinct_within_limit<'a>(accounts: impl Iterator<Item = &'a String>) -> bool {
    let mut seen = BTreeSet::new();
    for account in accounts {
        if account.is_empty() || !seen.insert(account) {
            return false;
        }
    }
    seen.len() <= MAX_ACCOUNTS_PER_LIST
}

fn validate_rule(rule: &RouteRule) -> Result<(), RoutingConfigError> {
    let accounts = rule.accounts.iter().map(|a| &a.connector_account);
    if rule.accounts.is_empty() || !distinct_within_limit(accounts) {
        return Err(RoutingConfigError::BadAccounts(rule.id.clone()));
    }
    let total: u64 = rule.accounts.iter().map(|a| u64::from(a.weight)).sum();
    if total == 0 || total > 1_000_000 {
        return Err(RoutingConfigError::BadWeights(rule.id.clone()));
    }
    let when = &rule.when;
    let negative = [when.min_amount_minor, when.max_amount_minor]
        .iter()
        .flatten()
        .any(|m| *m < 0);
    let empty =
        matches!((when.min_amount_minor, when.max_amount_minor), (Some(lo), Some(hi)) if lo > hi);
    if negative || empty {
        return Err(RoutingConfigError::BadAmountRange(rule.id.clone()));
    }
    for currency in &when.currencies {
        if Currency::parse(currency).is_err() {
            return Err(RoutingConfigError::BadCurrency {
                rule: rule.id.clone(),
                currency: currency.clone(),
            });
        }
    }
    Ok(())
}

/// What routing knows about the payment.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    pub payment_id: &'a str,
    pub amount: Money,
    pub payment_method_type: Option<&'a str>,
    /// The payment's metadata (string values).
    pub metadata: &'a BTreeMap<String, String>,
}

impl RouteConditions {
    /// Whether the payment satisfies every condition that is set.
    pub fn hold_for(&self, input: &RouteInput<'_>) -> bool {
        let currency = input.amount.currency.as_str();
        let amount = input.amount.amount_minor;
        (self.currencies.is_empty() || self.currencies.iter().any(|c| c == currency))
            && self.min_amount_minor.is_none_or(|lo| amount >= lo)
            && self.max_amount_minor.is_none_or(|hi| amount <= hi)
            && (self.payment_method_types.is_empty()
                || input
                    .payment_method_type
                    .is_some_and(|t| self.payment_method_types.iter().any(|p| p == t)))
            && self
                .metadata
                .iter()
                .all(|(k, v)| input.metadata.get(k) == Some(v))
    }
}

/// One account of a plan, and why it is there (for the attempt's history).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanEntry {
    pub connector_account: String,
    /// The rule that put it here; None for the fallback chain.
    pub rule: Option<String>,
    pub reason: String,
}

/// The ordered accounts a payment may be tried at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingPlan {
    pub entries: Vec<PlanEntry>,
}

impl RoutingPlan {
    /// A plan of one account a caller named, with that as the reason.
    pub fn named(account: &str) -> RoutingPlan {
        RoutingPlan {
            entries: vec![PlanEntry {
                connector_account: account.to_owned(),
                rule: None,
                reason: format!("connector account {account} named by the request"),
            }],
        }
    }

    pub fn first(&self) -> Option<&PlanEntry> {
        self.entries.first()
    }
}

/// FNV-1a, 64 bit: a stable hash of the payment id for the volume split
/// (the same on every host and every release; not for security).
pub fn volume_bucket(payment_id: &str, total_weight: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in payment_id.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash % total_weight.max(1)
}

/// The plan for a payment: the first rule whose conditions hold picks its
/// first account by weight (bucket of the payment id), then its other
/// accounts in their listed order, then the fallback chain; each account once.
pub fn plan_route(config: &RoutingConfig, input: &RouteInput<'_>) -> RoutingPlan {
    let mut entries: Vec<PlanEntry> = Vec::new();
    let push = |entries: &mut Vec<PlanEntry>, entry: PlanEntry| {
        if !entries
            .iter()
            .any(|e| e.connector_account == entry.connector_account)
        {
            entries.push(entry);
        }
    };
    if let Some(rule) = config.rules.iter().find(|r| r.when.hold_for(input)) {
        let total: u64 = rule.accounts.iter().map(|a| u64::from(a.weight)).sum();
        let bucket = volume_bucket(input.payment_id, total);
        let mut upper = 0u64;
        let chosen = rule.accounts.iter().position(|a| {
            upper += u64::from(a.weight);
            a.weight > 0 && bucket < upper
        });
        if let Some(index) = chosen {
            let account = &rule.accounts[index];
            push(
                &mut entries,
                PlanEntry {
                    connector_account: account.connector_account.clone(),
                    rule: Some(rule.id.clone()),
                    reason: format!(
                        "rule {}: weighted split, bucket {bucket} of {total} (weight {})",
                        rule.id, account.weight
                    ),
                },
            );
        }
        for account in &rule.accounts {
            push(
                &mut entries,
                PlanEntry {
                    connector_account: account.connector_account.clone(),
                    rule: Some(rule.id.clone()),
                    reason: format!("rule {}: next account of the rule", rule.id),
                },
            );
        }
    }
    for account in &config.fallback {
        push(
            &mut entries,
            PlanEntry {
                connector_account: account.clone(),
                rule: None,
                reason: "fallback chain".to_owned(),
            },
        );
    }
    RoutingPlan { entries }
}

/// What [`next_step`] knows about one attempt of the payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptFact {
    pub connector_account: String,
    pub adapter: String,
    pub state: AttemptState,
    /// The failure code of a FAILED attempt.
    pub failure_code: Option<String>,
    pub created_at_ms: i64,
}

/// The facts [`next_step`] decides on.
#[derive(Debug, Clone, Copy)]
pub struct FailoverInput<'a> {
    pub order: OrderState,
    /// The payment's attempts, oldest first.
    pub attempts: &'a [AttemptFact],
    pub plan: &'a RoutingPlan,
    pub overrides: &'a [FailureOverride],
    /// Accounts that may not take a new attempt now (disabled, paused, an
    /// open breaker), with the reason.
    pub ineligible: &'a BTreeMap<String, String>,
    /// No failover starts at or after this instant.
    pub deadline_ms: i64,
    pub now_ms: i64,
}

/// Why no new attempt is started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Stop {
    /// The order is closed, or its latest attempt took or holds the money.
    Settled,
    /// The payment has no attempt to fail over from.
    NoAttempt,
    /// An attempt is unresolved: seed 001 §9, never a second charge while one may exist.
    Unresolved { state: AttemptState },
    /// The customer must act on the current attempt.
    CustomerAction,
    /// The latest attempt ended without a failure code routing may act on
    /// (e.g. canceled).
    NotFailed { state: AttemptState },
    /// The failure table says this code must not be tried elsewhere.
    NotCascadable { code: String, class: FailureClass },
    /// The payment's failover deadline has passed.
    DeadlinePassed,
    /// Every account of the plan was tried or is ineligible.
    Exhausted { skipped: Vec<(String, String)> },
}

/// What the orchestrator does next for the payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum NextStep {
    Stop(Stop),
    /// Start a new attempt at this account.
    Failover {
        connector_account: String,
        /// The plan's reason for the account, the code failed over from,
        /// and the accounts skipped on the way, for the attempt's history.
        reason: String,
        skipped: Vec<(String, String)>,
    },
}

/// The next step after the payment's latest attempt (see the module doc).
pub fn next_step(input: &FailoverInput<'_>) -> NextStep {
    match blocker(input) {
        Some(stop) => NextStep::Stop(stop),
        None => choose_next(input),
    }
}

/// The first reason not to start anything, in order of the hard rule.
fn blocker(input: &FailoverInput<'_>) -> Option<Stop> {
    use AttemptState as A;
    if let Some(open) = input.attempts.iter().find(|a| {
        matches!(
            a.state,
            A::Created | A::Submitted | A::Processing | A::Unknown
        )
    }) {
        return Some(Stop::Unresolved { state: open.state });
    }
    if input.attempts.iter().any(|a| a.state == A::RequiresAction) {
        return Some(Stop::CustomerAction);
    }
    let held = input
        .attempts
        .iter()
        .any(|a| matches!(a.state, A::Authorized | A::Succeeded));
    if input.order.is_terminal() || held {
        return Some(Stop::Settled);
    }
    let latest = match input.attempts.last() {
        Some(latest) => latest,
        None => return Some(Stop::NoAttempt),
    };
    if latest.state != A::Failed {
        return Some(Stop::NotFailed {
            state: latest.state,
        });
    }
    let code = latest.failure_code.clone().unwrap_or_default();
    let verdict = classify_failure(&latest.adapter, &code, input.overrides);
    if !verdict.cascade {
        return Some(Stop::NotCascadable {
            code,
            class: verdict.class,
        });
    }
    (input.now_ms >= input.deadline_ms).then_some(Stop::DeadlinePassed)
}

fn choose_next(input: &FailoverInput<'_>) -> NextStep {
    let tried: BTreeSet<&str> = input
        .attempts
        .iter()
        .map(|a| a.connector_account.as_str())
        .collect();
    let mut skipped = Vec::new();
    for entry in &input.plan.entries {
        let account = entry.connector_account.as_str();
        if tried.contains(account) {
            continue;
        }
        if let Some(why) = input.ineligible.get(account) {
            skipped.push((account.to_owned(), why.clone()));
            continue;
        }
        let from = input
            .attempts
            .last()
            .and_then(|a| a.failure_code.as_deref())
            .unwrap_or("-");
        return NextStep::Failover {
            connector_account: account.to_owned(),
            reason: format!("failover after {from}: {}", entry.reason),
            skipped,
        };
    }
    NextStep::Stop(Stop::Exhausted { skipped })
}

#[cfg(test)]
mod tests;
