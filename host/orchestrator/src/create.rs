//! Creating a payment and choosing its connector account: the one place the
//! merchant API and every other caller go through, so the merchant's tenant
//! scope (which accounts are theirs and usable) is resolved once.

use std::collections::BTreeMap;

use sluice_core::{plan_route, FailureOverride, PlanEntry, RouteInput, RoutingConfig, RoutingPlan};
use sluice_store::{Fulfillment, NewPayment, PaymentOrder, Provenance, StoreError};

use crate::commands::{ConfirmOptions, Created};
use crate::error::OrchestratorError;
use crate::orchestrator::Orchestrator;

/// What a merchant creates a payment with.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatePayment {
    pub merchant_order_no: String,
    pub amount: sluice_core::Money,
    pub capture_mode: sluice_core::CaptureMode,
    pub payment_method_token: Option<String>,
    pub return_url: Option<String>,
    pub description: Option<String>,
    /// A JSON object of string values.
    pub metadata: serde_json::Value,
    /// The business goal the payment buys (seed 000), if any.
    pub fulfillment: Fulfillment,
    /// Start the first attempt right away, with these options.
    pub confirm: Option<ConfirmOptions>,
}

/// Why no connector account can serve a payment; the field it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteRefusal {
    /// The named account does not exist or is another merchant's.
    #[error("no such connector account")]
    UnknownAccount,
    #[error("connector account {0} is disabled")]
    Disabled(String),
    #[error("no active connector account can serve this payment")]
    NoMatch { by_adapter: bool },
    #[error("several active connector accounts match; name one with connector_account")]
    Ambiguous { by_adapter: bool },
    /// Every account that could serve the payment is skipped for new
    /// attempts now: `account (why)`, in plan order.
    #[error("every connector account that could serve this payment is skipped for new attempts: {}", .0.join("; "))]
    AllSkipped(Vec<String>),
}

impl RouteRefusal {
    /// The request field the refusal is about.
    pub fn param(&self) -> &'static str {
        match self {
            RouteRefusal::NoMatch { by_adapter: true }
            | RouteRefusal::Ambiguous { by_adapter: true } => "routing.adapter",
            _ => "connector_account",
        }
    }
}

impl Orchestrator {
    /// Create a payment (unique per merchant and merchant order number). The
    /// same number with the same parameters returns the existing payment;
    /// with different parameters it is a conflict naming the fields. With
    /// `confirm`, the first attempt starts at once (a repeated create
    /// confirms only a payment that was never confirmed).
    pub async fn create_payment(
        &self,
        merchant_id: &str,
        params: CreatePayment,
    ) -> Result<Created, OrchestratorError> {
        if !params.metadata.is_object() {
            return Err(OrchestratorError::InvalidRequest(
                "metadata must be a JSON object".into(),
            ));
        }
        let new = NewPayment {
            merchant_id: merchant_id.to_owned(),
            merchant_order_no: params.merchant_order_no.clone(),
            amount: params.amount,
            capture_mode: params.capture_mode,
            payment_method_token: params.payment_method_token.clone(),
            return_url: params.return_url.clone(),
            description: params.description.clone(),
            metadata: params.metadata.clone(),
            fulfillment: params.fulfillment.clone(),
        };
        let (order, created) = match &params.confirm {
            // The common case, a new payment confirmed at once: one
            // transaction for the payment and its first attempt.
            Some(options) => match self.create_confirmed(&new, options).await? {
                Some(view) => {
                    return Ok(Created {
                        view,
                        created: true,
                    })
                }
                None => (self.earlier(&new).await?, false),
            },
            None => self.insert_or_existing(&new).await?,
        };
        tracing::info!(payment_id = %order.id, created, "payment created");
        // A payment this call created has no attempt yet; an existing one is
        // confirmed by this create only if it never was.
        let never_confirmed = created || self.store().list_attempts(&order.id).await?.is_empty();
        let view = match (&params.confirm, never_confirmed) {
            (Some(options), true) => self.confirm_order(merchant_id, order, options).await?,
            _ => self.payment(merchant_id, &order.id).await?,
        };
        Ok(Created { view, created })
    }

    /// Insert the payment, or find the one created before under its order
    /// number. The insert goes first: a repeated create is rare, and its
    /// unique violation costs less than a read before every new payment.
    async fn insert_or_existing(
        &self,
        new: &NewPayment,
    ) -> Result<(PaymentOrder, bool), OrchestratorError> {
        let provenance = Provenance::actor(&format!("merchant:{}", new.merchant_id));
        match self.store().create_payment(new, &provenance).await {
            Ok(order) => Ok((order, true)),
            // Created before (a retry), or by a concurrent create that won the race.
            Err(StoreError::Conflict(_)) => Ok((self.earlier(new).await?, false)),
            Err(error) => Err(error.into()),
        }
    }

