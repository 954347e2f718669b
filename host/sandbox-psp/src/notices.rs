//! Turns ledger `Happening`s into each format's webhook notifications.

use serde_json::{json, Value};

use crate::config::Format;
use crate::model::{Happening, Payment, Refund};
use crate::stripe;
use crate::util::iso8601_utc;

/// One notification to send to every matching webhook target.
#[derive(Debug, Clone)]
pub enum Notice {
    /// One Stripe `event`; `object` is the snapshot at the time of the event.
    Stripe {
        api_key: String,
        event_type: &'static str,
        object: Value,
        idempotency_key: Option<String>,
    },
    /// Adyen items produced by one operation (batched or split at delivery).
    Adyen {
        api_key: String,
        items: Vec<AdyenItem>,
    },
}

/// One Adyen `NotificationRequestItem`, before signing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdyenItem {
    pub psp_reference: String,
    pub original_reference: Option<String>,
    pub merchant_account: String,
    pub merchant_reference: String,
    pub value: i64,
    pub currency: String,
    pub event_code: &'static str,
    pub success: bool,
    pub reason: Option<String>,
    pub payment_method: String,
    pub event_date: String,
}

/// The notifications the gateway gets for `happenings` of payment `p`.
/// `refunds` holds the refunds the happenings name.
/// `now_secs` dates the Adyen items (`eventDate`).
pub fn notices_for(
    now_secs: i64,
    p: &Payment,
    refunds: &[Refund],
    happenings: &[Happening],
) -> Vec<Notice> {
    match p.format {
        Format::Stripe => happenings
            .iter()
            .flat_map(|h| stripe_notices(p, refunds, h))
            .collect(),
        Format::Adyen => happenings
            .iter()
            .filter_map(|h| {
                let items = adyen_items(now_secs, p, refunds, h);
                (!items.is_empty()).then(|| Notice::Adyen {
                    api_key: p.api_key.clone(),
                    items,
                })
            })
            .collect(),
    }
}

fn stripe_notices(p: &Payment, refunds: &[Refund], h: &Happening) -> Vec<Notice> {
    let pi = |event_type| Notice::Stripe {
        api_key: p.api_key.clone(),
        event_type,
        object: stripe::payment_intent_json(p),
        idempotency_key: p.idempotency_key.clone(),
    };
    let refund_event = |event_type, refund_id: &str| {
        find(refunds, refund_id).map(|r| Notice::Stripe {
            api_key: p.api_key.clone(),
            event_type,
            object: stripe::refund_json(r),
            idempotency_key: r.idempotency_key.clone(),
        })
    };
    match h {
        Happening::Authorized => vec![pi("payment_intent.amount_capturable_updated")],
        Happening::Succeeded { .. } | Happening::Captured { .. } => {
            vec![pi("payment_intent.succeeded")]
        }
        Happening::Declined => vec![pi("payment_intent.payment_failed")],
        Happening::RequiresAction => vec![pi("payment_intent.requires_action")],
        Happening::Processing => vec![pi("payment_intent.processing")],
        Happening::Canceled { .. } => vec![pi("payment_intent.canceled")],
        // Stripe refuses these synchronously; nothing to notify.
        Happening::CaptureFailed { .. }
        | Happening::CancelFailed { .. }
        | Happening::RefundRefused { .. } => vec![],
        Happening::RefundCreated { refund_id } => refund_event("refund.created", refund_id)
            .into_iter()
            .collect(),
        Happening::RefundSucceeded { refund_id } => {
            let charge = Notice::Stripe {
                api_key: p.api_key.clone(),
                event_type: "charge.refunded",
                object: stripe::charge_json(p),
                idempotency_key: None,
            };
            std::iter::once(charge)
                .chain(refund_event("refund.updated", refund_id))
                .collect()
        }
        Happening::RefundFailed { refund_id } => refund_event("refund.failed", refund_id)
            .into_iter()
            .collect(),
    }
}

