//! What merchants send, and its validation. Every type refuses unknown
//! fields; every check names the parameter it is about. Validation happens
//! before anything is written, so a refused request changes nothing.

use std::collections::BTreeMap;

use serde::Deserialize;
use sluice_core::{CaptureMode, Currency, Money, MoneyError};
use utoipa::{IntoParams, ToSchema};

use crate::error::ApiError;

/// Largest amount accepted, in minor units: far above any real payment, far
/// below where sums of amounts could overflow an i64.
pub const MAX_AMOUNT_MINOR: i64 = 999_999_999_999;
pub const MAX_ORDER_NO_CHARS: usize = 64;
pub const MAX_TOKEN_CHARS: usize = 255;
pub const MAX_URL_CHARS: usize = 2048;
pub const MAX_DESCRIPTION_CHARS: usize = 1000;
pub const MAX_REASON_CHARS: usize = 500;
pub const MAX_METADATA_KEYS: usize = 50;
pub const MAX_METADATA_KEY_CHARS: usize = 40;
pub const MAX_METADATA_VALUE_CHARS: usize = 500;
pub const MAX_ID_CHARS: usize = 100;
/// Longest payment method type (`card`, `sepa_debit`, ...).
pub const MAX_METHOD_TYPE_CHARS: usize = 40;
/// Longest a fulfillment deadline may lie in the future (90 days).
pub const MAX_FULFILLMENT_WINDOW_MS: i64 = 90 * 24 * 3600 * 1000;

/// `automatic` takes the money at once (sale); `manual` only authorizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CaptureModeParam {
    Automatic,
    Manual,
}

impl From<CaptureModeParam> for CaptureMode {
    fn from(mode: CaptureModeParam) -> Self {
        match mode {
            CaptureModeParam::Automatic => CaptureMode::Automatic,
            CaptureModeParam::Manual => CaptureMode::Manual,
        }
    }
}

/// Pick the merchant's only active connector account of this adapter.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoutingHint {
    #[schema(schema_with = crate::openapi::fields::routing_adapter)]
    pub adapter: String,
}

/// `push`: the merchant confirms fulfillment through the API. `pull`: Sluice
/// calls the merchant's fulfillment endpoint (configured per merchant by an
/// administrator) and reads the business fact from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FulfillmentModeParam {
    Push,
    Pull,
}

