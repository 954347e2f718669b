//! `decide_*`: snapshot + normalised event → decision. Pure.
//!
//! Every decision follows the same steps (seed 001 §3 `decide`):
//!
//! 1. normalise the event kind (a non-definitive failure is "unknown"; in
//!    automatic capture an authorization is only progress);
//! 2. refuse events for another aggregate or another reference;
//! 3. ignore a duplicate of the last accepted event (same PSP notification
//!    id, or the same PSP reference + kind + result);
//! 4. flag a PSP reference that differs from the recorded one;
//! 5. look the (state, kind, evidence) up in the matrix;
//! 6. for an `Apply`, fill in the amounts, check the amount movements against
//!    the payment's amounts, and derive the other aggregates' new states.

use crate::amounts::Amounts;
use crate::decision::{
    Aggregate, Cascade, Decision, Effect, IgnoreReason, OutboxEvent, ReconciliationReason,
    RejectReason,
};
use crate::event::{EventIdentity, EventKind, PaymentEvent};
use crate::matrix::{
    self, Fx, Miss, Outcome, Row, ATTEMPT_KINDS, ATTEMPT_MATRIX, CAPTURE_KINDS, CAPTURE_MATRIX,
    REFUND_KINDS, REFUND_MATRIX,
};
use crate::money::Money;
use crate::snapshot::{
    AttemptSnapshot, CaptureMode, CaptureSnapshot, OrderSnapshot, RefundSnapshot,
};
use crate::state::{AttemptState, CaptureState, OrderState, RefundState};

/// A state type the matrices can talk about.
pub trait Lifecycle: Copy + PartialEq + 'static {
    fn name(&self) -> &'static str;
}

impl Lifecycle for AttemptState {
    fn name(&self) -> &'static str {
        self.as_str()
    }
}

impl Lifecycle for RefundState {
    fn name(&self) -> &'static str {
        self.as_str()
    }
}

impl Lifecycle for CaptureState {
    fn name(&self) -> &'static str {
        self.as_str()
    }
}

impl Lifecycle for OrderState {
    fn name(&self) -> &'static str {
        self.as_str()
    }
}

/// Which aggregate an event is decided on.
///
/// Refund kinds go to the refund named by `action_reference` (or, failing
/// that, by `psp_reference`). In manual capture, capture results and any
/// progress that carries an `action_reference` go to that capture; a capture
/// result without one must be matched by the store to the capture in flight
/// (by PSP reference), never guessed. Everything else goes to the attempt.
pub fn route_event(event: &PaymentEvent, mode: CaptureMode) -> Aggregate {
    use EventKind as K;
    match event.kind {
        K::RefundProcessing | K::RefundSucceeded | K::RefundFailed | K::RefundUnknown => {
            Aggregate::Refund
        }
        K::PaymentCaptured | K::CaptureFailed if mode == CaptureMode::Manual => Aggregate::Capture,
        K::AttemptSubmitted | K::PaymentProcessing | K::ResultUnknown
            if mode == CaptureMode::Manual && event.action_reference.is_some() =>
        {
            Aggregate::Capture
        }
        _ => Aggregate::Attempt,
    }
}

/// The kind an attempt decides on, after normalisation.
pub fn attempt_event_kind(mode: CaptureMode, event: &PaymentEvent) -> EventKind {
    use EventKind as K;
    match (event.kind, mode) {
        (K::PaymentFailed, _) if !event.failure_is_definitive() => K::ResultUnknown,
        // The PSP captures by itself: holding the funds is only progress.
        (K::PaymentAuthorized, CaptureMode::Automatic) => K::PaymentProcessing,
        // A capture report without a capture record is the sale's own result.
        (K::PaymentCaptured, CaptureMode::Automatic) => K::PaymentSucceeded,
        (K::CaptureFailed, CaptureMode::Automatic) if event.failure_is_definitive() => {
            K::PaymentFailed
        }
        (K::CaptureFailed, CaptureMode::Automatic) => K::ResultUnknown,
        (kind, _) => kind,
    }
}

/// The kind a refund decides on, after normalisation.
pub fn refund_event_kind(event: &PaymentEvent) -> EventKind {
    match event.kind {
        EventKind::RefundFailed if !event.failure_is_definitive() => EventKind::RefundUnknown,
        kind => kind,
    }
}

/// The kind a capture decides on, after normalisation.
pub fn capture_event_kind(event: &PaymentEvent) -> EventKind {
    match event.kind {
        EventKind::CaptureFailed if !event.failure_is_definitive() => EventKind::ResultUnknown,
        kind => kind,
    }
}

