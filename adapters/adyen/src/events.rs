//! Small constructors for normalised events and failures, so every mapping fills every
//! field deliberately.

use crate::types::{EventKind, EvidenceSource, Failure, FailureCategory, Money, PaymentEvent};

/// Longest PSP message copied into a failure; PSP messages are for humans and the audit
/// trail, not for storage of arbitrary payloads.
const MAX_MESSAGE_CHARS: usize = 500;

/// An event of `kind` with every optional field empty.
pub fn event(kind: EventKind, evidence: EvidenceSource, raw_status: &str) -> PaymentEvent {
    PaymentEvent {
        kind,
        attempt_reference: None,
        action_reference: None,
        psp_reference: None,
        psp_payment_reference: None,
        amount: None,
        provider_event_id: None,
        evidence,
        raw_status: raw_status.to_string(),
        failure: None,
        next_action_url: None,
    }
}

/// A failure with a PSP code and a bounded human message.
pub fn failure(category: FailureCategory, code: &str, message: &str) -> Failure {
    Failure {
        category,
        code: code.to_string(),
        message: message.chars().take(MAX_MESSAGE_CHARS).collect(),
    }
}

/// Money from an amount and its currency; None without a currency.
pub fn money(amount_minor: Option<i64>, currency: Option<&str>) -> Option<Money> {
    match (amount_minor, currency) {
        (Some(amount_minor), Some(currency)) if !currency.is_empty() => Some(Money {
            amount_minor,
            currency: currency.to_ascii_uppercase(),
        }),
        _ => None,
    }
}
