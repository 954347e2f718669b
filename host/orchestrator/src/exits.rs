//! Exits of the open attempt states that need more than one query (issue 11
//! §3–§4): a void recorded as sent before the call, the follow-up of a void
//! whose outcome is not known, the expiry of an authorization, and the
//! re-send of an original request the PSP proved it never received.
//!
//! Every decision here is the pure core's (`sluice_core::decide_resend`,
//! the matrix row of `VOID_SUBMITTED`); this module only performs them.

use sluice_core::{
    decide_resend, AttemptState, CaptureMode, EventKind, EvidenceSource, PaymentEvent,
    PendingState, Resend, ResendCheck,
};
use sluice_store::{
    Capture, EventTarget, PaymentAttempt, PaymentOrder, PendingKind, Refund, SentCall,
};

use crate::advance::{action_spec, attempt_spec, Action, Learned};
use crate::call::{self, Connector};
use crate::convert::{Operation, OperationSpec};
use crate::error::OrchestratorError;
use crate::orchestrator::{Orchestrator, OwnAggregate, Trigger};

/// Why a void is sent; recorded verbatim as the `raw_status` of the
/// `VOID_SUBMITTED` history row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoidReason {
    /// `POST /v1/payments/{id}/void`.
    Merchant,
    /// The authorization's validity ended and the PSP still held the funds.
    AuthorizationExpired,
}

impl VoidReason {
    fn raw_status(self) -> &'static str {
        match self {
            VoidReason::Merchant => "void_requested_by_merchant",
            VoidReason::AuthorizationExpired => "void_after_authorization_expired",
        }
    }
}

impl Orchestrator {
    /// Void an AUTHORIZED attempt: the void is recorded as sent through the
    /// door (`VOID_SUBMITTED`, the attempt stays AUTHORIZED), then sent. Only
    /// the caller whose record was applied sends; a crash after the record
    /// leaves the attempt in the scan set, and recovery queries it and sends
    /// the same void again while the PSP still holds the funds.
    pub(crate) async fn void_authorization(
        &self,
        attempt: &PaymentAttempt,
        order: &PaymentOrder,
        connector: &Connector,
        trigger: Trigger,
        reason: VoidReason,
    ) -> Result<Action, OrchestratorError> {
        let spec = attempt_spec(Operation::Void, attempt, order);
        let request = match call::prepare(connector, &spec).await? {
            Ok(request) => request,
            Err(not_sent) => return Ok(not_sent.into()),
        };
        let slot = match self.call_slot(connector, spec.operation).await {
            Ok(slot) => slot,
            Err(shed) => return Ok(Action::shed(spec.operation, &shed)),
        };
        let provenance = Self::provenance(connector, trigger);
        let recorded = PaymentEvent {
            attempt_reference: Some(attempt.reference.clone()),
            psp_reference: attempt.psp_reference.clone(),
            raw_status: reason.raw_status().into(),
            ..PaymentEvent::new(EventKind::VoidSubmitted, EvidenceSource::SyncResponse)
        };
        let target = EventTarget::Attempt(attempt.reference.clone());
        let recorded = self
            .record_sent(
                target,
                recorded,
                &provenance,
                connector,
                SentCall::default(),
            )
            .await?;
        if recorded.is_none() {
            return Ok(Action::Waiting {
                reason: "a void was already recorded as sent; recovery follows it",
            });
        }
        let call = (&spec, &request, &provenance);
        self.send(connector, &own_attempt(attempt), call, slot, None)
            .await
    }

    /// Recovery of an AUTHORIZED attempt whose void was recorded as sent:
    /// query; if the PSP still holds the funds, send the same void again (same
    /// reference, same idempotency key). The PSP's PAYMENT_CANCELED closes
    /// the attempt and the order through the door.
    pub(crate) async fn follow_void(
        &self,
        attempt: &PaymentAttempt,
        order: &PaymentOrder,
        connector: &Connector,
        own: &OwnAggregate,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        let spec = attempt_spec(Operation::QueryPayment, attempt, order);
        let queried = self
            .query(
                PendingKind::Attempt,
                &attempt.id,
                connector,
                own,
                &spec,
                trigger,
            )
            .await?;
        let after = self.store().get_attempt(&attempt.id).await?;
        if after.state != AttemptState::Authorized {
            return Ok(queried);
        }
        let spec = attempt_spec(Operation::Void, &after, order);
        let request = match call::prepare(connector, &spec).await? {
            Ok(request) => request,
            Err(not_sent) => return Ok(not_sent.into()),
        };
        let slot = match self.call_slot(connector, spec.operation).await {
            Ok(slot) => slot,
            Err(shed) => return Ok(Action::shed(spec.operation, &shed)),
        };
        tracing::info!(payment_id = %attempt.payment_id, attempt_id = %attempt.id,
            "the PSP still holds an authorization whose void was recorded as sent: sending the same void again");
        self.store()
            .note_psp_call(PendingKind::Attempt, &attempt.id)
            .await?;
        let provenance = Self::provenance(connector, trigger);
        self.send(connector, own, (&spec, &request, &provenance), slot, None)
            .await
    }

