//! The sandbox's books: payments, refunds and how many charges each reference caused.
//!
//! Everything here runs under one lock and never awaits. Operations return the
//! snapshot after the change and the `Happening`s the webhook layer turns into
//! each format's notifications.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::SandboxClock;
use crate::config::{Format, RefundBehaviour};
use crate::faults::{CardOutcome, Decline};
use crate::util::Ids;

/// A payment's lifecycle, named after Stripe's PaymentIntent statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PayStatus {
    RequiresAction,
    Processing,
    RequiresCapture,
    Succeeded,
    Canceled,
    /// Declined (Stripe shows `requires_payment_method`).
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    Pending,
    Succeeded,
    Failed,
}

/// One payment (a Stripe PaymentIntent or an Adyen payment).
#[derive(Debug, Clone, Serialize)]
pub struct Payment {
    pub format: Format,
    pub id: String,
    /// The key that created it: objects are visible only to their own account.
    #[serde(skip)]
    pub api_key: String,
    /// The attempt reference: Stripe `metadata[sluice_attempt_reference]` (else the
    /// idempotency key, else the id); Adyen `reference`.
    pub reference: String,
    pub idempotency_key: Option<String>,
    /// Minor units.
    pub amount: i64,
    /// Upper-case ISO 4217.
    pub currency: String,
    pub manual_capture: bool,
    pub payment_method: String,
    pub status: PayStatus,
    pub amount_capturable: i64,
    pub amount_received: i64,
    pub amount_refunded: i64,
    pub amount_refund_pending: i64,
    pub metadata: BTreeMap<String, String>,
    pub merchant_account: Option<String>,
    pub return_url: Option<String>,
    /// Stripe: the `ch_...` of the latest charge.
    pub charge_id: Option<String>,
    #[serde(skip)]
    pub decline: Option<Decline>,
    pub next_action_url: Option<String>,
    /// Money was reserved or taken at some point.
    pub committed: bool,
    pub created: i64,
    pub canceled_at: Option<i64>,
    pub cancellation_reason: Option<String>,
}

/// One refund.
#[derive(Debug, Clone, Serialize)]
pub struct Refund {
    pub format: Format,
    pub id: String,
    pub payment_id: String,
    /// Stripe: the refunded charge.
    pub charge_id: Option<String>,
    #[serde(skip)]
    pub api_key: String,
    /// Stripe `metadata[sluice_refund_reference]` (else the idempotency key);
    /// Adyen `reference`.
    pub reference: Option<String>,
    pub idempotency_key: Option<String>,
    pub amount: i64,
    pub currency: String,
    pub status: RefundStatus,
    pub metadata: BTreeMap<String, String>,
    pub created: i64,
    pub failure_reason: Option<String>,
    /// For a pending refund: whether it will succeed when it settles.
    #[serde(skip)]
    pub settles_successfully: bool,
}

/// How often the sandbox executed a payment for one attempt reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReferenceCount {
    /// Payment objects created (every executed create, whatever its outcome).
    pub payments: u32,
    /// Money-moving charges: creates that reserved or took money (at once or later).
    pub charges: u32,
}

/// A fact the webhook layer reports to the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happening {
    /// Funds reserved, awaiting capture.
    Authorized,
    /// Authorised and captured in one go; `capture_psp` is Adyen's capture reference.
    Succeeded {
        capture_psp: Option<String>,
    },
    Declined,
    RequiresAction,
    Processing,
    Captured {
        modification_psp: Option<String>,
        amount: i64,
        reference: Option<String>,
    },
    CaptureFailed {
        modification_psp: String,
        amount: i64,
        reference: Option<String>,
        reason: String,
    },
    Canceled {
        modification_psp: Option<String>,
        reference: Option<String>,
    },
    CancelFailed {
        modification_psp: String,
        reference: Option<String>,
        reason: String,
    },
    RefundCreated {
        refund_id: String,
    },
    RefundSucceeded {
        refund_id: String,
    },
    RefundFailed {
        refund_id: String,
    },
    /// Adyen: a refund request refused after `201 received` (no refund exists).
    RefundRefused {
        modification_psp: String,
        amount: i64,
        reference: Option<String>,
        reason: String,
    },
}

