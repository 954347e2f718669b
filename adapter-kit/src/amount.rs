//! Decimal amounts in a currency's major unit (as settlement reports print them) →
//! integer minor units, exactly: no floats anywhere.

/// Why an amount cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("{0:?} is not a decimal amount")]
    NotDecimal(String),
    #[error("{amount:?} has more decimals than {currency} has minor units")]
    TooPrecise { amount: String, currency: String },
    #[error("{0:?} is out of range")]
    OutOfRange(String),
    #[error("{0:?} is not an ISO 4217 currency code")]
    BadCurrency(String),
}

/// ISO 4217 minor-unit exponent of `code` (upper case): 0, 2 or 3.
pub fn exponent(code: &str) -> Result<u32, AmountError> {
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(AmountError::BadCurrency(code.to_string()));
    }
    const ZERO: &[&str] = &[
        "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "VND", "VUV",
        "XAF", "XOF", "XPF",
    ];
    const THREE: &[&str] = &["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"];
    Ok(if ZERO.contains(&code) {
        0
    } else if THREE.contains(&code) {
        3
    } else {
        2
    })
}

/// `"12.34"` EUR → 1234; `"-7.5"` EUR → -750; `"1,000.00"` is refused (no grouping);
/// an empty text is zero. Extra decimals are accepted only when they are zeros.
pub fn minor_units(text: &str, currency: &str) -> Result<i64, AmountError> {
    let exp = exponent(currency)?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(0);
    }
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let is_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !is_digits(whole) || !is_digits(fraction) {
        return Err(AmountError::NotDecimal(text.to_string()));
    }
    let exp_len = exp as usize;
    if fraction.len() > exp_len && fraction[exp_len..].bytes().any(|b| b != b'0') {
        return Err(AmountError::TooPrecise {
            amount: text.to_string(),
            currency: currency.to_string(),
        });
    }
    let mut padded: String = fraction.chars().take(exp_len).collect();
    while padded.len() < exp_len {
        padded.push('0');
    }
    let out_of_range = || AmountError::OutOfRange(text.to_string());
    let whole: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| out_of_range())?
    };
    let fraction: i64 = if padded.is_empty() {
        0
    } else {
        padded.parse().map_err(|_| out_of_range())?
    };
    let value = whole
        .checked_mul(10i64.pow(exp))
        .and_then(|w| w.checked_add(fraction))
        .ok_or_else(out_of_range)?;
    Ok(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_follow_the_currency_exponent() {
        assert_eq!(minor_units("5.00", "GBP"), Ok(500));
        assert_eq!(minor_units("7.5", "EUR"), Ok(750));
        assert_eq!(minor_units("-0.29", "USD"), Ok(-29));
        assert_eq!(minor_units("1500", "JPY"), Ok(1500));
        assert_eq!(minor_units("1.234", "KWD"), Ok(1234));
        assert_eq!(minor_units("3.100", "EUR"), Ok(310));
        assert_eq!(minor_units("", "EUR"), Ok(0));
    }

    #[test]
    fn odd_amounts_are_refused() {
        assert!(matches!(
            minor_units("1.005", "EUR"),
            Err(AmountError::TooPrecise { .. })
        ));
        assert!(matches!(
            minor_units("1,000.00", "EUR"),
            Err(AmountError::NotDecimal(_))
        ));
        assert!(matches!(
            minor_units("1e3", "EUR"),
            Err(AmountError::NotDecimal(_))
        ));
        assert!(matches!(
            minor_units(".", "EUR"),
            Err(AmountError::NotDecimal(_))
        ));
        assert!(matches!(
            minor_units("99999999999999999999", "EUR"),
            Err(AmountError::OutOfRange(_))
        ));
        assert!(matches!(
            minor_units("1", "eur"),
            Err(AmountError::BadCurrency(_))
        ));
    }
}
