//! Signed HTTP delivery to a merchant endpoint.

use crate::deliveries::EventEnvelope;
use crate::endpoints::SigningEndpoint;
use crate::signature::{
    sign, sign_standard, EVENT_ID_HEADER, SIGNATURE_HEADER, WEBHOOK_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER, WEBHOOK_TIMESTAMP_HEADER,
};
use crate::DeliveryError;
use std::time::Duration;

/// Sent with every delivery, so merchants can tell retries apart in their logs.
pub const DELIVERY_ID_HEADER: &str = "Sluice-Delivery-Id";
const USER_AGENT: &str = concat!("Sluice-Webhooks/", env!("CARGO_PKG_VERSION"));

/// What one HTTP try came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SendOutcome {
    /// A 2xx answer.
    Delivered { status: i64 },
    /// Anything else: a non-2xx answer (with its status), a timeout, a refused
    /// connection. The error never contains the URL, which may carry a token.
    Failed { error: String, status: Option<i64> },
}

/// One signed POST to a merchant's endpoint, as the publisher built it.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookPost {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for WebhookPost {
    // The URL may carry a token and the headers carry signatures: neither is
    // printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("WebhookPost")
            .field("header_names", &names)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// What carries a delivery to a merchant: HTTP in production
/// ([`HttpWebhookTransport`]); the simulator's merchants answer in process.
#[async_trait::async_trait]
pub trait WebhookTransport: Send + Sync {
    /// The HTTP status of the answer, or why there was none (a description
    /// that never contains the URL).
    async fn post(&self, post: WebhookPost) -> Result<u16, String>;
}

/// Merchant webhooks over HTTP(S): no redirects, one whole-request timeout.
#[derive(Debug, Clone)]
pub struct HttpWebhookTransport {
    client: reqwest::Client,
}

impl HttpWebhookTransport {
    pub fn new(timeout: Duration) -> Result<HttpWebhookTransport, DeliveryError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // A redirect would send signed payment data somewhere the merchant
            // did not register; a 3xx is a failure the merchant must fix.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| DeliveryError::Config(format!("HTTP client: {e}")))?;
        Ok(HttpWebhookTransport { client })
    }
}

#[async_trait::async_trait]
impl WebhookTransport for HttpWebhookTransport {
    async fn post(&self, post: WebhookPost) -> Result<u16, String> {
        let mut request = self.client.post(&post.url);
        for (name, value) in &post.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        match request.body(post.body).send().await {
            Ok(response) => Ok(response.status().as_u16()),
            Err(e) => Err(describe(e)),
        }
    }
}

#[derive(Clone)]
pub(crate) struct WebhookSender {
    transport: std::sync::Arc<dyn WebhookTransport>,
}

impl WebhookSender {
    pub(crate) fn new(transport: std::sync::Arc<dyn WebhookTransport>) -> WebhookSender {
        WebhookSender { transport }
    }

    /// POST the event, signed at `now_unix`.
    pub(crate) async fn send(
        &self,
        endpoint: &SigningEndpoint,
        envelope: &EventEnvelope,
        delivery_id: &str,
        now_unix: i64,
    ) -> SendOutcome {
        let body = match serde_json::to_vec(envelope) {
            Ok(body) => body,
            Err(e) => {
                return SendOutcome::Failed {
                    error: format!("cannot encode the event: {e}"),
                    status: None,
                }
            }
        };
        let post = WebhookPost {
            url: endpoint.endpoint.url.clone(),
            headers: signed_headers(endpoint, envelope, delivery_id, now_unix, &body),
            body,
        };
        match self.transport.post(post).await {
            Ok(status) if (200..300).contains(&status) => SendOutcome::Delivered {
                status: i64::from(status),
            },
            Ok(status) => SendOutcome::Failed {
                error: format!("endpoint answered HTTP {status}"),
                status: Some(i64::from(status)),
            },
            Err(error) => SendOutcome::Failed {
                error,
                status: None,
            },
        }
    }
}

/// The content type, both signatures and the ids of one delivery.
fn signed_headers(
    endpoint: &SigningEndpoint,
    envelope: &EventEnvelope,
    delivery_id: &str,
    now_unix: i64,
    body: &[u8],
) -> Vec<(String, String)> {
    let mut headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        (
            SIGNATURE_HEADER.to_owned(),
            sign(&endpoint.secret, now_unix, body),
        ),
        (EVENT_ID_HEADER.to_owned(), envelope.id.clone()),
        (DELIVERY_ID_HEADER.to_owned(), delivery_id.to_owned()),
    ];
    // Standard Webhooks, same secret, same instant. Every secret Sluice
    // mints has the key; one that does not (written by hand) still gets
    // the `Sluice-Signature`, and the reason is logged, never the secret.
    match sign_standard(&endpoint.secret, &envelope.id, now_unix, body) {
        Ok(standard) => headers.extend([
            (WEBHOOK_ID_HEADER.to_owned(), envelope.id.clone()),
            (WEBHOOK_TIMESTAMP_HEADER.to_owned(), now_unix.to_string()),
            (WEBHOOK_SIGNATURE_HEADER.to_owned(), standard),
        ]),
        Err(error) => tracing::warn!(endpoint_id = %endpoint.endpoint.id, %error,
            "no Standard Webhooks signature for this endpoint's secret"),
    }
    headers
}

/// A transport error with its causes, without the URL.
fn describe(error: reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    let error = error.without_url();
    let mut text = format!("{kind}: {error}");
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
