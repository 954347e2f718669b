//! Shared test scaffolding: a host with plain maps and a fixed clock, fixtures, contexts.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use sluice_adapter_runtime::Keyring;
use sluice_adapter_stripe::bindings::sluice::psp::host::LogLevel;
use sluice_adapter_stripe::host::{HmacAlgorithm, KeyEncoding, KeyringError};
use sluice_adapter_stripe::types::{
    CaptureMode, EventKind, EvidenceSource, Failure, FailureCategory, HttpRequest, HttpResponse,
    Money, Operation, OperationContext, PaymentEvent,
};
use sluice_adapter_stripe::Host;

pub const ATTEMPT: &str = "att_7f3c2a";
pub const PI: &str = "pi_3QxYz1LkdIwHu7ix0a1b2c3d";
pub const REFUND: &str = "re_3QxYz1LkdIwHu7ix1refund";
pub const API_KEY: &str = "sk_test_51Hk2lUnitTestKey";
pub const WEBHOOK_SECRET: &str = "whsec_test_5WbX5kEWLlfzsGNjH64I8lOOqUB6e8FH";
/// 2024-12-01T00:00:00Z, in the tests' host clock.
pub const NOW_SECONDS: i64 = 1_733_011_200;

/// A host backed by maps, with a clock the test controls and a log it can read.
pub struct TestHost {
    pub config: BTreeMap<String, String>,
    pub secrets: BTreeMap<String, String>,
    /// Older, still valid versions of a secret (a rotation window).
    pub previous: BTreeMap<String, String>,
    pub now_millis: i64,
    pub logs: RefCell<Vec<String>>,
}

impl TestHost {
    /// A fully configured connector account.
    pub fn configured() -> Self {
        let mut host = TestHost {
            config: BTreeMap::new(),
            secrets: BTreeMap::new(),
            previous: BTreeMap::new(),
            now_millis: NOW_SECONDS * 1000 + 250,
            logs: RefCell::new(Vec::new()),
        };
        host.config
            .insert("base_url".into(), "http://127.0.0.1:9000/stripe/".into());
        host.secrets.insert("api_key".into(), API_KEY.into());
        host.secrets
            .insert("webhook_secret".into(), WEBHOOK_SECRET.into());
        host
    }

    pub fn without_config(mut self, key: &str) -> Self {
        self.config.remove(key);
        self
    }

    /// The current secret `key` becomes `value`; the old one stays valid (rotation).
    pub fn rotated(mut self, key: &str, value: &str) -> Self {
        if let Some(old) = self.secrets.insert(key.into(), value.into()) {
            self.previous.insert(key.into(), old);
        }
        self
    }

    pub fn with_secret_value(mut self, key: &str, value: &str) -> Self {
        self.secrets.insert(key.into(), value.into());
        self
    }

    pub fn without_secret(mut self, key: &str) -> Self {
        self.secrets.remove(key);
        self
    }

    pub fn with_config(mut self, key: &str, value: &str) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }
}

impl Host for TestHost {
    fn config(&self, key: &str) -> Option<String> {
        self.config.get(key).cloned()
    }

    fn hmac(
        &self,
        key: &str,
        algorithm: HmacAlgorithm,
        encoding: KeyEncoding,
        data: &[u8],
    ) -> Result<Vec<Vec<u8>>, KeyringError> {
        keyring_hmac(&self.keyring(), key, algorithm, encoding, data)
    }

    fn now_unix_millis(&self) -> i64 {
        self.now_millis
    }

    fn log(&self, _level: LogLevel, message: &str) {
        self.logs.borrow_mut().push(message.to_string());
    }
}

impl TestHost {
    /// The host's own keyring over this host's secrets: the test keyring.
    pub fn keyring(&self) -> Keyring {
        let mut keyring = Keyring::default();
        for (name, value) in &self.secrets {
            let mut versions = vec![value.clone()];
            versions.extend(self.previous.get(name).cloned());
            keyring.insert_versions(name.clone(), versions);
        }
        keyring
    }
}

