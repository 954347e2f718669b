//! Payment method tokens select the sandbox's behaviour (docs/psp-wire-subsets.md).

/// How the card network answers an authorisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CardOutcome {
    Approve,
    Decline(Decline),
    /// The customer must authenticate first (3-D Secure).
    RequiresAction,
    /// Accepted, outcome known only later (settled by timer or `settle_pending`).
    Pending,
}

/// A definitive decline, with each format's codes. The last four are only
/// ever set per account (`PUT /_sandbox/account_declines/{api_key}`), for
/// routing tests and the demo: the same card declines at one account and
/// not at another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decline {
    Generic,
    InsufficientFunds,
    /// The customer failed or abandoned 3-D Secure.
    AuthenticationFailed,
    /// The issuer could not be reached.
    IssuerUnavailable,
    /// The processor behind the PSP failed.
    ProcessingError,
    StolenCard,
    Fraud,
}

impl Decline {
    /// Stripe `error.code`.
    pub fn stripe_code(self) -> &'static str {
        match self {
            Decline::AuthenticationFailed => "payment_intent_authentication_failure",
            Decline::ProcessingError => "processing_error",
            _ => "card_declined",
        }
    }

    /// Stripe `error.decline_code`, when the code is `card_declined`.
    pub fn stripe_decline_code(self) -> Option<&'static str> {
        match self {
            Decline::Generic => Some("generic_decline"),
            Decline::InsufficientFunds => Some("insufficient_funds"),
            Decline::AuthenticationFailed | Decline::ProcessingError => None,
            Decline::IssuerUnavailable => Some("issuer_not_available"),
            Decline::StolenCard => Some("stolen_card"),
            Decline::Fraud => Some("fraudulent"),
        }
    }

    pub fn stripe_message(self) -> &'static str {
        match self {
            Decline::Generic => "Your card was declined.",
            Decline::InsufficientFunds => "Your card has insufficient funds.",
            Decline::AuthenticationFailed => {
                "We are unable to authenticate your payment method. Please choose a different payment method and try again."
            }
            Decline::IssuerUnavailable => "Your card was declined: the issuer is not available.",
            Decline::ProcessingError => {
                "An error occurred while processing your card. Try again in a little bit."
            }
            Decline::StolenCard | Decline::Fraud => "Your card was declined.",
        }
    }

    /// Adyen `refusalReason`.
    pub fn adyen_reason(self) -> &'static str {
        match self {
            Decline::Generic => "Refused",
            Decline::InsufficientFunds => "Not enough balance",
            Decline::AuthenticationFailed => "3D Not Authenticated",
            Decline::IssuerUnavailable => "Issuer Unavailable",
            Decline::ProcessingError => "Acquirer Error",
            Decline::StolenCard => "Blocked Card",
            Decline::Fraud => "FRAUD",
        }
    }

    /// Adyen `refusalReasonCode`.
    pub fn adyen_reason_code(self) -> &'static str {
        match self {
            Decline::Generic => "2",
            Decline::InsufficientFunds => "12",
            Decline::AuthenticationFailed => "11",
            Decline::IssuerUnavailable => "9",
            Decline::ProcessingError => "4",
            Decline::StolenCard => "5",
            Decline::Fraud => "20",
        }
    }
}

/// What happens around the answer, independent of the card outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Normal,
    /// Commit, then hold the answer for `timeout_hold`.
    CommitThenTimeout,
    /// `500` before anything executes.
    ServerError,
    /// Wait `slow_delay`, then execute and answer.
    Slow,
    /// Deliver the webhooks (and wait for their acknowledgement) before answering.
    WebhookBeforeResponse,
    /// Commit, then answer `200` with a body that is not JSON.
    Garbage,
}

/// The behaviour a payment method token selects. Unknown tokens behave like `pm_card_visa`.
pub fn behaviour_for(token: &str) -> (CardOutcome, Transport) {
    match token {
        "pm_card_chargeDeclined" => (CardOutcome::Decline(Decline::Generic), Transport::Normal),
        "pm_card_insufficient_funds" => (
            CardOutcome::Decline(Decline::InsufficientFunds),
            Transport::Normal,
        ),
        "pm_card_threeDSecureRequired" => (CardOutcome::RequiresAction, Transport::Normal),
        "pm_sluice_commit_then_timeout" => (CardOutcome::Approve, Transport::CommitThenTimeout),
        "pm_sluice_server_error" => (CardOutcome::Approve, Transport::ServerError),
        "pm_sluice_slow" => (CardOutcome::Approve, Transport::Slow),
        "pm_sluice_late_webhook_only" => (CardOutcome::Pending, Transport::Normal),
        "pm_sluice_webhook_before_response" => {
            (CardOutcome::Approve, Transport::WebhookBeforeResponse)
        }
        "pm_sluice_garbage" => (CardOutcome::Approve, Transport::Garbage),
        _ => (CardOutcome::Approve, Transport::Normal),
    }
}

/// The card outcome at one account: the token's, unless the account has a
/// decline set and the token would have been approved.
pub fn outcome_at_account(
    token_outcome: CardOutcome,
    account_decline: Option<Decline>,
) -> CardOutcome {
    match (token_outcome, account_decline) {
        (CardOutcome::Approve, Some(decline)) => CardOutcome::Decline(decline),
        (outcome, _) => outcome,
    }
}

/// What the `pm_sluice_garbage` answer carries instead of JSON.
pub const GARBAGE_BODY: &str = "<html><body>502 Bad Gateway</body></html>\u{0}\u{1}not json";
