//! `advance(target, trigger)`: one entry for the API, the webhook processor,
//! the scanner and operators (seed 000 §5). Every call re-reads the primary
//! store and takes at most one external step from what it finds:
//!
//! | state                         | api / scanner / operator                    | webhook            |
//! |-------------------------------|---------------------------------------------|--------------------|
//! | terminal                      | nothing                                     | nothing            |
//! | CREATED                       | record SUBMITTED / PROCESSING, then send    | nothing            |
//! | SUBMITTED, PROCESSING, REQUIRES_ACTION | query, unless the sender's call is still within its budget (api only) | nothing |
//! | UNKNOWN                       | query with the original reference           | query              |
//! | AUTHORIZED (attempt)          | nothing: the merchant captures or voids     | nothing            |
//!
//! Sending is guarded by the door itself: the SUBMITTED (PROCESSING for a
//! capture or refund) event is applied first, and only the caller whose event
//! was *applied* sends. A concurrent caller sees a duplicate and stands back,
//! and the PSP's idempotency key (the stable reference) is the second net.
//! UNKNOWN is only ever resolved by a query with the original reference.

use serde::Serialize;
use tracing::Instrument;

use sluice_core::{
    AttemptState, CaptureMode, CaptureState, EventKind, EvidenceSource, Failure, FailureCategory,
    PaymentEvent, RefundState,
};
use sluice_store::{
    Applied, ApplyEvent, AttemptHead, Capture, DecisionKind, EventTarget, PaymentAttempt,
    PaymentOrder, PendingKind, Provenance, Refund, SentCall,
};

use crate::call::{self, Connector, NotSent};
use crate::config::millis;
use crate::convert::{Operation, OperationSpec};
use crate::error::OrchestratorError;
use crate::first_send::Prepared;
use crate::orchestrator::{
    metadata_pairs, DecisionTally, Orchestrator, OwnAggregate, Target, Trigger,
};

/// What one `advance` call did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Advanced {
    pub target: Target,
    pub payment_id: String,
    pub state_before: String,
    pub state_after: String,
    pub action: Action,
}

/// The one step `advance` took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// The aggregate is terminal: nothing to do, ever.
    Final,
    /// Nothing to do now; someone or something else moves it next.
    Waiting { reason: &'static str },
    /// The operation was sent to the PSP. `unknown` holds the host's reason
    /// when the outcome could not be learned (the aggregate is then UNKNOWN).
    Sent {
        operation: Operation,
        unknown: Option<String>,
        decisions: DecisionTally,
    },
    /// A query proved the PSP has no such payment, and the original request
    /// was sent again with the same reference (its idempotency key), within
    /// the PSP's retention (`sluice_core::decide_resend`).
    Resent {
        operation: Operation,
        unknown: Option<String>,
        decisions: DecisionTally,
    },
    /// The PSP was asked for the current truth with the original reference.
    Queried {
        operation: Operation,
        unknown: Option<String>,
        decisions: DecisionTally,
    },
    /// The request never left the host (the adapter or the host refused it).
    /// A first send that cannot leave closes its aggregate without money
    /// moving; a query that cannot leave changes nothing.
    NotSent { code: String, message: String },
    /// No PSP call slot of the connector account came free in time
    /// ([`crate::call_slots`]): nothing was recorded or sent, the aggregate
    /// is as it was, and whoever advances it next (the scanner) sends it.
    Shed {
        operation: Operation,
        reason: String,
    },
}

impl Orchestrator {
    /// Take the next step for an attempt, capture or refund, from the state
    /// the primary store holds now.
    pub async fn advance(
        &self,
        target: Target,
        trigger: Trigger,
    ) -> Result<Advanced, OrchestratorError> {
        match &target {
            Target::Attempt(id) => self.advance_attempt(id, trigger).await,
            Target::Capture(id) => self.advance_capture(id, trigger).await,
            Target::Refund(id) => self.advance_refund(id, trigger).await,
        }
    }

