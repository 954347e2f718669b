//! Operation context → the Stripe HTTP request (see `docs/psp-wire-subsets.md`).
//!
//! Bodies are `application/x-www-form-urlencoded` with Stripe's bracket notation for
//! nested keys (`metadata[key]`), encoded with the WHATWG form encoder: brackets are sent
//! percent-encoded (`metadata%5Bkey%5D`), which every form parser, Stripe's included,
//! decodes to the same key.

use crate::host::{require_config, Host, API_KEY_PLACEHOLDER, CONFIG_BASE_URL};
use crate::model::{META_ATTEMPT, META_CAPTURE, META_ORDER, META_REFUND};
use crate::types::{
    Failure, FailureCategory, Header, HttpRequest, Money, Operation, OperationContext,
};

const FORM: &str = "application/x-www-form-urlencoded";

/// Suffix that turns the attempt reference into the void's idempotency key. Stripe's
/// idempotency keys are account-wide, so the void cannot reuse the creation's key.
pub const VOID_KEY_SUFFIX: &str = ":void";

/// Build the request for `ctx`. Err when the connector account lacks a setting
/// (`configuration`) or the context lacks what the operation needs (`unsupported`).
/// The API key is the placeholder `{{secret:api_key}}`: the host substitutes it (or
/// refuses the call as misconfigured when the account has no `api_key`).
pub fn build_request(host: &impl Host, ctx: &OperationContext) -> Result<HttpRequest, Failure> {
    let base = require_config(host, CONFIG_BASE_URL)?;
    let base = base.trim_end_matches('/');
    let call = plan(base, ctx)?;
    let mut headers = vec![header(
        "Authorization",
        &format!("Bearer {API_KEY_PLACEHOLDER}"),
    )];
    let body = match &call.form {
        Some(form) => {
            headers.push(header("Content-Type", FORM));
            form.clone().into_bytes()
        }
        None => Vec::new(),
    };
    if let Some(key) = &call.idempotency_key {
        headers.push(header("Idempotency-Key", key));
    }
    Ok(HttpRequest {
        method: call.method.to_string(),
        url: call.url,
        headers,
        body,
    })
}

/// What to send, before authentication is added.
struct Call {
    method: &'static str,
    url: String,
    form: Option<String>,
    idempotency_key: Option<String>,
}

fn plan(base: &str, ctx: &OperationContext) -> Result<Call, Failure> {
    let attempt = non_empty(&ctx.attempt_reference, "attempt_reference")?;
    match ctx.operation {
        Operation::Authorize => create_intent(base, ctx, attempt, "manual"),
        Operation::Sale => create_intent(base, ctx, attempt, "automatic"),
        Operation::Capture => {
            let pi = psp_payment_reference(ctx)?;
            let capture_ref = action_reference(ctx)?;
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair(
                "amount_to_capture",
                &positive_amount(&ctx.amount)?.to_string(),
            )
            .append_pair(&meta(META_CAPTURE), capture_ref);
            Ok(Call {
                method: "POST",
                url: format!("{base}/v1/payment_intents/{}/capture", path_segment(pi)?),
                form: Some(form.finish()),
                idempotency_key: Some(capture_ref.to_string()),
            })
        }
        Operation::Void => {
            let pi = psp_payment_reference(ctx)?;
            Ok(Call {
                method: "POST",
                url: format!("{base}/v1/payment_intents/{}/cancel", path_segment(pi)?),
                form: Some(String::new()),
                idempotency_key: Some(format!("{attempt}{VOID_KEY_SUFFIX}")),
            })
        }
        Operation::Refund => {
            let pi = psp_payment_reference(ctx)?;
            let refund_ref = action_reference(ctx)?;
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("payment_intent", pi)
                .append_pair("amount", &positive_amount(&ctx.amount)?.to_string())
                .append_pair(&meta(META_REFUND), refund_ref)
                .append_pair(&meta(META_ATTEMPT), attempt);
            Ok(Call {
                method: "POST",
                url: format!("{base}/v1/refunds"),
                form: Some(form.finish()),
                idempotency_key: Some(refund_ref.to_string()),
            })
        }
        Operation::QueryPayment => {
            let url = match known(&ctx.psp_payment_reference) {
                Some(pi) => format!("{base}/v1/payment_intents/{}", path_segment(pi)?),
                None => {
                    let query = format!("metadata['{META_ATTEMPT}']:'{}'", search_literal(attempt));
                    let qs = form_urlencoded::Serializer::new(String::new())
                        .append_pair("query", &query)
                        .finish();
                    format!("{base}/v1/payment_intents/search?{qs}")
                }
            };
            Ok(get(url))
        }
        Operation::QueryRefund => {
            let url = match known(&ctx.psp_refund_reference) {
                Some(re) => format!("{base}/v1/refunds/{}", path_segment(re)?),
                None => {
                    action_reference(ctx)?;
                    let pi = psp_payment_reference(ctx)?;
                    let qs = form_urlencoded::Serializer::new(String::new())
                        .append_pair("payment_intent", pi)
                        .append_pair("limit", "100")
                        .finish();
                    format!("{base}/v1/refunds?{qs}")
                }
            };
            Ok(get(url))
        }
    }
}

