//! Normalised payment events: the only input that can move a state.
//! They mirror the `event-kind`, `evidence-source` and `failure-category` of
//! `wit/psp-adapter.wit`, plus the host-only `Operator` evidence and the
//! host-only `VOID_SUBMITTED` kind.

use serde::{Deserialize, Serialize};

macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)*
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            pub fn as_str(&self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)* _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum! {
    /// What happened, normalised across PSPs.
    EventKind {
        AttemptSubmitted => "ATTEMPT_SUBMITTED",
        /// Non-final progress; stale once the attempt is final.
        PaymentProcessing => "PAYMENT_PROCESSING",
        CustomerActionRequired => "CUSTOMER_ACTION_REQUIRED",
        PaymentAuthorized => "PAYMENT_AUTHORIZED",
        PaymentCaptured => "PAYMENT_CAPTURED",
        CaptureFailed => "CAPTURE_FAILED",
        PaymentSucceeded => "PAYMENT_SUCCEEDED",
        PaymentFailed => "PAYMENT_FAILED",
        ResultUnknown => "RESULT_UNKNOWN",
        PaymentCanceled => "PAYMENT_CANCELED",
        RefundProcessing => "REFUND_PROCESSING",
        RefundSucceeded => "REFUND_SUCCEEDED",
        RefundFailed => "REFUND_FAILED",
        RefundUnknown => "REFUND_UNKNOWN",
        Chargeback => "CHARGEBACK",
        /// Host-only (never produced by an adapter): a void of an
        /// authorization is recorded as sent through the door before the call,
        /// so a crash after sending it converges by query.
        VoidSubmitted => "VOID_SUBMITTED",
    }
}

impl EventKind {
    /// Kinds only the host builds: no adapter event maps to them.
    pub fn is_host_only(&self) -> bool {
        matches!(self, EventKind::VoidSubmitted)
    }
}

text_enum! {
    /// Where the evidence for an event came from, weakest first.
    EvidenceSource {
        /// The PSP's direct answer to our request.
        SyncResponse => "sync_response",
        /// A PSP webhook whose signature was verified.
        Webhook => "webhook",
        /// The PSP's answer to a query with the original reference.
        Query => "query",
        /// A controlled, two-person-approved human correction.
        Operator => "operator",
        /// A line of the PSP's settlement report (issue 14): proof that money
        /// moved. It may close an open item as the success the PSP booked,
        /// never as a failure, and never leaves a terminal state.
        Reconciliation => "reconciliation",
    }
}

text_enum! {
    /// Why something failed, by meaning. Only `Declined` is a definitive failure.
    FailureCategory {
        Declined => "declined",
        Retryable => "retryable",
        Unknown => "unknown",
        Configuration => "configuration",
        Conflict => "conflict",
        Unsupported => "unsupported",
    }
}

impl FailureCategory {
    /// Only a definitive decline may end an attempt as FAILED; everything else
    /// leaves the outcome open.
    pub fn is_definitive(&self) -> bool {
        matches!(self, FailureCategory::Declined)
    }
}

/// A classified failure: the category drives decisions, the PSP's code and
/// message are kept for the audit history. Never carries secrets or card data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Failure {
    pub category: FailureCategory,
    pub code: String,
    pub message: String,
}

/// One normalised payment event (the host-side twin of the WIT `payment-event`).
///
/// Every state change of every aggregate is the decision about one of these.
/// Sync responses and queries come from the adapter's `parse-response`,
/// webhooks from `handle-webhook`, transport failures are built by the host
/// itself (kind `RESULT_UNKNOWN`, evidence `sync_response`), and operator
/// corrections are built by the admin API with evidence `operator`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentEvent {
    pub kind: EventKind,
    pub evidence: EvidenceSource,
    /// The host's attempt reference, when the PSP echoed it.
    pub attempt_reference: Option<String>,
    /// The host's capture or refund reference, for capture and refund events.
    pub action_reference: Option<String>,
    /// The PSP's id of the object the event is about (payment, refund or capture).
    pub psp_reference: Option<String>,
    /// For refund, capture and chargeback events: the PSP's id of the payment.
    pub psp_payment_reference: Option<String>,
    pub amount: Option<crate::Money>,
    /// The PSP's unique id of this notification (webhooks only).
    pub provider_event_id: Option<String>,
    /// The PSP's own status text, verbatim, for the audit history.
    pub raw_status: String,
    pub failure: Option<Failure>,
    /// For `CUSTOMER_ACTION_REQUIRED`: where the customer must go.
    pub next_action_url: Option<String>,
}

