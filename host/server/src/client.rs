//! HTTP client of the gateway's API, used by `sluice adapter ...` (admin
//! token) and `sluice payments ...` (a merchant API key).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{ActivateRequest, AdapterList, AdapterVersionView};
use crate::error::ErrorBody;

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the gateway at {url}: {source}")]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the gateway refused the request ({status}): {code}: {message}")]
    Api {
        status: StatusCode,
        code: String,
        message: String,
    },
    #[error("unexpected answer from the gateway ({status}): {body}")]
    Unexpected { status: StatusCode, body: String },
}

/// A client of one gateway's admin API.
pub struct AdminClient {
    base_url: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// A response both as raw JSON (for `--json`) and typed (for tables).
pub struct Answer<T> {
    pub raw: Value,
    pub value: T,
}

impl AdminClient {
    pub fn new(base_url: &str, token: Option<String>) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            // Uploads compile the component on the server; give it time.
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|source| ClientError::Transport {
                url: base_url.to_string(),
                source,
            })?;
        Ok(AdminClient {
            base_url: base_url.trim_end_matches('/').to_string(),
            token,
            http,
        })
    }

    /// Uploads a component (validated by the server, activated unless `activate` is
    /// false, staged as the shadow with `shadow`).
    pub async fn load(
        &self,
        name: &str,
        wasm: Vec<u8>,
        activate: bool,
        shadow: bool,
    ) -> Result<Answer<AdapterVersionView>, ClientError> {
        let path = if shadow {
            format!("/admin/adapters/{name}?shadow=true")
        } else {
            format!("/admin/adapters/{name}?activate={activate}")
        };
        let request = self
            .request(Method::PUT, &path)
            .header("content-type", "application/wasm")
            .body(wasm);
        self.send(request).await
    }

    pub async fn list(&self) -> Result<Answer<AdapterList>, ClientError> {
        self.send(self.request(Method::GET, "/admin/adapters"))
            .await
    }

    pub async fn activate(
        &self,
        name: &str,
        digest: &str,
    ) -> Result<Answer<AdapterVersionView>, ClientError> {
        let request = self
            .request(Method::POST, &format!("/admin/adapters/{name}/activate"))
            .json(&ActivateRequest {
                digest: digest.to_string(),
            });
        self.send(request).await
    }

    pub async fn rollback(&self, name: &str) -> Result<Answer<AdapterVersionView>, ClientError> {
        self.send(self.request(Method::POST, &format!("/admin/adapters/{name}/rollback")))
            .await
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .request(method, format!("{}{path}", self.base_url));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// `GET path` as JSON, with the client's token (an admin token, or a
    /// merchant API key for `/v1`).
    /// Any admin route with an optional JSON body, answered as JSON.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer<Value>, ClientError> {
        let request = self.request(method, path);
        let request = match body {
            Some(body) => request.json(body),
            None => request,
        };
        self.send(request).await
    }

    pub async fn get_json(&self, path: &str) -> Result<Value, ClientError> {
        let answer: Answer<Value> = self.send(self.request(Method::GET, path)).await?;
        Ok(answer.value)
    }

    /// `POST path` with a JSON body, answered as JSON.
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let request = self.request(Method::POST, path).json(body);
        let answer: Answer<Value> = self.send(request).await?;
        Ok(answer.value)
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<Answer<T>, ClientError> {
        let transport = |source| ClientError::Transport {
            url: self.base_url.clone(),
            source,
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<ErrorBody>(&body) {
                Ok(error) => ClientError::Api {
                    status,
                    code: error.error.code,
                    message: error.error.message,
                },
                Err(_) => unexpected(status, &body),
            });
        }
        let raw: Value = serde_json::from_slice(&body).map_err(|_| unexpected(status, &body))?;
        let value = serde_json::from_value(raw.clone()).map_err(|_| unexpected(status, &body))?;
        Ok(Answer { raw, value })
    }
}

fn unexpected(status: StatusCode, body: &[u8]) -> ClientError {
    const SHOWN: usize = 512;
    let text = String::from_utf8_lossy(&body[..body.len().min(SHOWN)]).into_owned();
    ClientError::Unexpected { status, body: text }
}
