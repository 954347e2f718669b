//! `build-request`: one operation → one HTTP request in the test wire format.

use crate::types::{Failure, FailureCategory, Header, HttpRequest, Operation, OperationContext};
use serde_json::{json, Map, Value};

/// What the host replaces with the account's API key in the request it sends.
pub const API_KEY_PLACEHOLDER: &str = "{{secret:api_key}}";

/// Builds the request for `ctx`. `base_url` comes from the connector account; without
/// it the host must not call the PSP at all. The API key is a placeholder the host
/// substitutes (and refuses the call when the account has no `api_key`).
pub fn build_request(
    base_url: Option<&str>,
    ctx: &OperationContext,
) -> Result<HttpRequest, Failure> {
    let base = base_url
        .map(|b| b.trim_end_matches('/'))
        .filter(|b| !b.is_empty())
        .ok_or_else(|| configuration("missing_base_url", "connector account has no base_url"))?;

    let plan = plan(base, ctx)?;
    let mut headers = vec![
        header("Authorization", &format!("Bearer {API_KEY_PLACEHOLDER}")),
        header("Accept", "application/json"),
    ];
    let body = match &plan.body {
        Some(body) => {
            headers.push(header("Content-Type", "application/json"));
            serde_json::to_vec(body).map_err(|e| unsupported("encode_failed", &e.to_string()))?
        }
        None => Vec::new(),
    };
    if let Some(key) = plan.idempotency_key {
        headers.push(header("Idempotency-Key", &key));
    }
    Ok(HttpRequest {
        method: plan.method.to_string(),
        url: plan.url,
        headers,
        body,
    })
}

struct Plan {
    method: &'static str,
    url: String,
    body: Option<Value>,
    idempotency_key: Option<String>,
}

fn plan(base: &str, ctx: &OperationContext) -> Result<Plan, Failure> {
    let amount = ctx.amount.amount_minor;
    let currency = ctx.amount.currency.clone();
    match ctx.operation {
        Operation::Authorize | Operation::Sale => {
            let capture = if ctx.operation == Operation::Sale {
                "automatic"
            } else {
                "manual"
            };
            let metadata: Map<String, Value> = ctx
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            Ok(Plan {
                method: "POST",
                url: format!("{base}/v1/payments"),
                body: Some(json!({
                    "reference": ctx.attempt_reference,
                    "amount": amount,
                    "currency": currency,
                    "capture": capture,
                    "payment_method": ctx.payment_method_token,
                    "return_url": ctx.return_url,
                    "description": ctx.merchant_order_no,
                    "metadata": metadata,
                })),
                idempotency_key: Some(ctx.attempt_reference.clone()),
            })
        }
        Operation::Capture => {
            let payment = psp_payment(ctx)?;
            let reference = action_reference(ctx)?;
            Ok(Plan {
                method: "POST",
                url: format!("{base}/v1/payments/{}/capture", encode(payment)),
                body: Some(
                    json!({ "reference": reference, "amount": amount, "currency": currency }),
                ),
                idempotency_key: Some(reference.to_string()),
            })
        }
        Operation::Void => {
            let payment = psp_payment(ctx)?;
            let key = ctx
                .action_reference
                .clone()
                .unwrap_or_else(|| format!("{}-void", ctx.attempt_reference));
            Ok(Plan {
                method: "POST",
                url: format!("{base}/v1/payments/{}/cancel", encode(payment)),
                body: Some(json!({ "reference": key })),
                idempotency_key: Some(key),
            })
        }
        Operation::Refund => {
            let payment = psp_payment(ctx)?;
            let reference = action_reference(ctx)?;
            Ok(Plan {
                method: "POST",
                url: format!("{base}/v1/refunds"),
                body: Some(json!({
                    "payment": payment,
                    "reference": reference,
                    "amount": amount,
                    "currency": currency,
                })),
                idempotency_key: Some(reference.to_string()),
            })
        }
        Operation::QueryPayment => {
            let url = match &ctx.psp_payment_reference {
                Some(id) => format!("{base}/v1/payments/{}", encode(id)),
                None => format!(
                    "{base}/v1/payments?reference={}",
                    encode(&ctx.attempt_reference)
                ),
            };
            Ok(get(url))
        }
        Operation::QueryRefund => {
            let url = match &ctx.psp_refund_reference {
                Some(id) => format!("{base}/v1/refunds/{}", encode(id)),
                None => format!(
                    "{base}/v1/refunds?reference={}",
                    encode(action_reference(ctx)?)
                ),
            };
            Ok(get(url))
        }
    }
}

