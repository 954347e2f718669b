//! Integer money: minor units plus an ISO 4217 currency. No floats anywhere.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a piece of money input is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("amount must be greater than zero, got {0}")]
    NotPositive(i64),
    #[error("currency must be a three-letter upper-case ISO 4217 code, got {0:?}")]
    BadCurrency(String),
    #[error("currency {0} is not supported")]
    UnsupportedCurrency(String),
    #[error("currency mismatch: expected {expected}, got {got}")]
    CurrencyMismatch { expected: Currency, got: Currency },
    #[error("amount arithmetic overflowed")]
    Overflow,
}

/// An ISO 4217 currency code, validated to three upper-case ASCII letters and
/// to the set of currencies Sluice knows the minor unit of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Currency([u8; 3]);

/// Currencies Sluice accepts, with their minor-unit exponent.
const KNOWN_CURRENCIES: &[(&str, u8)] = &[
    ("AUD", 2),
    ("BRL", 2),
    ("CAD", 2),
    ("CHF", 2),
    ("CNY", 2),
    ("CZK", 2),
    ("DKK", 2),
    ("EUR", 2),
    ("GBP", 2),
    ("HKD", 2),
    ("HUF", 2),
    ("INR", 2),
    ("JPY", 0),
    ("KRW", 0),
    ("MXN", 2),
    ("NOK", 2),
    ("NZD", 2),
    ("PLN", 2),
    ("SEK", 2),
    ("SGD", 2),
    ("USD", 2),
    ("ZAR", 2),
];

impl Currency {
    /// Every code [`Currency::parse`] accepts, in alphabetical order (the
    /// merchant API's OpenAPI document lists them).
    pub fn known_codes() -> impl Iterator<Item = &'static str> {
        KNOWN_CURRENCIES.iter().map(|(code, _)| *code)
    }

    /// Parse and validate a currency code.
    pub fn parse(code: &str) -> Result<Self, MoneyError> {
        let bytes = code.as_bytes();
        if bytes.len() != 3 || !bytes.iter().all(u8::is_ascii_uppercase) {
            return Err(MoneyError::BadCurrency(code.to_owned()));
        }
        if !KNOWN_CURRENCIES.iter().any(|(known, _)| *known == code) {
            return Err(MoneyError::UnsupportedCurrency(code.to_owned()));
        }
        Ok(Currency([bytes[0], bytes[1], bytes[2]]))
    }

    pub fn as_str(&self) -> &str {
        // Only ever built from three ASCII upper-case letters in `parse`.
        std::str::from_utf8(&self.0).unwrap_or("XXX")
    }

    /// Number of decimal places of the minor unit (2 for EUR, 0 for JPY).
    pub fn minor_unit_exponent(&self) -> u8 {
        KNOWN_CURRENCIES
            .iter()
            .find(|(code, _)| *code == self.as_str())
            .map(|(_, exp)| *exp)
            .unwrap_or(2)
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for Currency {
    type Error = MoneyError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Currency::parse(&value)
    }
}

impl From<Currency> for String {
    fn from(value: Currency) -> Self {
        value.as_str().to_owned()
    }
}

/// A positive or zero amount of money in minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Money {
    pub amount_minor: i64,
    pub currency: Currency,
}

impl Money {
    /// A strictly positive amount, as every merchant-supplied amount must be.
    pub fn positive(amount_minor: i64, currency: Currency) -> Result<Self, MoneyError> {
        if amount_minor <= 0 {
            return Err(MoneyError::NotPositive(amount_minor));
        }
        Ok(Money {
            amount_minor,
            currency,
        })
    }

    pub fn ensure_same_currency(&self, other: Currency) -> Result<(), MoneyError> {
        if self.currency != other {
            return Err(MoneyError::CurrencyMismatch {
                expected: self.currency,
                got: other,
            });
        }
        Ok(())
    }
}

impl fmt::Display for Money {
    /// `EUR 1000` (minor units): exact, never a float.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.currency, self.amount_minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_case_or_unknown_currency_is_refused() {
        assert!(matches!(
            Currency::parse("usd"),
            Err(MoneyError::BadCurrency(_))
        ));
        assert!(matches!(
            Currency::parse("XYZ"),
            Err(MoneyError::UnsupportedCurrency(_))
        ));
        assert_eq!(
            Currency::parse("EUR").map(|c| c.to_string()),
            Ok("EUR".into())
        );
    }

    #[test]
    fn zero_and_negative_amounts_are_refused() {
        let eur = Currency::parse("EUR").unwrap();
        assert_eq!(Money::positive(0, eur), Err(MoneyError::NotPositive(0)));
        assert_eq!(Money::positive(-5, eur), Err(MoneyError::NotPositive(-5)));
        assert!(Money::positive(1, eur).is_ok());
    }
}
