//! The two signatures on every merchant webhook, made with one endpoint secret.
//!
//! `Sluice-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "{t}.{body}")>`:
//! the same scheme as Stripe's webhook signatures, so merchants can reuse what
//! they know: the key is the endpoint secret's UTF-8 bytes (the whole
//! `whsec_...` string), the message is the timestamp, a dot and the raw body.
//! Verification accepts any `v1` entry, so a future secret rotation can sign
//! with two keys at once.
//!
//! Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature:
//! v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`), so merchants can
//! verify with the specification's published library in their language. Its
//! key is the base64 decoding of the secret after `whsec_`, exactly what
//! those libraries compute from the same string. New endpoints get
//! `whsec_<base64 of 32 random bytes>`; endpoints created before had
//! `whsec_<64 hex digits>`, and hex digits are base64 characters (64 of them
//! decode without padding), so their secrets work with the libraries as
//! they are: no migration, no second secret. `webhook-id` is the event id,
//! the same on every retry and replay, as the specification asks.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "Sluice-Signature";
/// The header carrying the stable event id (also in the body as `id`).
pub const EVENT_ID_HEADER: &str = "Sluice-Event-Id";
/// Default tolerance between the signature's timestamp and the verifier's clock.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

/// Standard Webhooks: the message id (our event id).
pub const WEBHOOK_ID_HEADER: &str = "webhook-id";
/// Standard Webhooks: the send time, unix seconds.
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Standard Webhooks: space-separated `v1,<base64>` signatures.
pub const WEBHOOK_SIGNATURE_HEADER: &str = "webhook-signature";
/// The prefix of an endpoint secret.
pub const SECRET_PREFIX: &str = "whsec_";

type HmacSha256 = Hmac<Sha256>;

/// Why a secret has no Standard Webhooks key (never shows the secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("the endpoint secret after `whsec_` is not base64")]
    NotBase64,
    #[error("the endpoint secret is empty")]
    Empty,
}

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signature header has no t= timestamp")]
    MissingTimestamp,
    #[error("the signature header has no v1= signature")]
    MissingSignature,
    #[error("the signature timestamp is outside the tolerance")]
    OutsideTolerance,
    #[error("no v1 signature matches the body")]
    Mismatch,
}

fn mac(secret: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The header value for `body` signed at `timestamp` (unix seconds).
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let digest = mac(secret, timestamp, body).finalize().into_bytes();
    format!("t={timestamp},v1={}", hex::encode(digest))
}

/// The Standard Webhooks key of an endpoint secret: the base64 decoding of
/// what follows `whsec_`.
pub fn standard_key(secret: &str) -> Result<Vec<u8>, SecretError> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    let key = BASE64.decode(encoded).map_err(|_| SecretError::NotBase64)?;
    if key.is_empty() {
        return Err(SecretError::Empty);
    }
    Ok(key)
}

