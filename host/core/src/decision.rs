//! What the core answers: a decision, and the effects the store executes with it.

use serde::Serialize;

use crate::amounts::AmountError;
use crate::event::{EventKind, EvidenceSource};
use crate::money::Money;
use crate::state::{AttemptState, OrderState};

/// Which aggregate a decision is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Aggregate {
    Order,
    Attempt,
    Refund,
    Capture,
}

impl Aggregate {
    pub fn as_str(&self) -> &'static str {
        match self {
            Aggregate::Order => "order",
            Aggregate::Attempt => "attempt",
            Aggregate::Refund => "refund",
            Aggregate::Capture => "capture",
        }
    }
}

impl std::fmt::Display for Aggregate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer to "what does this event (or command) do to this aggregate?".
///
/// `S` is the state type of the aggregate decided about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Decision<S> {
    /// Move to `new_state` (possibly the same state, e.g. a recorded
    /// chargeback), move the aggregates in `cascade` with it, and execute
    /// `effects` in the same transaction. `rule` is the matrix row's text, for
    /// the state history.
    Apply {
        new_state: S,
        cascade: Cascade,
        effects: Vec<Effect>,
        rule: &'static str,
    },
    /// Nothing changes. The store records the event as ignored (history /
    /// inbox status) and acknowledges it.
    Ignore(IgnoreReason),
    /// The event or command is not acceptable here. Nothing changes; the store
    /// records the rejection. For merchant commands this is a 4xx.
    Reject(RejectReason),
    /// The evidence contradicts what is already established. Nothing changes;
    /// the store flags the payment for manual review, records the event and
    /// emits `payment.needs_review`. Never last-writer-wins.
    NeedsReconciliation(ReconciliationReason),
}

impl<S> Decision<S> {
    pub fn is_apply(&self) -> bool {
        matches!(self, Decision::Apply { .. })
    }

    /// The effects to execute: empty unless the decision is `Apply`.
    pub fn effects(&self) -> &[Effect] {
        match self {
            Decision::Apply { effects, .. } => effects,
            _ => &[],
        }
    }

    /// One line for the state history: the rule applied, or why not.
    pub fn explain(&self) -> String {
        match self {
            Decision::Apply { rule, .. } => (*rule).to_owned(),
            Decision::Ignore(reason) => reason.to_string(),
            Decision::Reject(reason) => reason.to_string(),
            Decision::NeedsReconciliation(reason) => reason.to_string(),
        }
    }

    /// A short stable label for history rows and metrics:
    /// `applied`, `ignored_duplicate`, `ignored_stale`, `rejected`, `needs_reconciliation`.
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Apply { .. } => "applied",
            Decision::Ignore(IgnoreReason::Duplicate) => "ignored_duplicate",
            Decision::Ignore(IgnoreReason::Stale) => "ignored_stale",
            Decision::Reject(_) => "rejected",
            Decision::NeedsReconciliation(_) => "needs_reconciliation",
        }
    }
}

/// Other aggregates an applied decision moves in the same transaction.
///
/// An attempt decision may move the order; a capture decision may move the
/// attempt and the order. A refund never moves either: a refund's success is
/// not the payment's failure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Cascade {
    pub attempt: Option<AttemptState>,
    pub order: Option<OrderState>,
}

/// Why an event changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, thiserror::Error)]
pub enum IgnoreReason {
    /// The same event, or the same fact, was already accepted.
    #[error("duplicate")]
    Duplicate,
    /// The event is older news than the current state (e.g. "processing"
    /// after "succeeded"); recorded, never rolled back to.
    #[error("stale")]
    Stale,
}

/// Why an event or command is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub enum RejectReason {
    #[error("a {kind} event does not apply to a {aggregate}")]
    WrongAggregate {
        aggregate: Aggregate,
        kind: EventKind,
    },
    #[error("event names {aggregate} {got:?}, expected {expected:?}")]
    ReferenceMismatch {
        aggregate: Aggregate,
        expected: String,
        got: String,
    },
    #[error("{evidence} evidence may not move a {aggregate} in {from} on {kind}")]
    EvidenceNotAllowed {
        aggregate: Aggregate,
        from: &'static str,
        kind: EventKind,
        evidence: EvidenceSource,
    },
    #[error("no rule for a {aggregate} in {from} on {kind}")]
    NoRule {
        aggregate: Aggregate,
        from: &'static str,
        kind: EventKind,
    },
    #[error("the order is {0}: it is closed")]
    OrderClosed(OrderState),
    #[error("the current attempt is {0}: it must reach a definitive result first")]
    AttemptInFlight(AttemptState),
    #[error("the order is {0}: money may be moving")]
    OrderBusy(OrderState),
    #[error("the payment already succeeded")]
    PaymentTaken,
    #[error("the {0} was already sent to the PSP; only its result can close it")]
    AlreadySent(Aggregate),
}

