//! The failure table, as data: what a PSP's failure code means, and whether
//! routing may try the payment at another connector account after it
//! (issue 13; seed 001 §9's hard rule: only a definitive failure may lead to a
//! new attempt, and only some definitive failures should).
//!
//! One table per wire format ([`STRIPE_FAILURES`], [`ADYEN_FAILURES`]), one
//! commented row per code the adapter puts into `failure.code`, plus the
//! host's own codes ([`HOST_FAILURES`], e.g. [`CREDENTIALS_REFUSED_CODE`]),
//! which mean the same whatever the adapter. A merchant may override any row
//! for one adapter ([`FailureOverride`]); [`classify_failure`] is the one pure
//! lookup: merchant override → host code → the adapter's table → the
//! fallback. The fallback never cascades: a code nobody has classified is
//! treated like a decline of the card itself, so an unclassified answer can
//! never lead to a second charge elsewhere.
//!
//! "Cascade" only says the *code* allows another account. Whether a new
//! attempt is actually started (nothing UNKNOWN or in flight, an eligible
//! account left, the deadline not passed) is the routing step's
//! decision.

use serde::{Deserialize, Serialize};

/// The host's code for an attempt whose PSP refused the connector account's
/// credentials (HTTP 401/403, the PSP's documented authentication failure)
/// before executing anything: no money moved, and the account is at fault,
/// not the card.
pub const CREDENTIALS_REFUSED_CODE: &str = "credentials_refused";

/// What a failure code means, by meaning rather than by PSP wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The card issuer could not be reached or did not answer in time.
    IssuerUnavailable,
    /// The acquirer or processor behind the PSP failed.
    ProcessorUnavailable,
    /// The PSP reports an error while processing, not a decision about the card.
    ProcessingError,
    /// The PSP refused the connector account's credentials; nothing executed.
    CredentialsRefused,
    /// The issuer declined for lack of funds or over a limit.
    InsufficientFunds,
    /// The card is reported lost or stolen, or must be retained.
    LostOrStolenCard,
    /// The issuer, acquirer or PSP suspects fraud.
    Fraud,
    /// A generic refusal by the issuer ("do not honor", "refused").
    IssuerDeclined,
    /// The card details are wrong or the card is expired or blocked.
    InvalidCard,
    /// The customer failed or abandoned authentication (3-D Secure).
    AuthenticationFailed,
    /// The PSP refused the request itself (parameters, unsupported method).
    InvalidRequest,
    /// Nobody has classified this code.
    Unclassified,
}