    /// The recovery scanner's authorization expiry: query once more (the PSP
    /// may have expired the authorization itself, or it was captured), and
    /// void what the PSP still holds (recorded as sent first). Returns the
    /// attempt's state afterwards; an attempt that is not AUTHORIZED, or whose
    /// void is already recorded, is only queried (or left alone).
    pub async fn expire_authorization(
        &self,
        attempt_id: &str,
    ) -> Result<AttemptState, OrchestratorError> {
        let attempt = self.store().get_attempt(attempt_id).await?;
        if attempt.state != AttemptState::Authorized {
            return Ok(attempt.state);
        }
        let order = self.store().get_payment(None, &attempt.payment_id).await?;
        let connector = self.attempt_connector(&attempt).await?;
        let own = own_attempt(&attempt);
        if attempt.void_requested_at.is_some() {
            self.follow_void(&attempt, &order, &connector, &own, Trigger::Scanner)
                .await?;
            return Ok(self.store().get_attempt(attempt_id).await?.state);
        }
        let spec = attempt_spec(Operation::QueryPayment, &attempt, &order);
        self.query(
            PendingKind::Attempt,
            &attempt.id,
            &connector,
            &own,
            &spec,
            Trigger::Scanner,
        )
        .await?;
        let after = self.store().get_attempt(attempt_id).await?;
        if after.state == AttemptState::Authorized {
            tracing::warn!(payment_id = %attempt.payment_id, attempt_id,
                adapter = %attempt.adapter,
                "authorization past its validity and still held at the PSP: voiding it");
            self.void_authorization(
                &after,
                &order,
                &connector,
                Trigger::Scanner,
                VoidReason::AuthorizationExpired,
            )
            .await?;
        }
        Ok(self.store().get_attempt(attempt_id).await?.state)
    }

    /// Query an attempt with its original reference; when the answer proves
    /// the PSP has no such payment and the core allows it (seed 000 §6: the
    /// protocol makes a retry safe, the same idempotency key within the PSP's
    /// retention), re-send the original request with the same reference.
    pub(crate) async fn query_attempt(
        &self,
        attempt: &PaymentAttempt,
        order: &PaymentOrder,
        connector: &Connector,
        own: &OwnAggregate,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        let spec = attempt_spec(Operation::QueryPayment, attempt, order);
        let operation = match attempt.capture_mode {
            CaptureMode::Automatic => Operation::Sale,
            CaptureMode::Manual => Operation::Authorize,
        };
        let resend = attempt_spec(operation, attempt, order);
        let item = Absent {
            kind: PendingKind::Attempt,
            id: &attempt.id,
            created_at: attempt.created_at,
            query: &spec,
            resend: &resend,
        };
        self.query_or_resend(item, |l| l.absent, connector, own, trigger)
            .await
    }

    /// Query a refund with its original reference (`spec`); when the answer
    /// proves the PSP has no such refund, re-send it like an attempt
    /// ([`Self::resend_if_safe`]).
    pub(crate) async fn query_refund(
        &self,
        refund: &Refund,
        attempt: &PaymentAttempt,
        order: &PaymentOrder,
        connector: &Connector,
        spec: &OperationSpec,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        let own = &OwnAggregate::Refund {
            reference: refund.reference.clone(),
            mode: attempt.capture_mode,
        };
        let resend = action_spec(
            Operation::Refund,
            attempt,
            order,
            &refund.reference,
            refund.amount,
            None,
        );
        let item = Absent {
            kind: PendingKind::Refund,
            id: &refund.id,
            created_at: refund.created_at,
            query: spec,
            resend: &resend,
        };
        self.query_or_resend(item, |l| l.absent, connector, own, trigger)
            .await
    }

    /// Query a capture (the contract has no capture query: it asks about the
    /// payment, whose amount is the payment's); when the answer shows the
    /// payment still only authorized, no capture of it completed, so re-send
    /// the capture with its own reference like an attempt
    /// ([`Self::resend_if_safe`]): a PSP that did receive it answers from the
    /// key, one that did not captures once.
    pub(crate) async fn query_capture(
        &self,
        capture: &Capture,
        attempt: &PaymentAttempt,
        order: &PaymentOrder,
        connector: &Connector,
        own: &OwnAggregate,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        let spec = action_spec(
            Operation::QueryPayment,
            attempt,
            order,
            &capture.reference,
            attempt.amount,
            None,
        );
        let resend = action_spec(
            Operation::Capture,
            attempt,
            order,
            &capture.reference,
            capture.amount,
            None,
        );
        let item = Absent {
            kind: PendingKind::Capture,
            id: &capture.id,
            created_at: capture.created_at,
            query: &spec,
            resend: &resend,
        };
        self.query_or_resend(item, |l| l.uncaptured, connector, own, trigger)
            .await
    }