fn adyen_items(now_secs: i64, p: &Payment, refunds: &[Refund], h: &Happening) -> Vec<AdyenItem> {
    let item =
        |psp: &str, original: Option<&str>, reference: &str, value: i64, code, success| AdyenItem {
            psp_reference: psp.to_owned(),
            original_reference: original.map(str::to_owned),
            merchant_account: p.merchant_account.clone().unwrap_or_default(),
            merchant_reference: reference.to_owned(),
            value,
            currency: p.currency.clone(),
            event_code: code,
            success,
            reason: None,
            payment_method: "visa".to_owned(),
            event_date: iso8601_utc(now_secs),
        };
    let with_reason = |mut i: AdyenItem, reason: &str| {
        i.reason = Some(reason.to_owned());
        i
    };
    let own_ref = |r: &Option<String>| r.clone().unwrap_or_else(|| p.reference.clone());
    match h {
        Happening::Authorized => vec![item(
            &p.id,
            None,
            &p.reference,
            p.amount,
            "AUTHORISATION",
            true,
        )],
        Happening::Succeeded { capture_psp } => {
            let auth = item(&p.id, None, &p.reference, p.amount, "AUTHORISATION", true);
            let capture = capture_psp
                .as_deref()
                .map(|c| item(c, Some(&p.id), &p.reference, p.amount, "CAPTURE", true));
            std::iter::once(auth).chain(capture).collect()
        }
        Happening::Declined => {
            let reason = p.decline.map(|d| d.adyen_reason()).unwrap_or("Refused");
            vec![with_reason(
                item(&p.id, None, &p.reference, p.amount, "AUTHORISATION", false),
                reason,
            )]
        }
        Happening::RequiresAction | Happening::Processing | Happening::RefundCreated { .. } => {
            vec![]
        }
        Happening::Captured {
            modification_psp,
            amount,
            reference,
        } => {
            let psp = modification_psp.as_deref().unwrap_or(&p.id);
            vec![item(
                psp,
                Some(&p.id),
                &own_ref(reference),
                *amount,
                "CAPTURE",
                true,
            )]
        }
        Happening::CaptureFailed {
            modification_psp,
            amount,
            reference,
            reason,
        } => vec![with_reason(
            item(
                modification_psp,
                Some(&p.id),
                &own_ref(reference),
                *amount,
                "CAPTURE",
                false,
            ),
            reason,
        )],
        Happening::Canceled {
            modification_psp,
            reference,
        } => {
            let psp = modification_psp.as_deref().unwrap_or(&p.id);
            vec![item(
                psp,
                Some(&p.id),
                &own_ref(reference),
                p.amount,
                "CANCELLATION",
                true,
            )]
        }
        Happening::CancelFailed {
            modification_psp,
            reference,
            reason,
        } => vec![with_reason(
            item(
                modification_psp,
                Some(&p.id),
                &own_ref(reference),
                p.amount,
                "CANCELLATION",
                false,
            ),
            reason,
        )],
        Happening::RefundRefused {
            modification_psp,
            amount,
            reference,
            reason,
        } => vec![with_reason(
            item(
                modification_psp,
                Some(&p.id),
                &own_ref(reference),
                *amount,
                "REFUND",
                false,
            ),
            reason,
        )],
        Happening::RefundSucceeded { refund_id } | Happening::RefundFailed { refund_id } => {
            let success = matches!(h, Happening::RefundSucceeded { .. });
            find(refunds, refund_id)
                .map(|r| {
                    let i = item(
                        &r.id,
                        Some(&p.id),
                        &own_ref(&r.reference),
                        r.amount,
                        "REFUND",
                        success,
                    );
                    match &r.failure_reason {
                        Some(reason) if !success => with_reason(i, reason),
                        _ => i,
                    }
                })
                .into_iter()
                .collect()
        }
    }
}

fn find<'a>(refunds: &'a [Refund], id: &str) -> Option<&'a Refund> {
    refunds.iter().find(|r| r.id == id)
}

impl AdyenItem {
    /// The item as JSON, with `additionalData.hmacSignature` set to `signature`.
    pub fn to_json(&self, signature: &str) -> Value {
        let mut item = json!({
            "additionalData": { "hmacSignature": signature },
            "amount": { "currency": self.currency, "value": self.value },
            "eventCode": self.event_code,
            "eventDate": self.event_date,
            "merchantAccountCode": self.merchant_account,
            "merchantReference": self.merchant_reference,
            "paymentMethod": self.payment_method,
            "pspReference": self.psp_reference,
            "success": if self.success { "true" } else { "false" },
        });
        if let Some(obj) = item.as_object_mut() {
            if let Some(original) = &self.original_reference {
                obj.insert("originalReference".into(), json!(original));
            }
            obj.insert(
                "reason".into(),
                json!(self.reason.clone().unwrap_or_default()),
            );
            if self.event_code == "AUTHORISATION" && self.success {
                obj.insert("operations".into(), json!(["CANCEL", "CAPTURE", "REFUND"]));
            }
        }
        json!({ "NotificationRequestItem": item })
    }
}