    /// The payment created before under the new one's order number (a retry,
    /// or a concurrent create that won the race).
    async fn earlier(&self, new: &NewPayment) -> Result<PaymentOrder, OrchestratorError> {
        self.existing_by_order_no(new).await?.ok_or_else(|| {
            OrchestratorError::Conflict("the payment could not be created; retry".into())
        })
    }

    async fn existing_by_order_no(
        &self,
        new: &NewPayment,
    ) -> Result<Option<PaymentOrder>, OrchestratorError> {
        let existing = match self
            .store()
            .get_payment_by_order_no(&new.merchant_id, &new.merchant_order_no)
            .await
        {
            Ok(existing) => existing,
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        let fields = differences(&existing, new);
        if fields.is_empty() {
            return Ok(Some(existing));
        }
        Err(OrchestratorError::OrderNoConflict {
            merchant_order_no: existing.merchant_order_no,
            payment_id: existing.id,
            fields,
        })
    }

    /// The merchant's connector account for a new attempt: the one named (it
    /// must be theirs and active), else their only active account of the
    /// hinted adapter, else the first eligible account of their routing
    /// configuration (routed without a payment id: the set of accounts is
    /// the same, only the weighted first choice differs), else their only
    /// active account.
    pub async fn route(
        &self,
        merchant_id: &str,
        route: &ConfirmOptions,
    ) -> Result<String, OrchestratorError> {
        let routing = self.routing_for(merchant_id, route, None).await?;
        let ineligible = self.ineligible_accounts(merchant_id).await?;
        Ok(first_eligible(&routing.plan, &ineligible)?
            .0
            .connector_account
            .clone())
    }

    /// How a new attempt of the payment is routed: the named account alone,
    /// the hinted adapter's only active account alone, the merchant's routing
    /// configuration's plan for this payment (`input`; without it, every
    /// account the configuration names, for a check before the payment
    /// exists), or the merchant's only active account.
    pub(crate) async fn routing_for(
        &self,
        merchant_id: &str,
        route: &ConfirmOptions,
        input: Option<&RouteInput<'_>>,
    ) -> Result<Routing, OrchestratorError> {
        let stored = self.store().routing_config_cached(merchant_id).await?;
        let overrides = stored
            .as_ref()
            .map(|s| s.config.failure_overrides.clone())
            .unwrap_or_default();
        let single = |account: String, why: String| Routing {
            plan: RoutingPlan {
                entries: vec![PlanEntry {
                    connector_account: account,
                    rule: None,
                    reason: why,
                }],
            },
            overrides: overrides.clone(),
            failover_window_ms: 0,
        };
        if let Some(id) = &route.connector_account_id {
            let account = self.named_account(merchant_id, id).await?;
            return Ok(single(
                account,
                format!("connector account {id} named by the request"),
            ));
        }
        if let (None, Some(stored)) = (&route.adapter_hint, &stored) {
            let plan = match input {
                Some(input) => plan_route(&stored.config, input),
                None => plan_any(&stored.config),
            };
            return Ok(Routing {
                plan: RoutingPlan {
                    entries: plan
                        .entries
                        .into_iter()
                        .map(|e| PlanEntry {
                            reason: format!("routing config v{}: {}", stored.version, e.reason),
                            ..e
                        })
                        .collect(),
                },
                overrides,
                failover_window_ms: stored.config.failover_window_ms,
            });
        }
        let (account, why) = self.only_active(merchant_id, route).await?;
        Ok(single(account, why))
    }

    async fn named_account(
        &self,
        merchant_id: &str,
        id: &str,
    ) -> Result<String, OrchestratorError> {
        let account = match self.store().connector_account_cached(id, merchant_id).await {
            Ok(account) => account,
            Err(StoreError::NotFound { .. }) => {
                return Err(RouteRefusal::UnknownAccount.into());
            }
            Err(error) => return Err(error.into()),
        };
        if account.status != "active" {
            return Err(RouteRefusal::Disabled(account.id).into());
        }
        Ok(account.id)
    }

    async fn only_active(
        &self,
        merchant_id: &str,
        route: &ConfirmOptions,
    ) -> Result<(String, String), OrchestratorError> {
        let hint = route.adapter_hint.as_ref();
        let accounts = self
            .store()
            .list_connector_accounts_cached(merchant_id)
            .await?;
        let candidates: Vec<_> = accounts
            .iter()
            .filter(|a| a.status == "active")
            .filter(|a| hint.is_none_or(|hint| &a.adapter == hint))
            .collect();
        let by_adapter = hint.is_some();
        match candidates.as_slice() {
            [one] => Ok((
                one.id.clone(),
                match hint {
                    Some(hint) => format!("the merchant's only active {hint} account"),
                    None => "the merchant's only active account".to_owned(),
                },
            )),
            [] => Err(RouteRefusal::NoMatch { by_adapter }.into()),
            _ => Err(RouteRefusal::Ambiguous { by_adapter }.into()),
        }
    }

    /// The eligibility filter of routing: the merchant's accounts that may not
    /// take a new attempt now, with the reason (disabled, paused by an
    /// operator, breaker open). Queries of attempts already at an account
    /// are never filtered.
    pub(crate) async fn ineligible_accounts(
        &self,
        merchant_id: &str,
    ) -> Result<BTreeMap<String, String>, OrchestratorError> {
        Ok(self
            .store()
            .list_connector_accounts_cached(merchant_id)
            .await?
            .iter()
            .filter_map(|a| {
                let why = if a.status == "active" {
                    self.new_attempt_refusal(a)?
                } else {
                    format!("account is {}", a.status)
                };
                Some((a.id.clone(), why))
            })
            .collect())
    }
}

/// How a payment's attempts are routed (see [`Orchestrator::routing_for`]).
#[derive(Debug, Clone)]
pub(crate) struct Routing {
    pub plan: RoutingPlan,
    pub overrides: Vec<FailureOverride>,
    /// 0: no failover (a named account, a hint, the only account).
    pub failover_window_ms: i64,
}

/// A plan over every account of the configuration, for the check before a
/// payment exists: every rule's accounts, then the fallback.
fn plan_any(config: &RoutingConfig) -> RoutingPlan {
    let mut entries: Vec<PlanEntry> = Vec::new();
    let rules = config.rules.iter().flat_map(|r| {
        r.accounts
            .iter()
            .map(move |a| (a.connector_account.clone(), Some(r.id.clone())))
    });
    let fallback = config.fallback.iter().map(|a| (a.clone(), None));
    for (account, rule) in rules.chain(fallback) {
        if !entries.iter().any(|e| e.connector_account == account) {
            entries.push(PlanEntry {
                connector_account: account,
                rule,
                reason: "routing configuration".to_owned(),
            });
        }
    }
    RoutingPlan { entries }
}

/// Accounts routing passed over, with the reason.
pub(crate) type Skipped = Vec<(String, String)>;

/// The first account of the plan that may take a new attempt, and the ones
/// skipped on the way with their reasons.
pub(crate) fn first_eligible<'p>(
    plan: &'p RoutingPlan,
    ineligible: &BTreeMap<String, String>,
) -> Result<(&'p PlanEntry, Skipped), RouteRefusal> {
    let mut skipped = Vec::new();
    for entry in &plan.entries {
        match ineligible.get(&entry.connector_account) {
            Some(why) => skipped.push((entry.connector_account.clone(), why.clone())),
            None => return Ok((entry, skipped)),
        }
    }
    if skipped.is_empty() {
        return Err(RouteRefusal::NoMatch { by_adapter: false });
    }
    Err(RouteRefusal::AllSkipped(
        skipped
            .iter()
            .map(|(a, why)| format!("{a} ({why})"))
            .collect(),
    ))
}

/// Which stored parameters differ from a repeated create's (empty: same payment).
fn differences(existing: &PaymentOrder, new: &NewPayment) -> Vec<&'static str> {
    let (a, b) = (&existing.fulfillment, &new.fulfillment);
    [
        (
            "amount",
            existing.amount.amount_minor != new.amount.amount_minor,
        ),
        ("currency", existing.amount.currency != new.amount.currency),
        ("capture_mode", existing.capture_mode != new.capture_mode),
        (
            "payment_method",
            existing.payment_method_token != new.payment_method_token,
        ),
        ("return_url", existing.return_url != new.return_url),
        ("description", existing.description != new.description),
        ("metadata", existing.metadata != new.metadata),
        (
            "fulfillment",
            (&a.biz_key, a.deadline, &a.mode) != (&b.biz_key, b.deadline, &b.mode),
        ),
    ]
    .into_iter()
    .filter_map(|(field, differs)| differs.then_some(field))
    .collect()
}
