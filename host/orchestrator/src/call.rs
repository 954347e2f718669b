//! One PSP operation, end to end on the host side: the adapter builds the
//! request, the host checks and performs it, the adapter parses the answer.
//!
//! Classification lives here and only here. Anything that may have reached
//! the PSP without a usable answer (timeout, connection error, 5xx, an answer
//! the adapter cannot interpret, an adapter that traps while parsing) is
//! UNKNOWN. Only a definitive decline the adapter reports is a failure, and
//! the core decides even that from the event's failure category. The one
//! host-made failure is the PSP's documented refusal of the account's
//! credentials (HTTP 401/403 to a first send, read by the adapter as a
//! configuration failure): nothing executed, so it is a definitive
//! `credentials_refused` failure (`OperationSpec::credentials_refused`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::metrics;

use sluice_adapter_runtime::{AdapterHandle, ConnectorAccountScope, Keyring};
use sluice_core::PaymentEvent;

use crate::convert::{self, OperationSpec};
use crate::error::OrchestratorError;
use crate::transport::{check_request, CallBudget, CheckedRequest, PspTransport};

/// Everything needed to call one connector account's PSP.
#[derive(Clone)]
pub(crate) struct Connector {
    pub account_id: String,
    pub adapter: AdapterHandle,
    /// Only this account's settings and secrets.
    pub scope: ConnectorAccountScope,
    pub budget: CallBudget,
    /// What recovery may rely on for this connector (re-send window,
    /// authorization validity).
    pub recovery: crate::config::ConnectorRecovery,
    /// How many PSP calls may be in flight through this account at once.
    pub limits: crate::CallLimits,
    /// The adapter's shadow version, when one is staged: it repeats this
    /// connector's adapter calls off the request path.
    pub shadow: Option<crate::shadow::ShadowTap>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("account_id", &self.account_id)
            .field("adapter", &self.adapter.identity())
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Connector {
    pub fn base_url(&self) -> &str {
        self.scope
            .config
            .get("base_url")
            .map(String::as_str)
            .unwrap_or("")
    }
}

/// Shortest and longest per-connector call budgets the host accepts.
const MIN_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_TIMEOUT: Duration = Duration::from_secs(120);

/// The call budget of a connector account: its `timeout_ms` setting, or the default.
pub(crate) fn budget_for(
    config: &BTreeMap<String, String>,
    default_timeout: Duration,
    max_response_bytes: usize,
) -> CallBudget {
    let timeout = config
        .get("timeout_ms")
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(default_timeout)
        .clamp(MIN_TIMEOUT, MAX_TIMEOUT);
    CallBudget {
        timeout,
        max_response_bytes,
    }
}

/// A request that never left the host: nothing can have happened at the PSP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotSent {
    pub code: String,
    pub message: String,
}

/// What the host learned from one call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallOutcome {
    /// The adapter interpreted the PSP's answer.
    Answered(Vec<PaymentEvent>),
    /// The request may have been processed, but the host learned nothing.
    Unknown { code: String, message: String },
}

impl CallOutcome {
    /// The events to apply: the adapter's, or the host's own UNKNOWN.
    pub fn into_events(self, spec: &OperationSpec) -> Vec<PaymentEvent> {
        match self {
            CallOutcome::Answered(events) => events,
            CallOutcome::Unknown { code, message } => vec![spec.unknown_event(&code, &message)],
        }
    }

    pub fn unknown_code(&self) -> Option<&str> {
        match self {
            CallOutcome::Answered(_) => None,
            CallOutcome::Unknown { code, .. } => Some(code),
        }
    }

    /// The PSP answered a query saying it has no such payment.
    pub fn proves_absence(&self) -> bool {
        match self {
            CallOutcome::Answered(events) => events.iter().any(PaymentEvent::proves_absence),
            CallOutcome::Unknown { .. } => false,
        }
    }

    /// The PSP answered a query saying the payment is still only authorized.
    pub fn shows_uncaptured(&self) -> bool {
        match self {
            CallOutcome::Answered(events) => events.iter().any(PaymentEvent::shows_uncaptured),
            CallOutcome::Unknown { .. } => false,
        }
    }

