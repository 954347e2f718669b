//! `handle-webhook`: verify the `X-Test-Signature` header and normalise the body.
//!
//! Signature: `X-Test-Signature: t=<unix seconds>,v1=<hex hmac-sha256>` where the MAC is
//! keyed with the connector account's `webhook_secret` over `"{t}.{raw body}"`; in the
//! component the host's keyring computes it (the adapter never sees the secret). Several
//! `v1` entries may be present, and the keyring may hold several valid versions of the
//! secret (rotation); any one matching is enough. The signed
//! timestamp must be within the tolerance (default 300 s) of the host clock.
//!
//! Body: `{"id": "<event id>", "type": "payment.succeeded", "data": {...}}` with `data`
//! holding `id` (PSP object id), `payment` (for refunds), `reference` (host reference),
//! `amount`, `currency`, `status`, `decline_code`, `next_action_url`.

use crate::response::{amount, str_field};
use crate::types::{
    EventKind, EvidenceSource, Failure, FailureCategory, Header, HttpResponse, PaymentEvent,
    WebhookAcceptance, WebhookRejection, WebhookRequest,
};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

/// Signature header name (compared case-insensitively).
pub const SIGNATURE_HEADER: &str = "X-Test-Signature";
/// Replay window when the account does not configure `webhook_tolerance_seconds`.
pub const DEFAULT_TOLERANCE_SECONDS: i64 = 300;

/// What verification needs from the connector account.
#[derive(Clone, Copy)]
pub struct WebhookSecrets<'a> {
    pub webhook_secret: Option<&'a str>,
    pub tolerance_seconds: i64,
}

impl std::fmt::Debug for WebhookSecrets<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSecrets")
            .field("webhook_secret", &self.webhook_secret.map(|_| "<redacted>"))
            .field("tolerance_seconds", &self.tolerance_seconds)
            .finish()
    }
}

/// The expected MACs of the signed data, one per valid version of the secret; None
/// when the account has no webhook secret. In the component this is the host's keyring.
pub type ExpectedMacs<'a> = &'a dyn Fn(&[u8]) -> Option<Vec<Vec<u8>>>;

/// Verifies `request` with a secret in hand (native tests and benchmarks).
pub fn verify_and_normalise(
    secrets: &WebhookSecrets<'_>,
    now_unix_secs: i64,
    request: &WebhookRequest,
) -> Result<WebhookAcceptance, WebhookRejection> {
    let macs = |data: &[u8]| {
        secrets
            .webhook_secret
            .filter(|s| !s.is_empty())
            .map(|secret| vec![mac_for(secret, data).finalize().into_bytes().to_vec()])
    };
    verify_with_macs(&macs, secrets.tolerance_seconds, now_unix_secs, request)
}

/// Verifies `request` against the expected MACs and turns it into events plus the
/// acknowledgement to send back.
pub fn verify_with_macs(
    expected_macs: ExpectedMacs<'_>,
    tolerance_seconds: i64,
    now_unix_secs: i64,
    request: &WebhookRequest,
) -> Result<WebhookAcceptance, WebhookRejection> {
    if !request.method.eq_ignore_ascii_case("POST") {
        return Err(WebhookRejection::Unsupported(format!(
            "method {} is not POST",
            request.method
        )));
    }
    let header = find_header(&request.headers, SIGNATURE_HEADER).ok_or_else(|| {
        WebhookRejection::BadSignature(format!("missing {SIGNATURE_HEADER} header"))
    })?;
    let signature = parse_signature_header(header)?;
    let expected =
        expected_macs(&signed_data(signature.timestamp, &request.body)).ok_or_else(|| {
            WebhookRejection::BadSignature("connector account has no webhook_secret".into())
        })?;
    if !any_signature_matches(&expected, &signature.v1) {
        return Err(WebhookRejection::BadSignature(
            "no v1 signature matches the webhook secret".into(),
        ));
    }
    let age = now_unix_secs.saturating_sub(signature.timestamp);
    if age.saturating_abs() > tolerance_seconds {
        return Err(WebhookRejection::StaleTimestamp(format!(
            "signed {age} s away from now, tolerance {tolerance_seconds} s"
        )));
    }
    let body: Value = serde_json::from_slice(&request.body)
        .map_err(|e| WebhookRejection::Malformed(format!("body is not JSON: {e}")))?;
    let events = normalise(&body)?;
    Ok(WebhookAcceptance {
        events,
        ack: HttpResponse {
            status: 200,
            headers: vec![Header {
                name: "Content-Type".into(),
                value: "application/json".into(),
            }],
            body: br#"{"received":true}"#.to_vec(),
        },
    })
}

/// The header value a PSP would send for `body` signed at `timestamp`.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mac = mac_for(secret, &signed_data(timestamp, body))
        .finalize()
        .into_bytes();
    format!("t={timestamp},v1={}", hex::encode(mac))
}