/// What the common steps need to know about the aggregate decided about.
struct Subject<'a, S> {
    aggregate: Aggregate,
    state: S,
    reference: &'a str,
    psp_reference: Option<&'a str>,
    last_event: Option<&'a EventIdentity>,
    amount: Money,
}

impl<S> Subject<'_, S> {
    /// The PSP id by which the event names this subject. An attempt is the
    /// payment: capture, refund and chargeback reports name it in
    /// `psp_payment_reference` (their `psp_reference` is the capture, refund
    /// or dispute itself, e.g. Adyen's CAPTURE of an automatic sale).
    fn psp_reference_in<'e>(&self, event: &'e PaymentEvent) -> Option<&'e str> {
        match self.aggregate {
            Aggregate::Attempt => event
                .psp_payment_reference
                .as_deref()
                .or(event.psp_reference.as_deref()),
            _ => event.psp_reference.as_deref(),
        }
    }
}

/// The matrix row for the event, or the decision that ends it early.
fn screen<S: Lifecycle, T>(
    subject: &Subject<'_, S>,
    event: &PaymentEvent,
    event_reference: Option<&str>,
    kind: EventKind,
    kinds: &[EventKind],
    table: &'static [Row<S>],
) -> Result<&'static Row<S>, Decision<T>> {
    if !kinds.contains(&kind) {
        return Err(Decision::Reject(RejectReason::WrongAggregate {
            aggregate: subject.aggregate,
            kind: event.kind,
        }));
    }
    if let Some(got) = event_reference.filter(|got| *got != subject.reference) {
        return Err(Decision::Reject(RejectReason::ReferenceMismatch {
            aggregate: subject.aggregate,
            expected: subject.reference.to_owned(),
            got: got.to_owned(),
        }));
    }
    let identity = EventIdentity::of(event);
    if subject
        .last_event
        .is_some_and(|last| last.same_as(&identity))
    {
        return Err(Decision::Ignore(IgnoreReason::Duplicate));
    }
    if let (Some(expected), Some(got)) = (subject.psp_reference, subject.psp_reference_in(event)) {
        if expected != got {
            return Err(Decision::NeedsReconciliation(
                ReconciliationReason::PspReferenceMismatch {
                    expected: expected.to_owned(),
                    got: got.to_owned(),
                },
            ));
        }
    }
    matrix::resolve(table, subject.state, kind, event.evidence).map_err(|miss| {
        let from = subject.state.name();
        Decision::Reject(match miss {
            Miss::EvidenceNotAllowed => RejectReason::EvidenceNotAllowed {
                aggregate: subject.aggregate,
                from,
                kind,
                evidence: event.evidence,
            },
            Miss::NoRule => RejectReason::NoRule {
                aggregate: subject.aggregate,
                from,
                kind,
            },
        })
    })
}

/// The row's new state, or the decision for a row that names none.
fn target_state<S: Lifecycle, T>(
    subject: &Subject<'_, S>,
    kind: EventKind,
    outcome: Outcome<S>,
) -> Result<S, Decision<T>> {
    match outcome {
        Outcome::To(state) => Ok(state),
        Outcome::Duplicate => Err(Decision::Ignore(IgnoreReason::Duplicate)),
        Outcome::Stale => Err(Decision::Ignore(IgnoreReason::Stale)),
        Outcome::Conflict => Err(Decision::NeedsReconciliation(
            ReconciliationReason::Contradiction {
                aggregate: subject.aggregate,
                current: subject.state.name(),
                kind,
            },
        )),
    }
}

/// The effects of a row, with the subject's amount filled in, plus the
/// bookkeeping effects the event itself carries. Refuses a PSP-stated amount
/// that differs from the one money would move by.
fn effects_for<S: Lifecycle>(
    subject: &Subject<'_, S>,
    row: &Row<S>,
    requires_action: bool,
    event: &PaymentEvent,
    amounts: Amounts,
) -> Result<Vec<Effect>, ReconciliationReason> {
    let amount_minor = subject.amount.amount_minor;
    let mut effects: Vec<Effect> = row
        .effects
        .iter()
        .map(|fx| match *fx {
            Fx::RecordAuthorization => Effect::RecordAuthorization { amount_minor },
            Fx::RecordSale => Effect::RecordSale { amount_minor },
            Fx::VoidAuthorization => Effect::VoidAuthorization,
            Fx::SettleCapture => Effect::SettleCapture { amount_minor },
            Fx::ReleaseCapture => Effect::ReleaseCapture { amount_minor },
            Fx::SettleRefund => Effect::SettleRefund { amount_minor },
            Fx::ReleaseRefund => Effect::ReleaseRefund { amount_minor },
            Fx::ScheduleQuery => Effect::ScheduleQuery,
            Fx::RecordVoidRequest => Effect::RecordVoidRequest,
            Fx::Emit(outbox) => Effect::Emit(outbox),
        })
        .collect();
    let takes_money = row.effects.iter().any(|fx| {
        matches!(
            fx,
            Fx::RecordAuthorization | Fx::RecordSale | Fx::SettleCapture | Fx::SettleRefund
        )
    });
    if takes_money {
        if let Some(got) = event.amount.filter(|got| *got != subject.amount) {
            return Err(ReconciliationReason::AmountMismatch {
                expected: subject.amount,
                got,
            });
        }
    }
    amounts
        .apply_all(&effects)
        .map_err(ReconciliationReason::AmountInvariant)?;
    if subject.psp_reference.is_none() {
        if let Some(psp_reference) = subject.psp_reference_in(event) {
            effects.push(Effect::RecordPspReference {
                psp_reference: psp_reference.to_owned(),
            });
        }
    }
    if requires_action {
        if let Some(url) = &event.next_action_url {
            effects.push(Effect::RecordNextAction { url: url.clone() });
        }
    }
    Ok(effects)
}

