//! An attempt's first send made ready before its record: the request built
//! by the attempt's adapter and a PSP call slot held. `submit_attempt`
//! then records it through the door and sends; a create with `confirm`
//! writes the record with the payment itself
//! ([`sluice_store::Store::create_payment_with_attempt`] with a
//! [`FirstSend`]), one synchronous commit and one round trip fewer on the
//! request path, and sends from the rows that commit left.

use sluice_core::{CaptureMode, EventKind, EvidenceSource, PaymentEvent};
use sluice_store::{
    AdapterPin, Applied, AttemptHead, DecisionKind, EventTarget, FirstSend, Fulfillment,
    PaymentDetails, Provenance, SentCall,
};

use crate::advance::{attempt_spec, Action};
use crate::call::{self, Connector, NotSent};
use crate::call_slots::CallSlot;
use crate::convert::{Operation, OperationSpec};
use crate::error::OrchestratorError;
use crate::orchestrator::{Orchestrator, OwnAggregate, Trigger};
use crate::transport::CheckedRequest;

/// A first send whose request is built and whose call slot is held, with
/// the record to write before it leaves.
pub(crate) struct Ready {
    spec: OperationSpec,
    request: CheckedRequest,
    slot: CallSlot,
    provenance: Provenance,
    pub record: FirstSend,
}

/// How making a first send ready went.
pub(crate) enum Prepared {
    Ready(Box<Ready>),
    /// The adapter or the host refused the request: it cannot leave.
    NotSent(NotSent),
    /// No call slot came free in time: nothing is recorded or sent.
    Shed(Action),
}

impl Orchestrator {
    /// Build the first send's request from `head` and take its call slot,
    /// the slot before any record: a call shed here never left the host and
    /// the attempt stays CREATED, never SUBMITTED without a send.
    pub(crate) async fn prepare_first_send(
        &self,
        head: &AttemptHead,
        connector: &Connector,
        trigger: Trigger,
    ) -> Result<Prepared, OrchestratorError> {
        let (attempt, order) = (&head.attempt, &head.order);
        let operation = match attempt.capture_mode {
            CaptureMode::Automatic => Operation::Sale,
            CaptureMode::Manual => Operation::Authorize,
        };
        let spec = attempt_spec(operation, attempt, order);
        let request = match call::prepare(connector, &spec).await? {
            Ok(request) => request,
            Err(not_sent) => return Ok(Prepared::NotSent(not_sent)),
        };
        let slot = match self.call_slot(connector, spec.operation).await {
            Ok(slot) => slot,
            Err(shed) => return Ok(Prepared::Shed(Action::shed(spec.operation, &shed))),
        };
        let provenance = Self::provenance(connector, trigger);
        let submitted = PaymentEvent {
            attempt_reference: Some(attempt.reference.clone()),
            raw_status: "submitted".into(),
            ..PaymentEvent::new(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse)
        };
        let target = EventTarget::Attempt(attempt.reference.clone());
        // The version that builds the request is pinned with the record (a
        // pin already there is kept).
        let identity = connector.adapter.identity();
        let pin = AdapterPin {
            version: identity.version.clone(),
            digest: identity.digest.clone(),
        };
        let record = FirstSend {
            input: self.sent_input(target, submitted, &provenance, connector),
            sent: SentCall {
                pin: Some(pin),
                known: None,
            },
        };
        Ok(Prepared::Ready(Box::new(Ready {
            spec,
            request,
            slot,
            provenance,
            record,
        })))
    }

    /// Send a first send whose record was applied, its answer decided from
    /// `after`, the rows that record left (those of the payment's create).
    pub(crate) async fn send_first(
        &self,
        connector: &Connector,
        own: &OwnAggregate,
        ready: Ready,
        after: Option<AttemptHead>,
    ) -> Result<Answered, OrchestratorError> {
        self.admit_new_attempt(connector).await;
        let Ready {
            spec,
            request,
            slot,
            provenance,
            ..
        } = ready;
        let created = after.clone();
        let call = (&spec, &request, &provenance);
        let (action, _, applied) = self
            .send_deciding(connector, own, call, slot, after)
            .await?;
        let payment = created.and_then(|created| whole_payment(&created, &applied));
        Ok(Answered { action, payment })
    }
}

/// What a first send's answer did and, when its decisions are all that
/// happened to the payment since its create, the payment as they left it:
/// the request's answer, without reading it again.
pub(crate) struct Answered {
    pub action: Action,
    pub payment: Option<PaymentDetails>,
}

/// The payment as the decisions about a first send's answer left it, when
/// they are everything that happened to it since `created`, the rows its
/// create (with the record of that send) wrote: each decision applied and
/// moving the payment's version by exactly one from the version before it.
/// Every change to a payment moves its version (its attempts, captures,
/// refunds, amounts and review flag), so no other change fits between them,
/// and a fresh payment has only that attempt and no capture or refund. A
/// payment with a fulfillment is never taken so: its fulfillment moves on a
/// version of its own.
fn whole_payment(created: &AttemptHead, applied: &[Applied]) -> Option<PaymentDetails> {
    let base = created.order.version;
    let fresh =
        created.attempt.attempt_no == 1 && created.order.fulfillment == Fulfillment::default();
    let consecutive = (applied.iter().zip(1_i64..)).all(|(a, n)| {
        a.decision == DecisionKind::Applied && Some(a.payment_version) == base.checked_add(n)
    });
    let last = applied.last()?.after.as_ref()?;
    let same = last.attempt.id == created.attempt.id
        && Some(last.order.version) == base.checked_add(i64::try_from(applied.len()).ok()?);
    (fresh && consecutive && same).then(|| PaymentDetails {
        order: last.order.clone(),
        amounts: last.amounts,
        attempts: vec![last.attempt.clone()],
        captures: Vec::new(),
        refunds: Vec::new(),
    })
}