fn create_intent(
    base: &str,
    ctx: &OperationContext,
    attempt: &str,
    capture_method: &str,
) -> Result<Call, Failure> {
    let token = known(&ctx.payment_method_token).ok_or_else(|| {
        unsupported(
            "payment_method_required",
            "a payment needs a payment method token",
        )
    })?;
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("amount", &positive_amount(&ctx.amount)?.to_string())
        .append_pair("currency", &currency(&ctx.amount)?)
        .append_pair("payment_method", token)
        .append_pair("confirm", "true")
        .append_pair("capture_method", capture_method)
        .append_pair(&meta(META_ATTEMPT), attempt)
        .append_pair(&meta(META_ORDER), &ctx.merchant_order_no);
    if let Some(return_url) = known(&ctx.return_url) {
        form.append_pair("return_url", return_url);
    }
    Ok(Call {
        method: "POST",
        url: format!("{base}/v1/payment_intents"),
        form: Some(form.finish()),
        idempotency_key: Some(attempt.to_string()),
    })
}

fn get(url: String) -> Call {
    Call {
        method: "GET",
        url,
        form: None,
        idempotency_key: None,
    }
}

fn header(name: &str, value: &str) -> Header {
    Header {
        name: name.to_string(),
        value: value.to_string(),
    }
}

fn meta(key: &str) -> String {
    format!("metadata[{key}]")
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

fn psp_payment_reference(ctx: &OperationContext) -> Result<&str, Failure> {
    known(&ctx.psp_payment_reference).ok_or_else(|| {
        unsupported(
            "psp_payment_reference_required",
            "the operation needs the PSP's payment reference",
        )
    })
}

fn action_reference(ctx: &OperationContext) -> Result<&str, Failure> {
    known(&ctx.action_reference).ok_or_else(|| {
        unsupported(
            "action_reference_required",
            "the operation needs the host's capture or refund reference",
        )
    })
}

fn positive_amount(money: &Money) -> Result<i64, Failure> {
    if money.amount_minor > 0 {
        Ok(money.amount_minor)
    } else {
        Err(unsupported(
            "invalid_amount",
            "the amount must be a positive number of minor units",
        ))
    }
}

/// Stripe wants the ISO code in lower case.
fn currency(money: &Money) -> Result<String, Failure> {
    let code = &money.currency;
    if code.len() == 3 && code.bytes().all(|b| b.is_ascii_alphabetic()) {
        Ok(code.to_ascii_lowercase())
    } else {
        Err(unsupported(
            "invalid_currency",
            "the currency must be a three-letter ISO 4217 code",
        ))
    }
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

/// Escape a value for a single-quoted string in Stripe's search query language.
fn search_literal(raw: &str) -> String {
    raw.replace('\\', "\\\\").replace('\'', "\\'")
}
