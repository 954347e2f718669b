//! Commands: decisions that start from the merchant or the orchestrator
//! rather than from PSP evidence. They go through the same door as events.
//!
//! The order-level rules, as a table a reader can audit:
//!
//! | command        | allowed when                                              | order becomes | emits             |
//! |----------------|-----------------------------------------------------------|---------------|-------------------|
//! | `StartAttempt` | order CREATED or PROCESSING, no attempt or the latest one FAILED/CANCELED | PROCESSING | —        |
//! | `Cancel`       | same                                                      | CANCELED      | `payment.canceled`|
//! | `Expire`       | same                                                      | EXPIRED       | `payment.expired` |
//! | `GiveUp`       | same (no legal attempt remains)                           | FAILED        | `payment.failed`  |
//!
//! "Same" means no money can be moving: any attempt that is not FAILED or
//! CANCELED must first reach a definitive result (an UNKNOWN attempt blocks
//! a new one: seed 001 §9, §12 E), and an AUTHORIZED one must be voided at
//! the PSP (its PAYMENT_CANCELED then cancels the order). Repeating the
//! command that closed the order is `Ignore(Duplicate)`; anything else on a
//! closed order is `Reject(OrderClosed)`.
//!
//! `StartAttempt` applies PROCESSING even when the order already is
//! PROCESSING: the store bumps the order version, so two concurrent attempt
//! creations cannot both win the CAS.

use serde::{Deserialize, Serialize};

use crate::amounts::AmountError;
use crate::decision::{
    Aggregate, Cascade, Decision, Effect, IgnoreReason, OutboxEvent, RejectReason,
};
use crate::money::{Money, MoneyError};
use crate::snapshot::{AttemptSnapshot, CaptureMode, OrderSnapshot, RefundSnapshot};
use crate::state::{AttemptState, OrderState, RefundState};

/// An order-level command from the merchant or the orchestrator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderCommand {
    /// Create a new attempt (the first, or one after a definitive failure).
    StartAttempt,
    /// The merchant cancels the payment.
    Cancel,
    /// The payment's deadline passed without a payment.
    Expire,
    /// The orchestrator decides no legal attempt remains.
    GiveUp,
}

impl OrderCommand {
    fn target(self) -> (OrderState, Option<OutboxEvent>, &'static str) {
        match self {
            OrderCommand::StartAttempt => (
                OrderState::Processing,
                None,
                "a new attempt may start: no money is moving",
            ),
            OrderCommand::Cancel => (
                OrderState::Canceled,
                Some(OutboxEvent::PaymentCanceled),
                "canceled by the merchant while no money was moving",
            ),
            OrderCommand::Expire => (
                OrderState::Expired,
                Some(OutboxEvent::PaymentExpired),
                "expired while no money was moving",
            ),
            OrderCommand::GiveUp => (
                OrderState::Failed,
                Some(OutboxEvent::PaymentFailed),
                "no legal attempt remains",
            ),
        }
    }
}

/// Decide an order command. `latest_attempt` is the state of the order's
/// most recent attempt, if it has one.
pub fn decide_order(
    order: &OrderSnapshot,
    latest_attempt: Option<AttemptState>,
    command: OrderCommand,
) -> Decision<OrderState> {
    let (target, emit, rule) = command.target();
    if order.state.is_terminal() {
        return if order.state == target {
            Decision::Ignore(IgnoreReason::Duplicate)
        } else {
            Decision::Reject(RejectReason::OrderClosed(order.state))
        };
    }
    match latest_attempt {
        Some(AttemptState::Succeeded) => return Decision::Reject(RejectReason::PaymentTaken),
        Some(attempt) if !attempt.is_terminal() => {
            return Decision::Reject(RejectReason::AttemptInFlight(attempt))
        }
        _ => {}
    }
    // With no attempt in flight the order can only be CREATED or PROCESSING;
    // anything else means the snapshot disagrees with itself.
    if !matches!(order.state, OrderState::Created | OrderState::Processing) {
        return Decision::Reject(RejectReason::OrderBusy(order.state));
    }
    Decision::Apply {
        new_state: target,
        cascade: Cascade::default(),
        effects: emit.map(Effect::Emit).into_iter().collect(),
        rule,
    }
}

/// Why a capture, refund or void request is refused before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestRefused {
    #[error("the payment is {0}; only a succeeded payment can be refunded")]
    NotRefundable(OrderState),
    #[error("the attempt is {0}; only an authorized attempt can be captured or voided")]
    NotCapturable(AttemptState),
    #[error("the attempt uses automatic capture")]
    AutomaticCapture,
    #[error(transparent)]
    Money(#[from] MoneyError),
    #[error(transparent)]
    Amount(#[from] AmountError),
}

/// A refund request: the reservation to make before the refund row exists
/// and before the PSP is called (seed 001 §6). The store applies it with a
/// conditional update; only if it lands is the refund created.
pub fn request_refund(order: &OrderSnapshot, amount: Money) -> Result<Effect, RequestRefused> {
    if order.state != OrderState::Succeeded {
        return Err(RequestRefused::NotRefundable(order.state));
    }
    order.amount.ensure_same_currency(amount.currency)?;
    order.amounts.reserve_refund(amount.amount_minor)?;
    Ok(Effect::ReserveRefund {
        amount_minor: amount.amount_minor,
    })
}

/// A capture request on a manual-capture attempt: the reservation to make
/// before the capture row exists. A succeeded attempt may take further
/// captures while authorized funds remain (multiple capture).
pub fn request_capture(
    order: &OrderSnapshot,
    attempt: &AttemptSnapshot,
    amount: Money,
) -> Result<Effect, RequestRefused> {
    if attempt.capture_mode != CaptureMode::Manual {
        return Err(RequestRefused::AutomaticCapture);
    }
    if !matches!(
        attempt.state,
        AttemptState::Authorized | AttemptState::Succeeded
    ) {
        return Err(RequestRefused::NotCapturable(attempt.state));
    }
    order.amount.ensure_same_currency(amount.currency)?;
    order.amounts.reserve_capture(amount.amount_minor)?;
    Ok(Effect::ReserveCapture {
        amount_minor: amount.amount_minor,
    })
}

/// A void request: only an authorized attempt with no capture in flight.
pub fn request_void(
    order: &OrderSnapshot,
    attempt: &AttemptSnapshot,
) -> Result<(), RequestRefused> {
    if attempt.state != AttemptState::Authorized {
        return Err(RequestRefused::NotCapturable(attempt.state));
    }
    order.amounts.void_authorization()?;
    Ok(())
}

/// Cancel a refund that was never sent to the PSP (e.g. the adapter refused
/// to build the request), releasing its reservation. The store must only call
/// this when it knows no request left: a refund that may have been sent can
/// only be closed by the PSP's answer.
pub fn cancel_unsent_refund(refund: &RefundSnapshot) -> Decision<RefundState> {
    match refund.state {
        RefundState::Created => Decision::Apply {
            new_state: RefundState::Canceled,
            cascade: Cascade::default(),
            effects: vec![Effect::ReleaseRefund {
                amount_minor: refund.amount.amount_minor,
            }],
            rule: "refund canceled before it was sent: reservation released",
        },
        RefundState::Canceled => Decision::Ignore(IgnoreReason::Duplicate),
        _ => Decision::Reject(RejectReason::AlreadySent(Aggregate::Refund)),
    }
}