/// Guaranteed fulfillment or refund (issue 7): the business goal and its deadline.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FulfillmentParams {
    /// The merchant's stable business goal; several payments may serve one.
    #[schema(schema_with = crate::openapi::fields::biz_key)]
    pub biz_key: String,
    /// Unix milliseconds; in the future, at most 90 days ahead.
    #[serde(deserialize_with = "integer")]
    pub deadline: i64,
    pub mode: FulfillmentModeParam,
    /// Not part of the contract (hence not in the document): the pull-mode
    /// endpoint is configured per merchant, and naming one here is refused
    /// with a message that says so.
    #[schema(ignore)]
    pub endpoint: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePaymentRequest {
    /// Minor units (cents for EUR), > 0.
    #[schema(schema_with = crate::openapi::fields::amount)]
    #[serde(deserialize_with = "integer")]
    pub amount: i64,
    /// ISO 4217, upper case.
    #[schema(schema_with = crate::openapi::fields::currency)]
    pub currency: String,
    /// Unique per merchant: creating again with the same number returns the
    /// existing payment if every parameter matches, 409 otherwise.
    #[schema(schema_with = crate::openapi::fields::order_no)]
    pub merchant_order_no: String,
    /// Default `automatic`.
    pub capture_mode: Option<CaptureModeParam>,
    /// The connector account (id) to pay through (used with `confirm`;
    /// validated, not stored, without it: name it again on confirm).
    /// Not together with `routing`.
    #[schema(schema_with = crate::openapi::fields::create_connector_account)]
    pub connector_account: Option<String>,
    /// Or: route to the merchant's only active account of this adapter.
    pub routing: Option<RoutingHint>,
    /// An opaque payment method token for the PSP.
    #[schema(schema_with = crate::openapi::fields::payment_method)]
    pub payment_method: Option<String>,
    /// The kind of payment method (`card`, `sepa_debit`, ...), default `card`:
    /// what routing rules match and PSP metrics are labelled with (used with
    /// `confirm`; give it again on a later confirm).
    #[schema(schema_with = crate::openapi::fields::payment_method_type)]
    pub payment_method_type: Option<String>,
    #[schema(schema_with = crate::openapi::fields::return_url)]
    pub return_url: Option<String>,
    #[schema(schema_with = crate::openapi::fields::description)]
    pub description: Option<String>,
    /// Up to 50 string pairs; keys up to 40, values up to 500 characters.
    #[schema(schema_with = crate::openapi::fields::metadata)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Start an attempt at the PSP right away.
    pub confirm: Option<bool>,
    pub fulfillment: Option<FulfillmentParams>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmPaymentRequest {
    /// The connector account (id) to pay through. Default: the merchant's
    /// only active account (of the `routing` adapter, when given). Not
    /// together with `routing`.
    #[schema(schema_with = crate::openapi::fields::confirm_connector_account)]
    pub connector_account: Option<String>,
    /// Or: route to the merchant's only active account of this adapter.
    pub routing: Option<RoutingHint>,
    /// New payment details for this attempt (e.g. after a decline); the
    /// payment's own token otherwise.
    #[schema(schema_with = crate::openapi::fields::new_payment_method)]
    pub payment_method: Option<String>,
    /// The kind of payment method of this attempt (`card`, `sepa_debit`, ...),
    /// default `card`: what routing rules match and PSP metrics are labelled with.
    #[schema(schema_with = crate::openapi::fields::payment_method_type)]
    pub payment_method_type: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequestBody {
    /// Minor units; default: everything still capturable.
    #[schema(schema_with = crate::openapi::fields::capture_amount)]
    #[serde(default, deserialize_with = "optional_integer")]
    pub amount: Option<i64>,
    /// If given, must be the payment's currency.
    #[schema(schema_with = crate::openapi::fields::payment_currency)]
    pub currency: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundRequestBody {
    /// Minor units; default: everything still refundable.
    #[schema(schema_with = crate::openapi::fields::refund_amount)]
    #[serde(default, deserialize_with = "optional_integer")]
    pub amount: Option<i64>,
    /// If given, must be the payment's currency.
    #[schema(schema_with = crate::openapi::fields::payment_currency)]
    pub currency: Option<String>,
    #[schema(schema_with = crate::openapi::fields::refund_reason)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VoidRequestBody {}

/// The merchant confirms that the business goal was reached, attributed to
/// one attempt (seed 000's `resume_order_no`). Confirm first, and grant the
/// entitlement only if this call succeeds: a refused confirmation means the
/// money is being (or was) returned.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FulfillmentConfirmation {
    /// The attempt reference the business recorded the goal with (this
    /// payment's `attempts[].reference`, or another attempt of the same
    /// `biz_key`: then this payment is refunded as `fulfilled_elsewhere`).
    #[schema(schema_with = crate::openapi::fields::attempt_reference)]
    pub attempt_reference: String,
}

/// Filters and pagination of `GET /v1/payments`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListPaymentsQuery {
    /// 1 to 100, default 20.
    #[param(schema_with = crate::openapi::fields::page_limit)]
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    #[param(schema_with = crate::openapi::fields::cursor)]
    pub starting_after: Option<String>,
    /// A client status: `created`, `processing`, `requires_action`,
    /// `authorized`, `succeeded`, `partially_refunded`, `refunded`, `failed`,
    /// `canceled`, `expired` or `manual_review`.
    #[param(value_type = Option<crate::views::PaymentStatus>)]
    pub status: Option<String>,
    /// Created at or after (unix ms); not after `created_lte`.
    pub created_gte: Option<i64>,
    /// Created at or before (unix ms).
    pub created_lte: Option<i64>,
    #[param(schema_with = crate::openapi::fields::order_no_filter)]
    pub merchant_order_no: Option<String>,
}

/// Most payments one page of `GET /v1/payments` holds.
pub const MAX_PAGE: i64 = 100;

/// `GET /v1/payments/{id}/timeline`: one page of the history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TimelineQuery {
    #[param(schema_with = crate::openapi::fields::timeline_limit)]
    pub limit: Option<i64>,
    #[param(schema_with = crate::openapi::fields::timeline_cursor)]
    pub starting_after: Option<i64>,
}

/// Most history rows one page of a timeline holds, and the default.
pub const MAX_TIMELINE_PAGE: i64 = 500;
pub const DEFAULT_TIMELINE_PAGE: i64 = 100;

// ---- integers ---------------------------------------------------------------------

/// An integer, also written with a zero fraction (`259.0`): JSON Schema's
/// `integer`, which the OpenAPI document promises, includes those. A value
/// with a fraction, or out of range, is refused like any type error.
pub fn integer<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    deserializer.deserialize_any(IntegerVisitor)
}

