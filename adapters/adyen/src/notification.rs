//! Adyen standard notifications (webhooks) → verified, normalised events and the
//! `[accepted]` acknowledgement.
//!
//! A notification is `{"live": "false", "notificationItems": [{"NotificationRequestItem":
//! {...}}, ...]}`. Every item is verified on its own ([`crate::hmac_signature`]).
//!
//! **A batch with any item that fails verification is refused as a whole**
//! (`bad-signature`), and none of its items reaches the host. Adyen retries a
//! notification it did not see acknowledged, so refusing loses nothing: once the cause is
//! fixed (usually a rotated or mistyped HMAC key) the retried batch is accepted, and the
//! host's inbox deduplicates items it may see twice. Taking the good items and
//! acknowledging would make Adyen drop the bad item for good, and a batch with a forged
//! item is not one whose other items we want to trust either.
//!
//! The HMAC is computed by the host's keyring (the key never enters the adapter): one
//! MAC per valid version of `webhook_secret`, hex-decoded, so an item signed with the
//! old or the new key verifies during a rotation.
//!
//! **An item for another merchant account is refused, with its batch** (`unsupported`).
//! An HMAC key can be configured at company level and then signs the notifications of
//! every merchant account of the company, so a valid signature does not prove the item
//! belongs to this connector account: its `merchantAccountCode` must equal the account's
//! `merchant_account` setting. The refusal is kept by the host as evidence, and Adyen
//! keeps retrying until the notification is sent where it belongs.
//!
//! | `eventCode` | `success: "true"` | `success: "false"` |
//! |---|---|---|
//! | `AUTHORISATION` | `payment-authorized` (attempt = `merchantReference`) | `payment-failed`, declined, code = `reason` |
//! | `CAPTURE` | `payment-captured` (action = `merchantReference`, payment = `originalReference`) | `capture-failed`, declined |
//! | `CAPTURE_FAILED` | `capture-failed`, declined | `capture-failed`, declined |
//! | `CANCELLATION` | `payment-canceled` (attempt = `merchantReference`, payment = `originalReference`) | `result-unknown`, conflict: the void was refused, query the payment |
//! | `REFUND` | `refund-succeeded` (action = `merchantReference`, refund = `pspReference`) | `refund-failed`, declined |
//! | `REFUND_FAILED` | `refund-failed`, declined | `refund-failed`, declined |
//! | `CHARGEBACK` | `chargeback` | nothing |
//! | anything else | nothing (accepted) | nothing (accepted) |
//!
//! `AUTHORISATION` success means authorised, also for a sale: with automatic capture Adyen
//! (and the sandbox) send a `CAPTURE` notification when the capture happens, and that is
//! the event that says money was taken. For a capture Adyen fills `merchantReference`
//! with the capture's `reference` (our capture reference); for an automatic capture it
//! is the payment's reference (our attempt reference). The host locates capture and
//! refund events by `psp-payment-reference` (`originalReference`).
//!
//! Adyen has no event id. The provider event id is `pspReference:eventCode:success`,
//! which is what identifies a notification item across Adyen's retries.

use serde::Deserialize;
use serde_json::Value;

use crate::bindings::sluice::psp::host::LogLevel;
use crate::events::{event, failure, money};
use crate::hmac_signature::{matches_any, SignedFields};
use crate::host::{
    HmacAlgorithm, Host, KeyEncoding, KeyringError, CONFIG_MERCHANT_ACCOUNT, SECRET_WEBHOOK,
};
use crate::types::{
    EventKind, EvidenceSource, FailureCategory, Header, HttpResponse, PaymentEvent,
    WebhookAcceptance, WebhookRejection, WebhookRequest,
};

/// The body Adyen expects back for an accepted notification.
pub const ACK_BODY: &[u8] = b"[accepted]";

#[derive(Debug, Deserialize)]
struct Notification {
    #[serde(rename = "notificationItems")]
    items: Vec<ItemWrapper>,
}

#[derive(Debug, Deserialize)]
struct ItemWrapper {
    #[serde(rename = "NotificationRequestItem")]
    item: Value,
}

/// One notification item: the signed fields as text, plus what the mapping reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub signed: SignedFields,
    pub amount: Option<i64>,
    pub signature: Option<String>,
    pub reason: Option<String>,
}

