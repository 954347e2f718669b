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

#[derive(Debug, Clone)]
pub(crate) struct WebhookSender {
    client: reqwest::Client,
}

impl WebhookSender {
    pub(crate) fn new(timeout: Duration) -> Result<WebhookSender, DeliveryError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // A redirect would send signed payment data somewhere the merchant
            // did not register; a 3xx is a failure the merchant must fix.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| DeliveryError::Config(format!("HTTP client: {e}")))?;
        Ok(WebhookSender { client })
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
        let signature = sign(&endpoint.secret, now_unix, &body);
        let mut request = self
            .client
            .post(&endpoint.endpoint.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .header(EVENT_ID_HEADER, &envelope.id)
            .header(DELIVERY_ID_HEADER, delivery_id);
        // Standard Webhooks, same secret, same instant. Every secret Sluice
        // mints has the key; one that does not (written by hand) still gets
        // the `Sluice-Signature`, and the reason is logged, never the secret.
        match sign_standard(&endpoint.secret, &envelope.id, now_unix, &body) {
            Ok(standard) => {
                request = request
                    .header(WEBHOOK_ID_HEADER, &envelope.id)
                    .header(WEBHOOK_TIMESTAMP_HEADER, now_unix.to_string())
                    .header(WEBHOOK_SIGNATURE_HEADER, standard);
            }
            Err(error) => tracing::warn!(endpoint_id = %endpoint.endpoint.id, %error,
                "no Standard Webhooks signature for this endpoint's secret"),
        }
        let sent = request.body(body).send().await;
        match sent {
            Ok(response) if response.status().is_success() => SendOutcome::Delivered {
                status: i64::from(response.status().as_u16()),
            },
            Ok(response) => SendOutcome::Failed {
                error: format!("endpoint answered HTTP {}", response.status().as_u16()),
                status: Some(i64::from(response.status().as_u16())),
            },
            Err(e) => SendOutcome::Failed {
                error: describe(e),
                status: None,
            },
        }
    }
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