/// Why an operation on an existing payment was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    NotFound,
    /// The payment is not in a state that allows the operation.
    UnexpectedState(PayStatus),
    AmountTooLarge {
        available: i64,
    },
    AmountNotPositive,
    CurrencyMismatch,
}

impl Refusal {
    pub fn describe(&self, operation: &str) -> String {
        match self {
            Refusal::NotFound => "no such payment".to_owned(),
            Refusal::UnexpectedState(s) => {
                format!(
                    "cannot {operation} a payment with status {}",
                    status_name(*s)
                )
            }
            Refusal::AmountTooLarge { available } => {
                format!("the {operation} amount exceeds the available {available}")
            }
            Refusal::AmountNotPositive => format!("the {operation} amount must be positive"),
            Refusal::CurrencyMismatch => {
                format!("the {operation} currency differs from the payment's")
            }
        }
    }
}

fn status_name(s: PayStatus) -> &'static str {
    match s {
        PayStatus::RequiresAction => "requires_action",
        PayStatus::Processing => "processing",
        PayStatus::RequiresCapture => "requires_capture",
        PayStatus::Succeeded => "succeeded",
        PayStatus::Canceled => "canceled",
        PayStatus::Failed => "requires_payment_method",
    }
}

/// What a payment create asks for, already validated.
#[derive(Debug, Clone)]
pub struct NewPayment {
    pub format: Format,
    pub api_key: String,
    /// Empty: the payment's own id becomes its reference.
    pub reference: String,
    pub idempotency_key: Option<String>,
    pub amount: i64,
    pub currency: String,
    pub manual_capture: bool,
    pub payment_method: String,
    pub metadata: BTreeMap<String, String>,
    pub merchant_account: Option<String>,
    pub return_url: Option<String>,
}

/// What a refund asks for, already validated.
#[derive(Debug, Clone)]
pub struct NewRefund {
    pub api_key: String,
    pub payment_id: String,
    /// None: everything still refundable.
    pub amount: Option<i64>,
    pub currency: Option<String>,
    pub reference: Option<String>,
    pub idempotency_key: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

pub type Changed = (Payment, Vec<Happening>);

pub struct Ledger {
    clock: SandboxClock,
    payments: BTreeMap<String, Payment>,
    payment_order: Vec<String>,
    refunds: BTreeMap<String, Refund>,
    refund_order: Vec<String>,
    payment_counts: BTreeMap<String, ReferenceCount>,
    refund_counts: BTreeMap<String, u32>,
    pub refund_behaviour: RefundBehaviour,
}

impl Ledger {
    pub fn new(refund_behaviour: RefundBehaviour, clock: SandboxClock) -> Self {
        Self {
            clock,
            payments: BTreeMap::new(),
            payment_order: Vec::new(),
            refunds: BTreeMap::new(),
            refund_order: Vec::new(),
            payment_counts: BTreeMap::new(),
            refund_counts: BTreeMap::new(),
            refund_behaviour,
        }
    }