fn standard_mac(key: &[u8], msg_id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
    };
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `webhook-signature` value for `body` sent as message `msg_id` at
/// `timestamp` (unix seconds): `v1,<base64>`.
pub fn sign_standard(
    secret: &str,
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, SecretError> {
    let key = standard_key(secret)?;
    let digest = standard_mac(&key, msg_id, timestamp, body)
        .finalize()
        .into_bytes();
    Ok(format!("v1,{}", BASE64.encode(digest)))
}

/// Check Standard Webhooks headers against the raw body, in constant time:
/// any `v1,` entry of `signature_header` may match.
pub fn verify_standard(
    secret: &str,
    msg_id: &str,
    timestamp_header: &str,
    signature_header: &str,
    body: &[u8],
    now_unix: i64,
    tolerance_secs: i64,
) -> Result<(), SignatureError> {
    let timestamp = timestamp_header
        .trim()
        .parse::<i64>()
        .map_err(|_| SignatureError::MissingTimestamp)?;
    if (now_unix - timestamp).abs() > tolerance_secs {
        return Err(SignatureError::OutsideTolerance);
    }
    let candidates: Vec<&str> = signature_header
        .split(' ')
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .collect();
    if candidates.is_empty() {
        return Err(SignatureError::MissingSignature);
    }
    let key = standard_key(secret).map_err(|_| SignatureError::Mismatch)?;
    let expected = standard_mac(&key, msg_id, timestamp, body);
    let matches = candidates.iter().any(|candidate| {
        BASE64
            .decode(candidate)
            .map(|bytes| expected.clone().verify_slice(&bytes).is_ok())
            .unwrap_or(false)
    });
    if matches {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// A fresh endpoint secret: `whsec_` and the base64 of 32 random bytes, the
/// form Standard Webhooks' libraries expect.
pub fn mint_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("{SECRET_PREFIX}{}", BASE64.encode(bytes))
}

/// Check a `Sluice-Signature` header against the raw body, in constant time.
pub fn verify(
    secret: &str,
    header: &str,
    body: &[u8],
    now_unix: i64,
    tolerance_secs: i64,
) -> Result<(), SignatureError> {
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<i64>().ok(),
            Some(("v1", value)) => candidates.push(value),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::MissingTimestamp)?;
    if candidates.is_empty() {
        return Err(SignatureError::MissingSignature);
    }
    if (now_unix - timestamp).abs() > tolerance_secs {
        return Err(SignatureError::OutsideTolerance);
    }
    let expected = mac(secret, timestamp, body);
    let matches = candidates.iter().any(|candidate| {
        hex::decode(candidate)
            .map(|bytes| expected.clone().verify_slice(&bytes).is_ok())
            .unwrap_or(false)
    });
    if matches {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_and_any_change_to_body_time_or_secret_is_refused() {
        let body = br#"{"id":"evt_1"}"#;
        let header = sign("whsec_abc", 1_700_000_000, body);
        assert!(header.starts_with("t=1700000000,v1="));
        assert_eq!(
            verify("whsec_abc", &header, body, 1_700_000_100, 300),
            Ok(())
        );
        assert_eq!(
            verify(
                "whsec_abc",
                &header,
                br#"{"id":"evt_2"}"#,
                1_700_000_100,
                300
            ),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify("whsec_other", &header, body, 1_700_000_100, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify("whsec_abc", &header, body, 1_700_000_301, 300),
            Err(SignatureError::OutsideTolerance)
        );
        let rotated = format!("{header},v1=00ff");
        let rotated = rotated.replacen("v1=", "v1=deadbeef,v1=", 1);
        assert_eq!(
            verify("whsec_abc", &rotated, body, 1_700_000_000, 300),
            Ok(())
        );
        assert_eq!(
            verify("whsec_abc", "v1=00", body, 0, 300),
            Err(SignatureError::MissingTimestamp)
        );
        assert_eq!(
            verify("whsec_abc", "t=5", body, 5, 300),
            Err(SignatureError::MissingSignature)
        );
    }

    #[test]
    fn the_standard_signature_matches_the_specifications_published_test_vector() {
        // From the Standard Webhooks reference libraries' tests.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        let signature = sign_standard(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(
            signature.as_deref(),
            Ok("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
        let header = signature.unwrap();
        let verify = |secret: &str, body: &[u8], now: i64| {
            verify_standard(
                secret,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                "1614265330",
                &format!("v1,bm90IGl0 {header}"),
                body,
                now,
                300,
            )
        };
        assert_eq!(verify(secret, body, 1614265330), Ok(()));
        assert_eq!(
            verify("whsec_b3RoZXI=", body, 1614265330),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(secret, b"{}", 1614265330),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(secret, body, 1614265331 + 300),
            Err(SignatureError::OutsideTolerance)
        );
    }

    #[test]
    fn hex_secrets_of_older_endpoints_are_base64_keys_and_new_secrets_decode_to_32_bytes() {
        let legacy = format!("whsec_{}", "ab".repeat(32));
        assert_eq!(standard_key(&legacy).map(|k| k.len()), Ok(48));
        let fresh = mint_secret();
        assert!(fresh.starts_with("whsec_"), "{fresh}");
        assert_eq!(standard_key(&fresh).map(|k| k.len()), Ok(32));
        assert_eq!(
            standard_key("whsec_not base64!"),
            Err(SecretError::NotBase64)
        );
        assert_eq!(standard_key("whsec_"), Err(SecretError::Empty));
    }

    #[test]
    fn the_signature_matches_a_known_hmac_sha256_vector() {
        // Computed independently: printf '%s' '1.{}' | openssl dgst -sha256 -hmac key
        let header = sign("key", 1, b"{}");
        assert_eq!(
            header,
            "t=1,v1=1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224"
        );
        // The test vector in docs/webhooks.md.
        assert_eq!(
            sign("whsec_test", 1_767_225_600, br#"{"id":"evt_1"}"#),
            "t=1767225600,v1=45b40331de0325606dc5400202ade162460fbe48daf9401adfdcd0d7b4f35470"
        );
    }
}
