//! Operation context → the Adyen Checkout request (see `docs/psp-wire-subsets.md`).
//!
//! Adyen's Checkout API has no lookup of a payment or a refund. A query is therefore the
//! original request replayed, byte for byte, with the original `Idempotency-Key`: Adyen
//! returns the response of the first request and never performs it twice, and when the
//! first request never reached Adyen the replay is that very request (a sale stays a
//! sale, an authorization an authorization: the context's `capture-mode` says which).
//! Adyen's keys are unique per company account across endpoints, so the void uses its
//! own key (`<attempt reference>:void`), and keys are at most 64 characters.
//!
//! The API key is the placeholder `{{secret:api_key}}` in `X-API-Key`: the host
//! substitutes it after its destination check.

use crate::host::{
    require_config, Host, API_KEY_PLACEHOLDER, CONFIG_BASE_URL, CONFIG_MERCHANT_ACCOUNT,
};
use crate::model::{AdditionalData, Amount, ModificationRequest, PaymentMethod, PaymentRequest};
use crate::types::{
    CaptureMode, Failure, FailureCategory, Header, HttpRequest, Money, Operation, OperationContext,
};

/// The Checkout API version in every path.
pub const API_VERSION: &str = "v71";
/// Suffix that turns the attempt reference into the void's idempotency key.
pub const VOID_KEY_SUFFIX: &str = ":void";
/// Adyen's limit on `Idempotency-Key`.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 64;

/// Build the request for `ctx`. Err when the connector account lacks a setting
/// (`configuration`) or the context lacks what the operation needs (`unsupported`).
pub fn build_request(host: &impl Host, ctx: &OperationContext) -> Result<HttpRequest, Failure> {
    let base = require_config(host, CONFIG_BASE_URL)?;
    let base = base.trim_end_matches('/');
    let merchant_account = require_config(host, CONFIG_MERCHANT_ACCOUNT)?;
    let (path, body, key) = plan(ctx, &merchant_account)?;
    if key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS {
        return Err(unsupported(
            "idempotency_key_too_long",
            "Adyen accepts idempotency keys of at most 64 characters",
        ));
    }
    Ok(HttpRequest {
        method: "POST".to_string(),
        url: format!("{base}/{API_VERSION}{path}"),
        headers: vec![
            header("X-API-Key", API_KEY_PLACEHOLDER),
            header("Content-Type", "application/json"),
            header("Idempotency-Key", &key),
        ],
        body,
    })
}

/// The path under the API version, the JSON body and the idempotency key.
fn plan(
    ctx: &OperationContext,
    merchant_account: &str,
) -> Result<(String, Vec<u8>, String), Failure> {
    let attempt = non_empty(&ctx.attempt_reference, "attempt_reference")?;
    match ctx.operation {
        Operation::Authorize => payment(ctx, merchant_account, attempt, true),
        Operation::Sale => payment(ctx, merchant_account, attempt, false),
        // The query replays the creation exactly as it was sent, with the attempt's own
        // capture mode: Adyen answers a known key with the stored response, and a key it
        // never saw gets the very payment the merchant asked for, never an authorization
        // left open in place of a sale (or a capture in place of an authorization).
        Operation::QueryPayment => payment(
            ctx,
            merchant_account,
            attempt,
            ctx.capture_mode == CaptureMode::Manual,
        ),
        Operation::Capture => {
            let reference = action_reference(ctx)?;
            modification(
                ctx,
                merchant_account,
                "captures",
                Some(amount(&ctx.amount)?),
                reference,
                reference,
            )
        }
        Operation::Refund | Operation::QueryRefund => {
            let reference = action_reference(ctx)?;
            modification(
                ctx,
                merchant_account,
                "refunds",
                Some(amount(&ctx.amount)?),
                reference,
                reference,
            )
        }
        Operation::Void => modification(
            ctx,
            merchant_account,
            "cancels",
            None,
            attempt,
            &format!("{attempt}{VOID_KEY_SUFFIX}"),
        ),
    }
}