    async fn advance_attempt(
        &self,
        id: &str,
        trigger: Trigger,
    ) -> Result<Advanced, OrchestratorError> {
        let (attempt, action) = self.step_attempt(id, trigger).await?;
        let after = self.store().get_attempt(id).await?;
        Ok(Advanced {
            target: Target::Attempt(attempt.id.clone()),
            payment_id: attempt.payment_id.clone(),
            state_before: attempt.state.to_string(),
            state_after: after.state.to_string(),
            action,
        })
    }

    /// [`Self::advance`] for a caller that needs only the action taken, not
    /// the state afterwards (the API's confirm, which reads the whole payment
    /// next): one read fewer.
    pub(crate) async fn advance_action(
        &self,
        target: Target,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        match &target {
            Target::Attempt(id) => Ok(self.step_attempt(id, trigger).await?.1),
            _ => Ok(self.advance(target, trigger).await?.action),
        }
    }

    /// One step of an attempt, decided from it and its order as read now.
    async fn step_attempt(
        &self,
        id: &str,
        trigger: Trigger,
    ) -> Result<(PaymentAttempt, Action), OrchestratorError> {
        let head = self.store().get_attempt_head(id).await?;
        self.step_attempt_on(head, trigger).await
    }

    /// [`Self::step_attempt`] from an attempt and its order already in hand.
    pub(crate) async fn step_attempt_on(
        &self,
        head: AttemptHead,
        trigger: Trigger,
    ) -> Result<(PaymentAttempt, Action), OrchestratorError> {
        let attempt = &head.attempt;
        let span = tracing::info_span!("advance", payment_id = %attempt.payment_id,
            attempt_id = %attempt.id, adapter = %attempt.adapter, trigger = %trigger);
        let action = self
            .attempt_step(&head, trigger)
            .instrument(span.clone())
            .await?;
        span.in_scope(|| tracing::info!(from = %attempt.state, ?action, "advanced attempt"));
        Ok((head.attempt, action))
    }

    async fn attempt_step(
        &self,
        head: &AttemptHead,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        use AttemptState as A;
        let (attempt, order) = (&head.attempt, &head.order);
        let recovering = matches!(trigger, Trigger::Scanner | Trigger::Operator);
        match attempt.state {
            state if state.is_terminal() => return Ok(Action::Final),
            // A void recorded as sent is followed by recovery (query, then
            // the same void again while the PSP still holds the funds).
            A::Authorized if !(recovering && attempt.void_requested_at.is_some()) => {
                return Ok(Action::Waiting {
                    reason: "authorized: the merchant captures or voids",
                })
            }
            A::Created if trigger == Trigger::Webhook => {
                return Ok(Action::Waiting {
                    reason: "not sent yet; a webhook never starts a charge",
                })
            }
            _ => {}
        }
        let connector = self.attempt_connector(attempt).await?;
        let own = OwnAggregate::Attempt {
            reference: attempt.reference.clone(),
            mode: attempt.capture_mode,
        };
        match attempt.state {
            A::Created => self.submit_attempt(head, &connector, &own, trigger).await,
            A::Authorized => {
                self.follow_void(attempt, order, &connector, &own, trigger)
                    .await
            }
            A::Unknown => {
                self.query_attempt(attempt, order, &connector, &own, trigger)
                    .await
            }
            _ if !self.may_query(
                trigger,
                attempt.last_psp_call_at.or(Some(attempt.updated_at)),
                &connector,
            ) =>
            {
                Ok(Action::Waiting {
                    reason: "a PSP call for it is still within its budget",
                })
            }
            _ => {
                self.query_attempt(attempt, order, &connector, &own, trigger)
                    .await
            }
        }
    }

    async fn submit_attempt(
        &self,
        head: &AttemptHead,
        connector: &Connector,
        own: &OwnAggregate,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        let ready = match self.prepare_first_send(head, connector, trigger).await? {
            Prepared::Ready(ready) => ready,
            Prepared::NotSent(not_sent) => {
                return self
                    .first_not_sent(head, connector, trigger, not_sent)
                    .await
            }
            Prepared::Shed(action) => return Ok(action),
        };
        let sent = SentCall {
            // The rows this send was decided from: the record need not read them again.
            known: Some(head.clone()),
            ..ready.record.sent.clone()
        };
        let recorded = self.apply_sent(ready.record.input.clone(), &sent).await?;
        if recorded.decision != DecisionKind::Applied {
            return Ok(Action::Waiting {
                reason: "another caller recorded it as sent and is sending it",
            });
        }
        // The answer is decided from the rows the record left.
        let answered = self.send_first(connector, own, *ready, recorded.after);
        Ok(answered.await?.action)
    }

