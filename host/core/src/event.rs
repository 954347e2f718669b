//! Normalised payment events: the only input that can move a state.
//! They mirror the `event-kind`, `evidence-source` and `failure-category` of
//! `wit/psp-adapter.wit`, plus the host-only `Operator` evidence.

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
