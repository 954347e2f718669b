//! Creating a payment and choosing its connector account: the one place the
//! merchant API and every other caller go through, so the merchant's tenant
//! scope (which accounts are theirs and usable) is resolved once.

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
        if let Some(options) = &params.confirm {
            // Refuse an unroutable payment before anything is written.
            self.route(merchant_id, options).await?;
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
        let (order, created) = self.insert_or_existing(&new).await?;
        tracing::info!(payment_id = %order.id, created, "payment created");
        let never_confirmed = self.store().list_attempts(&order.id).await?.is_empty();
        let view = match (&params.confirm, never_confirmed) {
            (Some(options), true) => self.confirm(merchant_id, &order.id, options).await?,
            _ => self.payment(merchant_id, &order.id).await?,
        };
        Ok(Created { view, created })
    }

    async fn insert_or_existing(
        &self,
        new: &NewPayment,
    ) -> Result<(PaymentOrder, bool), OrchestratorError> {
        if let Some(existing) = self.existing_by_order_no(new).await? {
            return Ok((existing, false));
        }
        let provenance = Provenance::actor(&format!("merchant:{}", new.merchant_id));
        match self.store().create_payment(new, &provenance).await {
            Ok(order) => Ok((order, true)),
            // A concurrent create with the same number won the race.
            Err(StoreError::Conflict(_)) => match self.existing_by_order_no(new).await? {
                Some(existing) => Ok((existing, false)),
                None => Err(OrchestratorError::Conflict(
                    "the payment could not be created; retry".into(),
                )),
            },
            Err(error) => Err(error.into()),
        }
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
    /// hinted adapter, else their only active account.
    pub async fn route(
        &self,
        merchant_id: &str,
        route: &ConfirmOptions,
    ) -> Result<String, OrchestratorError> {
        if let Some(id) = &route.connector_account_id {
            let account = match self
                .store()
                .get_connector_account(id, Some(merchant_id))
                .await
            {
                Ok(account) => account,
                Err(StoreError::NotFound { .. }) => {
                    return Err(RouteRefusal::UnknownAccount.into());
                }
                Err(error) => return Err(error.into()),
            };
            if account.status != "active" {
                return Err(RouteRefusal::Disabled(account.id).into());
            }
            return Ok(account.id);
        }
        let hint = route.adapter_hint.as_ref();
        let candidates: Vec<_> = self
            .store()
            .list_connector_accounts(merchant_id)
            .await?
            .into_iter()
            .filter(|a| a.status == "active")
            .filter(|a| hint.is_none_or(|hint| &a.adapter == hint))
            .collect();
        let by_adapter = hint.is_some();
        match candidates.as_slice() {
            [one] => Ok(one.id.clone()),
            [] => Err(RouteRefusal::NoMatch { by_adapter }.into()),
            _ => Err(RouteRefusal::Ambiguous { by_adapter }.into()),
        }
    }
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