    /// A first send whose request cannot leave the host: the attempt ends
    /// CANCELED without money, and the order stays open for a new attempt.
    pub(crate) async fn first_not_sent(
        &self,
        head: &AttemptHead,
        connector: &Connector,
        trigger: Trigger,
        not_sent: NotSent,
    ) -> Result<Action, OrchestratorError> {
        let attempt = &head.attempt;
        let event = PaymentEvent {
            attempt_reference: Some(attempt.reference.clone()),
            raw_status: "not_sent".into(),
            failure: Some(not_sent_failure(&not_sent)),
            ..PaymentEvent::new(EventKind::PaymentCanceled, EvidenceSource::SyncResponse)
        };
        let provenance = Self::provenance(connector, trigger);
        self.apply_host_event(
            EventTarget::Attempt(attempt.reference.clone()),
            event,
            &provenance,
            None,
        )
        .await?;
        let operation = match attempt.capture_mode {
            CaptureMode::Automatic => Operation::Sale,
            CaptureMode::Manual => Operation::Authorize,
        };
        self.watch_canary(connector, operation, crate::releases::FirstSend::Error)
            .await;
        Ok(not_sent.into())
    }

    async fn advance_capture(
        &self,
        id: &str,
        trigger: Trigger,
    ) -> Result<Advanced, OrchestratorError> {
        let capture = self.store().get_capture(id).await?;
        let span = tracing::info_span!("advance", payment_id = %capture.payment_id,
            capture_id = %capture.id, attempt_id = %capture.attempt_id,
            adapter = %capture.adapter, trigger = %trigger);
        async {
            let action = self.capture_step(&capture, trigger).await?;
            let after = self.store().get_capture(id).await?;
            tracing::info!(from = %capture.state, to = %after.state, ?action, "advanced capture");
            Ok(Advanced {
                target: Target::Capture(capture.id.clone()),
                payment_id: capture.payment_id.clone(),
                state_before: capture.state.to_string(),
                state_after: after.state.to_string(),
                action,
            })
        }
        .instrument(span)
        .await
    }

    async fn capture_step(
        &self,
        capture: &Capture,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        if capture.state.is_terminal() {
            return Ok(Action::Final);
        }
        if capture.state == CaptureState::Created && trigger == Trigger::Webhook {
            return Ok(Action::Waiting {
                reason: "not sent yet; a webhook never starts a capture",
            });
        }
        let attempt = self.store().get_attempt(&capture.attempt_id).await?;
        let order = self.store().get_payment(None, &capture.payment_id).await?;
        let connector = self.attempt_connector(&attempt).await?;
        let own = OwnAggregate::Capture {
            reference: capture.reference.clone(),
            mode: attempt.capture_mode,
        };
        let provenance = Self::provenance(&connector, trigger);
        match capture.state {
            CaptureState::Created => {
                self.send_capture(capture, &attempt, &order, &connector, &provenance)
                    .await
            }
            CaptureState::Processing
                if !self.may_query(
                    trigger,
                    capture.last_psp_call_at.or(Some(capture.updated_at)),
                    &connector,
                ) =>
            {
                Ok(Action::Waiting {
                    reason: "a PSP call for it is still within its budget",
                })
            }
            _ => {
                self.query_capture(capture, &attempt, &order, &connector, &own, trigger)
                    .await
            }
        }
    }

