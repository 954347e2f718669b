//! What a client is told. A pure projection of the stored facts; it must
//! never claim more than the evidence shows (seed 000 §3: a 200 is not a
//! success, and "processing" covers everything not yet proven).

use serde::{Deserialize, Serialize};

use crate::amounts::Amounts;
use crate::fulfillment::{CompensationReason, FulfillmentState};
use crate::state::{AttemptState, OrderState, RefundState};

/// The payment status a merchant's client sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientStatus {
    /// No attempt yet: the payment waits for confirmation.
    Created,
    /// Not proven either way: poll again (covers UNKNOWN attempts).
    Processing,
    /// The customer must act (redirect, 3-D Secure).
    RequiresAction,
    /// Funds held (manual capture): not money taken.
    Authorized,
    /// Money taken, nothing refunded.
    Succeeded,
    /// Money taken, part of it refunded (settled refunds only).
    PartiallyRefunded,
    /// Money taken and all of it refunded.
    Refunded,
    /// Definitive failure. When the order is still open the client may retry
    /// with other payment details; when the order FAILED it is closed.
    Failed,
    Canceled,
    Expired,
    /// Contradicting evidence: automatic processing stopped, a human decides.
    ManualReview,
}

impl ClientStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            ClientStatus::Created => "created",
            ClientStatus::Processing => "processing",
            ClientStatus::RequiresAction => "requires_action",
            ClientStatus::Authorized => "authorized",
            ClientStatus::Succeeded => "succeeded",
            ClientStatus::PartiallyRefunded => "partially_refunded",
            ClientStatus::Refunded => "refunded",
            ClientStatus::Failed => "failed",
            ClientStatus::Canceled => "canceled",
            ClientStatus::Expired => "expired",
            ClientStatus::ManualReview => "manual_review",
        }
    }
}

impl std::fmt::Display for ClientStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The facts the projection reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentView {
    pub order: OrderState,
    pub latest_attempt: Option<AttemptState>,
    pub amounts: Amounts,
    /// Set by the store on a `NeedsReconciliation` decision, cleared by an operator.
    pub manual_review: bool,
}

/// The client-facing status of a payment.
pub fn client_status(view: &PaymentView) -> ClientStatus {
    // Under review nothing is claimed, not even a success: the review exists
    // because some evidence contradicts it.
    if view.manual_review {
        return ClientStatus::ManualReview;
    }
    match view.order {
        OrderState::Succeeded => refund_progress(&view.amounts),
        OrderState::Failed => ClientStatus::Failed,
        OrderState::Canceled => ClientStatus::Canceled,
        OrderState::Expired => ClientStatus::Expired,
        OrderState::Authorized => ClientStatus::Authorized,
        OrderState::RequiresAction => ClientStatus::RequiresAction,
        OrderState::Created | OrderState::Processing => open_order(view.latest_attempt),
    }
}

/// Why a payment's money went back, shown with `refunded` (or
/// `partially_refunded`): the compensation reason once the compensation
/// refund settled (fulfillment `compensated`). Nothing is claimed before the
/// refund's success, and an ordinary merchant refund has no such reason.
pub fn refund_reason(
    status: ClientStatus,
    fulfillment: Option<FulfillmentState>,
    compensation: Option<CompensationReason>,
) -> Option<CompensationReason> {
    match (status, fulfillment) {
        (
            ClientStatus::Refunded | ClientStatus::PartiallyRefunded,
            Some(FulfillmentState::Compensated),
        ) => compensation,
        _ => None,
    }
}

fn refund_progress(amounts: &Amounts) -> ClientStatus {
    // Only settled refunds count; a reserved or unknown refund is not money back.
    if amounts.refunded > 0 && amounts.refunded >= amounts.captured {
        ClientStatus::Refunded
    } else if amounts.refunded > 0 {
        ClientStatus::PartiallyRefunded
    } else {
        ClientStatus::Succeeded
    }
}

fn open_order(latest_attempt: Option<AttemptState>) -> ClientStatus {
    match latest_attempt {
        None => ClientStatus::Created,
        // The latest attempt ended without money: the client may retry.
        Some(AttemptState::Failed | AttemptState::Canceled) => ClientStatus::Failed,
        Some(AttemptState::RequiresAction) => ClientStatus::RequiresAction,
        // An open order never has a succeeded or authorized attempt (the order
        // mirrors it); if the store ever shows one, "processing" claims nothing.
        Some(
            AttemptState::Created
            | AttemptState::Submitted
            | AttemptState::Processing
            | AttemptState::Unknown
            | AttemptState::Authorized
            | AttemptState::Succeeded,
        ) => ClientStatus::Processing,
    }
}

/// The client-facing status of a refund: UNKNOWN is shown as pending.
pub fn refund_client_status(state: RefundState) -> &'static str {
    match state {
        RefundState::Created | RefundState::Processing | RefundState::Unknown => "pending",
        RefundState::Succeeded => "succeeded",
        RefundState::Failed => "failed",
        RefundState::Canceled => "canceled",
    }
}

#[cfg(test)]
mod refund_reason_tests {
    use super::*;

    #[test]
    fn the_compensation_reason_is_shown_only_once_the_compensation_refund_settled() {
        let reason = Some(CompensationReason::FulfillmentDeadlinePassed);
        assert_eq!(
            refund_reason(
                ClientStatus::Refunded,
                Some(FulfillmentState::Compensated),
                reason
            ),
            reason
        );
        // Being refunded is not refunded; a merchant refund has no reason.
        assert_eq!(
            refund_reason(
                ClientStatus::Succeeded,
                Some(FulfillmentState::Compensating),
                reason
            ),
            None
        );
        assert_eq!(
            refund_reason(
                ClientStatus::Refunded,
                Some(FulfillmentState::Fulfilled),
                None
            ),
            None
        );
        assert_eq!(refund_reason(ClientStatus::Refunded, None, None), None);
    }
}