/// Decide what an event does to a payment attempt (and, through it, to the order).
pub fn decide_attempt(
    order: &OrderSnapshot,
    attempt: &AttemptSnapshot,
    event: &PaymentEvent,
) -> Decision<AttemptState> {
    let subject = Subject {
        aggregate: Aggregate::Attempt,
        state: attempt.state,
        reference: &attempt.reference,
        psp_reference: attempt.psp_reference.as_deref(),
        last_event: attempt.last_event.as_ref(),
        amount: attempt.amount,
    };
    let kind = attempt_event_kind(attempt.capture_mode, event);
    let reference = event.attempt_reference.as_deref();
    let row = match screen(
        &subject,
        event,
        reference,
        kind,
        ATTEMPT_KINDS,
        ATTEMPT_MATRIX,
    ) {
        Ok(row) => row,
        Err(decision) => return decision,
    };
    let new_state = match target_state(&subject, kind, row.outcome) {
        Ok(state) => state,
        Err(decision) => return decision,
    };
    let requires_action = new_state == AttemptState::RequiresAction;
    let effects = match effects_for(&subject, row, requires_action, event, order.amounts) {
        Ok(effects) => effects,
        Err(reason) => return Decision::NeedsReconciliation(reason),
    };
    let order_state = match order_after(order.state, attempt.state, new_state) {
        Ok(order_state) => order_state,
        Err(reason) => return Decision::NeedsReconciliation(reason),
    };
    Decision::Apply {
        new_state,
        cascade: Cascade {
            attempt: None,
            order: order_state,
        },
        effects,
        rule: row.rule,
    }
}

/// Decide what an event does to a refund. A refund never moves the attempt
/// or the order: a succeeded refund does not make the payment a failure.
pub fn decide_refund(
    order: &OrderSnapshot,
    refund: &RefundSnapshot,
    event: &PaymentEvent,
) -> Decision<RefundState> {
    let subject = Subject {
        aggregate: Aggregate::Refund,
        state: refund.state,
        reference: &refund.reference,
        psp_reference: refund.psp_reference.as_deref(),
        last_event: refund.last_event.as_ref(),
        amount: refund.amount,
    };
    let kind = refund_event_kind(event);
    let reference = event.action_reference.as_deref();
    let row = match screen(
        &subject,
        event,
        reference,
        kind,
        REFUND_KINDS,
        REFUND_MATRIX,
    ) {
        Ok(row) => row,
        Err(decision) => return decision,
    };
    let new_state = match target_state(&subject, kind, row.outcome) {
        Ok(state) => state,
        Err(decision) => return decision,
    };
    match effects_for(&subject, row, false, event, order.amounts) {
        Ok(effects) => Decision::Apply {
            new_state,
            cascade: Cascade::default(),
            effects,
            rule: row.rule,
        },
        Err(reason) => Decision::NeedsReconciliation(reason),
    }
}

