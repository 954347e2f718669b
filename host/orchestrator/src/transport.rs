//! The host's PSP transport: adapters build requests, the host performs them.
//!
//! Adapters are untrusted, so before anything leaves the host:
//!
//! - the destination must lie under the connector account's configured
//!   `base_url` (same scheme, host and port; path under the base path, after
//!   URL normalisation so `..` or percent tricks cannot climb out);
//! - hop-by-hop and framing headers (`Host`, `Content-Length`, ...) are
//!   refused: the transport sets them itself;
//! - redirects are never followed and no proxy from the environment is used.
//!
//! The transport only moves bytes. Classifying what its errors mean for the
//! money (always "unknown": the request may have been processed) is the
//! orchestrator's job, in one place.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use sluice_adapter_runtime::{Header, HttpRequest, HttpResponse};

/// Why a request never left the host. Nothing was sent, so nothing can have
/// happened at the PSP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestRefused {
    #[error("the connector account has no valid base_url: {0}")]
    NoBaseUrl(String),
    #[error("the adapter asked for {url}, which is not under the connector account's base_url")]
    OutsideBaseUrl { url: String },
    #[error("the adapter built an invalid request: {0}")]
    Invalid(String),
}

/// Why a request that may have left the host got no usable answer. The PSP may
/// have processed it: the outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("the exchange failed: {0}")]
    Io(String),
    #[error("the response body exceeds {limit} bytes")]
    ResponseTooLarge { limit: usize },
}

impl TransportError {
    /// A short stable code for history rows and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            TransportError::Timeout(_) => "transport_timeout",
            TransportError::Connect(_) => "transport_connect",
            TransportError::Io(_) => "transport_io",
            TransportError::ResponseTooLarge { .. } => "response_too_large",
        }
    }
}

/// What one PSP call may do.
#[derive(Debug, Clone)]
pub struct CallBudget {
    /// Everything (connect, send, wait, read the body) within this time.
    pub timeout: Duration,
    /// Bodies larger than this are not read to the end.
    pub max_response_bytes: usize,
}

/// Performs a PSP request that was already checked against the base URL.
#[async_trait]
pub trait PspTransport: Send + Sync + std::fmt::Debug {
    async fn send(
        &self,
        request: &CheckedRequest,
        budget: &CallBudget,
    ) -> Result<HttpResponse, TransportError>;
}

/// A request whose destination and headers passed [`check_request`]. Once the
/// host substituted the credentials (`call::with_credentials`) it carries
/// secrets: its `Debug` shows header names and the body's size only.
#[derive(Clone, PartialEq, Eq)]
pub struct CheckedRequest {
    pub method: reqwest::Method,
    pub url: Url,
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for CheckedRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|h| h.name.as_str()).collect();
        f.debug_struct("CheckedRequest")
            .field("method", &self.method)
            .field("url", &self.url.as_str())
            .field("header_names", &names)
            .field("body_bytes", &self.body.len())
            .finish()
    }
}

/// Headers the transport owns; an adapter may not set them.
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-connection",
];

/// Checks an adapter-built request against the connector account's base URL.
pub fn check_request(
    request: &HttpRequest,
    base_url: &str,
) -> Result<CheckedRequest, RequestRefused> {
    let base = Url::parse(base_url).map_err(|e| RequestRefused::NoBaseUrl(e.to_string()))?;
    if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
        return Err(RequestRefused::NoBaseUrl(format!(
            "{base_url} is not an http(s) URL"
        )));
    }
    let url = Url::parse(&request.url).map_err(|_| RequestRefused::OutsideBaseUrl {
        url: request.url.clone(),
    })?;
    if !under_base(&url, &base) {
        return Err(RequestRefused::OutsideBaseUrl {
            url: request.url.clone(),
        });
    }
    let method = reqwest::Method::from_bytes(request.method.as_bytes())
        .map_err(|_| RequestRefused::Invalid(format!("method {:?}", request.method)))?;
    for header in &request.headers {
        let name = header.name.to_ascii_lowercase();
        if FORBIDDEN_HEADERS.contains(&name.as_str()) {
            return Err(RequestRefused::Invalid(format!(
                "header {} is set by the host",
                header.name
            )));
        }
        reqwest::header::HeaderName::from_bytes(header.name.as_bytes())
            .map_err(|_| RequestRefused::Invalid(format!("header name {:?}", header.name)))?;
        reqwest::header::HeaderValue::from_str(&header.value)
            .map_err(|_| RequestRefused::Invalid(format!("value of header {}", header.name)))?;
    }
    Ok(CheckedRequest {
        method,
        url,
        headers: request.headers.clone(),
        body: request.body.clone(),
    })
}

/// Same origin, no credentials in the URL, and the path inside the base path
/// (segment-wise: `/psp` does not cover `/pspevil`).
fn under_base(url: &Url, base: &Url) -> bool {
    let same_origin = url.scheme() == base.scheme()
        && url.host_str() == base.host_str()
        && url.port_or_known_default() == base.port_or_known_default();
    if !same_origin || !url.username().is_empty() || url.password().is_some() {
        return false;
    }
    let base_path = base.path().trim_end_matches('/');
    let path = url.path();
    base_path.is_empty()
        || path == base_path
        || path
            .strip_prefix(base_path)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The production transport: reqwest, no redirects, no environment proxy.
#[derive(Debug, Clone)]
pub struct ReqwestTransport {
    client: reqwest::Client,
}

impl ReqwestTransport {
    pub fn new() -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()?;
        Ok(ReqwestTransport { client })
    }
}