    /// The PSP's payment id an answer names, if any.
    pub fn psp_payment_reference(&self) -> Option<String> {
        match self {
            CallOutcome::Answered(events) => events.iter().find_map(|event| {
                event
                    .psp_payment_reference
                    .clone()
                    .or_else(|| event.psp_reference.clone())
            }),
            CallOutcome::Unknown { .. } => None,
        }
    }
}

/// Ask the adapter for the request, check its destination, then substitute the
/// account's credentials into its placeholders (in that order: a secret is
/// never written into a request bound for anywhere but the account's
/// `base_url`). `Ok(Err(_))`: the adapter or the host refused, nothing left.
/// `Err(_)`: the sandbox failed (transient); nothing left either, and the
/// caller should try again later.
pub(crate) async fn prepare(
    connector: &Connector,
    spec: &OperationSpec,
) -> Result<Result<CheckedRequest, NotSent>, OrchestratorError> {
    let built = connector
        .adapter
        .build_request(&connector.scope, spec.to_wit())
        .await?;
    if let Some(tap) = &connector.shadow {
        tap.repeat_build_request(connector, spec.to_wit(), &built);
    }
    let request = match built {
        Ok(request) => request,
        Err(failure) => {
            return Ok(Err(NotSent {
                code: failure.code,
                message: format!("the adapter did not build the request: {}", failure.message),
            }))
        }
    };
    let checked = match check_request(&request, connector.base_url()) {
        Ok(checked) => checked,
        Err(refused) => {
            return Ok(Err(NotSent {
                code: "request_refused".into(),
                message: refused.to_string(),
            }))
        }
    };
    Ok(with_credentials(checked, &connector.scope.secrets, spec))
}

/// The request that goes on the wire: every credential placeholder replaced
/// with the account's secret. A placeholder naming a secret the account lacks,
/// or a malformed one, is a configuration error and nothing is sent. So is a
/// placeholder in merchant-supplied data (order number, metadata, return URL,
/// token): an adapter copies those into bodies, and the merchant must not be
/// able to have a credential written into a field the PSP stores or echoes.
pub(crate) fn with_credentials(
    mut request: CheckedRequest,
    keyring: &Keyring,
    spec: &OperationSpec,
) -> Result<CheckedRequest, NotSent> {
    if spec.carries_placeholder() {
        return Err(NotSent {
            code: "placeholder_in_merchant_data".into(),
            message: "the payment's merchant data contains a credential placeholder \
                      ({{secret:...}} or {{basic:...}}); it is never sent"
                .into(),
        });
    }
    let refused = |error: sluice_adapter_runtime::PlaceholderError| NotSent {
        code: "credential_placeholder".into(),
        message: error.to_string(),
    };
    for header in &mut request.headers {
        header.value = keyring
            .substitute_header(&header.name, &header.value)
            .map_err(refused)?;
    }
    request.body = keyring.substitute(&request.body).map_err(refused)?;
    Ok(request)
}

/// Perform a checked request and let the adapter interpret the answer. The
/// account's call slot is held for the HTTP exchange only: parsing the answer
/// is the adapter bulkhead's business, not the PSP's.
pub(crate) async fn perform(
    transport: &dyn PspTransport,
    connector: &Connector,
    spec: &OperationSpec,
    request: &CheckedRequest,
    slot: crate::call_slots::CallSlot,
) -> CallOutcome {
    let started = Instant::now();
    let sent = transport.send(request, &connector.budget).await;
    drop(slot);
    let elapsed = started.elapsed();
    crate::psp_wait::record(elapsed);
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    let labels = metrics::CallLabels {
        adapter: connector.adapter.identity().name.as_str(),
        account: &connector.account_id,
        method: metrics::method_label(spec.payment_method_type.as_deref()),
        operation: spec.operation.as_str(),
    };
    let response = match sent {
        Ok(response) => response,
        Err(error) => {
            metrics::observe(&labels, elapsed, "unknown", error.code());
            metrics::observe_result(&labels, None);
            tracing::warn!(operation = %spec.operation, elapsed_ms, error = %error,
                "PSP call got no answer: outcome unknown");
            return CallOutcome::Unknown {
                code: error.code().to_owned(),
                message: error.to_string(),
            };
        }
    };
    let status = response.status;
    tracing::info!(operation = %spec.operation, status, elapsed_ms, "PSP answered");
    let shadow_input = connector.shadow.as_ref().map(|_| response.clone());
    let parsed = connector
        .adapter
        .parse_response(&connector.scope, spec.to_wit(), response)
        .await;
    if let (Some(tap), Some(input), Ok(parsed)) = (&connector.shadow, shadow_input, &parsed) {
        tap.repeat_parse_response(connector, spec.to_wit(), input, parsed);
    }
    let outcome = interpret(spec, status, parsed);
    let (label, events) = match &outcome {
        CallOutcome::Answered(events) => ("answered", Some(events.as_slice())),
        CallOutcome::Unknown { .. } => ("unknown", None),
    };
    metrics::observe(&labels, elapsed, label, metrics::status_class(status));
    metrics::observe_result(&labels, events);
    outcome
}