/// `keyring.hmac` as the host serves it to the component.
pub fn keyring_hmac(
    keyring: &Keyring,
    key: &str,
    algorithm: HmacAlgorithm,
    encoding: KeyEncoding,
    data: &[u8],
) -> Result<Vec<Vec<u8>>, KeyringError> {
    let hash = match algorithm {
        HmacAlgorithm::Sha256 => sluice_adapter_runtime::HmacHash::Sha256,
        HmacAlgorithm::Sha512 => sluice_adapter_runtime::HmacHash::Sha512,
    };
    let text = match encoding {
        KeyEncoding::Utf8 => sluice_adapter_runtime::KeyText::Utf8,
        KeyEncoding::Hex => sluice_adapter_runtime::KeyText::Hex,
        KeyEncoding::Base64 => sluice_adapter_runtime::KeyText::Base64,
    };
    keyring.hmac(key, hash, text, data).map_err(|e| match e {
        sluice_adapter_runtime::KeyringFailure::UnknownKey(_) => {
            KeyringError::UnknownKey(e.to_string())
        }
        sluice_adapter_runtime::KeyringFailure::UnusableKey { .. } => {
            KeyringError::UnusableKey(e.to_string())
        }
        sluice_adapter_runtime::KeyringFailure::TooLarge { .. } => {
            KeyringError::TooLarge(e.to_string())
        }
    })
}

/// What the host does to a built request before sending it: substitute the
/// credential placeholders with this host's secrets.
pub fn substituted(keyring: &Keyring, request: &HttpRequest) -> HttpRequest {
    let mut wire = request.clone();
    for header in &mut wire.headers {
        header.value = keyring
            .substitute_header(&header.name, &header.value)
            .expect("placeholders substitute");
    }
    wire.body = keyring
        .substitute(&wire.body)
        .expect("placeholders substitute");
    wire
}

pub fn fixture(relative: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(relative);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

pub fn response(status: u16, fixture_path: &str) -> HttpResponse {
    HttpResponse {
        status,
        headers: vec![],
        body: fixture(fixture_path),
    }
}

pub fn eur(amount_minor: i64) -> Money {
    Money {
        amount_minor,
        currency: "EUR".into(),
    }
}

/// The context of an operation on the standard test payment.
pub fn ctx(operation: Operation) -> OperationContext {
    let (amount, action, pi, refund) = match operation {
        Operation::Authorize | Operation::Sale => (2000, None, None, None),
        Operation::QueryPayment => (2000, None, Some(PI), None),
        Operation::Capture => (1500, Some("cap_91b0"), Some(PI), None),
        Operation::Void => (2000, None, Some(PI), None),
        Operation::Refund => (500, Some("rf_55d1"), Some(PI), None),
        Operation::QueryRefund => (500, Some("rf_55d1"), Some(PI), Some(REFUND)),
    };
    let capture_mode = match operation {
        Operation::Authorize | Operation::Capture | Operation::Void => CaptureMode::Manual,
        _ => CaptureMode::Automatic,
    };
    OperationContext {
        operation,
        capture_mode,
        attempt_reference: ATTEMPT.into(),
        action_reference: action.map(String::from),
        psp_payment_reference: pi.map(String::from),
        psp_refund_reference: refund.map(String::from),
        amount: eur(amount),
        payment_method_token: Some("pm_card_visa".into()),
        return_url: Some("https://shop.example/return".into()),
        merchant_order_no: "order-1001".into(),
        metadata: vec![("channel".into(), "web".into())],
    }
}

/// An event with every optional field empty, for building expected values.
pub fn blank(kind: EventKind, evidence: EvidenceSource, raw_status: &str) -> PaymentEvent {
    PaymentEvent {
        kind,
        attempt_reference: None,
        action_reference: None,
        psp_reference: None,
        psp_payment_reference: None,
        amount: None,
        provider_event_id: None,
        evidence,
        raw_status: raw_status.into(),
        failure: None,
        next_action_url: None,
    }
}

pub fn failure(category: FailureCategory, code: &str, message: &str) -> Option<Failure> {
    Some(Failure {
        category,
        code: code.into(),
        message: message.into(),
    })
}