/// Why evidence needs a human (or the reconciliation job) before anything moves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub enum ReconciliationReason {
    #[error("{kind} contradicts the {aggregate}'s established {current}")]
    Contradiction {
        aggregate: Aggregate,
        current: &'static str,
        kind: EventKind,
    },
    #[error("the PSP reports {got}, expected {expected}")]
    AmountMismatch { expected: Money, got: Money },
    #[error("the PSP reference {got:?} differs from the recorded {expected:?}")]
    PspReferenceMismatch { expected: String, got: String },
    #[error("the attempt would become {attempt} but the order is already {order}")]
    OrderClosed {
        order: OrderState,
        attempt: AttemptState,
    },
    #[error("a capture succeeded on an attempt that is {0}")]
    CaptureOnClosedAttempt(AttemptState),
    #[error("the amounts would break an invariant: {0}")]
    AmountInvariant(AmountError),
}

/// Domain events written to the transactional outbox (merchant webhooks and
/// internal consumers). Downstream consumers dedupe on their business key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum OutboxEvent {
    /// The customer must act (redirect, 3-D Secure).
    PaymentRequiresAction,
    /// Funds are held (manual capture); capture or void next.
    PaymentAuthorized,
    /// Money was taken. Emitted exactly once per payment.
    PaymentSucceeded,
    /// One attempt failed definitively; the payment stays open for a new
    /// attempt (the merchant may retry with other payment details).
    PaymentAttemptFailed,
    /// One attempt was canceled before any money was held; the payment stays open.
    PaymentAttemptCanceled,
    /// The order failed: no legal attempt remains.
    PaymentFailed,
    /// The order was canceled (merchant cancel, or a void of the authorization).
    PaymentCanceled,
    /// The order expired without a payment.
    PaymentExpired,
    /// A capture (part of an authorization) succeeded.
    PaymentCaptured,
    /// A capture failed definitively; its reservation was released.
    CaptureFailed,
    RefundSucceeded,
    RefundFailed,
    /// A chargeback was reported. Recorded, not acted on.
    PaymentDisputed,
    /// Contradicting evidence: a human must look (from `NeedsReconciliation`).
    PaymentNeedsReview,
}

impl OutboxEvent {
    /// The event type as merchants see it.
    pub fn as_str(&self) -> &'static str {
        match self {
            OutboxEvent::PaymentRequiresAction => "payment.requires_action",
            OutboxEvent::PaymentAuthorized => "payment.authorized",
            OutboxEvent::PaymentSucceeded => "payment.succeeded",
            OutboxEvent::PaymentAttemptFailed => "payment.attempt_failed",
            OutboxEvent::PaymentAttemptCanceled => "payment.attempt_canceled",
            OutboxEvent::PaymentFailed => "payment.failed",
            OutboxEvent::PaymentCanceled => "payment.canceled",
            OutboxEvent::PaymentExpired => "payment.expired",
            OutboxEvent::PaymentCaptured => "payment.captured",
            OutboxEvent::CaptureFailed => "capture.failed",
            OutboxEvent::RefundSucceeded => "refund.succeeded",
            OutboxEvent::RefundFailed => "refund.failed",
            OutboxEvent::PaymentDisputed => "payment.disputed",
            OutboxEvent::PaymentNeedsReview => "payment.needs_review",
        }
    }
}

impl std::fmt::Display for OutboxEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something the store (or the orchestrator, for `ScheduleQuery`) does in the
/// same transaction as an applied decision. Effects are data; the core never
/// performs them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum Effect {
    /// Manual capture: the authorization holds `amount_minor`.
    RecordAuthorization { amount_minor: i64 },
    /// Automatic capture: authorized = captured = `amount_minor`.
    RecordSale { amount_minor: i64 },
    /// Void: release whatever is held but not captured.
    VoidAuthorization,
    /// A capture command reserved its amount (before the PSP call).
    ReserveCapture { amount_minor: i64 },
    /// A capture succeeded: reservation → captured.
    SettleCapture { amount_minor: i64 },
    /// A capture failed definitively: reservation released.
    ReleaseCapture { amount_minor: i64 },
    /// A refund command reserved its amount (before the PSP call).
    ReserveRefund { amount_minor: i64 },
    /// A refund succeeded: reservation → refunded.
    SettleRefund { amount_minor: i64 },
    /// A refund failed definitively or was canceled unsent: reservation released.
    ReleaseRefund { amount_minor: i64 },
    /// Remember the PSP's id of the aggregate (first time it is learned).
    RecordPspReference { psp_reference: String },
    /// Remember where the customer must go (REQUIRES_ACTION).
    RecordNextAction { url: String },
    /// Write this domain event to the outbox.
    Emit(OutboxEvent),
    /// The outcome is unknown: schedule a query with the original reference
    /// (never a new charge). The store sets the row's next query time.
    ScheduleQuery,
    /// A void of the authorization was recorded as sent: the store keeps the
    /// time (the scanner queries the attempt until the PSP says).
    RecordVoidRequest,
}

impl Effect {
    /// Whether this effect changes the amount row (the store must then write
    /// it under the order's version in the same transaction).
    pub fn moves_money(&self) -> bool {
        matches!(
            self,
            Effect::RecordAuthorization { .. }
                | Effect::RecordSale { .. }
                | Effect::VoidAuthorization
                | Effect::ReserveCapture { .. }
                | Effect::SettleCapture { .. }
                | Effect::ReleaseCapture { .. }
                | Effect::ReserveRefund { .. }
                | Effect::SettleRefund { .. }
                | Effect::ReleaseRefund { .. }
        )
    }
}