impl PaymentEvent {
    /// An event with only a kind and an evidence source; the rest is filled in
    /// with struct-update syntax where needed.
    pub fn new(kind: EventKind, evidence: EvidenceSource) -> Self {
        PaymentEvent {
            kind,
            evidence,
            attempt_reference: None,
            action_reference: None,
            psp_reference: None,
            psp_payment_reference: None,
            amount: None,
            provider_event_id: None,
            raw_status: String::new(),
            failure: None,
            next_action_url: None,
        }
    }

    /// Whether a failure kind is a definitive one. A failure event whose
    /// category leaves the outcome open (retryable, conflict, ...) proves
    /// nothing about the money, so the core treats it as "unknown". Operator
    /// evidence is a controlled, approved correction and is always definitive.
    pub fn failure_is_definitive(&self) -> bool {
        self.evidence == EvidenceSource::Operator
            || self
                .failure
                .as_ref()
                .is_none_or(|failure| failure.category.is_definitive())
    }
}

/// The failure code by which an adapter says, in answer to a query, that the
/// PSP has no object with the original reference (e.g. a Stripe-format search
/// that finds no PaymentIntent carrying the attempt reference). A convention
/// of the contract until it has a typed "not found" (docs/psp-wire-subsets.md).
pub const NOT_FOUND_CODE: &str = "not_found";

impl PaymentEvent {
    /// A query answer saying the PSP has no such payment (or refund): the only evidence
    /// that lets recovery re-send the original request (with the same
    /// idempotency key, within the PSP's retention: `decide_resend`).
    pub fn proves_absence(&self) -> bool {
        self.evidence == EvidenceSource::Query
            && matches!(
                self.kind,
                EventKind::ResultUnknown | EventKind::RefundUnknown
            )
            && self
                .failure
                .as_ref()
                .is_some_and(|failure| failure.code == NOT_FOUND_CODE)
    }

    /// A query answer saying the payment is still only authorized: no capture
    /// of it has completed at the PSP, so a capture we hold as open may never
    /// have reached it (a process killed between recording it as sent and
    /// sending it). Only a re-send with the same key may follow
    /// (`decide_resend`), which the PSP answers from its stored result if it
    /// did receive it.
    pub fn shows_uncaptured(&self) -> bool {
        self.evidence == EvidenceSource::Query && self.kind == EventKind::PaymentAuthorized
    }
}

/// What the store remembers about the last event an aggregate accepted, so a
/// re-delivery is recognised as a duplicate even when the PSP gives it a new
/// notification id (seed 001 §5, the two layers of idempotency).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EventIdentity {
    /// Transport-level identity: the PSP's notification id, when it has one.
    pub provider_event_id: Option<String>,
    /// Business-level identity: kind + PSP reference + normalised result
    /// (amount and failure code), e.g. `PAYMENT_SUCCEEDED|pi_1|EUR 1000|-`.
    pub business_key: String,
}

impl EventIdentity {
    pub fn of(event: &PaymentEvent) -> Self {
        let amount = event
            .amount
            .map(|m| format!("{} {}", m.currency, m.amount_minor))
            .unwrap_or_else(|| "-".to_owned());
        let failure = event
            .failure
            .as_ref()
            .map(|f| f.code.as_str())
            .unwrap_or("-");
        EventIdentity {
            provider_event_id: event.provider_event_id.clone(),
            business_key: format!(
                "{}|{}|{}|{}",
                event.kind,
                event.psp_reference.as_deref().unwrap_or("-"),
                amount,
                failure
            ),
        }
    }

    /// Same notification, or the same fact told again.
    pub fn same_as(&self, other: &EventIdentity) -> bool {
        let same_notification = matches!(
            (&self.provider_event_id, &other.provider_event_id),
            (Some(a), Some(b)) if a == b
        );
        same_notification || self.business_key == other.business_key
    }
}
