//! Merchant webhook endpoints: where a merchant wants its events, which event
//! types, and the per-endpoint secret that signs them.

use crate::db::{begin_write, int, text};
use crate::DeliveryError;
use serde::{Deserialize, Serialize};
use sluice_store::Store;
use sqlx::any::AnyRow;
use sqlx::Row;

/// Longest URL an endpoint may have.
const MAX_URL_LEN: usize = 2048;
/// Most event type patterns on one endpoint.
const MAX_EVENT_TYPES: usize = 64;

/// An endpoint as operators and merchants see it. The secret is shown only
/// once, when the endpoint is created ([`CreatedEndpoint`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookEndpoint {
    pub id: String,
    pub merchant_id: String,
    pub url: String,
    pub description: String,
    /// Patterns: `"*"`, `"payment.*"` or an exact type such as `"refund.succeeded"`.
    pub event_types: Vec<String>,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A freshly created endpoint and its signing secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedEndpoint {
    #[serde(flatten)]
    pub endpoint: WebhookEndpoint,
    /// `whsec_...`: the HMAC key for `Sluice-Signature`. Not shown again.
    pub secret: String,
}

/// `Debug` never shows the secret (it is serialised once, to the caller).
impl std::fmt::Debug for CreatedEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedEndpoint")
            .field("endpoint", &self.endpoint)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// What an operator asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewWebhookEndpoint {
    pub url: String,
    #[serde(default)]
    pub description: String,
    /// Defaults to every event (`["*"]`).
    #[serde(default = "all_events")]
    pub event_types: Vec<String>,
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
}

fn all_events() -> Vec<String> {
    vec!["*".to_owned()]
}

fn enabled_by_default() -> bool {
    true
}

/// Rules for endpoint URLs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointPolicy {
    /// Accept plain `http://` URLs. Off in production (events carry payment
    /// data); on for the demo and tests, which talk to 127.0.0.1.
    pub allow_http: bool,
}

/// The secret as loaded for signing; never serialised.
#[derive(Clone)]
pub(crate) struct SigningEndpoint {
    pub endpoint: WebhookEndpoint,
    pub secret: String,
}

const COLS: &str =
    "id, merchant_id, url, description, event_types, enabled, created_at, updated_at";

impl NewWebhookEndpoint {
    fn validate(&self, policy: EndpointPolicy) -> Result<(), DeliveryError> {
        let invalid = |msg: String| Err(DeliveryError::InvalidRequest(msg));
        if self.url.len() > MAX_URL_LEN {
            return invalid(format!("url is longer than {MAX_URL_LEN} characters"));
        }
        let url = match reqwest::Url::parse(&self.url) {
            Ok(url) => url,
            Err(e) => return invalid(format!("url is not an absolute URL: {e}")),
        };
        match url.scheme() {
            "https" => {}
            "http" if policy.allow_http => {}
            "http" => return invalid("url must use https".into()),
            other => return invalid(format!("url scheme {other:?} is not http(s)")),
        }
        if url.host_str().is_none_or(str::is_empty) {
            return invalid("url has no host".into());
        }
        if url.password().is_some() || !url.username().is_empty() {
            return invalid("url must not carry credentials".into());
        }
        if self.event_types.is_empty() || self.event_types.len() > MAX_EVENT_TYPES {
            return invalid(format!(
                "event_types must list 1 to {MAX_EVENT_TYPES} patterns"
            ));
        }
        for pattern in &self.event_types {
            if !is_valid_pattern(pattern) {
                return invalid(format!(
                    "event type pattern {pattern:?} is not \"*\", \"<prefix>.*\" or an event type"
                ));
            }
        }
        Ok(())
    }
}

fn is_valid_token(token: &str) -> bool {
    !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn is_valid_pattern(pattern: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let body = pattern.strip_suffix(".*").unwrap_or(pattern);
    body.split('.').all(is_valid_token)
}

/// Does `event_type` match one of the endpoint's patterns?
pub fn matches_event_type(patterns: &[String], event_type: &str) -> bool {
    patterns.iter().any(|pattern| {
        pattern == "*"
            || pattern == event_type
            || pattern.strip_suffix(".*").is_some_and(|prefix| {
                event_type
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('.'))
            })
    })
}

fn mint_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("whsec_{}", hex::encode(bytes))
}

fn endpoint_from(row: &AnyRow) -> Result<WebhookEndpoint, DeliveryError> {
    let raw = text(row, "event_types")?;
    let event_types = serde_json::from_str(&raw)
        .map_err(|e| DeliveryError::corrupt("webhook_endpoints", format!("event_types: {e}")))?;
    Ok(WebhookEndpoint {
        id: text(row, "id")?,
        merchant_id: text(row, "merchant_id")?,
        url: text(row, "url")?,
        description: text(row, "description")?,
        event_types,
        enabled: int(row, "enabled")? == 1,
        created_at: int(row, "created_at")?,
        updated_at: int(row, "updated_at")?,
    })
}