/// [`integer`] for an optional field (`null` or absent is `None`).
pub fn optional_integer<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i64>, D::Error> {
    deserializer.deserialize_option(OptionalIntegerVisitor)
}

struct IntegerVisitor;

impl serde::de::Visitor<'_> for IntegerVisitor {
    type Value = i64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an integer")
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<i64, E> {
        Ok(v)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<i64, E> {
        i64::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<i64, E> {
        // 2^53: every integer below it is exact as an f64.
        const EXACT: f64 = 9_007_199_254_740_992.0;
        if v.fract() == 0.0 && v.abs() < EXACT {
            // Integral and within ±2^53, so the cast is exact.
            Ok(v as i64)
        } else {
            Err(E::invalid_type(serde::de::Unexpected::Float(v), &self))
        }
    }
}

struct OptionalIntegerVisitor;

impl<'de> serde::de::Visitor<'de> for OptionalIntegerVisitor {
    type Value = Option<i64>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an integer or null")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Option<i64>, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Option<i64>, E> {
        Ok(None)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<i64>, D::Error> {
        integer(d).map(Some)
    }
}

// ---- field checks --------------------------------------------------------------

pub fn amount(value: i64, param: &str) -> Result<i64, ApiError> {
    if value <= 0 {
        return Err(ApiError::invalid(
            "amount_invalid",
            param,
            format!("{param} must be a positive integer number of minor units, got {value}"),
        ));
    }
    if value > MAX_AMOUNT_MINOR {
        return Err(ApiError::invalid(
            "amount_too_large",
            param,
            format!("{param} must be at most {MAX_AMOUNT_MINOR} minor units, got {value}"),
        ));
    }
    Ok(value)
}

pub fn currency(code: &str, param: &str) -> Result<Currency, ApiError> {
    Currency::parse(code).map_err(|e| {
        let code = match e {
            MoneyError::UnsupportedCurrency(_) => "currency_unsupported",
            _ => "currency_invalid",
        };
        ApiError::invalid(code, param, e.to_string())
    })
}

pub fn money(amount_minor: i64, code: &str) -> Result<Money, ApiError> {
    let amount_minor = amount(amount_minor, "amount")?;
    let currency = currency(code, "currency")?;
    Ok(Money {
        amount_minor,
        currency,
    })
}

/// An optional currency that, when given, must be the payment's.
pub fn same_currency(given: Option<&str>, expected: Currency) -> Result<(), ApiError> {
    let Some(given) = given else { return Ok(()) };
    let given = currency(given, "currency")?;
    if given != expected {
        return Err(ApiError::state_conflict(
            "currency_mismatch",
            "currency",
            format!("the payment is in {expected}, not {given}"),
        ));
    }
    Ok(())
}

/// A free text: no control characters, at most `max` characters.
pub fn text(value: &str, param: &str, max: usize) -> Result<String, ApiError> {
    if value.chars().count() > max {
        return Err(ApiError::invalid(
            "string_too_long",
            param,
            format!("{param} must be at most {max} characters"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "string_invalid",
            param,
            format!("{param} must not contain control characters"),
        ));
    }
    Ok(value.to_owned())
}

/// A non-empty text without surrounding whitespace.
pub fn required_text(value: &str, param: &str, max: usize) -> Result<String, ApiError> {
    let value = text(value, param, max)?;
    if value.is_empty() || value.trim() != value {
        return Err(ApiError::invalid(
            "string_invalid",
            param,
            format!("{param} must be non-empty, without leading or trailing spaces"),
        ));
    }
    Ok(value)
}

pub fn optional_text(
    value: Option<&str>,
    param: &str,
    max: usize,
) -> Result<Option<String>, ApiError> {
    value.map(|v| required_text(v, param, max)).transpose()
}

/// An absolute http(s) URL without whitespace.
pub fn url(value: &str, param: &str) -> Result<String, ApiError> {
    let value = required_text(value, param, MAX_URL_CHARS)?;
    let scheme_ok = value.starts_with("https://") || value.starts_with("http://");
    if !scheme_ok || value.chars().any(char::is_whitespace) {
        return Err(ApiError::invalid(
            "url_invalid",
            param,
            format!("{param} must be an absolute http:// or https:// URL"),
        ));
    }
    Ok(value)
}

pub fn metadata(map: &BTreeMap<String, String>) -> Result<serde_json::Value, ApiError> {
    if map.len() > MAX_METADATA_KEYS {
        return Err(ApiError::invalid(
            "metadata_invalid",
            "metadata",
            format!("metadata may hold at most {MAX_METADATA_KEYS} keys"),
        ));
    }
    let mut out = serde_json::Map::new();
    for (key, value) in map {
        let param = format!(
            "metadata.{}",
            key.chars().take(MAX_METADATA_KEY_CHARS).collect::<String>()
        );
        required_text(key, &param, MAX_METADATA_KEY_CHARS)?;
        text(value, &param, MAX_METADATA_VALUE_CHARS)?;
        out.insert(key.clone(), serde_json::Value::String(value.clone()));
    }
    Ok(serde_json::Value::Object(out))
}

/// A payment method type: a lower-case letter, then lower-case letters, digits and
/// `_`, at most [`MAX_METHOD_TYPE_CHARS`]. Routing rules match it exactly.
pub fn payment_method_type(value: Option<&str>) -> Result<Option<String>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let mut bytes = value.bytes();
    let starts = bytes.next().is_some_and(|b| b.is_ascii_lowercase());
    let rest = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !starts || !rest || value.len() > MAX_METHOD_TYPE_CHARS {
        return Err(ApiError::invalid(
            "string_invalid",
            "payment_method_type",
            format!(
                "payment_method_type is a lower-case letter, then lower-case letters, digits \
                 or '_', at most {MAX_METHOD_TYPE_CHARS} characters (e.g. card, sepa_debit)"
            ),
        ));
    }
    Ok(Some(value.to_owned()))
}

/// An id in a path or body: short, visible ASCII. Anything else cannot exist,
/// so it is reported as missing rather than malformed (no oracle).
pub fn looks_like_id(value: &str) -> bool {
    !value.is_empty() && value.len() <= MAX_ID_CHARS && value.bytes().all(|b| b.is_ascii_graphic())
}

pub fn fulfillment(
    params: &FulfillmentParams,
    now_ms: i64,
) -> Result<sluice_store::Fulfillment, ApiError> {
    let biz_key = required_text(
        &params.biz_key,
        "fulfillment.biz_key",
        MAX_ORDER_NO_CHARS * 2,
    )?;
    if params.endpoint.is_some() {
        return Err(ApiError::invalid(
            "fulfillment_endpoint_per_merchant",
            "fulfillment.endpoint",
            "the fulfillment endpoint is configured per merchant (PUT /admin/merchants/{id}/fulfillment_endpoint), not per payment",
        ));
    }
    if params.deadline <= now_ms
        || params.deadline > now_ms.saturating_add(MAX_FULFILLMENT_WINDOW_MS)
    {
        return Err(ApiError::invalid(
            "fulfillment_deadline_invalid",
            "fulfillment.deadline",
            "fulfillment.deadline must be in the future (unix ms), at most 90 days ahead",
        ));
    }
    Ok(sluice_store::Fulfillment {
        biz_key: Some(biz_key),
        deadline: Some(params.deadline),
        mode: Some(
            match params.mode {
                FulfillmentModeParam::Push => "push",
                FulfillmentModeParam::Pull => "pull",
            }
            .into(),
        ),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_must_be_positive_and_bounded() {
        assert_eq!(
            amount(0, "amount").unwrap_err().detail.code,
            "amount_invalid"
        );
        assert_eq!(
            amount(-1, "amount").unwrap_err().detail.code,
            "amount_invalid"
        );
        assert_eq!(
            amount(MAX_AMOUNT_MINOR + 1, "amount")
                .unwrap_err()
                .detail
                .code,
            "amount_too_large"
        );
        assert_eq!(amount(1, "amount").unwrap(), 1);
    }

    #[test]
    fn integral_floats_are_integers_and_fractions_are_not() {
        #[derive(Debug, Deserialize)]
        struct Body {
            #[serde(deserialize_with = "integer")]
            amount: i64,
            #[serde(default, deserialize_with = "optional_integer")]
            limit: Option<i64>,
        }
        let parse = |text: &str| serde_json::from_str::<Body>(text).map(|b| (b.amount, b.limit));
        assert_eq!(parse(r#"{"amount": 259}"#).unwrap(), (259, None));
        assert_eq!(
            parse(r#"{"amount": 259.0, "limit": 5.0}"#).unwrap(),
            (259, Some(5))
        );
        assert_eq!(
            parse(r#"{"amount": -3, "limit": null}"#).unwrap(),
            (-3, None)
        );
        for bad in [
            r#"{"amount": 10.5}"#,
            r#"{"amount": 1e30}"#,
            r#"{"amount": 18446744073709551615}"#,
            r#"{"amount": "10"}"#,
            r#"{"amount": 1, "limit": 0.5}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn currencies_are_validated_by_the_core() {
        assert_eq!(
            currency("eur", "currency").unwrap_err().detail.code,
            "currency_invalid"
        );
        assert_eq!(
            currency("XYZ", "currency").unwrap_err().detail.code,
            "currency_unsupported"
        );
        let eur = currency("EUR", "currency").unwrap();
        assert_eq!(
            same_currency(Some("USD"), eur).unwrap_err().detail.code,
            "currency_mismatch"
        );
        assert!(same_currency(None, eur).is_ok());
    }

    #[test]
    fn texts_refuse_control_characters_and_excess_length() {
        assert!(text("a\u{0}b", "x", 10).is_err());
        assert!(text(&"é".repeat(11), "x", 10).is_err());
        assert!(text(&"é".repeat(10), "x", 10).is_ok());
        assert!(required_text(" padded", "x", 10).is_err());
        assert!(url("javascript:alert(1)", "return_url").is_err());
        assert!(url("https://shop.example/return", "return_url").is_ok());
    }

    #[test]
    fn metadata_is_bounded() {
        let many: BTreeMap<String, String> =
            (0..51).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(metadata(&many).is_err());
        let long_value = BTreeMap::from([("k".to_string(), "v".repeat(501))]);
        assert_eq!(
            metadata(&long_value).unwrap_err().detail.param.as_deref(),
            Some("metadata.k")
        );
    }
}
