//! Stripe webhooks → verified, normalised events and the acknowledgement Stripe expects.
//!
//! Order of checks: method (POST) → the tolerance → the `Stripe-Signature` header over
//! the raw body ([`crate::signature`], MACs from the host's keyring) → the event JSON.
//! Nothing is parsed before the signature is verified.
//!
//! | event type | events |
//! |---|---|
//! | `payment_intent.succeeded` | `payment-succeeded`, or `payment-captured` for manual capture |
//! | `payment_intent.payment_failed` | `payment-failed` (declined, code from `last_payment_error`) |
//! | `payment_intent.processing` | `payment-processing` |
//! | `payment_intent.requires_action` | `customer-action-required` |
//! | `payment_intent.amount_capturable_updated` | `payment-authorized` while the intent is `requires_capture`; nothing otherwise |
//! | `payment_intent.canceled` | `payment-canceled` |
//! | `charge.refunded` | one refund event per refund embedded in `refunds.data` (none when Stripe did not embed them; the `refund.*` events carry them) |
//! | `charge.refund.updated`, `refund.created`, `refund.updated`, `refund.failed` | the refund's status event |
//! | `charge.dispute.*` | `chargeback` |
//! | any other verified type (`payment_intent.created`, `payment_intent.partially_funded`, ...) | accepted, no events |
//!
//! The provider event id is the Stripe event id (`evt_...`). When one Stripe event yields
//! several events (`charge.refunded` with several refunds), each gets
//! `"{evt id}:{refund id}"` so the ids stay unique and stable across Stripe's retries.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::bindings::sluice::psp::host::LogLevel;
use crate::events::{event, money};
use crate::host::{
    HmacAlgorithm, Host, KeyEncoding, KeyringError, CONFIG_WEBHOOK_TOLERANCE, SECRET_WEBHOOK,
};
use crate::model::{Charge, Dispute, Event, PaymentIntent, Refund};
use crate::normalise::{
    intent_action_required, intent_authorized, intent_base, intent_failed, intent_succeeded,
    refund_event, Origin,
};
use crate::signature::{self, SignatureError, DEFAULT_TOLERANCE_SECONDS};
use crate::types::{
    EventKind, EvidenceSource, Header, HttpResponse, PaymentEvent, WebhookAcceptance,
    WebhookRejection, WebhookRequest,
};

/// The header Stripe signs webhooks with.
pub const SIGNATURE_HEADER: &str = "Stripe-Signature";

/// Verify and normalise one Stripe webhook.
pub fn handle_webhook(
    host: &impl Host,
    request: &WebhookRequest,
) -> Result<WebhookAcceptance, WebhookRejection> {
    if !request.method.eq_ignore_ascii_case("POST") {
        return Err(WebhookRejection::Unsupported(format!(
            "webhooks arrive as POST, not {}",
            request.method
        )));
    }
    let tolerance = tolerance_seconds(host)?;
    let now = host.now_unix_millis().div_euclid(1000);
    let header = header_value(&request.headers, SIGNATURE_HEADER);
    // Stripe keys the HMAC with the whole `whsec_...` text.
    let macs = |data: &[u8]| {
        host.hmac(
            SECRET_WEBHOOK,
            HmacAlgorithm::Sha256,
            KeyEncoding::Utf8,
            data,
        )
        .map_err(|e| SignatureError::Keyring(keyring_message(&e)))
    };
    signature::verify(header, &request.body, macs, tolerance, now).map_err(rejection)?;

    let stripe_event: Event = serde_json::from_slice(&request.body).map_err(|_| {
        WebhookRejection::Malformed("the body is not a Stripe event object".to_string())
    })?;
    let events = normalise_event(&stripe_event)?;
    if events.is_empty() {
        host.log(
            LogLevel::Debug,
            &format!(
                "verified Stripe event {} of type {} carries nothing to apply",
                stripe_event.id, stripe_event.kind
            ),
        );
    }
    Ok(WebhookAcceptance { events, ack: ack() })
}

/// What Stripe expects back: any 2xx; we send `{"received":true}` like Stripe's samples.
pub fn ack() -> HttpResponse {
    HttpResponse {
        status: 200,
        headers: vec![Header {
            name: "Content-Type".to_string(),
            value: "application/json".to_string(),
        }],
        body: br#"{"received":true}"#.to_vec(),
    }
}