type Parsed = Result<
    Result<Vec<sluice_adapter_runtime::PaymentEvent>, sluice_adapter_runtime::Failure>,
    sluice_adapter_runtime::AdapterError,
>;

/// The adapter's reading of an answer, classified by the host.
pub(crate) fn interpret(spec: &OperationSpec, status: u16, parsed: Parsed) -> CallOutcome {
    let events = match parsed {
        Err(error) => {
            return unknown(
                spec,
                "adapter_error",
                &format!("the adapter failed: {error}"),
            )
        }
        Ok(Err(failure)) => {
            return unknown(
                spec,
                &failure.code,
                &format!(
                    "HTTP {status}: the answer could not be interpreted: {}",
                    failure.message
                ),
            )
        }
        Ok(Ok(events)) => events,
    };
    match convert::payment_events(&events, spec.operation.evidence()) {
        Err(error) => unknown(spec, "unusable_answer", &error.to_string()),
        Ok(events) if events.is_empty() => unknown(
            spec,
            "no_events",
            &format!("HTTP {status}: the adapter reported nothing"),
        ),
        Ok(events) => match spec.credentials_refused(status, &events) {
            Some(refused) => {
                tracing::warn!(operation = %spec.operation, status,
                    "the PSP refused the connector account's credentials: nothing executed");
                CallOutcome::Answered(vec![refused])
            }
            None => CallOutcome::Answered(events),
        },
    }
}