    /// Send a reserved capture: recorded as sent through the door first; one
    /// the host refuses to send definitively did not happen, so its
    /// reservation is released (a capture has no CANCELED state).
    async fn send_capture(
        &self,
        capture: &Capture,
        attempt: &PaymentAttempt,
        order: &PaymentOrder,
        connector: &Connector,
        provenance: &Provenance,
    ) -> Result<Action, OrchestratorError> {
        let own = OwnAggregate::Capture {
            reference: capture.reference.clone(),
            mode: attempt.capture_mode,
        };
        let spec = action_spec(
            Operation::Capture,
            attempt,
            order,
            &capture.reference,
            capture.amount,
            None,
        );
        let request = match call::prepare(connector, &spec).await? {
            Ok(request) => request,
            Err(not_sent) => {
                // The capture definitively did not happen: release its
                // reservation. (A capture has no CANCELED state.)
                let event = PaymentEvent {
                    attempt_reference: Some(attempt.reference.clone()),
                    action_reference: Some(capture.reference.clone()),
                    raw_status: "not_sent".into(),
                    failure: Some(Failure {
                        category: FailureCategory::Declined,
                        ..not_sent_failure(&not_sent)
                    }),
                    ..PaymentEvent::new(EventKind::CaptureFailed, EvidenceSource::SyncResponse)
                };
                self.apply_host_event(
                    EventTarget::Capture(capture.reference.clone()),
                    event,
                    provenance,
                    None,
                )
                .await?;
                return Ok(not_sent.into());
            }
        };
        let outgoing = Outgoing {
            target: EventTarget::Capture(capture.reference.clone()),
            sent_kind: EventKind::AttemptSubmitted,
            attempt_reference: &attempt.reference,
            action_reference: &capture.reference,
        };
        self.record_then_send(outgoing, connector, &own, &spec, &request, provenance)
            .await
    }

    async fn advance_refund(
        &self,
        id: &str,
        trigger: Trigger,
    ) -> Result<Advanced, OrchestratorError> {
        let refund = self.store().get_refund(id).await?;
        let span = tracing::info_span!("advance", payment_id = %refund.payment_id,
            refund_id = %refund.id, attempt_id = %refund.attempt_id,
            adapter = %refund.adapter, trigger = %trigger);
        async {
            let action = self.refund_step(&refund, trigger).await?;
            let after = self.store().get_refund(id).await?;
            tracing::info!(from = %refund.state, to = %after.state, ?action, "advanced refund");
            Ok(Advanced {
                target: Target::Refund(refund.id.clone()),
                payment_id: refund.payment_id.clone(),
                state_before: refund.state.to_string(),
                state_after: after.state.to_string(),
                action,
            })
        }
        .instrument(span)
        .await
    }

    async fn refund_step(
        &self,
        refund: &Refund,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        if refund.state.is_terminal() {
            return Ok(Action::Final);
        }
        if refund.state == RefundState::Created && trigger == Trigger::Webhook {
            return Ok(Action::Waiting {
                reason: "not sent yet; a webhook never starts a refund",
            });
        }
        let attempt = self.store().get_attempt(&refund.attempt_id).await?;
        let order = self.store().get_payment(None, &refund.payment_id).await?;
        let connector = self.attempt_connector(&attempt).await?;
        let own = OwnAggregate::Refund {
            reference: refund.reference.clone(),
            mode: attempt.capture_mode,
        };
        let provenance = Self::provenance(&connector, trigger);
        match refund.state {
            RefundState::Created if attempt.psp_reference.is_none() => {
                self.hold_refund_for_review(refund, &attempt, &provenance)
                    .await
            }
            RefundState::Created => {
                let spec = action_spec(
                    Operation::Refund,
                    &attempt,
                    &order,
                    &refund.reference,
                    refund.amount,
                    None,
                );
                let request = match call::prepare(&connector, &spec).await? {
                    Ok(request) => request,
                    Err(not_sent) => {
                        self.store()
                            .cancel_unsent_refund(&refund.reference, &provenance)
                            .await?;
                        return Ok(not_sent.into());
                    }
                };
                let outgoing = Outgoing {
                    target: EventTarget::Refund(refund.reference.clone()),
                    sent_kind: EventKind::RefundProcessing,
                    attempt_reference: &attempt.reference,
                    action_reference: &refund.reference,
                };
                self.record_then_send(outgoing, &connector, &own, &spec, &request, &provenance)
                    .await
            }
            RefundState::Processing
                if !self.may_query(
                    trigger,
                    refund.last_psp_call_at.or(Some(refund.updated_at)),
                    &connector,
                ) =>
            {
                Ok(Action::Waiting {
                    reason: "a PSP call for it is still within its budget",
                })
            }
            _ => {
                let spec = action_spec(
                    Operation::QueryRefund,
                    &attempt,
                    &order,
                    &refund.reference,
                    refund.amount,
                    refund.psp_reference.clone(),
                );
                self.query_refund(refund, &attempt, &order, &connector, &spec, trigger)
                    .await
            }
        }
    }

