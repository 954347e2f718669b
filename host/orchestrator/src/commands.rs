//! The merchant-facing operations: create, confirm, capture, void, refund.
//!
//! Each persists what it must first (the order, the attempt with its stable
//! reference, the capture or refund reservation), then drives the PSP step in
//! a spawned task and waits for it at most [`OrchestratorConfig::sync_wait`].
//! When the outcome is not known by then, the caller gets the current view
//! (processing, with `in_progress` set) and the task carries on: the request
//! is never abandoned half-way because a client stopped waiting, and a
//! timeout is never reported as a failure.
//!
//! [`OrchestratorConfig::sync_wait`]: crate::OrchestratorConfig::sync_wait

use std::future::Future;

use sluice_core::{
    client_status, next_step, refund_client_status, request_void, AttemptFact, AttemptState,
    ClientStatus, FailoverInput, Money, NextStep, RouteInput,
};
use sluice_store::{
    Capture, CaptureRequest, NewAttempt, PaymentDetails, Provenance, Refund, RefundRequest,
};

use crate::advance::attempt_spec;
use crate::call::{self, Connector};
use crate::config::millis;
use crate::convert::Operation;
use crate::create::{first_eligible, Routing};
use crate::error::OrchestratorError;
use crate::exits::VoidReason;
use crate::first_send::Prepared;
use crate::orchestrator::{Orchestrator, OwnAggregate, Target, Trigger};

/// How to confirm. The connector account serving the attempt is the one
/// named, else the merchant's only active account of the hinted adapter,
/// else the merchant's only active account.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfirmOptions {
    pub connector_account_id: Option<String>,
    /// An adapter name, e.g. "stripe".
    pub adapter_hint: Option<String>,
    /// New payment details for this attempt (e.g. after a decline); the
    /// payment's own token otherwise.
    pub payment_method_token: Option<String>,
    /// What routing rules on the payment method type match against;
    /// `card` when not given (the only type of both wire subsets).
    pub payment_method_type: Option<String>,
}

/// A payment as the API shows it, read from the primary store after the call.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentView {
    pub details: PaymentDetails,
    /// The client-facing projection (never more than the evidence shows).
    pub status: ClientStatus,
    /// The call that produced this view did not learn its outcome within the
    /// wait budget; it goes on in the background. Poll again.
    pub in_progress: bool,
    /// When `status` is `processing`: a sensible time to poll again.
    pub poll_after_ms: Option<u64>,
}

