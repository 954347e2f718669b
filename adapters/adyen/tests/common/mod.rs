//! Shared test scaffolding: a host with plain maps, fixtures, contexts.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use sluice_adapter_adyen::bindings::sluice::psp::host::LogLevel;
use sluice_adapter_adyen::host::{HmacAlgorithm, KeyEncoding, KeyringError};
use sluice_adapter_adyen::types::{
    CaptureMode, EventKind, EvidenceSource, Failure, FailureCategory, HttpRequest, HttpResponse,
    Money, Operation, OperationContext, PaymentEvent,
};
use sluice_adapter_adyen::Host;
use sluice_adapter_runtime::Keyring;

pub const ATTEMPT: &str = "att_7f3c2a";
pub const PSP: &str = "X7K2M9Q4R8T6W3Z1";
pub const API_KEY: &str = "AQEyhmfxK4unit.test.api.key";
pub const MERCHANT_ACCOUNT: &str = "SluiceTestECOM";
/// The HMAC key of Adyen's published notification test vector.
pub const HMAC_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

/// A host backed by maps, with a log the test can read.
pub struct TestHost {
    pub config: BTreeMap<String, String>,
    pub secrets: BTreeMap<String, String>,
    /// Older, still valid versions of a secret (a rotation window).
    pub previous: BTreeMap<String, String>,
    pub logs: RefCell<Vec<String>>,
}

impl TestHost {
    /// A fully configured connector account.
    pub fn configured() -> Self {
        let mut host = TestHost {
            config: BTreeMap::new(),
            secrets: BTreeMap::new(),
            previous: BTreeMap::new(),
            logs: RefCell::new(Vec::new()),
        };
        host.config
            .insert("base_url".into(), "http://127.0.0.1:9000/adyen/".into());
        host.config
            .insert("merchant_account".into(), MERCHANT_ACCOUNT.into());
        host.secrets.insert("api_key".into(), API_KEY.into());
        host.secrets
            .insert("webhook_secret".into(), HMAC_KEY.into());
        host
    }

    pub fn without_config(mut self, key: &str) -> Self {
        self.config.remove(key);
        self
    }

    pub fn with_config(mut self, key: &str, value: &str) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }

    /// The current secret `key` becomes `value`; the old one stays valid (rotation).
    pub fn rotated(mut self, key: &str, value: &str) -> Self {
        if let Some(old) = self.secrets.insert(key.into(), value.into()) {
            self.previous.insert(key.into(), old);
        }
        self
    }

    pub fn without_secret(mut self, key: &str) -> Self {
        self.secrets.remove(key);
        self
    }

    pub fn with_secret(mut self, key: &str, value: &str) -> Self {
        self.secrets.insert(key.into(), value.into());
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
        1_733_011_200_000
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
    let (amount, action, psp) = match operation {
        Operation::Authorize | Operation::Sale => (2000, None, None),
        Operation::QueryPayment => (2000, None, None),
        Operation::Capture => (1500, Some("cap_91b0"), Some(PSP)),
        Operation::Void => (2000, None, Some(PSP)),
        Operation::Refund | Operation::QueryRefund => (500, Some("rf_55d1"), Some(PSP)),
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
        psp_payment_reference: psp.map(String::from),
        psp_refund_reference: None,
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