fn tolerance_seconds(host: &impl Host) -> Result<i64, WebhookRejection> {
    match host.config(CONFIG_WEBHOOK_TOLERANCE) {
        None => Ok(DEFAULT_TOLERANCE_SECONDS),
        Some(text) => text
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|t| *t >= 0)
            .ok_or_else(|| {
                WebhookRejection::Unsupported(format!(
                    "the connector account's `{CONFIG_WEBHOOK_TOLERANCE}` is not a non-negative number of seconds"
                ))
            }),
    }
}

/// The first header named `name`, compared case-insensitively.
fn header_value<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

fn rejection(error: SignatureError) -> WebhookRejection {
    let message = error.to_string();
    match error {
        SignatureError::MissingHeader | SignatureError::NoV1Signature | SignatureError::NoMatch => {
            WebhookRejection::BadSignature(message)
        }
        SignatureError::Malformed(_) => WebhookRejection::Malformed(message),
        SignatureError::Stale { .. } => WebhookRejection::StaleTimestamp(message),
        SignatureError::Keyring(_) => WebhookRejection::Unsupported(format!(
            "the connector account's secret `{SECRET_WEBHOOK}` cannot verify webhooks ({message})"
        )),
    }
}

fn keyring_message(error: &KeyringError) -> String {
    match error {
        KeyringError::UnknownKey(m) | KeyringError::UnusableKey(m) | KeyringError::TooLarge(m) => {
            m.clone()
        }
    }
}

/// A verified Stripe event → normalised events.
pub fn normalise_event(stripe_event: &Event) -> Result<Vec<PaymentEvent>, WebhookRejection> {
    let origin = Origin {
        evidence: Some(EvidenceSource::Webhook),
        provider_event_id: Some(stripe_event.id.clone()),
        ..Origin::default()
    };
    let object = &stripe_event.data.object;
    let kind = stripe_event.kind.as_str();
    let events = match kind {
        "payment_intent.succeeded" => {
            vec![intent_succeeded(&parse::<PaymentIntent>(object)?, &origin)]
        }
        "payment_intent.payment_failed" => vec![intent_failed(&parse(object)?, &origin)],
        "payment_intent.processing" => vec![intent_base(
            &parse(object)?,
            EventKind::PaymentProcessing,
            &origin,
        )],
        "payment_intent.requires_action" => {
            vec![intent_action_required(&parse(object)?, &origin)]
        }
        "payment_intent.amount_capturable_updated" => {
            let pi: PaymentIntent = parse(object)?;
            if pi.status == "requires_capture" {
                vec![intent_authorized(&pi, &origin)]
            } else {
                Vec::new()
            }
        }
        "payment_intent.canceled" => vec![intent_base(
            &parse(object)?,
            EventKind::PaymentCanceled,
            &origin,
        )],
        "charge.refunded" => {
            let charge: Charge = parse(object)?;
            let refunds = charge.refunds.map(|l| l.data).unwrap_or_default();
            let several = refunds.len() > 1;
            refunds
                .iter()
                .map(|re| {
                    let mut ev = refund_event(re, &origin);
                    if several {
                        ev.provider_event_id = Some(format!("{}:{}", stripe_event.id, re.id));
                    }
                    ev
                })
                .collect()
        }
        "charge.refund.updated" | "refund.created" | "refund.updated" | "refund.failed" => {
            vec![refund_event(&parse::<Refund>(object)?, &origin)]
        }
        k if k.starts_with("charge.dispute.") => vec![dispute_event(&parse(object)?, &origin)],
        _ => Vec::new(),
    };
    Ok(events)
}

fn dispute_event(dispute: &Dispute, origin: &Origin) -> PaymentEvent {
    let status = dispute.status.as_deref().unwrap_or("");
    let mut ev = event(EventKind::Chargeback, EvidenceSource::Webhook, status);
    ev.psp_reference = Some(dispute.id.clone());
    ev.psp_payment_reference = dispute
        .payment_intent
        .as_ref()
        .or(dispute.charge.as_ref())
        .map(|p| p.id().to_string());
    ev.amount = money(dispute.amount, dispute.currency.as_deref());
    ev.provider_event_id = origin.provider_event_id.clone();
    ev
}

fn parse<T: DeserializeOwned>(object: &Value) -> Result<T, WebhookRejection> {
    // serde's message may quote body values; the category of the error is enough here.
    T::deserialize(object).map_err(|e| {
        WebhookRejection::Malformed(format!(
            "the event's data.object cannot be read ({:?} error)",
            e.classify()
        ))
    })
}