/// Verify and normalise one Adyen notification.
pub fn handle_webhook(
    host: &impl Host,
    request: &WebhookRequest,
) -> Result<WebhookAcceptance, WebhookRejection> {
    if !request.method.eq_ignore_ascii_case("POST") {
        return Err(WebhookRejection::Unsupported(format!(
            "notifications arrive as POST, not {}",
            request.method
        )));
    }
    let merchant_account = host
        .config(CONFIG_MERCHANT_ACCOUNT)
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            WebhookRejection::Unsupported(format!(
                "the connector account has no setting `{CONFIG_MERCHANT_ACCOUNT}`, so no notification can be attributed to it"
            ))
        })?;
    let items = parse_items(&request.body)?;
    for (index, item) in items.iter().enumerate() {
        verify_item(host, index, item)?;
    }
    for (index, item) in items.iter().enumerate() {
        if item.signed.merchant_account_code != merchant_account {
            return Err(WebhookRejection::Unsupported(format!(
                "notification item {index} (pspReference {:?}) is for merchant account {:?}, not this connector account's; the whole batch is refused",
                item.signed.psp_reference, item.signed.merchant_account_code
            )));
        }
    }
    let events: Vec<PaymentEvent> = items.iter().filter_map(item_event).collect();
    host.log(
        LogLevel::Debug,
        &format!(
            "verified {} notification item(s), {} event(s)",
            items.len(),
            events.len()
        ),
    );
    Ok(WebhookAcceptance { events, ack: ack() })
}

/// Checks one item's signature against the keyring's MACs of its signed data.
fn verify_item(host: &impl Host, index: usize, item: &Item) -> Result<(), WebhookRejection> {
    let macs = host
        .hmac(
            SECRET_WEBHOOK,
            HmacAlgorithm::Sha256,
            KeyEncoding::Hex,
            item.signed.data_to_sign().as_bytes(),
        )
        .map_err(|e| {
            let detail = match e {
                KeyringError::UnknownKey(m)
                | KeyringError::UnusableKey(m)
                | KeyringError::TooLarge(m) => m,
            };
            WebhookRejection::Unsupported(format!(
                "the connector account's `{SECRET_WEBHOOK}` cannot verify notifications: {detail}"
            ))
        })?;
    let valid = item
        .signature
        .as_deref()
        .is_some_and(|sig| matches_any(&macs, sig));
    if valid {
        return Ok(());
    }
    Err(WebhookRejection::BadSignature(format!(
        "notification item {index} (pspReference {:?}, {}) has no valid HMAC signature for this account; the whole batch is refused so that Adyen retries it",
        item.signed.psp_reference, item.signed.event_code
    )))
}

/// `200` with body `[accepted]`.
pub fn ack() -> HttpResponse {
    HttpResponse {
        status: 200,
        headers: vec![Header {
            name: "Content-Type".to_string(),
            value: "text/plain".to_string(),
        }],
        body: ACK_BODY.to_vec(),
    }
}

/// The body's items with their signed fields rendered exactly as Adyen signs them.
pub fn parse_items(body: &[u8]) -> Result<Vec<Item>, WebhookRejection> {
    let notification: Notification = serde_json::from_slice(body)
        .map_err(|_| malformed("the body is not an Adyen notification with notificationItems"))?;
    if notification.items.is_empty() {
        return Err(malformed("the notification has no items"));
    }
    notification
        .items
        .iter()
        .map(|wrapper| parse_item(&wrapper.item))
        .collect()
}

fn parse_item(item: &Value) -> Result<Item, WebhookRejection> {
    if !item.is_object() {
        return Err(malformed("a NotificationRequestItem is not an object"));
    }
    let amount = item.get("amount").filter(|a| !a.is_null());
    let value = match amount.and_then(|a| a.get("value")).filter(|v| !v.is_null()) {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .ok_or_else(|| malformed("amount.value is not an integer"))?,
        ),
    };
    let success = match item.get("success") {
        None | Some(Value::Null) => String::new(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(malformed("success is neither a string nor a boolean")),
    };
    let signed = SignedFields {
        psp_reference: text(item, "pspReference")?,
        original_reference: text(item, "originalReference")?,
        merchant_account_code: text(item, "merchantAccountCode")?,
        merchant_reference: text(item, "merchantReference")?,
        value: value.map(|v| v.to_string()).unwrap_or_default(),
        currency: match amount {
            Some(a) => text(a, "currency")?,
            None => String::new(),
        },
        event_code: text(item, "eventCode")?,
        success,
    };
    let signature = item
        .get("additionalData")
        .and_then(|d| d.get("hmacSignature"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let reason = item
        .get("reason")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
        .map(str::to_string);
    Ok(Item {
        signed,
        amount: value,
        signature,
        reason,
    })
}

/// A string field as signed: absent or null is the empty string.
fn text(object: &Value, field: &str) -> Result<String, WebhookRejection> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(WebhookRejection::Malformed(format!(
            "{field} is not a string"
        ))),
    }
}

