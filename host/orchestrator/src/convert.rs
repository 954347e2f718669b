//! The one place where the adapter contract's types (generated from
//! `wit/psp-adapter.wit`) meet `sluice-core`'s domain types.
//!
//! Adapters are untrusted, so this is also where the host refuses to take an
//! adapter's word for things only the host can know:
//!
//! - the *evidence source* of an event is set by the host from how it was
//!   obtained (sync response, query answer, verified webhook), whatever the
//!   adapter claims: only verified evidence may resolve an UNKNOWN, so an
//!   adapter must not be able to promote a sync answer to a query;
//! - a provider event id is kept only on webhook evidence (the WIT contract
//!   says it is None otherwise, and a stray one would make the core's
//!   duplicate check swallow a genuine event);
//! - money must be a known currency and a strictly positive integer amount.

use sluice_adapter_runtime as wit;
use sluice_core::{
    CaptureMode, Currency, EventKind, EvidenceSource, Failure, FailureCategory, Money, PaymentEvent,
};

/// Why an adapter's output cannot be taken as a normalised event. The caller
/// treats such an answer as "unparseable": UNKNOWN, never FAILED.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    #[error("the adapter reported an invalid currency {0:?}")]
    BadCurrency(String),
    #[error("the adapter reported a non-positive amount {0}")]
    NonPositiveAmount(i64),
}

/// Core event kind of a WIT event kind (the two enums mirror each other).
pub fn event_kind(kind: wit::EventKind) -> EventKind {
    use wit::EventKind as W;
    match kind {
        W::AttemptSubmitted => EventKind::AttemptSubmitted,
        W::PaymentProcessing => EventKind::PaymentProcessing,
        W::CustomerActionRequired => EventKind::CustomerActionRequired,
        W::PaymentAuthorized => EventKind::PaymentAuthorized,
        W::PaymentCaptured => EventKind::PaymentCaptured,
        W::CaptureFailed => EventKind::CaptureFailed,
        W::PaymentSucceeded => EventKind::PaymentSucceeded,
        W::PaymentFailed => EventKind::PaymentFailed,
        W::ResultUnknown => EventKind::ResultUnknown,
        W::PaymentCanceled => EventKind::PaymentCanceled,
        W::RefundProcessing => EventKind::RefundProcessing,
        W::RefundSucceeded => EventKind::RefundSucceeded,
        W::RefundFailed => EventKind::RefundFailed,
        W::RefundUnknown => EventKind::RefundUnknown,
        W::Chargeback => EventKind::Chargeback,
    }
}

/// Core evidence of a WIT evidence source. Only used to compare with what the
/// host expected; the host's own value is what the event carries.
pub fn evidence(source: wit::EvidenceSource) -> EvidenceSource {
    match source {
        wit::EvidenceSource::SyncResponse => EvidenceSource::SyncResponse,
        wit::EvidenceSource::Webhook => EvidenceSource::Webhook,
        wit::EvidenceSource::Query => EvidenceSource::Query,
    }
}

pub fn failure_category(category: wit::FailureCategory) -> FailureCategory {
    use wit::FailureCategory as W;
    match category {
        W::Declined => FailureCategory::Declined,
        W::Retryable => FailureCategory::Retryable,
        W::Unknown => FailureCategory::Unknown,
        W::Configuration => FailureCategory::Configuration,
        W::Conflict => FailureCategory::Conflict,
        W::Unsupported => FailureCategory::Unsupported,
    }
}

pub fn failure(failure: &wit::Failure) -> Failure {
    Failure {
        category: failure_category(failure.category),
        code: failure.code.clone(),
        message: failure.message.clone(),
    }
}

/// Core money from WIT money: a known ISO 4217 code (case-insensitive on the
/// way in, as PSPs such as Stripe answer in lower case) and a positive amount.
pub fn money(money: &wit::Money) -> Result<Money, ConversionError> {
    let code = money.currency.to_ascii_uppercase();
    let currency =
        Currency::parse(&code).map_err(|_| ConversionError::BadCurrency(money.currency.clone()))?;
    Money::positive(money.amount_minor, currency)
        .map_err(|_| ConversionError::NonPositiveAmount(money.amount_minor))
}