#[async_trait]
impl PspTransport for ReqwestTransport {
    async fn send(
        &self,
        request: &CheckedRequest,
        budget: &CallBudget,
    ) -> Result<HttpResponse, TransportError> {
        // One deadline for the whole exchange, body included: a PSP trickling
        // bytes must not hold the call past its budget.
        match tokio::time::timeout(budget.timeout, self.exchange(request, budget)).await {
            Ok(result) => result,
            Err(_) => Err(TransportError::Timeout(budget.timeout)),
        }
    }
}

impl ReqwestTransport {
    async fn exchange(
        &self,
        request: &CheckedRequest,
        budget: &CallBudget,
    ) -> Result<HttpResponse, TransportError> {
        let mut builder = self
            .client
            .request(request.method.clone(), request.url.clone())
            .timeout(budget.timeout)
            .body(request.body.clone());
        for header in &request.headers {
            builder = builder.header(header.name.as_str(), header.value.as_str());
        }
        let mut response = builder
            .send()
            .await
            .map_err(|e| classify(e, budget.timeout))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| Header {
                name: name.as_str().to_owned(),
                value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            })
            .collect();
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| classify(e, budget.timeout))?
        {
            if body.len() + chunk.len() > budget.max_response_bytes {
                return Err(TransportError::ResponseTooLarge {
                    limit: budget.max_response_bytes,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(HttpResponse {
            status,
            headers,
            body,
        })
    }
}

fn classify(error: reqwest::Error, timeout: Duration) -> TransportError {
    // reqwest's Display of the error chain may include the URL; the URL is
    // built from references, never from secrets, so it is safe to keep.
    if error.is_timeout() {
        TransportError::Timeout(timeout)
    } else if error.is_connect() {
        TransportError::Connect(error.to_string())
    } else {
        TransportError::Io(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(url: &str) -> HttpRequest {
        HttpRequest {
            method: "POST".into(),
            url: url.into(),
            headers: vec![Header {
                name: "Idempotency-Key".into(),
                value: "pay_1_a1".into(),
            }],
            body: b"{}".to_vec(),
        }
    }

    const BASE: &str = "http://127.0.0.1:8080/psp";

    #[test]
    fn a_url_under_the_base_url_is_accepted() {
        let checked =
            check_request(&request("http://127.0.0.1:8080/psp/v1/payments"), BASE).unwrap();
        assert_eq!(checked.url.path(), "/psp/v1/payments");
        assert_eq!(checked.method, reqwest::Method::POST);
        assert!(check_request(&request("http://127.0.0.1:8080/psp"), BASE).is_ok());
        assert!(check_request(&request("http://127.0.0.1:8080/psp/"), &format!("{BASE}/")).is_ok());
    }

    #[test]
    fn a_url_outside_the_base_url_is_refused() {
        for url in [
            "http://127.0.0.1:8081/psp/v1/payments",
            "https://127.0.0.1:8080/psp/v1/payments",
            "http://localhost:8080/psp/v1/payments",
            "http://127.0.0.1:8080/pspevil/v1",
            "http://127.0.0.1:8080/psp/../admin",
            "http://127.0.0.1:8080/psp/%2e%2e/admin",
            "http://127.0.0.1:8080@evil.example/psp/v1",
            "http://user:pw@127.0.0.1:8080/psp/v1",
            "http://evil.example/psp/v1",
            "/psp/v1/payments",
            "file:///etc/passwd",
        ] {
            assert!(
                matches!(
                    check_request(&request(url), BASE),
                    Err(RequestRefused::OutsideBaseUrl { .. })
                ),
                "{url} must be refused"
            );
        }
    }

    #[test]
    fn a_missing_or_odd_base_url_refuses_everything() {
        assert!(matches!(
            check_request(&request("http://127.0.0.1/x"), ""),
            Err(RequestRefused::NoBaseUrl(_))
        ));
        assert!(matches!(
            check_request(&request("ftp://127.0.0.1/x"), "ftp://127.0.0.1/"),
            Err(RequestRefused::NoBaseUrl(_))
        ));
    }

    #[test]
    fn framing_headers_and_bad_methods_are_refused() {
        let mut req = request("http://127.0.0.1:8080/psp/v1");
        req.headers.push(Header {
            name: "Host".into(),
            value: "evil.example".into(),
        });
        assert!(matches!(
            check_request(&req, BASE),
            Err(RequestRefused::Invalid(_))
        ));
        let mut req = request("http://127.0.0.1:8080/psp/v1");
        req.method = "PO ST".into();
        assert!(matches!(
            check_request(&req, BASE),
            Err(RequestRefused::Invalid(_))
        ));
        let mut req = request("http://127.0.0.1:8080/psp/v1");
        req.headers.push(Header {
            name: "X-Evil".into(),
            value: "a\r\nb".into(),
        });
        assert!(matches!(
            check_request(&req, BASE),
            Err(RequestRefused::Invalid(_))
        ));
    }
}