    /// Query `item` with its original reference; when the answer shows what
    /// `proves_absent` asks for, hand it to [`Self::resend_if_safe`].
    async fn query_or_resend(
        &self,
        item: Absent<'_>,
        proves_absent: impl Fn(&Learned) -> bool,
        connector: &Connector,
        own: &OwnAggregate,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        let (queried, learned) = self
            .query_learning(item.kind, item.id, connector, own, item.query, trigger)
            .await?;
        if !proves_absent(&learned) {
            return Ok(queried);
        }
        self.resend_if_safe(item, queried, connector, own, trigger)
            .await
    }

    /// After a query proved the PSP has no such payment, refund or capture: re-send
    /// the original request (same reference, same idempotency key) if the core
    /// allows it. Its answer goes through the door like any sync answer (an
    /// UNKNOWN item accepts only verified evidence, so it may only be kept as
    /// history); then the item is queried again at once, by the PSP id the
    /// answer named when there is one, which is verified evidence.
    pub(crate) async fn resend_if_safe(
        &self,
        absent: Absent<'_>,
        queried: Action,
        connector: &Connector,
        own: &OwnAggregate,
        trigger: Trigger,
    ) -> Result<Action, OrchestratorError> {
        if !matches!(trigger, Trigger::Scanner | Trigger::Operator) {
            return Ok(queried);
        }
        let check = ResendCheck {
            state: self.pending_state(absent.kind, absent.id).await?,
            query_proved_absent: true,
            created_at_ms: absent.created_at,
            now_ms: self.now_ms(),
            resend_window_ms: connector.recovery.resend_window_ms(),
        };
        if let Resend::Keep { reason } = decide_resend(&check) {
            tracing::info!(
                id = absent.id,
                reason,
                "the PSP has no such object; not re-sent"
            );
            return Ok(queried);
        }
        let request = match call::prepare(connector, absent.resend).await? {
            Ok(request) => request,
            Err(not_sent) => return Ok(not_sent.into()),
        };
        let slot = match self.call_slot(connector, absent.resend.operation).await {
            Ok(slot) => slot,
            Err(shed) => return Ok(Action::shed(absent.resend.operation, &shed)),
        };
        tracing::warn!(id = absent.id, operation = ?absent.resend.operation,
            "the PSP has no such object: re-sending the original request with the same idempotency key");
        self.store().note_psp_call(absent.kind, absent.id).await?;
        let provenance = Self::provenance(connector, trigger);
        let (sent, learned) = self
            .send_learning(
                connector,
                own,
                (absent.resend, &request, &provenance),
                slot,
                None,
            )
            .await?;
        let Action::Sent {
            unknown, decisions, ..
        } = sent
        else {
            return Ok(sent);
        };
        if !self
            .pending_state(absent.kind, absent.id)
            .await?
            .is_terminal()
        {
            let mut query = absent.query.clone();
            if absent.kind == PendingKind::Attempt && query.psp_payment_reference.is_none() {
                query.psp_payment_reference = learned.psp_payment_reference;
            }
            self.query(absent.kind, absent.id, connector, own, &query, trigger)
                .await?;
        }
        Ok(Action::Resent {
            operation: absent.resend.operation,
            unknown,
            decisions,
        })
    }

    async fn pending_state(
        &self,
        kind: PendingKind,
        id: &str,
    ) -> Result<PendingState, OrchestratorError> {
        Ok(match kind {
            PendingKind::Attempt => {
                PendingState::Attempt(self.store().get_attempt(id).await?.state)
            }
            PendingKind::Refund => PendingState::Refund(self.store().get_refund(id).await?.state),
            PendingKind::Capture => {
                PendingState::Capture(self.store().get_capture(id).await?.state)
            }
        })
    }
}

/// An item whose query proved the PSP has no such object, with the request
/// that would re-send it and the query that follows.
pub(crate) struct Absent<'a> {
    pub kind: PendingKind,
    pub id: &'a str,
    /// When the item (and its reference) was created.
    pub created_at: i64,
    pub query: &'a OperationSpec,
    pub resend: &'a OperationSpec,
}

fn own_attempt(attempt: &PaymentAttempt) -> OwnAggregate {
    OwnAggregate::Attempt {
        reference: attempt.reference.clone(),
        mode: attempt.capture_mode,
    }
}