/// WIT money from core money.
pub fn wit_money(money: Money) -> wit::Money {
    wit::Money {
        amount_minor: money.amount_minor,
        currency: money.currency.as_str().to_owned(),
    }
}

/// A normalised core event from an adapter's event, with the evidence source
/// the host established (see the module doc).
pub fn payment_event(
    event: &wit::PaymentEvent,
    established: EvidenceSource,
) -> Result<PaymentEvent, ConversionError> {
    let claimed = evidence(event.evidence);
    if claimed != established {
        tracing::warn!(
            claimed = %claimed,
            established = %established,
            "adapter claimed another evidence source; the host's is kept"
        );
    }
    let amount = event.amount.as_ref().map(money).transpose()?;
    let provider_event_id = match established {
        EvidenceSource::Webhook => event.provider_event_id.clone(),
        _ => None,
    };
    Ok(PaymentEvent {
        kind: event_kind(event.kind),
        evidence: established,
        attempt_reference: event.attempt_reference.clone(),
        action_reference: event.action_reference.clone(),
        psp_reference: event.psp_reference.clone(),
        psp_payment_reference: event.psp_payment_reference.clone(),
        amount,
        provider_event_id,
        raw_status: event.raw_status.clone(),
        failure: event.failure.as_ref().map(failure),
        next_action_url: event.next_action_url.clone(),
    })
}

/// Convert every event of an adapter answer; one bad event spoils the answer
/// (the host cannot tell which parts of a confused answer to believe).
pub fn payment_events(
    events: &[wit::PaymentEvent],
    established: EvidenceSource,
) -> Result<Vec<PaymentEvent>, ConversionError> {
    events
        .iter()
        .map(|event| payment_event(event, established))
        .collect()
}

/// The WIT operation a host operation is expressed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Authorize,
    Sale,
    Capture,
    Void,
    Refund,
    QueryPayment,
    QueryRefund,
}

