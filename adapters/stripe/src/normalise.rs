//! Stripe objects → normalised events. Shared by responses (sync and query evidence) and
//! webhooks, so the same object always means the same thing whatever carried it.

use crate::events::{event, failure, money};
use crate::model::{PaymentIntent, Refund, META_ATTEMPT, META_CAPTURE, META_REFUND};
use crate::types::{EventKind, EvidenceSource, FailureCategory, Operation, PaymentEvent};

/// Where an object came from, and what the host already knows about it.
#[derive(Debug, Clone, Default)]
pub struct Origin<'a> {
    pub evidence: Option<EvidenceSource>,
    /// The webhook's event id (webhooks only).
    pub provider_event_id: Option<String>,
    /// The operation whose response this is (responses only).
    pub operation: Option<Operation>,
    /// The host's references from the operation context (responses only); used when the
    /// object does not echo them in its metadata.
    pub attempt_reference: Option<&'a str>,
    pub action_reference: Option<&'a str>,
}

impl Origin<'_> {
    fn evidence(&self) -> EvidenceSource {
        self.evidence.unwrap_or(EvidenceSource::SyncResponse)
    }
}

/// A PaymentIntent's status as an event.
///
/// | status | event |
/// |---|---|
/// | `requires_payment_method` | `payment-failed` (declined, code from `last_payment_error`): we always confirm on creation, so this status means the confirmation failed |
/// | `requires_confirmation` | `attempt-submitted` |
/// | `requires_action` | `customer-action-required` with `next_action.redirect_to_url.url` |
/// | `processing` | `payment-processing` |
/// | `requires_capture` | `payment-authorized` (amount = `amount_capturable`) |
/// | `canceled` | `payment-canceled` |
/// | `succeeded` | `payment-captured` for manual capture, else `payment-succeeded` (amount = `amount_received`) |
/// | anything else | `result-unknown` |
pub fn intent_event(pi: &PaymentIntent, origin: &Origin) -> PaymentEvent {
    match pi.status.as_str() {
        "requires_payment_method" => intent_failed(pi, origin),
        "requires_confirmation" => intent_base(pi, EventKind::AttemptSubmitted, origin),
        "requires_action" => intent_action_required(pi, origin),
        "processing" => intent_base(pi, EventKind::PaymentProcessing, origin),
        "requires_capture" => intent_authorized(pi, origin),
        "canceled" => intent_base(pi, EventKind::PaymentCanceled, origin),
        "succeeded" => intent_succeeded(pi, origin),
        other => {
            let mut ev = intent_base(pi, EventKind::ResultUnknown, origin);
            ev.failure = Some(failure(
                FailureCategory::Unknown,
                "unrecognised_status",
                &format!("PaymentIntent status `{other}` is not one the adapter knows"),
            ));
            ev
        }
    }
}

/// The fields every PaymentIntent event shares.
pub fn intent_base(pi: &PaymentIntent, kind: EventKind, origin: &Origin) -> PaymentEvent {
    let mut ev = event(kind, origin.evidence(), &pi.status);
    ev.attempt_reference = pi
        .metadata
        .get(META_ATTEMPT)
        .or(origin.attempt_reference)
        .map(str::to_string);
    ev.psp_reference = Some(pi.id.clone());
    ev.provider_event_id = origin.provider_event_id.clone();
    ev
}

pub fn intent_failed(pi: &PaymentIntent, origin: &Origin) -> PaymentEvent {
    let mut ev = intent_base(pi, EventKind::PaymentFailed, origin);
    let error = pi.last_payment_error.clone().unwrap_or_default();
    ev.failure = Some(failure(
        FailureCategory::Declined,
        error.best_code().unwrap_or("payment_failed"),
        error
            .message
            .as_deref()
            .unwrap_or("the payment method was declined"),
    ));
    ev
}

pub fn intent_action_required(pi: &PaymentIntent, origin: &Origin) -> PaymentEvent {
    let mut ev = intent_base(pi, EventKind::CustomerActionRequired, origin);
    ev.next_action_url = pi
        .next_action
        .as_ref()
        .and_then(|a| a.redirect_to_url.as_ref())
        .and_then(|r| r.url.clone());
    ev
}

pub fn intent_authorized(pi: &PaymentIntent, origin: &Origin) -> PaymentEvent {
    let mut ev = intent_base(pi, EventKind::PaymentAuthorized, origin);
    ev.amount = money(
        pi.amount_capturable.filter(|a| *a > 0).or(pi.amount),
        pi.currency.as_deref(),
    );
    ev
}

/// `succeeded` means captured. For a manual-capture intent that is a capture of an
/// authorization; for automatic capture it is the sale's success.
pub fn intent_succeeded(pi: &PaymentIntent, origin: &Origin) -> PaymentEvent {
    let manual = match pi.capture_method.as_deref() {
        Some(method) => method == "manual",
        None => origin.operation == Some(Operation::Capture),
    };
    let amount = money(pi.amount_received.or(pi.amount), pi.currency.as_deref());
    if manual {
        let mut ev = intent_base(pi, EventKind::PaymentCaptured, origin);
        ev.action_reference = pi
            .metadata
            .get(META_CAPTURE)
            .or(origin.action_reference)
            .map(str::to_string);
        ev.psp_payment_reference = Some(pi.id.clone());
        ev.amount = amount;
        ev
    } else {
        let mut ev = intent_base(pi, EventKind::PaymentSucceeded, origin);
        ev.amount = amount;
        ev
    }
}

/// A Refund's status as an event.
///
/// | status | event |
/// |---|---|
/// | `pending`, `requires_action` | `refund-processing` |
/// | `succeeded` | `refund-succeeded` |
/// | `failed` | `refund-failed` (declined, code = `failure_reason`) |
/// | `canceled` | `refund-failed` (declined, code `canceled`) |
/// | anything else | `refund-unknown` |
pub fn refund_event(re: &Refund, origin: &Origin) -> PaymentEvent {
    let (kind, fail) = match re.status.as_str() {
        "pending" | "requires_action" => (EventKind::RefundProcessing, None),
        "succeeded" => (EventKind::RefundSucceeded, None),
        "failed" => (
            EventKind::RefundFailed,
            Some(failure(
                FailureCategory::Declined,
                re.failure_reason.as_deref().unwrap_or("failed"),
                "the refund failed",
            )),
        ),
        "canceled" => (
            EventKind::RefundFailed,
            Some(failure(
                FailureCategory::Declined,
                "canceled",
                "the refund was canceled",
            )),
        ),
        other => (
            EventKind::RefundUnknown,
            Some(failure(
                FailureCategory::Unknown,
                "unrecognised_status",
                &format!("Refund status `{other}` is not one the adapter knows"),
            )),
        ),
    };
    let mut ev = event(kind, origin.evidence(), &re.status);
    ev.attempt_reference = re
        .metadata
        .get(META_ATTEMPT)
        .or(origin.attempt_reference)
        .map(str::to_string);
    ev.action_reference = re
        .metadata
        .get(META_REFUND)
        .or(origin.action_reference)
        .map(str::to_string);
    ev.psp_reference = Some(re.id.clone());
    ev.psp_payment_reference = re.payment_intent.as_ref().map(|p| p.id().to_string());
    ev.amount = money(re.amount, re.currency.as_deref());
    ev.provider_event_id = origin.provider_event_id.clone();
    ev.failure = fail;
    ev
}