    /// Executes a payment create: the card network answers `outcome`.
    pub fn create_payment(
        &mut self,
        ids: &Ids,
        new: NewPayment,
        outcome: CardOutcome,
        action_url: impl FnOnce(&str) -> String,
    ) -> Changed {
        let id = match new.format {
            Format::Stripe => ids.stripe("pi"),
            Format::Adyen => ids.adyen_psp_reference(),
        };
        let reference = if new.reference.is_empty() {
            id.clone()
        } else {
            new.reference
        };
        let mut p = Payment {
            format: new.format,
            id: id.clone(),
            api_key: new.api_key,
            reference,
            idempotency_key: new.idempotency_key,
            amount: new.amount,
            currency: new.currency,
            manual_capture: new.manual_capture,
            payment_method: new.payment_method,
            status: PayStatus::Processing,
            amount_capturable: 0,
            amount_received: 0,
            amount_refunded: 0,
            amount_refund_pending: 0,
            metadata: new.metadata,
            merchant_account: new.merchant_account,
            return_url: new.return_url,
            charge_id: None,
            decline: None,
            next_action_url: None,
            committed: false,
            created: self.clock.now_secs(),
            canceled_at: None,
            cancellation_reason: None,
        };
        self.payment_counts
            .entry(p.reference.clone())
            .or_default()
            .payments += 1;
        let happening = match outcome {
            CardOutcome::Approve => self.approve(ids, &mut p),
            CardOutcome::Decline(d) => decline(ids, &mut p, d),
            CardOutcome::RequiresAction => {
                p.status = PayStatus::RequiresAction;
                p.next_action_url = Some(action_url(&id));
                Happening::RequiresAction
            }
            CardOutcome::Pending => {
                p.status = PayStatus::Processing;
                if p.format == Format::Stripe {
                    p.charge_id = Some(ids.stripe("ch"));
                }
                Happening::Processing
            }
        };
        self.payment_order.push(id.clone());
        self.payments.insert(id, p.clone());
        (p, vec![happening])
    }

    fn approve(&mut self, ids: &Ids, p: &mut Payment) -> Happening {
        p.committed = true;
        p.next_action_url = None;
        self.payment_counts
            .entry(p.reference.clone())
            .or_default()
            .charges += 1;
        if p.format == Format::Stripe && p.charge_id.is_none() {
            p.charge_id = Some(ids.stripe("ch"));
        }
        if p.manual_capture {
            p.status = PayStatus::RequiresCapture;
            p.amount_capturable = p.amount;
            Happening::Authorized
        } else {
            p.status = PayStatus::Succeeded;
            p.amount_received = p.amount;
            let capture_psp = (p.format == Format::Adyen).then(|| ids.adyen_psp_reference());
            Happening::Succeeded { capture_psp }
        }
    }

    /// A `processing` payment learns its (successful) outcome.
    pub fn settle_payment(&mut self, ids: &Ids, id: &str) -> Option<Changed> {
        let mut p = self.payments.get(id)?.clone();
        if p.status != PayStatus::Processing {
            return None;
        }
        let happening = self.approve(ids, &mut p);
        self.payments.insert(p.id.clone(), p.clone());
        Some((p, vec![happening]))
    }

    /// The customer finished (or failed) the 3-D Secure step.
    pub fn complete_action(&mut self, ids: &Ids, id: &str, authenticated: bool) -> Option<Changed> {
        let mut p = self.payments.get(id)?.clone();
        if p.status != PayStatus::RequiresAction {
            return None;
        }
        let happening = if authenticated {
            self.approve(ids, &mut p)
        } else {
            decline(ids, &mut p, Decline::AuthenticationFailed)
        };
        self.payments.insert(p.id.clone(), p.clone());
        Some((p, vec![happening]))
    }

