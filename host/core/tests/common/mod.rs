//! Builders shared by the integration tests.
#![allow(dead_code)]

use sluice_core::*;

pub fn eur(amount_minor: i64) -> Money {
    Money {
        amount_minor,
        currency: Currency::parse("EUR").unwrap(),
    }
}

pub const PAYMENT: i64 = 1000;

/// The amounts a payment plausibly has while its attempt is in `state`.
pub fn amounts_for(state: AttemptState) -> Amounts {
    match state {
        AttemptState::Authorized => Amounts {
            authorized: PAYMENT,
            ..Amounts::default()
        },
        AttemptState::Succeeded => Amounts {
            authorized: PAYMENT,
            captured: PAYMENT,
            ..Amounts::default()
        },
        _ => Amounts::default(),
    }
}

/// The order state that mirrors an attempt in `state`.
pub fn order_for(state: AttemptState) -> OrderState {
    match state {
        AttemptState::Created => OrderState::Created,
        AttemptState::RequiresAction => OrderState::RequiresAction,
        AttemptState::Authorized => OrderState::Authorized,
        AttemptState::Succeeded => OrderState::Succeeded,
        _ => OrderState::Processing,
    }
}

pub fn order(state: OrderState, amounts: Amounts) -> OrderSnapshot {
    OrderSnapshot {
        state,
        version: 1,
        amount: eur(PAYMENT),
        amounts,
    }
}

pub fn attempt(state: AttemptState, mode: CaptureMode) -> AttemptSnapshot {
    AttemptSnapshot {
        reference: "att_1".into(),
        state,
        version: 1,
        capture_mode: mode,
        amount: eur(PAYMENT),
        psp_reference: None,
        last_event: None,
    }
}

pub fn refund(state: RefundState, amount: i64) -> RefundSnapshot {
    RefundSnapshot {
        reference: "ref_1".into(),
        state,
        version: 1,
        amount: eur(amount),
        psp_reference: None,
        last_event: None,
    }
}

pub fn capture(state: CaptureState, amount: i64) -> CaptureSnapshot {
    CaptureSnapshot {
        reference: "cap_1".into(),
        state,
        version: 1,
        amount: eur(amount),
        psp_reference: None,
        last_event: None,
    }
}

/// An event as an adapter would report it; failures carry a decline.
pub fn event(kind: EventKind, evidence: EvidenceSource) -> PaymentEvent {
    let failure = matches!(
        kind,
        EventKind::PaymentFailed | EventKind::RefundFailed | EventKind::CaptureFailed
    )
    .then(|| Failure {
        category: FailureCategory::Declined,
        code: "card_declined".into(),
        message: "declined".into(),
    });
    PaymentEvent {
        failure,
        ..PaymentEvent::new(kind, evidence)
    }
}

/// A decision reduced to what the tables state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum X<S> {
    /// Apply: new state and the cascade.
    To(S, Cascade),
    Dup,
    Stale,
    /// NeedsReconciliation because the event contradicts the state.
    Rec,
    /// Any other NeedsReconciliation (never expected in the tables).
    RecOther,
    /// Reject: not an event for this aggregate.
    Wrong,
    /// Reject: this evidence may not do this.
    Evid,
    /// Reject: no rule (never expected: the matrices are complete).
    NoRule,
    /// Any other rejection.
    RejectOther,
}

pub fn summarize<S: Copy>(decision: &Decision<S>) -> X<S> {
    match decision {
        Decision::Apply {
            new_state, cascade, ..
        } => X::To(*new_state, *cascade),
        Decision::Ignore(IgnoreReason::Duplicate) => X::Dup,
        Decision::Ignore(IgnoreReason::Stale) => X::Stale,
        Decision::NeedsReconciliation(ReconciliationReason::Contradiction { .. }) => X::Rec,
        Decision::NeedsReconciliation(_) => X::RecOther,
        Decision::Reject(RejectReason::WrongAggregate { .. }) => X::Wrong,
        Decision::Reject(RejectReason::EvidenceNotAllowed { .. }) => X::Evid,
        Decision::Reject(RejectReason::NoRule { .. }) => X::NoRule,
        Decision::Reject(_) => X::RejectOther,
    }
}

pub fn emitted<S>(decision: &Decision<S>) -> Vec<OutboxEvent> {
    decision
        .effects()
        .iter()
        .filter_map(|e| match e {
            Effect::Emit(o) => Some(*o),
            _ => None,
        })
        .collect()
}

/// A minimal in-memory "store" for one payment with one attempt: applies
/// decisions the way the real store's one door does (state, version, last
/// accepted event, order cascade, amounts, outbox).
#[derive(Debug, Clone)]
pub struct Sim {
    pub order: OrderSnapshot,
    pub attempt: AttemptSnapshot,
    pub outbox: Vec<OutboxEvent>,
    pub manual_review: bool,
}

impl Sim {
    pub fn new(state: AttemptState, mode: CaptureMode) -> Self {
        Sim {
            order: order(order_for(state), amounts_for(state)),
            attempt: attempt(state, mode),
            outbox: Vec::new(),
            manual_review: false,
        }
    }

    pub fn feed(&mut self, event: &PaymentEvent) -> Decision<AttemptState> {
        let decision = decide_attempt(&self.order, &self.attempt, event);
        match &decision {
            Decision::Apply {
                new_state,
                cascade,
                effects,
                ..
            } => {
                self.attempt.state = *new_state;
                self.attempt.version += 1;
                self.attempt.last_event = Some(EventIdentity::of(event));
                if let Some(order_state) = cascade.order {
                    self.order.state = order_state;
                    self.order.version += 1;
                }
                self.order.amounts = self
                    .order
                    .amounts
                    .apply_all(effects)
                    .expect("a decided effect applies to the snapshot it was decided on");
                for effect in effects {
                    match effect {
                        Effect::Emit(outbox) => self.outbox.push(*outbox),
                        Effect::RecordPspReference { psp_reference } => {
                            self.attempt.psp_reference = Some(psp_reference.clone())
                        }
                        _ => {}
                    }
                }
            }
            Decision::NeedsReconciliation(_) => self.manual_review = true,
            Decision::Ignore(_) | Decision::Reject(_) => {}
        }
        decision
    }

    pub fn view(&self) -> PaymentView {
        PaymentView {
            order: self.order.state,
            latest_attempt: Some(self.attempt.state),
            amounts: self.order.amounts,
            manual_review: self.manual_review,
        }
    }
}
