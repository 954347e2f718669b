//! The money invariants of one payment (seed 001 §6), as pure checked
//! arithmetic. Every amount is in minor units of the payment's one currency.
//!
//! Invariants, true of every `Amounts` value this module hands out:
//!
//! ```text
//! every field >= 0
//! captured + capture_reserved <= authorized
//! refunded + refund_reserved  <= captured
//! ```
//!
//! Reservations are what make concurrent requests safe: a capture or refund
//! first *reserves* its amount (the store does this with a conditional UPDATE
//! in a short transaction, before any PSP call), and the PSP's definitive
//! answer later *settles* (success) or *releases* (failure) that reservation.
//! An unknown outcome keeps the reservation. Two 70-unit refunds of a 100-unit
//! capture therefore cannot both reserve (seed 001 §12 C).

use serde::{Deserialize, Serialize};

use crate::decision::Effect;

/// Why an amount movement is refused. Nothing is changed when one is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum AmountError {
    #[error("amount must be greater than zero, got {0}")]
    NotPositive(i64),
    #[error("amount arithmetic overflowed")]
    Overflow,
    #[error("the payment already has an authorization or capture")]
    AlreadyAuthorized,
    #[error("capture of {requested} exceeds the capturable {available}")]
    ExceedsCapturable { requested: i64, available: i64 },
    #[error("refund of {requested} exceeds the refundable {available}")]
    ExceedsRefundable { requested: i64, available: i64 },
    #[error("settling or releasing {requested} exceeds the {reserved} reserved")]
    ExceedsReservation { requested: i64, reserved: i64 },
    #[error("a capture of {0} is still in flight")]
    CaptureInFlight(i64),
    #[error("stored amounts break an invariant")]
    Corrupt,
}

/// The amount summary of one payment (the `payment_amount` row).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Amounts {
    /// Reserved on the customer's instrument by the PSP.
    pub authorized: i64,
    /// Capture requests sent or about to be sent, outcome not yet known.
    pub capture_reserved: i64,
    /// Money actually taken.
    pub captured: i64,
    /// Refund requests sent or about to be sent, outcome not yet known.
    pub refund_reserved: i64,
    /// Money actually returned.
    pub refunded: i64,
}

fn positive(amount: i64) -> Result<i64, AmountError> {
    if amount <= 0 {
        return Err(AmountError::NotPositive(amount));
    }
    Ok(amount)
}

fn add(a: i64, b: i64) -> Result<i64, AmountError> {
    a.checked_add(b).ok_or(AmountError::Overflow)
}

fn sub(a: i64, b: i64) -> Result<i64, AmountError> {
    a.checked_sub(b).ok_or(AmountError::Overflow)
}

impl Amounts {
    /// Rebuild from stored columns, refusing values that break an invariant
    /// (the database CHECKs should make that impossible; this is the second net).
    pub fn from_parts(
        authorized: i64,
        capture_reserved: i64,
        captured: i64,
        refund_reserved: i64,
        refunded: i64,
    ) -> Result<Self, AmountError> {
        Amounts {
            authorized,
            capture_reserved,
            captured,
            refund_reserved,
            refunded,
        }
        .checked()
    }

    /// Whether every invariant holds.
    pub fn holds(&self) -> bool {
        self.checked().is_ok()
    }

    fn checked(self) -> Result<Self, AmountError> {
        let non_negative = [
            self.authorized,
            self.capture_reserved,
            self.captured,
            self.refund_reserved,
            self.refunded,
        ]
        .iter()
        .all(|v| *v >= 0);
        let captures_fit = add(self.captured, self.capture_reserved)? <= self.authorized;
        let refunds_fit = add(self.refunded, self.refund_reserved)? <= self.captured;
        if non_negative && captures_fit && refunds_fit {
            Ok(self)
        } else {
            Err(AmountError::Corrupt)
        }
    }

    /// What may still be reserved for capture.
    pub fn capturable(&self) -> i64 {
        self.authorized - self.captured - self.capture_reserved
    }

    /// What may still be reserved for refund.
    pub fn refundable(&self) -> i64 {
        self.captured - self.refunded - self.refund_reserved
    }

    /// A manual-capture authorization: funds held, nothing taken yet.
    pub fn record_authorization(self, amount: i64) -> Result<Self, AmountError> {
        let amount = positive(amount)?;
        if self.authorized != 0 || self.captured != 0 {
            return Err(AmountError::AlreadyAuthorized);
        }
        Amounts {
            authorized: amount,
            ..self
        }
        .checked()
    }

    /// An automatic-capture sale: authorized and captured in one step.
    pub fn record_sale(self, amount: i64) -> Result<Self, AmountError> {
        let amount = positive(amount)?;
        if self.authorized != 0 || self.captured != 0 {
            return Err(AmountError::AlreadyAuthorized);
        }
        Amounts {
            authorized: amount,
            captured: amount,
            ..self
        }
        .checked()
    }