impl FailureClass {
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureClass::IssuerUnavailable => "issuer_unavailable",
            FailureClass::ProcessorUnavailable => "processor_unavailable",
            FailureClass::ProcessingError => "processing_error",
            FailureClass::CredentialsRefused => "credentials_refused",
            FailureClass::InsufficientFunds => "insufficient_funds",
            FailureClass::LostOrStolenCard => "lost_or_stolen_card",
            FailureClass::Fraud => "fraud",
            FailureClass::IssuerDeclined => "issuer_declined",
            FailureClass::InvalidCard => "invalid_card",
            FailureClass::AuthenticationFailed => "authentication_failed",
            FailureClass::InvalidRequest => "invalid_request",
            FailureClass::Unclassified => "unclassified",
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of a failure table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureRow {
    /// The adapter's `failure.code`, compared exactly.
    pub code: &'static str,
    pub class: FailureClass,
    /// Another connector account may be tried after this failure.
    pub cascade: bool,
}

const fn row(code: &'static str, class: FailureClass, cascade: bool) -> FailureRow {
    FailureRow {
        code,
        class,
        cascade,
    }
}

use FailureClass as C;

/// Codes the host itself writes, the same for every adapter.
#[rustfmt::skip]
pub static HOST_FAILURES: &[FailureRow] = &[
    // HTTP 401/403 to a first send: the PSP authenticates before it executes
    // anything, so no money moved; another account has other credentials.
    row(CREDENTIALS_REFUSED_CODE, C::CredentialsRefused, true),
];

/// The Stripe format: `error.decline_code`, else `error.code` (adapters/stripe).
#[rustfmt::skip]
pub static STRIPE_FAILURES: &[FailureRow] = &[
    // The issuer or the network did not decide: another processor may reach it.
    row("issuer_not_available", C::IssuerUnavailable, true),
    row("try_again_later", C::IssuerUnavailable, true),
    row("processing_error", C::ProcessingError, true),
    // Decisions about the card or the customer: the same card fails everywhere,
    // and trying elsewhere after fraud or a stolen card is what fraudsters do.
    row("insufficient_funds", C::InsufficientFunds, false),
    row("card_velocity_exceeded", C::InsufficientFunds, false),
    row("withdrawal_count_limit_exceeded", C::InsufficientFunds, false),
    row("stolen_card", C::LostOrStolenCard, false),
    row("lost_card", C::LostOrStolenCard, false),
    row("pickup_card", C::LostOrStolenCard, false),
    row("fraudulent", C::Fraud, false),
    row("merchant_blacklist", C::Fraud, false),
    row("security_violation", C::Fraud, false),
    row("generic_decline", C::IssuerDeclined, false),
    row("do_not_honor", C::IssuerDeclined, false),
    row("card_declined", C::IssuerDeclined, false),
    row("transaction_not_allowed", C::IssuerDeclined, false),
    row("expired_card", C::InvalidCard, false),
    row("incorrect_cvc", C::InvalidCard, false),
    row("incorrect_number", C::InvalidCard, false),
    row("invalid_account", C::InvalidCard, false),
    row("payment_intent_authentication_failure", C::AuthenticationFailed, false),
    row("authentication_required", C::AuthenticationFailed, false),
    row("parameter_invalid_integer", C::InvalidRequest, false),
    row("parameter_missing", C::InvalidRequest, false),
];

/// The Adyen format: `refusalReasonCode`, else `refusalReason`, else the
/// service error's `errorCode` (adapters/adyen).
#[rustfmt::skip]
pub static ADYEN_FAILURES: &[FailureRow] = &[
    row("4", C::ProcessorUnavailable, true),       // Acquirer Error
    row("Acquirer Error", C::ProcessorUnavailable, true),
    row("9", C::IssuerUnavailable, true),          // Issuer Unavailable
    row("Issuer Unavailable", C::IssuerUnavailable, true),
    row("2", C::IssuerDeclined, false),            // Refused
    row("Refused", C::IssuerDeclined, false),
    row("27", C::IssuerDeclined, false),           // Declined Non Generic
    row("23", C::IssuerDeclined, false),           // Transaction Not Permitted
    row("12", C::InsufficientFunds, false),        // Not enough balance
    row("Not enough balance", C::InsufficientFunds, false),
    row("28", C::InsufficientFunds, false),        // Withdrawal amount exceeded
    row("5", C::LostOrStolenCard, false),          // Blocked Card
    row("14", C::Fraud, false),                    // Acquirer Fraud
    row("20", C::Fraud, false),                    // FRAUD
    row("22", C::Fraud, false),                    // FRAUD-CANCELLED
    row("31", C::Fraud, false),                    // Issuer Suspected Fraud
    row("6", C::InvalidCard, false),               // Expired Card
    row("8", C::InvalidCard, false),               // Invalid Card Number
    row("24", C::InvalidCard, false),              // CVC Declined
    row("11", C::AuthenticationFailed, false),     // 3D Not Authenticated
    row("3D Not Authenticated", C::AuthenticationFailed, false),
];

/// The shipped table of an adapter (by its name in `describe`); an adapter
/// without one only has the host's codes and the fallback.
pub fn default_table(adapter: &str) -> &'static [FailureRow] {
    match adapter {
        "stripe" => STRIPE_FAILURES,
        "adyen" => ADYEN_FAILURES,
        _ => &[],
    }
}

/// A merchant's own reading of one code of one adapter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FailureOverride {
    pub adapter: String,
    pub code: String,
    pub class: FailureClass,
    pub cascade: bool,
}

/// Which table answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictSource {
    Merchant,
    Host,
    Adapter,
    /// No row knew the code: never cascades.
    Fallback,
}

/// What a failure code means for routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FailureVerdict {
    pub class: FailureClass,
    pub cascade: bool,
    pub source: VerdictSource,
}

