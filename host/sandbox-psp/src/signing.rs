//! Webhook signatures exactly as Stripe and Adyen document them.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Why a signature could not be computed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignError {
    #[error("the Adyen HMAC key is not valid hex")]
    KeyNotHex,
}

/// `hex(HMAC-SHA256(secret, "{t}.{body}"))`: Stripe's `v1` scheme. The `whsec_...`
/// string is the key as-is, prefix included.
pub fn stripe_v1_signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = hmac_with_key(secret.as_bytes());
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// The full `Stripe-Signature` header value: `t=<unix>,v1=<hex>`.
pub fn stripe_signature_header(secret: &str, timestamp: i64, body: &[u8]) -> String {
    format!(
        "t={timestamp},v1={}",
        stripe_v1_signature(secret, timestamp, body)
    )
}

/// The fields of one Adyen notification item that its HMAC signature covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdyenSignedFields<'a> {
    pub psp_reference: &'a str,
    /// Empty when the item has no original reference.
    pub original_reference: &'a str,
    pub merchant_account_code: &'a str,
    pub merchant_reference: &'a str,
    pub value: i64,
    pub currency: &'a str,
    pub event_code: &'a str,
    pub success: bool,
}

/// `pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success`.
pub fn adyen_signing_payload(fields: &AdyenSignedFields<'_>) -> String {
    format!(
        "{}:{}:{}:{}:{}:{}:{}:{}",
        fields.psp_reference,
        fields.original_reference,
        fields.merchant_account_code,
        fields.merchant_reference,
        fields.value,
        fields.currency,
        fields.event_code,
        fields.success
    )
}

/// `base64(HMAC-SHA256(hex_decode(key), payload))`: Adyen's `additionalData.hmacSignature`.
pub fn adyen_hmac_signature(
    hex_key: &str,
    fields: &AdyenSignedFields<'_>,
) -> Result<String, SignError> {
    let key = hex::decode(hex_key).map_err(|_| SignError::KeyNotHex)?;
    let mut mac = hmac_with_key(&key);
    mac.update(adyen_signing_payload(fields).as_bytes());
    Ok(base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

fn hmac_with_key(key: &[u8]) -> HmacSha256 {
    // HMAC is defined for keys of any length (long keys are hashed, short ones
    // padded), so `new_from_slice` cannot fail for `Hmac<Sha256>`.
    match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 accepts keys of every length"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adyen_signature_matches_adyens_published_vector() {
        let fields = AdyenSignedFields {
            psp_reference: "7914073381342284",
            original_reference: "",
            merchant_account_code: "TestMerchant",
            merchant_reference: "TestPayment-1407325143704",
            value: 1130,
            currency: "EUR",
            event_code: "AUTHORISATION",
            success: true,
        };
        let sig = adyen_hmac_signature(
            "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
            &fields,
        );
        assert_eq!(
            sig.as_deref(),
            Ok("coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=")
        );
    }

    #[test]
    fn adyen_signature_refuses_a_key_that_is_not_hex() {
        let fields = AdyenSignedFields {
            psp_reference: "1",
            original_reference: "",
            merchant_account_code: "M",
            merchant_reference: "r",
            value: 1,
            currency: "EUR",
            event_code: "AUTHORISATION",
            success: true,
        };
        assert_eq!(
            adyen_hmac_signature("not-hex", &fields),
            Err(SignError::KeyNotHex)
        );
    }

    #[test]
    fn stripe_header_carries_the_timestamp_and_a_hex_v1() {
        let header = stripe_signature_header("whsec_test", 1_700_000_000, b"{}");
        let (t, v1) = header.split_once(",v1=").unwrap_or(("", ""));
        assert_eq!(t, "t=1700000000");
        assert_eq!(v1.len(), 64);
        assert_eq!(v1, stripe_v1_signature("whsec_test", 1_700_000_000, b"{}"));
        assert_ne!(v1, stripe_v1_signature("whsec_other", 1_700_000_000, b"{}"));
    }
}