fn get(url: String) -> Plan {
    Plan {
        method: "GET",
        url,
        body: None,
        idempotency_key: None,
    }
}

fn psp_payment(ctx: &OperationContext) -> Result<&str, Failure> {
    ctx.psp_payment_reference.as_deref().ok_or_else(|| Failure {
        category: FailureCategory::Conflict,
        code: "missing_psp_payment_reference".into(),
        message: format!("{:?} needs the PSP's payment id", ctx.operation),
    })
}

fn action_reference(ctx: &OperationContext) -> Result<&str, Failure> {
    ctx.action_reference.as_deref().ok_or_else(|| Failure {
        category: FailureCategory::Conflict,
        code: "missing_action_reference".into(),
        message: format!("{:?} needs an action reference", ctx.operation),
    })
}

/// Percent-encodes everything but RFC 3986 unreserved characters, so a reference can
/// never change the path or the query of the URL it is put into.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn header(name: &str, value: &str) -> Header {
    Header {
        name: name.to_string(),
        value: value.to_string(),
    }
}

fn configuration(code: &str, message: &str) -> Failure {
    Failure {
        category: FailureCategory::Configuration,
        code: code.into(),
        message: message.into(),
    }
}

fn unsupported(code: &str, message: &str) -> Failure {
    Failure {
        category: FailureCategory::Unsupported,
        code: code.into(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Money;

    fn ctx(operation: Operation) -> OperationContext {
        OperationContext {
            operation,
            capture_mode: crate::types::CaptureMode::Automatic,
            attempt_reference: "att_1".into(),
            action_reference: Some("rf 1/x".into()),
            psp_payment_reference: Some("pay_9".into()),
            psp_refund_reference: None,
            amount: Money {
                amount_minor: 1250,
                currency: "EUR".into(),
            },
            payment_method_token: Some("tok_visa".into()),
            return_url: None,
            merchant_order_no: "order-7".into(),
            metadata: vec![("k".into(), "v".into())],
        }
    }

    fn header_value<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    }

    #[test]
    fn sale_posts_json_with_the_attempt_reference_as_idempotency_key() {
        let req = build_request(Some("http://127.0.0.1:1/psp/"), &ctx(Operation::Sale)).unwrap();
        assert_eq!(req.method, "POST");
        assert_eq!(req.url, "http://127.0.0.1:1/psp/v1/payments");
        assert_eq!(header_value(&req, "idempotency-key"), Some("att_1"));
        assert_eq!(
            header_value(&req, "authorization"),
            Some("Bearer {{secret:api_key}}")
        );
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(body["amount"], 1250);
        assert_eq!(body["capture"], "automatic");
        assert_eq!(body["reference"], "att_1");
    }

    #[test]
    fn refund_uses_the_refund_reference_and_encodes_it_in_urls() {
        let req = build_request(Some("http://h"), &ctx(Operation::Refund)).unwrap();
        assert_eq!(header_value(&req, "idempotency-key"), Some("rf 1/x"));
        let query = build_request(Some("http://h"), &ctx(Operation::QueryRefund)).unwrap();
        assert_eq!(query.url, "http://h/v1/refunds?reference=rf%201%2Fx");
        assert!(query.body.is_empty());
    }

    #[test]
    fn a_missing_base_url_is_a_configuration_failure() {
        let err = build_request(None, &ctx(Operation::Sale)).unwrap_err();
        assert_eq!(err.category, FailureCategory::Configuration);
    }
}
