//! Adyen's notification HMAC, as Adyen's libraries compute it.
//!
//! Each `NotificationRequestItem` is signed on its own:
//! `base64(HMAC-SHA256(key = hex_decode(HMAC key), data))` where `data` joins, with `:`,
//! `pspReference`, `originalReference`, `merchantAccountCode`, `merchantReference`,
//! `amount.value` (integer minor units as decimal text), `amount.currency`, `eventCode`
//! and `success` (`"true"`/`"false"`); a missing field is the empty string. The signature
//! travels in `additionalData.hmacSignature` and is compared in constant time.
//!
//! In the adapter the MAC comes from the host's keyring ([`matches_any`]); [`sign`] and
//! [`is_valid`] compute it with a key in hand, for tests and the sandbox.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// Why a key cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the HMAC key is not a hexadecimal string")]
    NotHex,
    #[error("the HMAC key is empty")]
    Empty,
}

/// The HMAC key from its hex form (as Adyen's Customer Area shows it).
pub fn decode_key(hex_key: &str) -> Result<Vec<u8>, KeyError> {
    let key = hex::decode(hex_key.trim()).map_err(|_| KeyError::NotHex)?;
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    Ok(key)
}

/// The eight signed fields of one notification item, already rendered as text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignedFields {
    pub psp_reference: String,
    pub original_reference: String,
    pub merchant_account_code: String,
    pub merchant_reference: String,
    pub value: String,
    pub currency: String,
    pub event_code: String,
    pub success: String,
}

impl SignedFields {
    /// `pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success`.
    pub fn data_to_sign(&self) -> String {
        [
            self.psp_reference.as_str(),
            &self.original_reference,
            &self.merchant_account_code,
            &self.merchant_reference,
            &self.value,
            &self.currency,
            &self.event_code,
            &self.success,
        ]
        .join(":")
    }
}

fn mac(key: &[u8], fields: &SignedFields) -> [u8; 32] {
    // HMAC accepts keys of any length, so `new_from_slice` cannot fail here.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
    };
    mac.update(fields.data_to_sign().as_bytes());
    mac.finalize().into_bytes().into()
}

/// The base64 signature Adyen puts in `additionalData.hmacSignature`.
pub fn sign(key: &[u8], fields: &SignedFields) -> String {
    base64::engine::general_purpose::STANDARD.encode(mac(key, fields))
}

/// Whether `signature` (base64) equals any of `macs` (one per valid key version), in
/// constant time per candidate.
pub fn matches_any(macs: &[Vec<u8>], signature: &str) -> bool {
    let Ok(given) = base64::engine::general_purpose::STANDARD.decode(signature.trim()) else {
        return false;
    };
    let mut matched = subtle::Choice::from(0u8);
    for mac in macs {
        if mac.len() == given.len() && mac.len() == 32 {
            matched |= given.as_slice().ct_eq(mac);
        }
    }
    bool::from(matched)
}

/// Whether `signature` (base64) is the item's signature under `key`, in constant time.
pub fn is_valid(key: &[u8], fields: &SignedFields, signature: &str) -> bool {
    let Ok(given) = base64::engine::general_purpose::STANDARD.decode(signature.trim()) else {
        return false;
    };
    let expected = mac(key, fields);
    given.len() == expected.len() && bool::from(given.as_slice().ct_eq(&expected))
}
