//! A build-time variant of this test adapter, so host tests can load a second version
//! of `test-well-behaved` that behaves differently from the first: built with the
//! feature `variant` (`cargo xtask build-adapters` puts it in
//! `adapters/variants/test-well-behaved-variant.wasm`), it misbehaves as the connector
//! account's setting `test_variant` says:
//! - `skewed`: every amount it reads is a minor unit more than the PSP said (a shadow
//!   that disagrees on one field);
//! - `unknown_on_create`: it reads no answer to a new payment, so the payment's outcome
//!   is UNKNOWN (a canary that must be rolled back); queries are read soundly, so its
//!   attempts converge.
//!
//! Without the feature this module changes nothing, whatever the setting.

use crate::types::{Failure, FailureCategory, Operation, OperationContext, PaymentEvent};

/// The version `describe()` reports: the variant is a distinguishable version.
pub fn version() -> &'static str {
    if cfg!(feature = "variant") {
        "1.0.1-variant"
    } else {
        option_env!("SLUICE_TEST_ADAPTER_VERSION").unwrap_or("1.0.0")
    }
}

/// The variant's reading of an answer, from the sound one; `mode` is the account's
/// `test_variant` setting.
pub fn after_parse(
    mode: Option<&str>,
    ctx: &OperationContext,
    parsed: Result<Vec<PaymentEvent>, Failure>,
) -> Result<Vec<PaymentEvent>, Failure> {
    if !cfg!(feature = "variant") {
        return parsed;
    }
    match mode {
        Some("skewed") => parsed.map(|events| events.into_iter().map(skew).collect()),
        Some("unknown_on_create")
            if matches!(ctx.operation, Operation::Authorize | Operation::Sale) =>
        {
            Err(Failure {
                category: FailureCategory::Unknown,
                code: "variant_unknown".into(),
                message: "this variant reads no answer to a new payment".into(),
            })
        }
        _ => parsed,
    }
}

fn skew(mut event: PaymentEvent) -> PaymentEvent {
    if let Some(amount) = &mut event.amount {
        amount.amount_minor = amount.amount_minor.saturating_add(1);
    }
    event
}