fn unknown(spec: &OperationSpec, code: &str, message: &str) -> CallOutcome {
    tracing::warn!(operation = %spec.operation, code, message, "PSP answer unusable: outcome unknown");
    CallOutcome::Unknown {
        code: code.to_owned(),
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::Operation;
    use sluice_adapter_runtime as wit;
    use sluice_core::{Currency, EventKind, Money};

    fn spec(operation: Operation) -> OperationSpec {
        OperationSpec {
            operation,
            capture_mode: sluice_core::CaptureMode::Automatic,
            attempt_reference: "pay_1_a1".into(),
            action_reference: None,
            psp_payment_reference: None,
            psp_refund_reference: None,
            amount: Money::positive(100, Currency::parse("EUR").unwrap()).unwrap(),
            payment_method_token: None,
            return_url: None,
            merchant_order_no: "o-1".into(),
            metadata: vec![],
            payment_method_type: None,
        }
    }

    fn declined() -> wit::PaymentEvent {
        wit::PaymentEvent {
            kind: wit::EventKind::PaymentFailed,
            attempt_reference: Some("pay_1_a1".into()),
            action_reference: None,
            psp_reference: Some("p_1".into()),
            psp_payment_reference: None,
            amount: None,
            provider_event_id: None,
            evidence: wit::EvidenceSource::SyncResponse,
            raw_status: "declined".into(),
            failure: Some(wit::Failure {
                category: wit::FailureCategory::Declined,
                code: "card_declined".into(),
                message: "declined".into(),
            }),
            next_action_url: None,
        }
    }

    #[test]
    fn a_definitive_decline_from_the_adapter_is_passed_on_as_an_answer() {
        let outcome = interpret(&spec(Operation::Sale), 402, Ok(Ok(vec![declined()])));
        let CallOutcome::Answered(events) = outcome else {
            panic!("expected an answer");
        };
        assert_eq!(events[0].kind, EventKind::PaymentFailed);
        assert!(events[0].failure_is_definitive());
    }

    #[test]
    fn an_uninterpretable_answer_is_unknown_never_failed() {
        let failure = wit::Failure {
            category: wit::FailureCategory::Declined,
            code: "malformed_response".into(),
            message: "not JSON".into(),
        };
        let outcome = interpret(&spec(Operation::Sale), 200, Ok(Err(failure)));
        let events = outcome.into_events(&spec(Operation::Sale));
        assert_eq!(events[0].kind, EventKind::ResultUnknown);
        assert!(!events[0].failure_is_definitive());
    }

    #[test]
    fn an_adapter_crash_while_parsing_is_unknown() {
        let outcome = interpret(
            &spec(Operation::Refund),
            200,
            Err(wit::AdapterError::Trap("unreachable".into())),
        );
        assert_eq!(outcome.unknown_code(), Some("adapter_error"));
        let events = outcome.into_events(&spec(Operation::Refund));
        assert_eq!(events[0].kind, EventKind::RefundUnknown);
    }

    #[test]
    fn an_empty_or_unconvertible_answer_is_unknown() {
        assert_eq!(
            interpret(&spec(Operation::Sale), 200, Ok(Ok(vec![]))).unknown_code(),
            Some("no_events")
        );
        let mut bad = declined();
        bad.amount = Some(wit::Money {
            amount_minor: -1,
            currency: "EUR".into(),
        });
        assert_eq!(
            interpret(&spec(Operation::Sale), 200, Ok(Ok(vec![bad]))).unknown_code(),
            Some("unusable_answer")
        );
    }

    fn configuration_refusal() -> wit::PaymentEvent {
        wit::PaymentEvent {
            kind: wit::EventKind::ResultUnknown,
            raw_status: "authentication_error".into(),
            failure: Some(wit::Failure {
                category: wit::FailureCategory::Configuration,
                code: "authentication_error".into(),
                message: "the PSP refused the connector account's credentials".into(),
            }),
            ..declined()
        }
    }

    #[test]
    fn a_401_or_403_to_a_first_send_is_a_definitive_credentials_refused_failure() {
        for (operation, status) in [(Operation::Sale, 401), (Operation::Authorize, 403)] {
            let outcome = interpret(
                &spec(operation),
                status,
                Ok(Ok(vec![configuration_refusal()])),
            );
            let CallOutcome::Answered(events) = outcome else {
                panic!("expected an answer");
            };
            assert_eq!(events.len(), 1);
            assert_eq!(events[0].kind, EventKind::PaymentFailed);
            assert!(events[0].failure_is_definitive());
            let failure = events[0].failure.as_ref().unwrap();
            assert_eq!(failure.code, sluice_core::CREDENTIALS_REFUSED_CODE);
            assert!(failure.message.starts_with("credentials refused"));
            assert_eq!(events[0].attempt_reference.as_deref(), Some("pay_1_a1"));
        }
    }

    #[test]
    fn a_credentials_refusal_to_a_query_capture_void_or_refund_stays_as_the_adapter_read_it() {
        for operation in [
            Operation::QueryPayment,
            Operation::Capture,
            Operation::Void,
            Operation::Refund,
            Operation::QueryRefund,
        ] {
            let outcome = interpret(&spec(operation), 401, Ok(Ok(vec![configuration_refusal()])));
            let CallOutcome::Answered(events) = outcome else {
                panic!("expected an answer");
            };
            assert_eq!(events[0].kind, EventKind::ResultUnknown, "{operation}");
        }
    }

    #[test]
    fn timeouts_5xx_garbage_and_other_readings_of_a_401_never_become_credentials_refused() {
        // A configuration reading under another status (e.g. a 500 or a 200).
        for status in [200, 400, 404, 429, 500, 502, 503] {
            let events = interpret(
                &spec(Operation::Sale),
                status,
                Ok(Ok(vec![configuration_refusal()])),
            )
            .into_events(&spec(Operation::Sale));
            assert_eq!(events[0].kind, EventKind::ResultUnknown, "HTTP {status}");
        }
        // A 401 the adapter could not read, or read as something else.
        let garbage = wit::Failure {
            category: wit::FailureCategory::Unknown,
            code: "malformed_response".into(),
            message: "not JSON".into(),
        };
        let events = interpret(&spec(Operation::Sale), 401, Ok(Err(garbage)))
            .into_events(&spec(Operation::Sale));
        assert_eq!(events[0].kind, EventKind::ResultUnknown);
        let mut retryable = configuration_refusal();
        retryable.failure.as_mut().unwrap().category = wit::FailureCategory::Retryable;
        let events = interpret(&spec(Operation::Sale), 401, Ok(Ok(vec![retryable])))
            .into_events(&spec(Operation::Sale));
        assert_eq!(events[0].kind, EventKind::ResultUnknown);
        // A success, however odd its status, is never turned into a failure.
        let mut success = declined();
        success.kind = wit::EventKind::PaymentSucceeded;
        success.failure = None;
        let events = interpret(
            &spec(Operation::Sale),
            401,
            Ok(Ok(vec![success, configuration_refusal()])),
        )
        .into_events(&spec(Operation::Sale));
        assert_eq!(events[0].kind, EventKind::PaymentSucceeded);
        assert!(interpret(
            &spec(Operation::Sale),
            401,
            Err(wit::AdapterError::Trap("x".into()))
        )
        .unknown_code()
        .is_some());
    }

    fn checked(header: &str, body: &str) -> CheckedRequest {
        CheckedRequest {
            method: reqwest::Method::POST,
            url: reqwest::Url::parse("http://127.0.0.1:1/psp/v1/payments").unwrap(),
            headers: vec![wit::Header {
                name: "Authorization".into(),
                value: header.into(),
            }],
            body: body.as_bytes().to_vec(),
        }
    }

    fn keyring() -> Keyring {
        let mut keyring = Keyring::default();
        keyring.insert("api_key", "sk_test_wire_only");
        keyring
    }

    #[test]
    fn credentials_are_substituted_in_headers_and_body_of_the_wire_copy() {
        let wire = with_credentials(
            checked("Bearer {{secret:api_key}}", "key={{secret:api_key}}&a=1"),
            &keyring(),
            &spec(Operation::Sale),
        )
        .unwrap();
        assert_eq!(wire.headers[0].value, "Bearer sk_test_wire_only");
        assert_eq!(wire.body, b"key=sk_test_wire_only&a=1");
        // Its debug form, which a log line could carry, shows neither.
        let printed = format!("{wire:?}");
        assert!(!printed.contains("sk_test_wire_only"), "{printed}");
    }

    #[test]
    fn an_unknown_placeholder_is_a_configuration_error_and_nothing_is_sent() {
        let refused = with_credentials(
            checked("Bearer {{secret:password}}", ""),
            &keyring(),
            &spec(Operation::Sale),
        )
        .unwrap_err();
        assert_eq!(refused.code, "credential_placeholder");
        assert!(refused.message.contains("password"));
    }

    #[test]
    fn a_placeholder_in_merchant_data_is_never_substituted() {
        let mut spec = spec(Operation::Sale);
        spec.metadata = vec![("note".into(), "{{secret:api_key}}".into())];
        let refused = with_credentials(
            checked(
                "Bearer {{secret:api_key}}",
                r#"{"note":"{{secret:api_key}}"}"#,
            ),
            &keyring(),
            &spec,
        )
        .unwrap_err();
        assert_eq!(refused.code, "placeholder_in_merchant_data");
    }

    #[test]
    fn a_connector_budget_comes_from_its_config_within_bounds() {
        let default = Duration::from_secs(15);
        let mut config = BTreeMap::new();
        assert_eq!(budget_for(&config, default, 10).timeout, default);
        config.insert("timeout_ms".into(), "2500".into());
        assert_eq!(
            budget_for(&config, default, 10).timeout,
            Duration::from_millis(2500)
        );
        config.insert("timeout_ms".into(), "1".into());
        assert_eq!(budget_for(&config, default, 10).timeout, MIN_TIMEOUT);
        config.insert("timeout_ms".into(), "oops".into());
        assert_eq!(budget_for(&config, default, 10).timeout, default);
    }
}