    /// Captures `amount` (None: all) of an authorised payment. One capture per
    /// payment, as Stripe: the uncaptured remainder is released.
    pub fn capture(
        &mut self,
        api_key: &str,
        id: &str,
        amount: Option<i64>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Payment, Refusal> {
        let p = self.payment_mut(api_key, id)?;
        if p.status != PayStatus::RequiresCapture {
            return Err(Refusal::UnexpectedState(p.status));
        }
        let amount = amount.unwrap_or(p.amount_capturable);
        if amount <= 0 {
            return Err(Refusal::AmountNotPositive);
        }
        if amount > p.amount_capturable {
            return Err(Refusal::AmountTooLarge {
                available: p.amount_capturable,
            });
        }
        p.amount_received = amount;
        p.amount_capturable = 0;
        p.status = PayStatus::Succeeded;
        p.metadata.extend(metadata.clone());
        Ok(p.clone())
    }

    /// Cancels a payment that has not taken money.
    pub fn cancel(
        &mut self,
        api_key: &str,
        id: &str,
        reason: Option<String>,
    ) -> Result<Payment, Refusal> {
        let now = self.clock.now_secs();
        let p = self.payment_mut(api_key, id)?;
        let allowed = match p.format {
            Format::Stripe => matches!(
                p.status,
                PayStatus::RequiresCapture | PayStatus::RequiresAction | PayStatus::Failed
            ),
            Format::Adyen => matches!(
                p.status,
                PayStatus::RequiresCapture | PayStatus::RequiresAction | PayStatus::Processing
            ),
        };
        if !allowed {
            return Err(Refusal::UnexpectedState(p.status));
        }
        p.status = PayStatus::Canceled;
        p.amount_capturable = 0;
        p.next_action_url = None;
        p.canceled_at = Some(now);
        p.cancellation_reason = reason;
        Ok(p.clone())
    }

    /// Creates a refund of a captured payment, never beyond what is still refundable.
    pub fn refund(
        &mut self,
        ids: &Ids,
        new: NewRefund,
    ) -> Result<(Payment, Refund, Vec<Happening>), Refusal> {
        let behaviour = self.refund_behaviour;
        let now = self.clock.now_secs();
        let p = self.payment_mut(&new.api_key, &new.payment_id)?;
        if p.status != PayStatus::Succeeded {
            return Err(Refusal::UnexpectedState(p.status));
        }
        if let Some(currency) = &new.currency {
            if !currency.eq_ignore_ascii_case(&p.currency) {
                return Err(Refusal::CurrencyMismatch);
            }
        }
        let available = p.amount_received - p.amount_refunded - p.amount_refund_pending;
        let amount = new.amount.unwrap_or(available);
        if amount <= 0 {
            return Err(if available <= 0 {
                Refusal::AmountTooLarge { available }
            } else {
                Refusal::AmountNotPositive
            });
        }
        if amount > available {
            return Err(Refusal::AmountTooLarge { available });
        }
        let id = match p.format {
            Format::Stripe => ids.stripe("re"),
            Format::Adyen => ids.adyen_psp_reference(),
        };
        let settled = behaviour == RefundBehaviour::Succeed;
        if settled {
            p.amount_refunded += amount;
        } else {
            p.amount_refund_pending += amount;
        }
        let refund = Refund {
            format: p.format,
            id: id.clone(),
            payment_id: p.id.clone(),
            charge_id: p.charge_id.clone(),
            api_key: new.api_key,
            reference: new.reference.or(new.idempotency_key.clone()),
            idempotency_key: new.idempotency_key,
            amount,
            currency: p.currency.clone(),
            status: if settled {
                RefundStatus::Succeeded
            } else {
                RefundStatus::Pending
            },
            metadata: new.metadata,
            created: now,
            failure_reason: None,
            settles_successfully: behaviour != RefundBehaviour::PendingThenFail,
        };
        let payment = p.clone();
        let count_key = refund.reference.clone().unwrap_or_else(|| id.clone());
        *self.refund_counts.entry(count_key).or_default() += 1;
        self.refund_order.push(id.clone());
        self.refunds.insert(id.clone(), refund.clone());
        let mut happenings = vec![Happening::RefundCreated {
            refund_id: id.clone(),
        }];
        if settled {
            happenings.push(Happening::RefundSucceeded { refund_id: id });
        }
        Ok((payment, refund, happenings))
    }

    /// A pending refund reaches its final state.
    pub fn settle_refund(&mut self, id: &str) -> Option<(Payment, Refund, Happening)> {
        let mut r = self.refunds.get(id)?.clone();
        if r.status != RefundStatus::Pending {
            return None;
        }
        let p = self.payments.get_mut(&r.payment_id)?;
        p.amount_refund_pending -= r.amount;
        let happening = if r.settles_successfully {
            p.amount_refunded += r.amount;
            r.status = RefundStatus::Succeeded;
            Happening::RefundSucceeded {
                refund_id: r.id.clone(),
            }
        } else {
            r.status = RefundStatus::Failed;
            r.failure_reason = Some("lost_or_stolen_card".to_owned());
            Happening::RefundFailed {
                refund_id: r.id.clone(),
            }
        };
        let payment = p.clone();
        self.refunds.insert(r.id.clone(), r.clone());
        Some((payment, r, happening))
    }

    pub fn pending_payment_ids(&self) -> Vec<String> {
        self.ids_where(|p| p.status == PayStatus::Processing)
    }

    pub fn pending_refund_ids(&self) -> Vec<String> {
        self.refund_order
            .iter()
            .filter(|id| {
                self.refunds
                    .get(*id)
                    .is_some_and(|r| r.status == RefundStatus::Pending)
            })
            .cloned()
            .collect()
    }

    fn ids_where(&self, keep: impl Fn(&Payment) -> bool) -> Vec<String> {
        self.payment_order
            .iter()
            .filter(|id| self.payments.get(*id).is_some_and(&keep))
            .cloned()
            .collect()
    }

    /// A payment visible to `api_key`.
    pub fn payment(&self, api_key: &str, id: &str) -> Option<&Payment> {
        self.payments.get(id).filter(|p| p.api_key == api_key)
    }

    pub fn any_payment(&self, id: &str) -> Option<&Payment> {
        self.payments.get(id)
    }

    fn payment_mut(&mut self, api_key: &str, id: &str) -> Result<&mut Payment, Refusal> {
        self.payments
            .get_mut(id)
            .filter(|p| p.api_key == api_key)
            .ok_or(Refusal::NotFound)
    }

    pub fn refund_by_id(&self, api_key: &str, id: &str) -> Option<&Refund> {
        self.refunds.get(id).filter(|r| r.api_key == api_key)
    }

    pub fn any_refund(&self, id: &str) -> Option<&Refund> {
        self.refunds.get(id)
    }

    /// Payments of `api_key` whose metadata has every `(key, value)` pair, oldest first.
    pub fn search_by_metadata(&self, api_key: &str, pairs: &[(String, String)]) -> Vec<Payment> {
        self.payment_order
            .iter()
            .filter_map(|id| self.payments.get(id))
            .filter(|p| p.api_key == api_key)
            .filter(|p| {
                pairs
                    .iter()
                    .all(|(k, v)| p.metadata.get(k).is_some_and(|have| have == v))
            })
            .cloned()
            .collect()
    }

    /// Refunds of one payment, oldest first.
    pub fn refunds_of(&self, api_key: &str, payment_id: &str) -> Vec<Refund> {
        self.refund_order
            .iter()
            .filter_map(|id| self.refunds.get(id))
            .filter(|r| r.api_key == api_key && r.payment_id == payment_id)
            .cloned()
            .collect()
    }

    pub fn all_payments(&self) -> Vec<Payment> {
        self.payment_order
            .iter()
            .filter_map(|id| self.payments.get(id))
            .cloned()
            .collect()
    }

    pub fn all_refunds(&self) -> Vec<Refund> {
        self.refund_order
            .iter()
            .filter_map(|id| self.refunds.get(id))
            .cloned()
            .collect()
    }

    pub fn count_for(&self, reference: &str) -> ReferenceCount {
        self.payment_counts
            .get(reference)
            .copied()
            .unwrap_or_default()
    }

    pub fn counts(&self) -> BTreeMap<String, ReferenceCount> {
        self.payment_counts.clone()
    }

    pub fn refund_count_for(&self, reference: &str) -> u32 {
        self.refund_counts.get(reference).copied().unwrap_or(0)
    }
}

fn decline(ids: &Ids, p: &mut Payment, d: Decline) -> Happening {
    p.status = PayStatus::Failed;
    p.decline = Some(d);
    p.next_action_url = None;
    if p.format == Format::Stripe {
        p.charge_id = Some(ids.stripe("ch"));
    }
    Happening::Declined
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_payment(manual: bool) -> NewPayment {
        NewPayment {
            format: Format::Stripe,
            api_key: "sk".into(),
            reference: "att_1".into(),
            idempotency_key: Some("att_1".into()),
            amount: 1000,
            currency: "EUR".into(),
            manual_capture: manual,
            payment_method: "pm_card_visa".into(),
            metadata: BTreeMap::new(),
            merchant_account: None,
            return_url: None,
        }
    }

    fn refund_of(id: &str, amount: i64) -> NewRefund {
        NewRefund {
            api_key: "sk".into(),
            payment_id: id.into(),
            amount: Some(amount),
            currency: None,
            reference: Some(format!("ref_{amount}")),
            idempotency_key: None,
            metadata: BTreeMap::new(),
        }
    }

    #[test]
    fn a_partial_capture_releases_the_remainder_and_allows_no_second_capture() {
        let ids = Ids::new(Some(1));
        let mut ledger = Ledger::new(RefundBehaviour::default(), SandboxClock::system());
        let (p, _) = ledger.create_payment(&ids, new_payment(true), CardOutcome::Approve, |_| {
            String::new()
        });
        let empty = BTreeMap::new();
        let captured = ledger.capture("sk", &p.id, Some(600), &empty);
        assert_eq!(
            captured.map(|p| (p.amount_received, p.amount_capturable)),
            Ok((600, 0))
        );
        assert_eq!(
            ledger.capture("sk", &p.id, Some(100), &empty).err(),
            Some(Refusal::UnexpectedState(PayStatus::Succeeded))
        );
    }

    #[test]
    fn refunds_never_exceed_the_captured_amount() {
        let ids = Ids::new(Some(2));
        let mut ledger = Ledger::new(RefundBehaviour::default(), SandboxClock::system());
        let (p, _) = ledger.create_payment(&ids, new_payment(false), CardOutcome::Approve, |_| {
            String::new()
        });
        assert!(ledger.refund(&ids, refund_of(&p.id, 700)).is_ok());
        assert_eq!(
            ledger.refund(&ids, refund_of(&p.id, 301)).err(),
            Some(Refusal::AmountTooLarge { available: 300 })
        );
        assert!(ledger.refund(&ids, refund_of(&p.id, 300)).is_ok());
        assert_eq!(
            ledger.any_payment(&p.id).map(|p| p.amount_refunded),
            Some(1000)
        );
    }

    #[test]
    fn a_declined_create_counts_a_payment_but_no_charge() {
        let ids = Ids::new(Some(3));
        let mut ledger = Ledger::new(RefundBehaviour::default(), SandboxClock::system());
        ledger.create_payment(
            &ids,
            new_payment(false),
            CardOutcome::Decline(Decline::Generic),
            |_| String::new(),
        );
        assert_eq!(
            ledger.count_for("att_1"),
            ReferenceCount {
                payments: 1,
                charges: 0
            }
        );
    }

    #[test]
    fn a_pending_refund_that_fails_gives_its_amount_back() {
        let ids = Ids::new(Some(4));
        let mut ledger = Ledger::new(RefundBehaviour::PendingThenFail, SandboxClock::system());
        let (p, _) = ledger.create_payment(&ids, new_payment(false), CardOutcome::Approve, |_| {
            String::new()
        });
        let (_, r, _) = ledger
            .refund(&ids, refund_of(&p.id, 1000))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            ledger.refund(&ids, refund_of(&p.id, 1)).err(),
            Some(Refusal::AmountTooLarge { available: 0 })
        );
        let settled = ledger
            .settle_refund(&r.id)
            .map(|(p, r, _)| (p.amount_refunded, r.status));
        assert_eq!(settled, Some((0, RefundStatus::Failed)));
        assert!(ledger.refund(&ids, refund_of(&p.id, 1000)).is_ok());
    }
}