    /// A refund of a payment whose success carries no PSP payment reference
    /// (an operator's resolution without that evidence) cannot be sent: every
    /// adapter needs the reference, and a refusal would cancel the refund
    /// silently. It stays CREATED with its amount reserved, and the payment
    /// waits in manual review with the reason (flagged once, through the door).
    async fn hold_refund_for_review(
        &self,
        refund: &Refund,
        attempt: &PaymentAttempt,
        provenance: &Provenance,
    ) -> Result<Action, OrchestratorError> {
        let reason = format!(
            "refund {} of {} cannot be sent: the payment's success (attempt {}) carries no \
             PSP payment reference; an operator must settle the refund with the PSP and resolve it",
            refund.id, refund.amount.amount_minor, attempt.id
        );
        self.store()
            .flag_manual_review(PendingKind::Refund, &refund.id, &reason, provenance)
            .await?;
        tracing::warn!(payment_id = %refund.payment_id, refund_id = %refund.id,
            attempt_id = %attempt.id, "refund held for manual review: no PSP payment reference");
        Ok(Action::Waiting {
            reason: "the payment's success carries no PSP reference; in manual review",
        })
    }

    /// Whether a non-UNKNOWN, non-final aggregate may be queried now. The API
    /// leaves alone what another caller's call is still handling (its answer
    /// is on the way): `last_call_at` is the last PSP call, or the row's last
    /// change when none is noted yet (SUBMITTED is written just before the
    /// call). The scanner and operators decide for themselves, and a webhook
    /// is evidence enough on its own.
    fn may_query(
        &self,
        trigger: Trigger,
        last_call_at: Option<i64>,
        connector: &Connector,
    ) -> bool {
        match trigger {
            Trigger::Scanner | Trigger::Operator => true,
            Trigger::Webhook => false,
            Trigger::Api => {
                let window =
                    millis(connector.budget.timeout) + millis(self.config().in_flight_grace);
                last_call_at.is_none_or(|at| self.now_ms().saturating_sub(at) >= window)
            }
        }
    }

    /// Record "sent" through the door before the call, with the time of the
    /// call and, for an attempt's first send, the adapter version to pin
    /// (`sent`). The decision when this caller applied it (and so owns the
    /// send); none when another caller did.
    pub(crate) async fn record_sent(
        &self,
        target: EventTarget,
        event: PaymentEvent,
        provenance: &Provenance,
        connector: &Connector,
        sent: SentCall,
    ) -> Result<Option<sluice_store::Applied>, OrchestratorError> {
        let input = self.sent_input(target, event, provenance, connector);
        let applied = self.apply_sent(input, &sent).await?;
        Ok((applied.decision == DecisionKind::Applied).then_some(applied))
    }

    /// The record of a call about to be sent, with the scanner's next look:
    /// if the host dies mid-call, the scanner finds the row once the call's
    /// budget (and a little more) has passed, and queries.
    pub(crate) fn sent_input(
        &self,
        target: EventTarget,
        event: PaymentEvent,
        provenance: &Provenance,
        connector: &Connector,
    ) -> ApplyEvent {
        let window = millis(connector.budget.timeout) + millis(self.config().in_flight_grace);
        ApplyEvent {
            next_retry_time: Some(self.now_ms().saturating_add(window)),
            ..ApplyEvent::new(target, event, provenance.clone())
        }
    }