/// Register an endpoint for a merchant; the returned secret is shown once.
pub async fn create_endpoint(
    store: &Store,
    merchant_id: &str,
    new: &NewWebhookEndpoint,
    policy: EndpointPolicy,
) -> Result<CreatedEndpoint, DeliveryError> {
    new.validate(policy)?;
    let mut tx = begin_write(store).await?;
    let merchant = sqlx::query("SELECT id FROM merchants WHERE id = $1")
        .bind(merchant_id)
        .fetch_optional(&mut *tx)
        .await?;
    if merchant.is_none() {
        return Err(DeliveryError::not_found("merchant", merchant_id));
    }
    let now = store.now_ms();
    let endpoint = WebhookEndpoint {
        id: format!("we_{}", uuid::Uuid::now_v7().simple()),
        merchant_id: merchant_id.to_owned(),
        url: new.url.clone(),
        description: new.description.clone(),
        event_types: new.event_types.clone(),
        enabled: new.enabled,
        created_at: now,
        updated_at: now,
    };
    let secret = mint_secret();
    let event_types = serde_json::to_string(&endpoint.event_types)
        .map_err(|e| DeliveryError::InvalidRequest(format!("event_types: {e}")))?;
    sqlx::query(
        "INSERT INTO webhook_endpoints (id, merchant_id, url, description, event_types, secret, \
            enabled, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
    )
    .bind(&endpoint.id)
    .bind(&endpoint.merchant_id)
    .bind(&endpoint.url)
    .bind(&endpoint.description)
    .bind(event_types)
    .bind(store.seal_secret(
        &sluice_store::secrets::webhook_endpoint_context(&endpoint.id),
        secret.as_bytes(),
    )?)
    .bind(i64::from(endpoint.enabled))
    .bind(now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(endpoint_id = %endpoint.id, merchant_id, "webhook endpoint created");
    Ok(CreatedEndpoint { endpoint, secret })
}

/// A merchant's endpoints, oldest first.
pub async fn list_endpoints(
    store: &Store,
    merchant_id: &str,
) -> Result<Vec<WebhookEndpoint>, DeliveryError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLS} FROM webhook_endpoints WHERE merchant_id = $1 ORDER BY created_at, id"
    ))
    .bind(merchant_id)
    .fetch_all(store.pool())
    .await?;
    rows.iter().map(endpoint_from).collect()
}

/// Switch an endpoint on or off. Events fanned out while it is off are not
/// queued for it; deliveries queued before are retried on the schedule (and
/// dead-lettered, replayable, if it stays off that long).
pub async fn set_endpoint_enabled(
    store: &Store,
    endpoint_id: &str,
    enabled: bool,
) -> Result<WebhookEndpoint, DeliveryError> {
    let row = sqlx::query(&format!(
        "UPDATE webhook_endpoints SET enabled = $2, updated_at = $3 WHERE id = $1 RETURNING {COLS}"
    ))
    .bind(endpoint_id)
    .bind(i64::from(enabled))
    .bind(store.now_ms())
    .fetch_optional(store.pool())
    .await?
    .ok_or_else(|| DeliveryError::not_found("webhook endpoint", endpoint_id))?;
    endpoint_from(&row)
}

/// An endpoint with its secret, for signing.
pub(crate) async fn signing_endpoint(
    store: &Store,
    endpoint_id: &str,
) -> Result<SigningEndpoint, DeliveryError> {
    let row = sqlx::query(&format!(
        "SELECT {COLS}, secret FROM webhook_endpoints WHERE id = $1"
    ))
    .bind(endpoint_id)
    .fetch_optional(store.pool())
    .await?
    .ok_or_else(|| DeliveryError::not_found("webhook endpoint", endpoint_id))?;
    let sealed = row.try_get::<String, _>("secret")?;
    let context = sluice_store::secrets::webhook_endpoint_context(endpoint_id);
    Ok(SigningEndpoint {
        endpoint: endpoint_from(&row)?,
        secret: store.open_secret_text(&context, &sealed)?,
    })
}

/// The enabled endpoints of a merchant, inside the fan-out transaction.
pub(crate) async fn enabled_endpoints(
    conn: &mut sqlx::AnyConnection,
    merchant_id: &str,
) -> Result<Vec<WebhookEndpoint>, DeliveryError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLS} FROM webhook_endpoints WHERE merchant_id = $1 AND enabled = 1 ORDER BY id"
    ))
    .bind(merchant_id)
    .fetch_all(conn)
    .await?;
    rows.iter().map(endpoint_from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn event_type_patterns_match_exact_types_prefixes_and_everything() {
        assert!(matches_event_type(&patterns(&["*"]), "payment.succeeded"));
        assert!(matches_event_type(
            &patterns(&["payment.*"]),
            "payment.succeeded"
        ));
        assert!(!matches_event_type(
            &patterns(&["payment.*"]),
            "refund.succeeded"
        ));
        assert!(!matches_event_type(
            &patterns(&["payment.*"]),
            "payments.succeeded"
        ));
        assert!(matches_event_type(
            &patterns(&["refund.failed", "refund.succeeded"]),
            "refund.succeeded"
        ));
        assert!(!matches_event_type(
            &patterns(&["refund.failed"]),
            "refund.succeeded"
        ));
    }

    #[test]
    fn endpoints_need_https_unless_allowed_and_valid_patterns() {
        let mut new = NewWebhookEndpoint {
            url: "https://merchant.example/hooks".into(),
            description: String::new(),
            event_types: all_events(),
            enabled: true,
        };
        let strict = EndpointPolicy::default();
        assert!(new.validate(strict).is_ok());
        new.url = "http://127.0.0.1:8080/hooks".into();
        assert!(new.validate(strict).is_err());
        assert!(new.validate(EndpointPolicy { allow_http: true }).is_ok());
        new.url = "https://user:pw@merchant.example/".into();
        assert!(new.validate(strict).is_err());
        new.url = "ftp://merchant.example/".into();
        assert!(new.validate(strict).is_err());
        new.url = "https://merchant.example/".into();
        for bad in [
            "",
            "payment.",
            "Payment.succeeded",
            "payment.*.x",
            "pay ment",
        ] {
            new.event_types = patterns(&[bad]);
            assert!(new.validate(strict).is_err(), "{bad:?} must be refused");
        }
        new.event_types = vec![];
        assert!(new.validate(strict).is_err());
        new.event_types = patterns(&["payment.*", "refund.succeeded"]);
        assert!(new.validate(strict).is_ok());
    }
}