fn payment(
    ctx: &OperationContext,
    merchant_account: &str,
    attempt: &str,
    manual_capture: bool,
) -> Result<(String, Vec<u8>, String), Failure> {
    let token = known(&ctx.payment_method_token).ok_or_else(|| {
        unsupported(
            "payment_method_required",
            "a payment needs a payment method token",
        )
    })?;
    let body = PaymentRequest {
        amount: amount(&ctx.amount)?,
        reference: attempt.to_string(),
        merchant_account: merchant_account.to_string(),
        payment_method: PaymentMethod {
            kind: "scheme",
            stored_payment_method_id: token.to_string(),
        },
        return_url: known(&ctx.return_url).map(str::to_string),
        merchant_order_reference: Some(ctx.merchant_order_no.clone()).filter(|o| !o.is_empty()),
        additional_data: manual_capture.then_some(AdditionalData {
            manual_capture: "true",
        }),
    };
    Ok(("/payments".to_string(), json(&body)?, attempt.to_string()))
}

fn modification(
    ctx: &OperationContext,
    merchant_account: &str,
    endpoint: &str,
    amount: Option<Amount>,
    reference: &str,
    idempotency_key: &str,
) -> Result<(String, Vec<u8>, String), Failure> {
    let psp = known(&ctx.psp_payment_reference).ok_or_else(|| {
        unsupported(
            "psp_payment_reference_required",
            "the operation needs the PSP's payment reference",
        )
    })?;
    let body = ModificationRequest {
        merchant_account: merchant_account.to_string(),
        amount,
        reference: reference.to_string(),
    };
    Ok((
        format!("/payments/{}/{endpoint}", path_segment(psp)?),
        json(&body)?,
        idempotency_key.to_string(),
    ))
}

fn json<T: serde::Serialize>(body: &T) -> Result<Vec<u8>, Failure> {
    // Serialising these plain structs cannot fail; map it anyway rather than panic.
    serde_json::to_vec(body)
        .map_err(|_| unsupported("unserialisable", "the request body cannot be encoded"))
}

fn header(name: &str, value: &str) -> Header {
    Header {
        name: name.to_string(),
        value: value.to_string(),
    }
}

fn known(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

fn non_empty<'a>(value: &'a str, what: &str) -> Result<&'a str, Failure> {
    if value.is_empty() {
        Err(unsupported(
            &format!("{what}_required"),
            &format!("the operation needs a non-empty {what}"),
        ))
    } else {
        Ok(value)
    }
}

fn action_reference(ctx: &OperationContext) -> Result<&str, Failure> {
    known(&ctx.action_reference).ok_or_else(|| {
        unsupported(
            "action_reference_required",
            "the operation needs the host's capture or refund reference",
        )
    })
}

/// Adyen's amount: positive minor units and the upper-case ISO code.
fn amount(money: &Money) -> Result<Amount, Failure> {
    if money.amount_minor <= 0 {
        return Err(unsupported(
            "invalid_amount",
            "the amount must be a positive number of minor units",
        ));
    }
    let code = &money.currency;
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(unsupported(
            "invalid_currency",
            "the currency must be a three-letter ISO 4217 code",
        ));
    }
    Ok(Amount {
        currency: code.to_ascii_uppercase(),
        value: money.amount_minor,
    })
}

fn unsupported(code: &str, message: &str) -> Failure {
    Failure {
        category: FailureCategory::Unsupported,
        code: code.to_string(),
        message: message.to_string(),
    }
}

/// Percent-encode one URL path segment (RFC 3986 unreserved characters stay as they are),
/// so a PSP reference can never add path segments or a query string. A reference made of
/// dots only is refused: URL parsers treat it as `.`/`..` even when percent-encoded.
pub fn path_segment(raw: &str) -> Result<String, Failure> {
    if raw.bytes().all(|b| b == b'.') {
        return Err(unsupported(
            "invalid_psp_reference",
            "a PSP reference cannot be a dot segment",
        ));
    }
    let mut out = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    Ok(out)
}