    pub(crate) async fn apply_host_event(
        &self,
        target: EventTarget,
        event: PaymentEvent,
        provenance: &Provenance,
        next_retry_time: Option<i64>,
    ) -> Result<DecisionKind, OrchestratorError> {
        let applied = self
            .apply(ApplyEvent {
                next_retry_time,
                ..ApplyEvent::new(target, event, provenance.clone())
            })
            .await?;
        Ok(applied.decision)
    }

    /// Record a capture or refund as sent through the door, then send it.
    /// Only the caller whose record was applied sends; a concurrent caller
    /// stands back (the module docs).
    async fn record_then_send(
        &self,
        outgoing: Outgoing<'_>,
        connector: &Connector,
        own: &OwnAggregate,
        spec: &OperationSpec,
        request: &crate::transport::CheckedRequest,
        provenance: &Provenance,
    ) -> Result<Action, OrchestratorError> {
        let slot = match self.call_slot(connector, spec.operation).await {
            Ok(slot) => slot,
            Err(shed) => return Ok(Action::shed(spec.operation, &shed)),
        };
        let sent = PaymentEvent {
            attempt_reference: Some(outgoing.attempt_reference.to_owned()),
            action_reference: Some(outgoing.action_reference.to_owned()),
            raw_status: "submitted".into(),
            ..PaymentEvent::new(outgoing.sent_kind, EvidenceSource::SyncResponse)
        };
        let recorded = self
            .record_sent(
                outgoing.target,
                sent,
                provenance,
                connector,
                SentCall::default(),
            )
            .await?;
        if recorded.is_none() {
            return Ok(Action::Waiting {
                reason: "another caller recorded it as sent and is sending it",
            });
        }
        self.send(connector, own, (spec, request, provenance), slot, None)
            .await
    }

    /// Send the `call` and put its answer through the door, starting from the
    /// `known` rows of the attempt it is about when the caller has them
    /// (the record of the send's [`sluice_store::Applied::after`]).
    pub(crate) async fn send(
        &self,
        connector: &Connector,
        own: &OwnAggregate,
        call: Call<'_>,
        slot: crate::call_slots::CallSlot,
        known: Option<AttemptHead>,
    ) -> Result<Action, OrchestratorError> {
        let (action, _) = self
            .send_learning(connector, own, call, slot, known)
            .await?;
        Ok(action)
    }

    /// [`Self::send`], also telling what the answer showed.
    pub(crate) async fn send_learning(
        &self,
        connector: &Connector,
        own: &OwnAggregate,
        call: Call<'_>,
        slot: crate::call_slots::CallSlot,
        known: Option<AttemptHead>,
    ) -> Result<(Action, Learned), OrchestratorError> {
        let (action, learned, _) = self
            .send_deciding(connector, own, call, slot, known)
            .await?;
        Ok((action, learned))
    }

    /// [`Self::send_learning`], also with the door's decisions about the
    /// answer, in the order they were taken.
    pub(crate) async fn send_deciding(
        &self,
        connector: &Connector,
        own: &OwnAggregate,
        (spec, request, provenance): Call<'_>,
        slot: crate::call_slots::CallSlot,
        known: Option<AttemptHead>,
    ) -> Result<(Action, Learned, Vec<Applied>), OrchestratorError> {
        let outcome = self.perform(connector, spec, request, slot).await;
        let learned = Learned::from(&outcome);
        let unknown = outcome.unknown_code().map(str::to_owned);
        let applied = self
            .apply_outcome(connector, own, spec, outcome, provenance, known)
            .await?;
        let action = Action::Sent {
            operation: spec.operation,
            unknown,
            decisions: DecisionTally::of(&applied),
        };
        Ok((action, learned, applied))
    }

    pub(crate) async fn query(
        &self,
        kind: PendingKind,
        id: &str,
        connector: &Connector,
        own: &OwnAggregate,
        spec: &OperationSpec,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        let (action, _) = self
            .query_learning(kind, id, connector, own, spec, trigger)
            .await?;
        Ok(action)
    }