impl Operation {
    pub fn as_str(&self) -> &'static str {
        match self {
            Operation::Authorize => "authorize",
            Operation::Sale => "sale",
            Operation::Capture => "capture",
            Operation::Void => "void",
            Operation::Refund => "refund",
            Operation::QueryPayment => "query-payment",
            Operation::QueryRefund => "query-refund",
        }
    }

    pub fn to_wit(self) -> wit::Operation {
        match self {
            Operation::Authorize => wit::Operation::Authorize,
            Operation::Sale => wit::Operation::Sale,
            Operation::Capture => wit::Operation::Capture,
            Operation::Void => wit::Operation::Void,
            Operation::Refund => wit::Operation::Refund,
            Operation::QueryPayment => wit::Operation::QueryPayment,
            Operation::QueryRefund => wit::Operation::QueryRefund,
        }
    }

    /// Queries produce query evidence; every other answer is a sync response.
    pub fn evidence(self) -> EvidenceSource {
        match self {
            Operation::QueryPayment | Operation::QueryRefund => EvidenceSource::Query,
            _ => EvidenceSource::SyncResponse,
        }
    }

    /// Whether the operation concerns a refund (its "no answer" is
    /// REFUND_UNKNOWN rather than RESULT_UNKNOWN).
    pub fn is_refund(self) -> bool {
        matches!(self, Operation::Refund | Operation::QueryRefund)
    }

    /// The event kind the host reports when it learned nothing.
    pub fn unknown_kind(self) -> EventKind {
        if self.is_refund() {
            EventKind::RefundUnknown
        } else {
            EventKind::ResultUnknown
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything the host knows about one operation, before it becomes a WIT
/// `operation-context`. Built from persisted facts only, so every retry and
/// query sends the same references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationSpec {
    pub operation: Operation,
    /// The capture mode the attempt was created with (a query replaying the
    /// creation must replay exactly that).
    pub capture_mode: CaptureMode,
    pub attempt_reference: String,
    pub action_reference: Option<String>,
    pub psp_payment_reference: Option<String>,
    pub psp_refund_reference: Option<String>,
    pub amount: Money,
    pub payment_method_token: Option<String>,
    pub return_url: Option<String>,
    pub merchant_order_no: String,
    pub metadata: Vec<(String, String)>,
    /// The payment method type the attempt was routed for; never sent to
    /// the adapter, only a label of the PSP call metrics.
    pub payment_method_type: Option<String>,
}

impl OperationSpec {
    pub fn to_wit(&self) -> wit::OperationContext {
        wit::OperationContext {
            operation: self.operation.to_wit(),
            capture_mode: match self.capture_mode {
                CaptureMode::Automatic => wit::CaptureMode::Automatic,
                CaptureMode::Manual => wit::CaptureMode::Manual,
            },
            attempt_reference: self.attempt_reference.clone(),
            action_reference: self.action_reference.clone(),
            psp_payment_reference: self.psp_payment_reference.clone(),
            psp_refund_reference: self.psp_refund_reference.clone(),
            amount: wit_money(self.amount),
            payment_method_token: self.payment_method_token.clone(),
            return_url: self.return_url.clone(),
            merchant_order_no: self.merchant_order_no.clone(),
            metadata: self.metadata.clone(),
        }
    }

    /// Whether a merchant-supplied string of the operation holds a credential
    /// placeholder (see [`crate::call::with_credentials`]).
    pub fn carries_placeholder(&self) -> bool {
        let suspicious = |text: &str| text.contains("{{secret:") || text.contains("{{basic:");
        suspicious(&self.merchant_order_no)
            || self.return_url.as_deref().is_some_and(suspicious)
            || self.payment_method_token.as_deref().is_some_and(suspicious)
            || self
                .metadata
                .iter()
                .any(|(k, v)| suspicious(k) || suspicious(v))
    }

    /// The event the host records when it learned nothing about this
    /// operation's outcome (timeout, connection error, 5xx, unparseable
    /// answer): RESULT_UNKNOWN / REFUND_UNKNOWN with the operation's own
    /// references, never a failure.
    pub fn unknown_event(&self, code: &str, message: &str) -> PaymentEvent {
        PaymentEvent {
            attempt_reference: Some(self.attempt_reference.clone()),
            action_reference: self.action_reference.clone(),
            raw_status: code.to_owned(),
            failure: Some(Failure {
                category: FailureCategory::Unknown,
                code: code.to_owned(),
                message: message.to_owned(),
            }),
            ..PaymentEvent::new(self.operation.unknown_kind(), self.operation.evidence())
        }
    }
}

/// HTTP statuses by which a PSP documents that it refused the connector
/// account's credentials (authentication, permission) before executing
/// anything (docs/psp-wire-subsets.md, both formats).
pub const CREDENTIALS_REFUSED_STATUSES: &[u16] = &[401, 403];

impl OperationSpec {
    /// The PSP's answer to a first send (sale or authorize) is its documented
    /// refusal of the account's credentials: HTTP 401/403 *and* the adapter
    /// read it as a configuration failure of unknown outcome. Nothing
    /// executed, so the attempt is a definitive not-executed failure with the
    /// host's code `credentials_refused` (which routing may cascade from),
    /// instead of an UNKNOWN waiting for the review age. Anything else (a
    /// query, a capture, a refund, another status, another reading by the
    /// adapter) is left as the adapter read it.
    pub fn credentials_refused(
        &self,
        status: u16,
        events: &[PaymentEvent],
    ) -> Option<PaymentEvent> {
        let first_send = matches!(self.operation, Operation::Sale | Operation::Authorize);
        let refused = CREDENTIALS_REFUSED_STATUSES.contains(&status)
            && !events.is_empty()
            && events.iter().all(|event| {
                event.kind == EventKind::ResultUnknown
                    && event
                        .failure
                        .as_ref()
                        .is_some_and(|f| f.category == FailureCategory::Configuration)
            });
        (first_send && refused).then(|| PaymentEvent {
            attempt_reference: Some(self.attempt_reference.clone()),
            raw_status: format!("http_{status}"),
            failure: Some(Failure {
                category: FailureCategory::Declined,
                code: sluice_core::CREDENTIALS_REFUSED_CODE.to_owned(),
                message: format!(
                    "credentials refused: the PSP answered HTTP {status} to the connector \
                     account's credentials before executing anything; no money moved"
                ),
            }),
            ..PaymentEvent::new(EventKind::PaymentFailed, EvidenceSource::SyncResponse)
        })
    }
}

/// The first value of a header, by case-insensitive name.
pub fn header_value<'a>(headers: &'a [wit::Header], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wit_event(kind: wit::EventKind) -> wit::PaymentEvent {
        wit::PaymentEvent {
            kind,
            attempt_reference: Some("pay_1_a1".into()),
            action_reference: None,
            psp_reference: Some("psp_9".into()),
            psp_payment_reference: None,
            amount: Some(wit::Money {
                amount_minor: 1250,
                currency: "eur".into(),
            }),
            provider_event_id: Some("evt_1".into()),
            evidence: wit::EvidenceSource::Webhook,
            raw_status: "succeeded".into(),
            failure: None,
            next_action_url: None,
        }
    }

    #[test]
    fn every_wit_event_kind_maps_to_the_core_kind_of_the_same_name() {
        use wit::EventKind as W;
        let all = [
            W::AttemptSubmitted,
            W::PaymentProcessing,
            W::CustomerActionRequired,
            W::PaymentAuthorized,
            W::PaymentCaptured,
            W::CaptureFailed,
            W::PaymentSucceeded,
            W::PaymentFailed,
            W::ResultUnknown,
            W::PaymentCanceled,
            W::RefundProcessing,
            W::RefundSucceeded,
            W::RefundFailed,
            W::RefundUnknown,
            W::Chargeback,
        ];
        let adapter_kinds = EventKind::ALL.iter().filter(|k| !k.is_host_only()).count();
        assert_eq!(all.len(), adapter_kinds);
        for kind in all {
            let core = event_kind(kind);
            let wit_name = variant_name(&format!("{kind:?}"));
            let core_name: String = core.as_str().split('_').map(capitalise).collect();
            assert_eq!(wit_name, core_name);
        }
    }

    /// The generated bindings print enum values as `Type::Variant`.
    fn variant_name(debug: &str) -> String {
        debug.rsplit("::").next().unwrap_or(debug).to_owned()
    }

    fn capitalise(word: &str) -> String {
        let lower = word.to_ascii_lowercase();
        let mut chars = lower.chars();
        chars
            .next()
            .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
            .unwrap_or_default()
    }

    #[test]
    fn every_failure_category_maps_and_only_declined_is_definitive() {
        use wit::FailureCategory as W;
        let all = [
            W::Declined,
            W::Retryable,
            W::Unknown,
            W::Configuration,
            W::Conflict,
            W::Unsupported,
        ];
        assert_eq!(all.len(), FailureCategory::ALL.len());
        for category in all {
            let core = failure_category(category);
            assert_eq!(
                variant_name(&format!("{category:?}")).to_ascii_lowercase(),
                core.as_str()
            );
            assert_eq!(core.is_definitive(), category == W::Declined);
        }
    }

    #[test]
    fn the_host_evidence_replaces_what_the_adapter_claims() {
        let event = wit_event(wit::EventKind::PaymentSucceeded);
        let core = payment_event(&event, EvidenceSource::SyncResponse).unwrap();
        assert_eq!(core.evidence, EvidenceSource::SyncResponse);
        // A provider event id only means something on a webhook.
        assert_eq!(core.provider_event_id, None);
        let webhook = payment_event(&event, EvidenceSource::Webhook).unwrap();
        assert_eq!(webhook.provider_event_id.as_deref(), Some("evt_1"));
    }

    #[test]
    fn money_is_upper_cased_and_must_be_known_and_positive() {
        let core = payment_event(
            &wit_event(wit::EventKind::PaymentSucceeded),
            EvidenceSource::Query,
        )
        .unwrap();
        let amount = core.amount.unwrap();
        assert_eq!(
            (amount.amount_minor, amount.currency.as_str()),
            (1250, "EUR")
        );

        let mut bad = wit_event(wit::EventKind::PaymentSucceeded);
        bad.amount = Some(wit::Money {
            amount_minor: 10,
            currency: "XXQ".into(),
        });
        assert_eq!(
            payment_event(&bad, EvidenceSource::Query),
            Err(ConversionError::BadCurrency("XXQ".into()))
        );
        bad.amount = Some(wit::Money {
            amount_minor: -10,
            currency: "EUR".into(),
        });
        assert_eq!(
            payment_event(&bad, EvidenceSource::Query),
            Err(ConversionError::NonPositiveAmount(-10))
        );
    }

    #[test]
    fn one_bad_event_spoils_the_whole_answer() {
        let good = wit_event(wit::EventKind::PaymentSucceeded);
        let mut bad = good.clone();
        bad.amount = Some(wit::Money {
            amount_minor: 0,
            currency: "EUR".into(),
        });
        assert!(payment_events(&[good.clone(), bad], EvidenceSource::Query).is_err());
        assert_eq!(
            payment_events(&[good], EvidenceSource::Query)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn failures_keep_code_message_and_category() {
        let mut event = wit_event(wit::EventKind::PaymentFailed);
        event.failure = Some(wit::Failure {
            category: wit::FailureCategory::Declined,
            code: "insufficient_funds".into(),
            message: "no money".into(),
        });
        let core = payment_event(&event, EvidenceSource::SyncResponse).unwrap();
        assert_eq!(core.kind, EventKind::PaymentFailed);
        assert!(core.failure_is_definitive());
        assert_eq!(core.failure.unwrap().code, "insufficient_funds");
    }

    fn spec(operation: Operation) -> OperationSpec {
        OperationSpec {
            operation,
            capture_mode: CaptureMode::Manual,
            attempt_reference: "pay_1_a1".into(),
            action_reference: Some("rfdref_1".into()),
            psp_payment_reference: Some("psp_9".into()),
            psp_refund_reference: None,
            amount: Money::positive(700, Currency::parse("USD").unwrap()).unwrap(),
            payment_method_token: Some("tok_ok".into()),
            return_url: None,
            merchant_order_no: "order-1".into(),
            metadata: vec![("k".into(), "v".into())],
            payment_method_type: None,
        }
    }

    #[test]
    fn an_operation_spec_becomes_the_wit_context_unchanged() {
        let ctx = spec(Operation::Refund).to_wit();
        assert_eq!(ctx.operation, wit::Operation::Refund);
        assert_eq!(ctx.capture_mode, wit::CaptureMode::Manual);
        assert_eq!(ctx.attempt_reference, "pay_1_a1");
        assert_eq!(ctx.action_reference.as_deref(), Some("rfdref_1"));
        assert_eq!(ctx.amount.amount_minor, 700);
        assert_eq!(ctx.amount.currency, "USD");
        assert_eq!(ctx.metadata, vec![("k".to_string(), "v".to_string())]);
    }

    #[test]
    fn the_host_unknown_event_is_never_a_failure() {
        let unknown = spec(Operation::Sale).unknown_event("timeout", "no answer in 5 s");
        assert_eq!(unknown.kind, EventKind::ResultUnknown);
        assert_eq!(unknown.evidence, EvidenceSource::SyncResponse);
        assert!(!unknown.failure_is_definitive());
        let refund = spec(Operation::Refund).unknown_event("http_503", "server error");
        assert_eq!(refund.kind, EventKind::RefundUnknown);
        assert_eq!(refund.action_reference.as_deref(), Some("rfdref_1"));
        let query = spec(Operation::QueryPayment).unknown_event("timeout", "");
        assert_eq!(query.evidence, EvidenceSource::Query);
    }
}