/// The result of `create_payment`: the view, and whether this call created
/// it (false: an identical earlier request did).
#[derive(Debug, Clone, PartialEq)]
pub struct Created {
    pub view: PaymentView,
    pub created: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CaptureView {
    pub capture: Capture,
    pub payment: PaymentView,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RefundView {
    pub refund: Refund,
    /// `pending`, `succeeded`, `failed` or `canceled` (UNKNOWN shows as pending).
    pub status: &'static str,
    pub payment: PaymentView,
}

/// A route reason with the accounts routing skipped on the way, and why.
fn with_skipped(reason: &str, skipped: &[(String, String)]) -> String {
    if skipped.is_empty() {
        return reason.to_owned();
    }
    let skipped: Vec<String> = skipped
        .iter()
        .map(|(a, why)| format!("{a} ({why})"))
        .collect();
    format!("{reason}; skipped {}", skipped.join(", "))
}

/// How a payment's first attempt is routed: the payment's routing (its
/// failover plan) and the account chosen, with the reason recorded.
pub(crate) struct FirstRoute {
    routing: Routing,
    account: String,
    reason: String,
}

/// What a background step reported back within the wait budget.
enum Waited<T> {
    Done(T),
    /// It ended with an error (logged); recovery carries on.
    Failed,
    StillRunning,
}

/// How the first attempt's step went for the request waiting on it: still
/// running, or done, with the payment as its decisions left it when they are
/// known to be its whole state (`first_send::Answered::payment`).
struct Driven {
    in_progress: bool,
    known: Option<PaymentDetails>,
}

impl Driven {
    fn running(in_progress: bool) -> Driven {
        Driven {
            in_progress,
            known: None,
        }
    }
}

impl Orchestrator {
    /// Start an attempt at the PSP. Refused while an earlier attempt is in
    /// flight or UNKNOWN (only a definitive failure allows a new one).
    ///
    /// Routed by the merchant's routing configuration when no account is
    /// named: when the attempt fails definitively with a code the failure
    /// table marks as cascadable, the next eligible account of the plan gets
    /// the next attempt (`<payment>_a2`, ...), within this same confirm and
    /// the configuration's failover window; `sluice_core::next_step` decides,
    /// and never while an attempt is unresolved.
    pub async fn confirm(
        &self,
        merchant_id: &str,
        payment_id: &str,
        options: &ConfirmOptions,
    ) -> Result<PaymentView, OrchestratorError> {
        // Scope first: someone else's payment is "not found", never routed.
        let order = self
            .store()
            .get_payment(Some(merchant_id), payment_id)
            .await?;
        self.confirm_order(merchant_id, order, options).await
    }

    /// [`Self::confirm`] of an order read for `merchant_id`.
    pub(crate) async fn confirm_order(
        &self,
        merchant_id: &str,
        order: sluice_store::PaymentOrder,
        options: &ConfirmOptions,
    ) -> Result<PaymentView, OrchestratorError> {
        let route = self.first_route(merchant_id, &order, options).await?;
        let new = self
            .new_attempt(&order.id, &route.account, options, route.reason.clone())
            .await?;
        let first = self
            .store()
            .create_attempt(&new, &Self::merchant_actor(merchant_id))
            .await?;
        let drive = Driven::running(self.drive(Target::Attempt(first.id.clone())).await);
        self.run_attempts(merchant_id, &order.id, &first, drive, &route, options)
            .await
    }

    /// Create a payment and start its first attempt in one transaction (a
    /// create with `confirm`), then drive it as [`Self::confirm`] does. None
    /// when the merchant order number was used before: nothing was written,
    /// and the caller looks for the earlier payment. The first send's
    /// request is built and its call slot taken before the create, so that
    /// the record of the send commits with the payment (`first_send.rs`).
    pub(crate) async fn create_confirmed(
        &self,
        new: &sluice_store::NewPayment,
        options: &ConfirmOptions,
    ) -> Result<Option<PaymentView>, OrchestratorError> {
        let merchant_id = new.merchant_id.as_str();
        let payment_id = self.store().mint_payment_id();
        // Routed before anything is written: an unroutable payment is refused
        // and not created.
        let route = self
            .first_route_of(merchant_id, &payment_id, new.amount, &new.metadata, options)
            .await?;
        let attempt = self
            .new_attempt(&payment_id, &route.account, options, route.reason.clone())
            .await?;
        let fresh = self
            .store()
            .fresh_payment(&payment_id, new, &attempt)
            .await?;
        let first = match fresh.head() {
            // A failure here (the adapter's, the runtime's) leaves the record
            // to the step after the create, which meets it as before: the
            // payment is created and recovery carries on.
            Some(head) => (self.first_send_of(&head).await)
                .inspect_err(
                    |e| tracing::warn!(payment_id, error = %e, "first send not made ready"),
                )
                .ok(),
            None => None,
        };
        let record = match &first {
            Some((_, Prepared::Ready(ready))) => Some(&ready.record),
            _ => None,
        };
        let provenance = Self::merchant_actor(merchant_id);
        let created = self
            .store()
            .create_payment_with_attempt(&fresh, &provenance, record)
            .await;
        let created = match created {
            Ok(created) => created,
            Err(sluice_store::StoreError::Conflict(_)) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        let attempt = created.head.attempt.clone();
        tracing::info!(payment_id, attempt_id = %attempt.id, "payment created and confirmed");
        let drive = self.drive_created(created, first).await;
        let view = self
            .run_attempts(merchant_id, &payment_id, &attempt, drive, &route, options)
            .await?;
        Ok(Some(view))
    }

    /// The connector of a fresh attempt and its first send made ready.
    async fn first_send_of(
        &self,
        head: &sluice_store::AttemptHead,
    ) -> Result<(Connector, Prepared), OrchestratorError> {
        let connector = self.attempt_connector(&head.attempt).await?;
        let prepared = self
            .prepare_first_send(head, &connector, Trigger::Api)
            .await?;
        Ok((connector, prepared))
    }

    /// The first step of a payment just created, as [`Self::drive`] takes
    /// it: the send its record committed with, or a shed call (nothing to
    /// send; the scanner sends it), or else the step from the rows just
    /// written, which records the send through the door (the create could
    /// not carry it) or cancels a request that cannot leave.
    async fn drive_created(
        &self,
        created: sluice_store::CreatedPayment,
        first: Option<(Connector, Prepared)>,
    ) -> Driven {
        let head = created.head;
        let ready = match (created.sent, first) {
            (Some(sent), Some((connector, Prepared::Ready(ready)))) => {
                Some((sent, connector, ready))
            }
            (None, Some((_, Prepared::Shed(action)))) => {
                tracing::info!(payment_id = %head.order.id, ?action, "first send shed");
                return Driven::running(false);
            }
            // Anything else, its slot if one was taken given back first.
            _ => None,
        };
        let Some((sent, connector, ready)) = ready else {
            return Driven::running(self.drive_known(head).await);
        };
        let this = self.clone();
        let attempt = &head.attempt;
        let span = tracing::info_span!("advance", payment_id = %attempt.payment_id,
            attempt_id = %attempt.id, adapter = %attempt.adapter, trigger = %Trigger::Api);
        let own = OwnAggregate::Attempt {
            reference: attempt.reference.clone(),
            mode: attempt.capture_mode,
        };
        let step = async move {
            let answered = this
                .send_first(&connector, &own, *ready, sent.after)
                .await?;
            let action = &answered.action;
            tracing::info!(from = %AttemptState::Created, ?action, "advanced attempt");
            Ok(answered)
        };
        match self.wait_for(step, span).await {
            Waited::Done(answered) => Driven {
                in_progress: false,
                known: answered.payment,
            },
            Waited::Failed => Driven::running(false),
            Waited::StillRunning => Driven::running(true),
        }
    }

    /// The payment's routing and the account of its first attempt.
    async fn first_route(
        &self,
        merchant_id: &str,
        order: &sluice_store::PaymentOrder,
        options: &ConfirmOptions,
    ) -> Result<FirstRoute, OrchestratorError> {
        self.first_route_of(
            merchant_id,
            &order.id,
            order.amount,
            &order.metadata,
            options,
        )
        .await
    }

    async fn first_route_of(
        &self,
        merchant_id: &str,
        payment_id: &str,
        amount: Money,
        metadata: &serde_json::Value,
        options: &ConfirmOptions,
    ) -> Result<FirstRoute, OrchestratorError> {
        let metadata = crate::orchestrator::metadata_pairs(metadata)
            .into_iter()
            .collect();
        let input = RouteInput {
            payment_id,
            amount,
            payment_method_type: Some(options.payment_method_type.as_deref().unwrap_or("card")),
            metadata: &metadata,
        };
        let routing = self.routing_for(merchant_id, options, Some(&input)).await?;
        let ineligible = self.ineligible_accounts(merchant_id).await?;
        let (entry, skipped) = first_eligible(&routing.plan, &ineligible)?;
        let reason = with_skipped(&entry.reason, &skipped);
        let account = entry.connector_account.clone();
        Ok(FirstRoute {
            routing,
            account,
            reason,
        })
    }

    /// After the first attempt's drive (`in_progress`: still running): the
    /// failovers the core asks for, then the payment's view.
    async fn run_attempts(
        &self,
        merchant_id: &str,
        payment_id: &str,
        first: &sluice_store::PaymentAttempt,
        drive: Driven,
        route: &FirstRoute,
        options: &ConfirmOptions,
    ) -> Result<PaymentView, OrchestratorError> {
        let routing = &route.routing;
        let deadline_ms = first.created_at.saturating_add(routing.failover_window_ms);
        let Driven {
            mut in_progress,
            mut known,
        } = drive;
        while !in_progress {
            let Some((account, reason)) = self
                .failover_target(merchant_id, payment_id, routing, deadline_ms, &mut known)
                .await?
            else {
                break;
            };
            let next = match self
                .start_attempt(merchant_id, payment_id, &account, options, reason)
                .await
            {
                Ok(next) => next,
                Err(error) => {
                    // Someone else started an attempt meanwhile: theirs stands.
                    tracing::warn!(payment_id, error = %error, "failover attempt not started");
                    break;
                }
            };
            in_progress = self.drive(Target::Attempt(next.id)).await;
        }
        let details = self.details_of(merchant_id, payment_id, known).await?;
        self.view_of(details, in_progress)
    }

    /// Ask the core whether the payment fails over, and where.
    async fn failover_target(
        &self,
        merchant_id: &str,
        payment_id: &str,
        routing: &Routing,
        deadline_ms: i64,
        known: &mut Option<PaymentDetails>,
    ) -> Result<Option<(String, String)>, OrchestratorError> {
        if routing.failover_window_ms <= 0 {
            return Ok(None);
        }
        let details = self
            .details_of(merchant_id, payment_id, known.take())
            .await?;
        let attempts: Vec<AttemptFact> = details
            .attempts
            .iter()
            .map(|a| AttemptFact {
                connector_account: a.connector_account_id.clone(),
                adapter: a.adapter.clone(),
                state: a.state,
                failure_code: a.failure.as_ref().map(|f| f.code.clone()),
                created_at_ms: a.created_at,
            })
            .collect();
        let ineligible = self.ineligible_accounts(merchant_id).await?;
        let step = next_step(&FailoverInput {
            order: details.order.state,
            attempts: &attempts,
            plan: &routing.plan,
            overrides: &routing.overrides,
            ineligible: &ineligible,
            deadline_ms,
            now_ms: self.now_ms(),
        });
        match step {
            NextStep::Failover {
                connector_account,
                reason,
                skipped,
            } => {
                tracing::info!(payment_id, connector_account = %connector_account, %reason, "failing over");
                let reason = with_skipped(&reason, &skipped);
                Ok(Some((connector_account, reason)))
            }
            NextStep::Stop(stop) => {
                tracing::info!(payment_id, ?stop, "no failover");
                // What was just read is the answer's view too.
                *known = Some(details);
                Ok(None)
            }
        }
    }

    async fn start_attempt(
        &self,
        merchant_id: &str,
        payment_id: &str,
        account_id: &str,
        options: &ConfirmOptions,
        route_reason: String,
    ) -> Result<sluice_store::PaymentAttempt, OrchestratorError> {
        let new = self
            .new_attempt(payment_id, account_id, options, route_reason)
            .await?;
        Ok(self
            .store()
            .create_attempt(&new, &Self::merchant_actor(merchant_id))
            .await?)
    }

    /// A new attempt of `payment_id` at `account_id`, first looked at by the
    /// scanner once its call's budget (and a little more) has passed.
    async fn new_attempt(
        &self,
        payment_id: &str,
        account_id: &str,
        options: &ConfirmOptions,
        route_reason: String,
    ) -> Result<NewAttempt, OrchestratorError> {
        let connector = self.connector(account_id).await?;
        let window = millis(connector.budget.timeout) + millis(self.config().in_flight_grace);
        Ok(NewAttempt {
            payment_id: payment_id.to_owned(),
            connector_account_id: account_id.to_owned(),
            payment_method_token: options.payment_method_token.clone(),
            payment_method_type: Some(
                options
                    .payment_method_type
                    .clone()
                    .unwrap_or_else(|| "card".into()),
            ),
            next_retry_time: Some(self.now_ms().saturating_add(window)),
            route_reason: Some(route_reason),
            ..NewAttempt::default()
        })
    }

    fn merchant_actor(merchant_id: &str) -> Provenance {
        Provenance::actor(&format!("merchant:{merchant_id}"))
    }

    /// Capture all (`amount` None) or part of an authorization. The amount is
    /// reserved before anything is sent; too much is refused and changes nothing.
    pub async fn capture(
        &self,
        merchant_id: &str,
        payment_id: &str,
        amount: Option<Money>,
    ) -> Result<CaptureView, OrchestratorError> {
        self.capture_keyed(merchant_id, payment_id, amount, None)
            .await
    }

    /// [`Orchestrator::capture`] for a request carrying the merchant's
    /// `Idempotency-Key`: the capture reference is derived from the payment
    /// and the key, so a re-run of the same request (a retry that took the
    /// key over after a crash) finds the capture its first run reserved and
    /// drives that one, with the same PSP idempotency key.
    pub async fn capture_keyed(
        &self,
        merchant_id: &str,
        payment_id: &str,
        amount: Option<Money>,
        idempotency_key: Option<&str>,
    ) -> Result<CaptureView, OrchestratorError> {
        let details = self
            .store()
            .payment_details(Some(merchant_id), payment_id)
            .await?;
        let earlier = idempotency_key.and_then(|key| {
            let reference = sluice_store::keyed_capture_reference(payment_id, key);
            details.captures.iter().find(|c| c.reference == reference)
        });
        let amount = match (amount, earlier) {
            (Some(amount), _) => amount,
            (None, Some(earlier)) => earlier.amount,
            (None, None) => remaining(&details, details.amounts.capturable_minor(), "capture")?,
        };
        self.ensure_adapter_of_latest(&details).await?;
        let reservation = self
            .store()
            .reserve_capture(
                &CaptureRequest {
                    payment_id: payment_id.to_owned(),
                    merchant_id: Some(merchant_id.to_owned()),
                    amount,
                    idempotency_key: idempotency_key.map(str::to_owned),
                },
                &Provenance::actor(&format!("merchant:{merchant_id}")),
            )
            .await?;
        let capture_id = reservation.record.id;
        let waited = self.drive(Target::Capture(capture_id.clone())).await;
        Ok(CaptureView {
            capture: self.store().get_capture(&capture_id).await?,
            payment: self.view(merchant_id, payment_id, waited).await?,
        })
    }

    /// Refund all that is refundable (`amount` None) or part of it. The amount
    /// is reserved atomically before any PSP call: more than the refundable
    /// amount is refused and changes nothing.
    pub async fn refund(
        &self,
        merchant_id: &str,
        payment_id: &str,
        amount: Option<Money>,
        reason: Option<String>,
    ) -> Result<RefundView, OrchestratorError> {
        self.refund_keyed(merchant_id, payment_id, amount, reason, None)
            .await
    }

    /// [`Orchestrator::refund`] for a request carrying the merchant's
    /// `Idempotency-Key` (see [`Orchestrator::capture_keyed`]): a re-run finds
    /// the refund its first run reserved, never a second one.
    pub async fn refund_keyed(
        &self,
        merchant_id: &str,
        payment_id: &str,
        amount: Option<Money>,
        reason: Option<String>,
        idempotency_key: Option<&str>,
    ) -> Result<RefundView, OrchestratorError> {
        let details = self
            .store()
            .payment_details(Some(merchant_id), payment_id)
            .await?;
        let earlier = idempotency_key.and_then(|key| {
            let reference = sluice_store::keyed_refund_reference(payment_id, key);
            details.refunds.iter().find(|r| r.reference == reference)
        });
        let amount = match (amount, earlier) {
            (Some(amount), _) => amount,
            // "Everything refundable", replayed: what the first run reserved.
            (None, Some(earlier)) => earlier.amount,
            (None, None) => remaining(&details, details.amounts.refundable_minor(), "refund")?,
        };
        self.ensure_adapter_of_latest(&details).await?;
        let reservation = self
            .store()
            .reserve_refund(
                &RefundRequest {
                    payment_id: payment_id.to_owned(),
                    merchant_id: Some(merchant_id.to_owned()),
                    amount,
                    reason,
                    idempotency_key: idempotency_key.map(str::to_owned),
                },
                &Provenance::actor(&format!("merchant:{merchant_id}")),
            )
            .await?;
        let refund_id = reservation.record.id;
        let waited = self.drive(Target::Refund(refund_id.clone())).await;
        let refund = self.store().get_refund(&refund_id).await?;
        Ok(RefundView {
            status: refund_client_status(refund.state),
            refund,
            payment: self.view(merchant_id, payment_id, waited).await?,
        })
    }

    /// Void an authorization (manual capture, nothing captured or in flight).
    /// The void is recorded as sent through the door before the call; the
    /// PSP's PAYMENT_CANCELED is what cancels the payment. A void whose outcome
    /// is unknown (or whose sender crashed) leaves it authorized, and the
    /// recovery scanner queries it and sends the same void again (same
    /// reference) until the PSP says.
    pub async fn void(
        &self,
        merchant_id: &str,
        payment_id: &str,
    ) -> Result<PaymentView, OrchestratorError> {
        let details = self
            .store()
            .payment_details(Some(merchant_id), payment_id)
            .await?;
        let attempt = details.attempts.last().cloned().ok_or_else(|| {
            OrchestratorError::InvalidState("the payment has no attempt to void".into())
        })?;
        let snapshot = details.order.snapshot(&details.amounts)?;
        request_void(&snapshot, &attempt.snapshot())
            .map_err(|refused| OrchestratorError::InvalidState(refused.to_string()))?;
        let connector = self.attempt_connector(&attempt).await?;
        // Refuse what the adapter cannot build before anything is recorded.
        let spec = attempt_spec(Operation::Void, &attempt, &details.order);
        call::prepare(&connector, &spec)
            .await?
            .map_err(|not_sent| OrchestratorError::InvalidRequest(not_sent.message))?;
        let this = self.clone();
        let order = details.order.clone();
        let span = tracing::info_span!("void", payment_id, attempt_id = %attempt.id,
            adapter = %attempt.adapter);
        // Recorded as sent through the door, then sent (`exits.rs`).
        let waited = self
            .wait_for(
                async move {
                    this.void_authorization(
                        &attempt,
                        &order,
                        &connector,
                        Trigger::Api,
                        VoidReason::Merchant,
                    )
                    .await
                },
                span,
            )
            .await;
        self.view(
            merchant_id,
            payment_id,
            matches!(waited, Waited::StillRunning),
        )
        .await
    }

    /// Close, at the PSP, an attempt whose customer step (3-D Secure, a
    /// redirect) expired: the recovery scanner's REQUIRES_ACTION expiry.
    ///
    /// Only the PSP's PAYMENT_CANCELED closes the attempt (through the door),
    /// so a customer who completed the step meanwhile wins: the PSP refuses
    /// the cancel or reports the success, and the attempt follows that. An
    /// unknown outcome changes nothing (REQUIRES_ACTION is more than "no
    /// answer") and the next scan sends the same cancel again.
    ///
    /// Returns the attempt's state after the call; an attempt that is no
    /// longer REQUIRES_ACTION is left alone and its state returned.
    pub async fn cancel_expired_attempt(
        &self,
        payment_id: &str,
        attempt_id: &str,
    ) -> Result<AttemptState, OrchestratorError> {
        let details = self.store().payment_details(None, payment_id).await?;
        let attempt = details
            .attempts
            .iter()
            .find(|a| a.id == attempt_id)
            .cloned()
            .ok_or_else(|| {
                OrchestratorError::InvalidState(format!(
                    "payment {payment_id} has no attempt {attempt_id}"
                ))
            })?;
        if attempt.state != AttemptState::RequiresAction {
            return Ok(attempt.state);
        }
        let connector = self.attempt_connector(&attempt).await?;
        let spec = attempt_spec(Operation::Void, &attempt, &details.order);
        let request = call::prepare(&connector, &spec)
            .await?
            .map_err(|not_sent| OrchestratorError::InvalidRequest(not_sent.message))?;
        let own = OwnAggregate::Attempt {
            reference: attempt.reference.clone(),
            mode: attempt.capture_mode,
        };
        let provenance = Orchestrator::provenance(&connector, Trigger::Scanner);
        let Ok(slot) = self.call_slot(&connector, spec.operation).await else {
            // Shed (logged and counted): nothing sent; the next scan asks again.
            return Ok(attempt.state);
        };
        let outcome = self.perform(&connector, &spec, &request, slot).await;
        if let Some(code) = outcome.unknown_code() {
            tracing::info!(payment_id, attempt_id, adapter = %attempt.adapter, code,
                "cancel of an expired customer step has no answer yet; the next scan resends it");
        }
        self.apply_outcome(&connector, &own, &spec, outcome, &provenance, None)
            .await?;
        Ok(self.store().get_attempt(attempt_id).await?.state)
    }

    /// The payment as it is now, for a merchant.
    pub async fn payment(
        &self,
        merchant_id: &str,
        payment_id: &str,
    ) -> Result<PaymentView, OrchestratorError> {
        self.view(merchant_id, payment_id, false).await
    }

    async fn view(
        &self,
        merchant_id: &str,
        payment_id: &str,
        in_progress: bool,
    ) -> Result<PaymentView, OrchestratorError> {
        let details = self.details_of(merchant_id, payment_id, None).await?;
        self.view_of(details, in_progress)
    }

    /// The merchant's payment: `known` when the caller holds it whole (the
    /// rows its own decisions left, [`Driven::known`]; in builds with
    /// assertions checked against the database whenever the payment is still
    /// at their version), else read.
    async fn details_of(
        &self,
        merchant_id: &str,
        payment_id: &str,
        known: Option<PaymentDetails>,
    ) -> Result<PaymentDetails, OrchestratorError> {
        let known =
            known.filter(|k| k.order.id == payment_id && k.order.merchant_id == merchant_id);
        let Some(known) = known else {
            let details = self.store().payment_details(Some(merchant_id), payment_id);
            return Ok(details.await?);
        };
        if cfg!(debug_assertions) {
            let stored = self.store().payment_details(Some(merchant_id), payment_id);
            let stored = stored.await?;
            if stored.order.version == known.order.version {
                assert_eq!(
                    stored, known,
                    "the payment as its decisions left it is the stored one"
                );
            }
        }
        Ok(known)
    }

    fn view_of(
        &self,
        details: PaymentDetails,
        in_progress: bool,
    ) -> Result<PaymentView, OrchestratorError> {
        let status = client_status(&sluice_core::PaymentView {
            order: details.order.state,
            latest_attempt: details.attempts.last().map(|a| a.state),
            amounts: details.amounts.to_core()?,
            manual_review: details.order.manual_review,
        });
        let poll_after_ms = (status == ClientStatus::Processing).then(|| {
            u64::try_from(millis(self.config().sync_wait))
                .unwrap_or(u64::MAX)
                .max(1000)
        });
        Ok(PaymentView {
            details,
            status,
            in_progress,
            poll_after_ms,
        })
    }

    /// Run `advance(target, Api)` in its own task and wait for it within the
    /// budget. Returns whether it is still running. A failure of the step is
    /// logged, not returned: what was persisted stands, the view shows it,
    /// and the scanner takes the aggregate up again.
    /// [`Self::drive`] of an attempt whose rows this caller just wrote: its
    /// first step decides from them instead of reading them again (the door
    /// decides the record of the send from the attempt as it reads it then).
    async fn drive_known(&self, head: sluice_store::AttemptHead) -> bool {
        let this = self.clone();
        let span = tracing::info_span!("drive", target = %Target::Attempt(head.attempt.id.clone()));
        let step = async move {
            let (_, action) = this.step_attempt_on(head, Trigger::Api).await?;
            Ok(action)
        };
        matches!(self.wait_for(step, span).await, Waited::StillRunning)
    }

    async fn drive(&self, target: Target) -> bool {
        let this = self.clone();
        let span = tracing::info_span!("drive", target = %target);
        let waited = self
            .wait_for(
                async move { this.advance_action(target, Trigger::Api).await },
                span,
            )
            .await;
        matches!(waited, Waited::StillRunning)
    }

    async fn wait_for<T: Send + 'static>(
        &self,
        step: impl Future<Output = Result<T, OrchestratorError>> + Send + 'static,
        span: tracing::Span,
    ) -> Waited<T> {
        use tracing::Instrument;
        // The step's PSP calls count towards the request waiting for it.
        let task = tokio::spawn(crate::psp_wait::carried(step).instrument(span));
        match tokio::time::timeout(self.config().sync_wait, task).await {
            Ok(Ok(Ok(done))) => Waited::Done(done),
            Ok(Ok(Err(error))) => {
                tracing::warn!(error = %error, "PSP step failed; the scanner will take it up again");
                Waited::Failed
            }
            Ok(Err(join_error)) => {
                tracing::error!(error = %join_error, "PSP step task failed");
                Waited::Failed
            }
            Err(_) => {
                tracing::info!(
                    budget_ms = millis(self.config().sync_wait),
                    "outcome not known within the wait budget; continuing in the background"
                );
                Waited::StillRunning
            }
        }
    }

    /// Refuse a capture or refund early (nothing reserved) when the adapter
    /// that must send it is not loaded.
    async fn ensure_adapter_of_latest(
        &self,
        details: &PaymentDetails,
    ) -> Result<(), OrchestratorError> {
        let attempt = details
            .attempts
            .iter()
            .rev()
            .find(|a| matches!(a.state, AttemptState::Authorized | AttemptState::Succeeded));
        if let Some(attempt) = attempt {
            self.attempt_connector(attempt).await?;
        }
        Ok(())
    }
}

/// All that remains (to capture or refund), in the payment's currency.
fn remaining(details: &PaymentDetails, minor: i64, what: &str) -> Result<Money, OrchestratorError> {
    Money::positive(minor, details.order.amount.currency).map_err(|_| {
        OrchestratorError::InvalidState(format!("nothing left to {what} on this payment"))
    })
}