struct SignatureHeader {
    timestamp: i64,
    v1: Vec<Vec<u8>>,
}

fn parse_signature_header(value: &str) -> Result<SignatureHeader, WebhookRejection> {
    let mut timestamp = None;
    let mut v1 = Vec::new();
    for part in value.split(',') {
        let Some((key, val)) = part.trim().split_once('=') else {
            continue;
        };
        match key {
            "t" => timestamp = val.parse::<i64>().ok(),
            // A v1 that is not hex can never match; skipping it keeps the others usable.
            "v1" => v1.extend(hex::decode(val).ok()),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or_else(|| {
        WebhookRejection::BadSignature("signature header has no valid timestamp".into())
    })?;
    if v1.is_empty() {
        return Err(WebhookRejection::BadSignature(
            "signature header has no v1 signature".into(),
        ));
    }
    Ok(SignatureHeader { timestamp, v1 })
}

/// What the MAC covers: `"{t}.{raw body}"`.
pub fn signed_data(timestamp: i64, body: &[u8]) -> Vec<u8> {
    let mut data = timestamp.to_string().into_bytes();
    data.push(b'.');
    data.extend_from_slice(body);
    data
}

fn mac_for(secret: &str, data: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(data);
    mac
}

/// Constant-time comparison of every candidate with every expected MAC, so timing does
/// not leak an expected MAC.
fn any_signature_matches(expected: &[Vec<u8>], candidates: &[Vec<u8>]) -> bool {
    let mut matched = 0u8;
    for mac in expected {
        for candidate in candidates {
            if mac.len() == candidate.len() {
                let diff = mac
                    .iter()
                    .zip(candidate)
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b));
                matched |= u8::from(diff == 0);
            }
        }
    }
    matched == 1
}

fn find_header<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

fn normalise(body: &Value) -> Result<Vec<PaymentEvent>, WebhookRejection> {
    let malformed = |m: &str| WebhookRejection::Malformed(m.to_string());
    let event_id = str_field(body, "id").ok_or_else(|| malformed("missing id"))?;
    let event_type = str_field(body, "type").ok_or_else(|| malformed("missing type"))?;
    let data = body
        .get("data")
        .filter(|d| d.is_object())
        .ok_or_else(|| malformed("missing data object"))?;
    // A verified event of a type we do not act on is accepted with no events, so the PSP
    // stops retrying it.
    let Some(kind) = kind_for(event_type) else {
        return Ok(Vec::new());
    };
    let amount = amount(data).map_err(|f| WebhookRejection::Malformed(f.message))?;
    let refund_like = matches!(
        kind,
        EventKind::RefundSucceeded | EventKind::RefundFailed | EventKind::RefundProcessing
    );
    let (attempt_reference, action_reference) = if refund_like || kind == EventKind::PaymentCaptured
    {
        (None, str_field(data, "reference").map(String::from))
    } else {
        (str_field(data, "reference").map(String::from), None)
    };
    let psp_payment_reference = if kind == EventKind::Chargeback || refund_like {
        str_field(data, "payment").map(String::from)
    } else {
        None
    };
    let failure = matches!(
        kind,
        EventKind::PaymentFailed | EventKind::RefundFailed | EventKind::CaptureFailed
    )
    .then(|| Failure {
        category: FailureCategory::Declined,
        code: str_field(data, "decline_code")
            .unwrap_or("declined")
            .to_string(),
        message: format!("{event_type} webhook"),
    });
    Ok(vec![PaymentEvent {
        kind,
        attempt_reference,
        action_reference,
        psp_reference: str_field(data, "id").map(String::from),
        psp_payment_reference,
        amount,
        provider_event_id: Some(event_id.to_string()),
        evidence: EvidenceSource::Webhook,
        raw_status: str_field(data, "status").unwrap_or(event_type).to_string(),
        failure,
        next_action_url: str_field(data, "next_action_url").map(String::from),
    }])
}