    /// A void: whatever is held but not captured is released. Refused while a
    /// capture is in flight, because its outcome decides what is left to void.
    pub fn void_authorization(self) -> Result<Self, AmountError> {
        if self.capture_reserved != 0 {
            return Err(AmountError::CaptureInFlight(self.capture_reserved));
        }
        Amounts {
            authorized: self.captured,
            ..self
        }
        .checked()
    }

    pub fn reserve_capture(self, amount: i64) -> Result<Self, AmountError> {
        let amount = positive(amount)?;
        let available = self.capturable();
        if amount > available {
            return Err(AmountError::ExceedsCapturable {
                requested: amount,
                available,
            });
        }
        Amounts {
            capture_reserved: add(self.capture_reserved, amount)?,
            ..self
        }
        .checked()
    }

    /// A capture succeeded: its reservation becomes captured money.
    pub fn settle_capture(self, amount: i64) -> Result<Self, AmountError> {
        let amount = self.within_capture_reservation(amount)?;
        Amounts {
            capture_reserved: sub(self.capture_reserved, amount)?,
            captured: add(self.captured, amount)?,
            ..self
        }
        .checked()
    }

    /// A capture failed definitively: its reservation is free again.
    pub fn release_capture(self, amount: i64) -> Result<Self, AmountError> {
        let amount = self.within_capture_reservation(amount)?;
        Amounts {
            capture_reserved: sub(self.capture_reserved, amount)?,
            ..self
        }
        .checked()
    }

    pub fn reserve_refund(self, amount: i64) -> Result<Self, AmountError> {
        let amount = positive(amount)?;
        let available = self.refundable();
        if amount > available {
            return Err(AmountError::ExceedsRefundable {
                requested: amount,
                available,
            });
        }
        Amounts {
            refund_reserved: add(self.refund_reserved, amount)?,
            ..self
        }
        .checked()
    }

    /// A refund succeeded: its reservation becomes refunded money.
    pub fn settle_refund_success(self, amount: i64) -> Result<Self, AmountError> {
        let amount = self.within_refund_reservation(amount)?;
        Amounts {
            refund_reserved: sub(self.refund_reserved, amount)?,
            refunded: add(self.refunded, amount)?,
            ..self
        }
        .checked()
    }

    /// A refund failed definitively (or was canceled before it was sent).
    pub fn release_refund(self, amount: i64) -> Result<Self, AmountError> {
        let amount = self.within_refund_reservation(amount)?;
        Amounts {
            refund_reserved: sub(self.refund_reserved, amount)?,
            ..self
        }
        .checked()
    }

    fn within_capture_reservation(&self, amount: i64) -> Result<i64, AmountError> {
        let amount = positive(amount)?;
        if amount > self.capture_reserved {
            return Err(AmountError::ExceedsReservation {
                requested: amount,
                reserved: self.capture_reserved,
            });
        }
        Ok(amount)
    }

    fn within_refund_reservation(&self, amount: i64) -> Result<i64, AmountError> {
        let amount = positive(amount)?;
        if amount > self.refund_reserved {
            return Err(AmountError::ExceedsReservation {
                requested: amount,
                reserved: self.refund_reserved,
            });
        }
        Ok(amount)
    }

    /// Apply one effect of a decision. Effects that move no money leave the
    /// amounts as they are. The store applies a decision's effects in order,
    /// in the same transaction as the state change.
    pub fn apply(self, effect: &Effect) -> Result<Self, AmountError> {
        match *effect {
            Effect::RecordAuthorization { amount_minor } => self.record_authorization(amount_minor),
            Effect::RecordSale { amount_minor } => self.record_sale(amount_minor),
            Effect::VoidAuthorization => self.void_authorization(),
            Effect::ReserveCapture { amount_minor } => self.reserve_capture(amount_minor),
            Effect::SettleCapture { amount_minor } => self.settle_capture(amount_minor),
            Effect::ReleaseCapture { amount_minor } => self.release_capture(amount_minor),
            Effect::ReserveRefund { amount_minor } => self.reserve_refund(amount_minor),
            Effect::SettleRefund { amount_minor } => self.settle_refund_success(amount_minor),
            Effect::ReleaseRefund { amount_minor } => self.release_refund(amount_minor),
            Effect::RecordPspReference { .. }
            | Effect::RecordNextAction { .. }
            | Effect::Emit(_)
            | Effect::ScheduleQuery
            | Effect::RecordVoidRequest => Ok(self),
        }
    }

    /// Apply every effect in order; the first refusal wins and nothing changes.
    pub fn apply_all<'a>(
        self,
        effects: impl IntoIterator<Item = &'a Effect>,
    ) -> Result<Self, AmountError> {
        effects
            .into_iter()
            .try_fold(self, |amounts, effect| amounts.apply(effect))
    }
}
