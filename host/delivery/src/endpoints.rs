//! Merchant webhook endpoints: where a merchant wants its events, which event
//! types, and the per-endpoint secret that signs them.

use crate::db::{begin_write, commit_write, int, text};
use crate::DeliveryError;
use serde::{Deserialize, Serialize};
use sluice_store::Store;
use sqlx::any::AnyRow;
use sqlx::Row;
use std::sync::LazyLock;
use utoipa::ToSchema;

/// Longest URL an endpoint may have.
pub const MAX_URL_LEN: usize = 2048;
/// Most event type patterns on one endpoint.
pub const MAX_EVENT_TYPES: usize = 64;
/// Longest description of an endpoint.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;

/// What an endpoint URL looks like: `http(s)://`, a host name (letter-first
/// labels of letters, digits and single hyphens) or a dotted IPv4 address,
/// an optional port (1 to 65535) and an optional path of visible ASCII. No
/// user info, no IPv6 literal. The OpenAPI document states the same pattern.
pub const URL_PATTERN: &str = concat!(
    r"^https?://",
    r"([a-z][a-z0-9]*(-[a-z0-9]+)*(\.[a-z][a-z0-9]*(-[a-z0-9]+)*)*",
    r"|(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3})",
    r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?",
    r"(/[\x21-\x7e]*)?$",
);
/// An event type pattern: `*`, `<prefix>.*` or an exact type.
pub const EVENT_TYPE_PATTERN: &str = r"^(\*|[a-z0-9_]+(\.[a-z0-9_]+)*(\.\*)?)$";
/// A description: no control character.
pub const DESCRIPTION_PATTERN: &str = r"^[^\x00-\x1f\x7f-\x9f]*$";

static URL_RE: LazyLock<regex::Regex> = LazyLock::new(|| {
    // Invariant: URL_PATTERN is a constant that compiles (a unit test builds it).
    regex::Regex::new(URL_PATTERN).expect("URL_PATTERN compiles")
});

/// An endpoint as operators and merchants see it. The secret is shown only
/// once, when the endpoint is created ([`CreatedEndpoint`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedEndpoint {
    #[serde(flatten)]
    pub endpoint: WebhookEndpoint,
    /// `whsec_<base64>`: signs `Sluice-Signature` (its UTF-8 bytes are the
    /// key) and the Standard Webhooks `webhook-signature` (the base64 after
    /// `whsec_` is the key). Not shown again.
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NewWebhookEndpoint {
    /// Where events are POSTed: `https://` (plain `http://` only on a gateway
    /// that listens on a loopback address: demo and tests), a host name or
    /// IPv4 address, an optional port and path; no credentials.
    #[schema(schema_with = url_schema)]
    pub url: String,
    /// Free text without control characters.
    #[serde(default)]
    #[schema(schema_with = description_schema)]
    pub description: String,
    /// Patterns: `"*"`, `"payment.*"` or an exact type such as
    /// `"refund.succeeded"`; 1 to 64 of them. Defaults to every event (`["*"]`).
    #[serde(default = "all_events")]
    #[schema(schema_with = event_types_schema)]
    pub event_types: Vec<String>,
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
}

fn text_schema(max: usize, pattern: &str, description: &str) -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .max_length(Some(max))
        .pattern(Some(pattern))
        .description(Some(description))
        .build()
}

/// `url` of [`NewWebhookEndpoint`].
fn url_schema() -> utoipa::openapi::Object {
    text_schema(
        MAX_URL_LEN,
        URL_PATTERN,
        "Where events are POSTed: `https://` (plain `http://` only on a gateway that listens \
         on a loopback address: demo and tests), a host name or IPv4 address, an optional \
         port and path; no credentials.",
    )
}

/// `description` of [`NewWebhookEndpoint`].
fn description_schema() -> utoipa::openapi::Object {
    text_schema(
        MAX_DESCRIPTION_CHARS,
        DESCRIPTION_PATTERN,
        "Free text without control characters. Default: empty.",
    )
}

/// `event_types` of [`NewWebhookEndpoint`]: 1 to [`MAX_EVENT_TYPES`] [`EVENT_TYPE_PATTERN`]s.
fn event_types_schema() -> utoipa::openapi::Array {
    use utoipa::openapi::{ArrayBuilder, ObjectBuilder, Type};
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(EVENT_TYPE_PATTERN)),
        )
        .min_items(Some(1))
        .max_items(Some(MAX_EVENT_TYPES))
        .description(Some(
            "Patterns: `\"*\"`, `\"payment.*\"` or an exact type such as \
             `\"refund.succeeded\"`; 1 to 64 of them. Default: every event (`[\"*\"]`).",
        ))
        .build()
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
        if !URL_RE.is_match(&self.url) {
            return invalid(
                "url must be http(s)://<host name or IPv4>[:port][/path], visible ASCII".into(),
            );
        }
        if self.description.chars().count() > MAX_DESCRIPTION_CHARS
            || self.description.chars().any(char::is_control)
        {
            return invalid(format!(
                "description must be at most {MAX_DESCRIPTION_CHARS} characters, none a control character"
            ));
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
        id: format!("we_{}", store.env().uuid_v7().simple()),
        merchant_id: merchant_id.to_owned(),
        url: new.url.clone(),
        description: new.description.clone(),
        event_types: new.event_types.clone(),
        enabled: new.enabled,
        created_at: now,
        updated_at: now,
    };
    let secret = crate::signature::mint_secret();
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
    commit_write(store, tx).await?;
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
    .fetch_optional(store.writer())
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

    #[test]
    fn every_url_the_documented_pattern_allows_is_an_absolute_url_with_a_host_and_no_credentials() {
        let allowed = [
            "https://merchant.example/hooks",
            "http://127.0.0.1:65535/",
            "http://localhost:8080",
            "https://a",
            "https://a-b.c9/x?y=1#z",
            "https://a.b/%zz/\\/@x",
            "http://0.0.0.0:1",
            "http://255.255.255.255/",
        ];
        let refused = [
            "https://user:pw@merchant.example/",
            "https://merchant.example:0/",
            "https://merchant.example:65536/",
            "http://256.1.1.1/",
            "https://1.2.3/",
            "https://xn--a/",
            "https://a-/",
            "https://-a/",
            "https://a..b/",
            "https://A/",
            "https://a/ b",
            "https://a?x",
            "ftp://a/",
            "https://",
        ];
        let re = regex::Regex::new(URL_PATTERN).unwrap();
        for url in allowed {
            assert!(re.is_match(url), "{url} matches");
            let parsed = reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(parsed.host_str().is_some_and(|h| !h.is_empty()), "{url}");
            assert!(
                parsed.username().is_empty() && parsed.password().is_none(),
                "{url}"
            );
        }
        for url in refused {
            assert!(!re.is_match(url), "{url} is refused");
        }
    }

    #[test]
    fn a_description_with_a_control_character_or_over_the_limit_is_refused() {
        let mut new = NewWebhookEndpoint {
            url: "https://merchant.example/hooks".into(),
            description: "orders é".into(),
            event_types: all_events(),
            enabled: true,
        };
        let policy = EndpointPolicy::default();
        assert!(new.validate(policy).is_ok());
        new.description = "a\u{0}b".into();
        assert!(new.validate(policy).is_err());
        new.description = "x".repeat(MAX_DESCRIPTION_CHARS + 1);
        assert!(new.validate(policy).is_err());
        new.description = "é".repeat(MAX_DESCRIPTION_CHARS);
        assert!(new.validate(policy).is_ok());
    }
}