/// Decide what an event does to a capture. The first successful capture of an
/// authorized attempt also makes the attempt and the order SUCCEEDED.
pub fn decide_capture(
    order: &OrderSnapshot,
    attempt: &AttemptSnapshot,
    capture: &CaptureSnapshot,
    event: &PaymentEvent,
) -> Decision<CaptureState> {
    let subject = Subject {
        aggregate: Aggregate::Capture,
        state: capture.state,
        reference: &capture.reference,
        psp_reference: capture.psp_reference.as_deref(),
        last_event: capture.last_event.as_ref(),
        amount: capture.amount,
    };
    let kind = capture_event_kind(event);
    let reference = event.action_reference.as_deref();
    let row = match screen(
        &subject,
        event,
        reference,
        kind,
        CAPTURE_KINDS,
        CAPTURE_MATRIX,
    ) {
        Ok(row) => row,
        Err(decision) => return decision,
    };
    let new_state = match target_state(&subject, kind, row.outcome) {
        Ok(state) => state,
        Err(decision) => return decision,
    };
    let mut effects = match effects_for(&subject, row, false, event, order.amounts) {
        Ok(effects) => effects,
        Err(reason) => return Decision::NeedsReconciliation(reason),
    };
    let cascade = if new_state == CaptureState::Succeeded {
        match capture_cascade(order.state, attempt.state) {
            Ok(cascade) => cascade,
            Err(reason) => return Decision::NeedsReconciliation(reason),
        }
    } else {
        Cascade::default()
    };
    if cascade.attempt == Some(AttemptState::Succeeded) {
        effects.push(Effect::Emit(OutboxEvent::PaymentSucceeded));
    }
    Decision::Apply {
        new_state,
        cascade,
        effects,
        rule: row.rule,
    }
}

/// A captured authorization is a succeeded payment; a capture on an attempt
/// that never held funds (or released them) contradicts what we know.
fn capture_cascade(
    order: OrderState,
    attempt: AttemptState,
) -> Result<Cascade, ReconciliationReason> {
    match attempt {
        AttemptState::Authorized => Ok(Cascade {
            attempt: Some(AttemptState::Succeeded),
            order: order_after(order, AttemptState::Authorized, AttemptState::Succeeded)?,
        }),
        AttemptState::Succeeded => Ok(Cascade::default()),
        other => Err(ReconciliationReason::CaptureOnClosedAttempt(other)),
    }
}

/// One row of the order-mirror table: when the current attempt moves
/// `from` → `to`, the order moves to `order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MirrorRow {
    pub attempt_from: &'static [AttemptState],
    pub attempt_to: AttemptState,
    pub order: OrderState,
    pub rule: &'static str,
}

/// How the order follows its current attempt (seed 001 §2). First match wins.
///
/// The order never shows UNKNOWN, and an attempt's FAILED is not the order's:
/// after a definitive attempt failure (or a cancellation before any money was
/// held) the order stays PROCESSING, open for a new attempt, until the
/// orchestrator decides with an order command (`GiveUp` → FAILED, `Cancel`,
/// `Expire`). Clients see such an order as `failed` (retry allowed).
#[rustfmt::skip]
pub static ORDER_MIRROR: &[MirrorRow] = {
    use AttemptState as A;
    use OrderState as O;
    &[
        MirrorRow { attempt_from: A::ALL, attempt_to: A::Submitted, order: O::Processing, rule: "a request is out: the order is processing" },
        MirrorRow { attempt_from: A::ALL, attempt_to: A::Processing, order: O::Processing, rule: "the PSP is working on it" },
        MirrorRow { attempt_from: A::ALL, attempt_to: A::Unknown, order: O::Processing, rule: "UNKNOWN stays on the attempt; the order is PROCESSING" },
        MirrorRow { attempt_from: A::ALL, attempt_to: A::RequiresAction, order: O::RequiresAction, rule: "the customer must act" },
        MirrorRow { attempt_from: A::ALL, attempt_to: A::Authorized, order: O::Authorized, rule: "funds held, awaiting capture" },
        MirrorRow { attempt_from: A::ALL, attempt_to: A::Succeeded, order: O::Succeeded, rule: "money taken" },
        MirrorRow { attempt_from: A::ALL, attempt_to: A::Failed, order: O::Processing, rule: "an attempt's failure is not the order's: open until the orchestrator decides" },
        MirrorRow { attempt_from: &[A::Authorized], attempt_to: A::Canceled, order: O::Canceled, rule: "a void ends the payment" },
        MirrorRow { attempt_from: A::ALL, attempt_to: A::Canceled, order: O::Processing, rule: "canceled before any money was held: open until the orchestrator decides" },
    ]
};

/// The order's new state when its current attempt moves `from` → `to`:
/// `None` when the order does not move. A closed order cannot follow an
/// attempt that moved on; that is a reconciliation case.
pub fn order_after(
    order: OrderState,
    from: AttemptState,
    to: AttemptState,
) -> Result<Option<OrderState>, ReconciliationReason> {
    let Some(row) = ORDER_MIRROR
        .iter()
        .find(|row| row.attempt_to == to && row.attempt_from.contains(&from))
    else {
        return Ok(None);
    };
    if row.order == order {
        return Ok(None);
    }
    if order.is_terminal() {
        return Err(ReconciliationReason::OrderClosed { order, attempt: to });
    }
    Ok(Some(row.order))
}