fn malformed(message: &str) -> WebhookRejection {
    WebhookRejection::Malformed(message.to_string())
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

/// A verified item → at most one event (see the module table).
pub fn item_event(item: &Item) -> Option<PaymentEvent> {
    let f = &item.signed;
    let success = f.success == "true";
    let declined = |default_code: &str| {
        failure(
            FailureCategory::Declined,
            item.reason.as_deref().unwrap_or(default_code),
            item.reason.as_deref().unwrap_or(default_code),
        )
    };
    let mut ev = event(
        EventKind::ResultUnknown,
        EvidenceSource::Webhook,
        &f.event_code,
    );
    ev.provider_event_id = Some(format!(
        "{}:{}:{}",
        f.psp_reference, f.event_code, f.success
    ));
    ev.amount = money(item.amount, Some(&f.currency));
    match (f.event_code.as_str(), success) {
        ("AUTHORISATION", true) => {
            ev.kind = EventKind::PaymentAuthorized;
            ev.attempt_reference = non_empty(&f.merchant_reference);
            ev.psp_reference = non_empty(&f.psp_reference);
        }
        ("AUTHORISATION", false) => {
            ev.kind = EventKind::PaymentFailed;
            ev.attempt_reference = non_empty(&f.merchant_reference);
            ev.psp_reference = non_empty(&f.psp_reference);
            ev.failure = Some(declined("Refused"));
        }
        ("CAPTURE", true) => {
            ev.kind = EventKind::PaymentCaptured;
            modification_refs(&mut ev, f);
        }
        ("CAPTURE", false) | ("CAPTURE_FAILED", _) => {
            ev.kind = EventKind::CaptureFailed;
            modification_refs(&mut ev, f);
            ev.failure = Some(declined("CAPTURE_FAILED"));
        }
        ("CANCELLATION", true) => {
            ev.kind = EventKind::PaymentCanceled;
            ev.attempt_reference = non_empty(&f.merchant_reference);
            ev.psp_reference = non_empty(&f.original_reference).or(non_empty(&f.psp_reference));
            ev.amount = None;
        }
        ("CANCELLATION", false) => {
            ev.attempt_reference = non_empty(&f.merchant_reference);
            ev.psp_reference = non_empty(&f.original_reference).or(non_empty(&f.psp_reference));
            ev.amount = None;
            ev.failure = Some(failure(
                FailureCategory::Conflict,
                item.reason.as_deref().unwrap_or("CANCELLATION_FAILED"),
                "Adyen refused the cancellation; the payment's state must be queried",
            ));
        }
        ("REFUND", true) => {
            ev.kind = EventKind::RefundSucceeded;
            modification_refs(&mut ev, f);
        }
        ("REFUND", false) | ("REFUND_FAILED", _) => {
            ev.kind = EventKind::RefundFailed;
            modification_refs(&mut ev, f);
            ev.failure = Some(declined("REFUND_FAILED"));
        }
        ("CHARGEBACK", true) => {
            ev.kind = EventKind::Chargeback;
            ev.attempt_reference = non_empty(&f.merchant_reference);
            ev.psp_reference = non_empty(&f.psp_reference);
            ev.psp_payment_reference =
                non_empty(&f.original_reference).or(non_empty(&f.psp_reference));
        }
        _ => return None,
    }
    Some(ev)
}

/// Captures and refunds: the modification's own reference, ours, and the payment's.
fn modification_refs(ev: &mut PaymentEvent, f: &SignedFields) {
    ev.action_reference = non_empty(&f.merchant_reference);
    ev.psp_reference = non_empty(&f.psp_reference);
    ev.psp_payment_reference = non_empty(&f.original_reference);
}
