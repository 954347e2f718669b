//! `Stripe-Signature` verification, as Stripe's official libraries do it.
//!
//! The header is `t=<unix seconds>,v1=<hex>[,v1=<hex>...][,v0=<hex>]`. Each `v1` is
//! `hex(HMAC-SHA256(key = the whole "whsec_..." secret as UTF-8 bytes, "{t}.{raw body}"))`.
//! The request is authentic when any `v1` matches (Stripe sends several while a secret is
//! being rolled); other schemes (`v0`, unknown ones) are ignored. Comparison is constant
//! time. The timestamp must be within the tolerance of the host's clock, in either
//! direction, and is checked only after the signature, so an unsigned request never
//! learns anything about our clock.
//!
//! The adapter never holds the secret: [`verify`] takes the expected MACs of
//! [`signed_payload`] from the host's keyring, one per valid version of the secret (a
//! secret being rolled verifies with either). [`compute_v1`] is the same computation
//! with a secret in hand, for tests and the sandbox.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// Stripe's default tolerance, also used by its libraries.
pub const DEFAULT_TOLERANCE_SECONDS: i64 = 300;

/// Why a signature header was refused. Messages never contain the secret or a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("no Stripe-Signature header")]
    MissingHeader,
    #[error("the Stripe-Signature header cannot be parsed: {0}")]
    Malformed(&'static str),
    #[error("the Stripe-Signature header has no v1 signature")]
    NoV1Signature,
    #[error("no v1 signature matches the payload and the webhook secret")]
    NoMatch,
    #[error("the keyring computed no signature: {0}")]
    Keyring(String),
    #[error("the signed timestamp is {age_seconds} s from the host's clock, beyond the tolerance of {tolerance_seconds} s")]
    Stale {
        age_seconds: i64,
        tolerance_seconds: i64,
    },
}

/// A parsed header: the timestamp and the candidate `v1` signatures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureHeader {
    pub timestamp: i64,
    pub v1: Vec<String>,
}

/// Parse `t=...,v1=...`. Every element must be `key=value`; `t` must appear once, as an
/// integer; unknown schemes are kept out of `v1` and otherwise ignored.
pub fn parse_header(header: &str) -> Result<SignatureHeader, SignatureError> {
    let mut timestamp = None;
    let mut v1 = Vec::new();
    for item in header.split(',') {
        let item = item.trim();
        let (key, value) = item
            .split_once('=')
            .ok_or(SignatureError::Malformed("an element is not key=value"))?;
        match key {
            "t" => {
                if timestamp.is_some() {
                    return Err(SignatureError::Malformed("more than one timestamp"));
                }
                let t = value
                    .parse::<i64>()
                    .map_err(|_| SignatureError::Malformed("the timestamp is not an integer"))?;
                timestamp = Some(t);
            }
            "v1" => v1.push(value.to_string()),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed("no timestamp"))?;
    Ok(SignatureHeader { timestamp, v1 })
}

/// What Stripe signs: `"{timestamp}.{payload}"`.
pub fn signed_payload(timestamp: i64, payload: &[u8]) -> Vec<u8> {
    let mut data = timestamp.to_string().into_bytes();
    data.push(b'.');
    data.extend_from_slice(payload);
    data
}

/// `hex(HMAC-SHA256(secret, "{timestamp}.{payload}"))`: what Stripe puts in `v1`.
pub fn compute_v1(secret: &str, timestamp: i64, payload: &[u8]) -> String {
    // HMAC accepts keys of any length, so `new_from_slice` cannot fail here.
    let mut mac = match HmacSha256::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
    };
    mac.update(&signed_payload(timestamp, payload));
    hex::encode(mac.finalize().into_bytes())
}

/// Verify `header` for `payload`. `expected_macs` computes the MACs of the signed
/// payload with every valid version of the secret (the host's keyring). Returns the
/// signed timestamp when authentic and fresh.
pub fn verify(
    header: Option<&str>,
    payload: &[u8],
    expected_macs: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>, SignatureError>,
    tolerance_seconds: i64,
    now_unix_seconds: i64,
) -> Result<i64, SignatureError> {
    let header = parse_header(header.ok_or(SignatureError::MissingHeader)?)?;
    if header.v1.is_empty() {
        return Err(SignatureError::NoV1Signature);
    }
    let expected = expected_macs(&signed_payload(header.timestamp, payload))?;
    let mut matched = subtle::Choice::from(0u8);
    for candidate in &header.v1 {
        // A candidate that is not 64 hex digits cannot match; it is still just a candidate.
        if let Ok(bytes) = hex::decode(candidate) {
            for mac in &expected {
                if bytes.len() == mac.len() && mac.len() == 32 {
                    matched |= bytes.as_slice().ct_eq(mac);
                }
            }
        }
    }
    if !bool::from(matched) {
        return Err(SignatureError::NoMatch);
    }
    let age_seconds = now_unix_seconds.saturating_sub(header.timestamp);
    if age_seconds.saturating_abs() > tolerance_seconds {
        return Err(SignatureError::Stale {
            age_seconds,
            tolerance_seconds,
        });
    }
    Ok(header.timestamp)
}