    /// [`Self::query`], also telling what the answer showed.
    pub(crate) async fn query_learning(
        &self,
        kind: PendingKind,
        id: &str,
        connector: &Connector,
        own: &OwnAggregate,
        spec: &OperationSpec,
        trigger: Trigger,
    ) -> Result<(Action, Learned), OrchestratorError> {
        let request = match call::prepare(connector, spec).await? {
            Ok(request) => request,
            Err(not_sent) => return Ok((not_sent.into(), Learned::default())),
        };
        let slot = match self.call_slot(connector, spec.operation).await {
            Ok(slot) => slot,
            Err(shed) => return Ok((Action::shed(spec.operation, &shed), Learned::default())),
        };
        self.store().note_psp_call(kind, id).await?;
        let provenance = Self::provenance(connector, trigger);
        let outcome = self.perform(connector, spec, &request, slot).await;
        let learned = Learned::from(&outcome);
        let unknown = outcome.unknown_code().map(str::to_owned);
        let applied = self
            .apply_outcome(connector, own, spec, outcome, &provenance, None)
            .await?;
        let action = Action::Queried {
            operation: spec.operation,
            unknown,
            decisions: DecisionTally::of(&applied),
        };
        Ok((action, learned))
    }
}

/// One PSP call about to be sent: what it does, its checked request and on
/// whose behalf.
pub(crate) type Call<'a> = (
    &'a OperationSpec,
    &'a crate::transport::CheckedRequest,
    &'a Provenance,
);

/// What one PSP answer showed, beyond the events the door applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Learned {
    /// A query answer proving the PSP has no such payment.
    pub absent: bool,
    /// A query answer showing the payment still only authorized (no capture
    /// of it completed).
    pub uncaptured: bool,
    /// The PSP's payment id the answer named.
    pub psp_payment_reference: Option<String>,
}

impl From<&call::CallOutcome> for Learned {
    fn from(outcome: &call::CallOutcome) -> Self {
        Learned {
            absent: outcome.proves_absence(),
            uncaptured: outcome.shows_uncaptured(),
            psp_payment_reference: outcome.psp_payment_reference(),
        }
    }
}

impl Action {
    pub(crate) fn shed(operation: Operation, shed: &crate::Shed) -> Action {
        Action::Shed {
            operation,
            reason: shed.to_string(),
        }
    }
}

impl From<NotSent> for Action {
    fn from(not_sent: NotSent) -> Self {
        Action::NotSent {
            code: not_sent.code,
            message: not_sent.message,
        }
    }
}

fn not_sent_failure(not_sent: &NotSent) -> Failure {
    Failure {
        category: FailureCategory::Configuration,
        code: not_sent.code.clone(),
        message: not_sent.message.clone(),
    }
}

/// The context of a payment operation (authorize, sale, void, query-payment),
/// from persisted facts only.
/// A capture or refund about to be sent: its row, its door target and the
/// event that records it as sent before the call.
struct Outgoing<'a> {
    target: EventTarget,
    sent_kind: EventKind,
    attempt_reference: &'a str,
    action_reference: &'a str,
}

pub(crate) fn attempt_spec(
    operation: Operation,
    attempt: &PaymentAttempt,
    order: &PaymentOrder,
) -> OperationSpec {
    OperationSpec {
        operation,
        capture_mode: attempt.capture_mode,
        attempt_reference: attempt.reference.clone(),
        action_reference: None,
        psp_payment_reference: attempt.psp_reference.clone(),
        psp_refund_reference: None,
        amount: attempt.amount,
        payment_method_token: attempt.payment_method_token.clone(),
        return_url: order.return_url.clone(),
        merchant_order_no: order.merchant_order_no.clone(),
        metadata: metadata_pairs(&order.metadata),
        payment_method_type: attempt.payment_method_type.clone(),
    }
}

/// The context of a capture or refund operation (or its query).
pub(crate) fn action_spec(
    operation: Operation,
    attempt: &PaymentAttempt,
    order: &PaymentOrder,
    action_reference: &str,
    amount: sluice_core::Money,
    psp_refund_reference: Option<String>,
) -> OperationSpec {
    OperationSpec {
        action_reference: Some(action_reference.to_owned()),
        psp_refund_reference,
        amount,
        ..attempt_spec(operation, attempt, order)
    }
}