fn kind_for(event_type: &str) -> Option<EventKind> {
    Some(match event_type {
        "payment.processing" => EventKind::PaymentProcessing,
        "payment.requires_action" => EventKind::CustomerActionRequired,
        "payment.authorized" => EventKind::PaymentAuthorized,
        "payment.captured" => EventKind::PaymentCaptured,
        "payment.capture_failed" => EventKind::CaptureFailed,
        "payment.succeeded" => EventKind::PaymentSucceeded,
        "payment.failed" => EventKind::PaymentFailed,
        "payment.canceled" => EventKind::PaymentCanceled,
        "refund.processing" => EventKind::RefundProcessing,
        "refund.succeeded" => EventKind::RefundSucceeded,
        "refund.failed" => EventKind::RefundFailed,
        "dispute.created" => EventKind::Chargeback,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_test";
    const NOW: i64 = 1_800_000_000;

    fn secrets() -> WebhookSecrets<'static> {
        WebhookSecrets {
            webhook_secret: Some(SECRET),
            tolerance_seconds: DEFAULT_TOLERANCE_SECONDS,
        }
    }

    fn request(signature: &str, body: &str) -> WebhookRequest {
        WebhookRequest {
            method: "POST".into(),
            path: "/webhooks/test-well-behaved/acct".into(),
            headers: vec![Header {
                name: "x-test-signature".into(),
                value: signature.into(),
            }],
            body: body.as_bytes().to_vec(),
        }
    }

    const SUCCEEDED: &str = r#"{"id":"evt_1","type":"payment.succeeded","data":{"id":"pay_1","reference":"att_1","amount":1000,"currency":"EUR","status":"succeeded"}}"#;

    #[test]
    fn a_correctly_signed_webhook_is_normalised_and_acknowledged() {
        let req = request(&sign(SECRET, NOW - 10, SUCCEEDED.as_bytes()), SUCCEEDED);
        let acceptance = verify_and_normalise(&secrets(), NOW, &req).unwrap();
        assert_eq!(acceptance.ack.status, 200);
        assert_eq!(acceptance.ack.body, br#"{"received":true}"#);
        let event = &acceptance.events[0];
        assert_eq!(event.kind, EventKind::PaymentSucceeded);
        assert_eq!(event.evidence, EvidenceSource::Webhook);
        assert_eq!(event.provider_event_id.as_deref(), Some("evt_1"));
        assert_eq!(event.attempt_reference.as_deref(), Some("att_1"));
        assert_eq!(event.amount.as_ref().map(|m| m.amount_minor), Some(1000));
    }

    #[test]
    fn any_of_several_v1_signatures_may_match() {
        let good = sign(SECRET, NOW, SUCCEEDED.as_bytes());
        let v1 = good.split_once(",v1=").unwrap().1;
        let header = format!("t={NOW},v1={},v1={v1}", "00".repeat(32));
        assert!(verify_and_normalise(&secrets(), NOW, &request(&header, SUCCEEDED)).is_ok());
    }

    #[test]
    fn a_tampered_body_or_wrong_secret_is_a_bad_signature() {
        let header = sign(SECRET, NOW, SUCCEEDED.as_bytes());
        let tampered = SUCCEEDED.replace("1000", "9000");
        let err = verify_and_normalise(&secrets(), NOW, &request(&header, &tampered)).unwrap_err();
        assert!(matches!(err, WebhookRejection::BadSignature(_)));
        let other = sign("whsec_other", NOW, SUCCEEDED.as_bytes());
        let err = verify_and_normalise(&secrets(), NOW, &request(&other, SUCCEEDED)).unwrap_err();
        assert!(matches!(err, WebhookRejection::BadSignature(_)));
    }

    #[test]
    fn a_signature_older_than_the_tolerance_is_stale() {
        let header = sign(SECRET, NOW - 301, SUCCEEDED.as_bytes());
        let err = verify_and_normalise(&secrets(), NOW, &request(&header, SUCCEEDED)).unwrap_err();
        assert!(matches!(err, WebhookRejection::StaleTimestamp(_)));
    }

    #[test]
    fn missing_secret_or_header_is_refused() {
        let no_secret = WebhookSecrets {
            webhook_secret: None,
            tolerance_seconds: 300,
        };
        let header = sign(SECRET, NOW, SUCCEEDED.as_bytes());
        assert!(verify_and_normalise(&no_secret, NOW, &request(&header, SUCCEEDED)).is_err());
        let mut req = request(&header, SUCCEEDED);
        req.headers.clear();
        assert!(matches!(
            verify_and_normalise(&secrets(), NOW, &req),
            Err(WebhookRejection::BadSignature(_))
        ));
    }

    #[test]
    fn unknown_verified_types_are_accepted_without_events() {
        let body = r#"{"id":"evt_2","type":"customer.updated","data":{}}"#;
        let req = request(&sign(SECRET, NOW, body.as_bytes()), body);
        let acceptance = verify_and_normalise(&secrets(), NOW, &req).unwrap();
        assert!(acceptance.events.is_empty());
    }

    #[test]
    fn refund_webhooks_carry_the_refund_reference_and_payment() {
        let body = r#"{"id":"evt_3","type":"refund.succeeded","data":{"id":"re_1","payment":"pay_1","reference":"rf_1","amount":300,"currency":"EUR"}}"#;
        let req = request(&sign(SECRET, NOW, body.as_bytes()), body);
        let event = &verify_and_normalise(&secrets(), NOW, &req).unwrap().events[0];
        assert_eq!(event.kind, EventKind::RefundSucceeded);
        assert_eq!(event.action_reference.as_deref(), Some("rf_1"));
        assert_eq!(event.psp_payment_reference.as_deref(), Some("pay_1"));
        assert_eq!(event.psp_reference.as_deref(), Some("re_1"));
    }
}