/// Classify `code` as reported through `adapter`: the merchant's override
/// first, then the host's codes, then the adapter's shipped table; an
/// unknown code is `Unclassified` and never cascades.
pub fn classify_failure(
    adapter: &str,
    code: &str,
    overrides: &[FailureOverride],
) -> FailureVerdict {
    if let Some(own) = overrides
        .iter()
        .find(|o| o.adapter == adapter && o.code == code)
    {
        return FailureVerdict {
            class: own.class,
            cascade: own.cascade,
            source: VerdictSource::Merchant,
        };
    }
    let shipped = |table: &[FailureRow], source| {
        table
            .iter()
            .find(|r| r.code == code)
            .map(|r| FailureVerdict {
                class: r.class,
                cascade: r.cascade,
                source,
            })
    };
    shipped(HOST_FAILURES, VerdictSource::Host)
        .or_else(|| shipped(default_table(adapter), VerdictSource::Adapter))
        .unwrap_or(FailureVerdict {
            class: FailureClass::Unclassified,
            cascade: false,
            source: VerdictSource::Fallback,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_issuers_and_processing_errors_may_try_elsewhere_in_both_formats() {
        for (adapter, code) in [
            ("stripe", "issuer_not_available"),
            ("stripe", "processing_error"),
            ("adyen", "4"),
            ("adyen", "9"),
        ] {
            assert!(
                classify_failure(adapter, code, &[]).cascade,
                "{adapter} {code}"
            );
        }
    }

    #[test]
    fn funds_stolen_cards_and_fraud_never_try_elsewhere_in_both_formats() {
        for (adapter, code, class) in [
            ("stripe", "insufficient_funds", C::InsufficientFunds),
            ("stripe", "stolen_card", C::LostOrStolenCard),
            ("stripe", "fraudulent", C::Fraud),
            ("adyen", "12", C::InsufficientFunds),
            ("adyen", "5", C::LostOrStolenCard),
            ("adyen", "20", C::Fraud),
        ] {
            let verdict = classify_failure(adapter, code, &[]);
            assert_eq!(verdict.class, class, "{adapter} {code}");
            assert!(!verdict.cascade, "{adapter} {code}");
        }
    }

    #[test]
    fn credentials_refused_cascades_whatever_the_adapter() {
        for adapter in ["stripe", "adyen", "test-well-behaved"] {
            let verdict = classify_failure(adapter, CREDENTIALS_REFUSED_CODE, &[]);
            assert_eq!(verdict.class, C::CredentialsRefused);
            assert!(verdict.cascade);
            assert_eq!(verdict.source, VerdictSource::Host);
        }
    }

    #[test]
    fn an_unknown_code_or_adapter_never_cascades() {
        for (adapter, code) in [
            ("stripe", "new_code"),
            ("other", "issuer_not_available"),
            ("adyen", ""),
        ] {
            let verdict = classify_failure(adapter, code, &[]);
            assert_eq!(verdict.source, VerdictSource::Fallback);
            assert!(!verdict.cascade);
        }
    }

    #[test]
    fn a_merchant_override_wins_but_only_for_its_adapter_and_code() {
        let overrides = [FailureOverride {
            adapter: "stripe".into(),
            code: "processing_error".into(),
            class: C::ProcessingError,
            cascade: false,
        }];
        let verdict = classify_failure("stripe", "processing_error", &overrides);
        assert_eq!(
            (verdict.cascade, verdict.source),
            (false, VerdictSource::Merchant)
        );
        assert!(classify_failure("adyen", "4", &overrides).cascade);
        assert!(classify_failure("stripe", "issuer_not_available", &overrides).cascade);
    }

    #[test]
    fn no_code_appears_twice_in_a_table() {
        for table in [HOST_FAILURES, STRIPE_FAILURES, ADYEN_FAILURES] {
            let mut codes: Vec<_> = table.iter().map(|r| r.code).collect();
            codes.sort_unstable();
            let before = codes.len();
            codes.dedup();
            assert_eq!(before, codes.len());
        }
    }

    #[test]
    fn only_unavailability_processing_and_credentials_cascade_by_default() {
        let may = [
            C::IssuerUnavailable,
            C::ProcessorUnavailable,
            C::ProcessingError,
            C::CredentialsRefused,
        ];
        for table in [HOST_FAILURES, STRIPE_FAILURES, ADYEN_FAILURES] {
            for r in table {
                assert_eq!(r.cascade, may.contains(&r.class), "{}", r.code);
            }
        }
    }
}
