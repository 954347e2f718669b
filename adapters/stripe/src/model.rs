//! The subset of Stripe's API objects the adapter reads. Unknown fields are ignored so
//! new Stripe fields never break parsing; fields Stripe may omit or null are `Option`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// Metadata key carrying the host's attempt reference.
pub const META_ATTEMPT: &str = "sluice_attempt_reference";
/// Metadata key carrying the host's capture reference (set by each capture).
pub const META_CAPTURE: &str = "sluice_capture_reference";
/// Metadata key carrying the host's refund reference.
pub const META_REFUND: &str = "sluice_refund_reference";
/// Metadata key carrying the merchant's order number.
pub const META_ORDER: &str = "merchant_order_no";

/// Stripe metadata: string keys to string values. Anything else is dropped rather than
/// failing the whole object, because metadata never decides an outcome.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(from = "Option<BTreeMap<String, Value>>")]
pub struct Metadata(pub BTreeMap<String, String>);

impl From<Option<BTreeMap<String, Value>>> for Metadata {
    fn from(raw: Option<BTreeMap<String, Value>>) -> Self {
        let map = raw
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| match v {
                Value::String(s) => Some((k, s)),
                _ => None,
            })
            .collect();
        Metadata(map)
    }
}

impl Metadata {
    /// The value of `key`, if set and non-empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// A reference to another object: Stripe sends an id string, or the whole object when
/// the field was expanded.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Expandable {
    Id(String),
    Object { id: String },
}

impl Expandable {
    pub fn id(&self) -> &str {
        match self {
            Expandable::Id(id) | Expandable::Object { id } => id,
        }
    }
}

/// `last_payment_error` of a PaymentIntent, and the `error` of an error response.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ApiError {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub code: Option<String>,
    pub decline_code: Option<String>,
    pub message: Option<String>,
    /// Present on errors about a PaymentIntent (e.g. a card error while confirming).
    /// Kept raw so a surprising shape there never hides the error itself.
    pub payment_intent: Option<Value>,
}

impl ApiError {
    /// The most specific code: the decline code of a card decline, else the error code.
    pub fn best_code(&self) -> Option<&str> {
        self.decline_code
            .as_deref()
            .or(self.code.as_deref())
            .filter(|c| !c.is_empty())
    }

    /// The PaymentIntent the error is about, when Stripe included a readable one.
    pub fn payment_intent(&self) -> Option<PaymentIntent> {
        self.payment_intent
            .as_ref()
            .and_then(|v| PaymentIntent::deserialize(v).ok())
    }
}

/// An error response body: `{"error": {...}}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ErrorEnvelope {
    pub error: ApiError,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RedirectToUrl {
    pub url: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct NextAction {
    pub redirect_to_url: Option<RedirectToUrl>,
}

/// A PaymentIntent.
#[derive(Debug, Clone, Deserialize)]
pub struct PaymentIntent {
    pub id: String,
    pub status: String,
    pub amount: Option<i64>,
    pub amount_capturable: Option<i64>,
    pub amount_received: Option<i64>,
    pub currency: Option<String>,
    pub capture_method: Option<String>,
    #[serde(default)]
    pub metadata: Metadata,
    pub last_payment_error: Option<ApiError>,
    pub next_action: Option<NextAction>,
}

/// A Refund.
#[derive(Debug, Clone, Deserialize)]
pub struct Refund {
    pub id: String,
    pub status: String,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    pub payment_intent: Option<Expandable>,
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub metadata: Metadata,
}

/// A list (`object: "list"`) or a search result (`object: "search_result"`).
#[derive(Debug, Clone, Deserialize)]
pub struct List<T> {
    pub data: Vec<T>,
}

/// A Charge, as carried by `charge.refunded`.
#[derive(Debug, Clone, Deserialize)]
pub struct Charge {
    pub id: String,
    pub refunds: Option<List<Refund>>,
}

/// A Dispute, as carried by `charge.dispute.*`.
#[derive(Debug, Clone, Deserialize)]
pub struct Dispute {
    pub id: String,
    pub status: Option<String>,
    pub reason: Option<String>,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    pub charge: Option<Expandable>,
    pub payment_intent: Option<Expandable>,
}

/// A webhook `event` object. `data.object` is parsed according to `type`.
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub data: EventData,
}

#[derive(Debug, Clone, Deserialize)]
pub struct EventData {
    pub object: Value,
}
