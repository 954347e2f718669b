//! Shared helpers: compiled test adapters, in-process gateways on 127.0.0.1:0, HTTP calls.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use reqwest::{Method, StatusCode};
use serde_json::Value;
use sha2::{Digest, Sha256};
use sluice_server::config::{Config, Secret};
use sluice_server::server::{self, RunningServer};
use tokio::net::TcpListener;

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

pub use sluice_test_support::adapters::{adapter_bytes, WELL_BEHAVED};

/// Appends a custom section: same behaviour, different bytes, so a different version.
pub fn with_custom_section(wasm: &[u8], name: &str) -> Vec<u8> {
    let mut content = leb128(name.len());
    content.extend_from_slice(name.as_bytes());
    let mut out = wasm.to_vec();
    out.push(0);
    out.extend(leb128(content.len()));
    out.extend(content);
    out
}

fn leb128(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A config for a test gateway: everything under `data_dir`, SQLite, a known admin token.
pub fn config(data_dir: &Path, adapters_dir: Option<PathBuf>) -> Config {
    let mut config = Config::from_parts(None, |_| None).expect("default config");
    config.listen = "127.0.0.1:0".parse().expect("loopback address");
    config.data_dir = data_dir.to_path_buf();
    config.database_url = Secret::new(format!("sqlite://{}/sluice.db", data_dir.display()));
    config.admin_token = Some(Secret::new(ADMIN_TOKEN));
    config.adapters_dir = adapters_dir;
    config.master_key = Some(Secret::new(TEST_MASTER_KEY));
    config
}

/// Where `sluice demo` keeps its development master key.
pub const DEV_KEY_FILE: &str = sluice_server::master_key::DEV_MASTER_KEY_FILE;

/// The master key of test gateways (64 hex digits).
pub const TEST_MASTER_KEY: &str =
    "5e1ce5e1ce5e1ce5e1ce5e1ce5e1ce5e1ce5e1ce5e1ce5e1ce5e1ce5e1ce5e1c";

/// Starts a gateway on an ephemeral loopback port and waits until start-up loading is done.
pub async fn start(config: &Config) -> RunningServer {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let server = server::start(config, Some(listener))
        .await
        .expect("start the gateway");
    server.ready().await;
    server
}

/// A directory with copies of the named compiled adapters, for start-up loading.
pub fn adapters_subset(names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for name in names {
        std::fs::write(dir.path().join(format!("{name}.wasm")), adapter_bytes(name))
            .expect("write adapter copy");
    }
    dir
}

/// An HTTP client of one test gateway.
pub struct Http {
    pub base: String,
    client: reqwest::Client,
}

pub struct Reply {
    pub status: StatusCode,
    pub json: Value,
}

impl Http {
    pub fn new(server: &RunningServer) -> Self {
        Http {
            base: server.url(),
            client: reqwest::Client::new(),
        }
    }

    /// Sends a request with the admin token (or `token` when given; `Some("")` sends none).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Body>,
    ) -> Reply {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        match token {
            None => request = request.bearer_auth(ADMIN_TOKEN),
            Some("") => {}
            Some(token) => request = request.bearer_auth(token),
        }
        request = match body {
            None => request,
            Some(Body::Wasm(bytes)) => request
                .header("content-type", "application/wasm")
                .body(bytes),
            Some(Body::Json(value)) => request.json(&value),
            Some(Body::Raw(content_type, text)) => {
                request.header("content-type", content_type).body(text)
            }
        };
        let response = request.send().await.expect("HTTP request to the gateway");
        let status = response.status();
        let bytes = response.bytes().await.expect("response body");
        let json = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "response ({status}) is not JSON: {e}: {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        Reply { status, json }
    }

    pub async fn upload(&self, name: &str, wasm: Vec<u8>, activate: bool) -> Reply {
        let path = if activate {
            format!("/admin/adapters/{name}")
        } else {
            format!("/admin/adapters/{name}?activate=false")
        };
        self.call(Method::PUT, &path, None, Some(Body::Wasm(wasm)))
            .await
    }

    pub async fn list(&self) -> Value {
        let reply = self.call(Method::GET, "/admin/adapters", None, None).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        reply.json
    }

    pub async fn activate(&self, name: &str, digest: &str) -> Reply {
        let body = serde_json::json!({ "digest": digest });
        self.call(
            Method::POST,
            &format!("/admin/adapters/{name}/activate"),
            None,
            Some(Body::Json(body)),
        )
        .await
    }

    pub async fn rollback(&self, name: &str) -> Reply {
        self.call(
            Method::POST,
            &format!("/admin/adapters/{name}/rollback"),
            None,
            None,
        )
        .await
    }
}

pub enum Body {
    Wasm(Vec<u8>),
    Json(Value),
    Raw(&'static str, String),
}

/// The listed adapter named `name`.
pub fn adapter<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["adapters"]
        .as_array()
        .expect("adapters array")
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("adapter {name} not listed in {list}"))
}

/// Asserts the error shape and returns its code.
pub fn error_code(reply: &Reply) -> String {
    let error = &reply.json["error"];
    assert!(
        error["type"].is_string(),
        "error without type: {}",
        reply.json
    );
    assert!(
        error["message"].is_string(),
        "error without message: {}",
        reply.json
    );
    assert!(
        error.get("param").is_some(),
        "error without param: {}",
        reply.json
    );
    error["code"]
        .as_str()
        .unwrap_or_else(|| panic!("error without code: {}", reply.json))
        .to_string()
}

/// What the active version of `name` answers to `describe()` right now, through the runtime
/// the gateway serves with.
pub async fn active_describe(server: &RunningServer, name: &str) -> (String, String) {
    let handle = server
        .state()
        .adapters
        .runtime()
        .active(name)
        .unwrap_or_else(|| panic!("{name} has no active version"));
    let digest = handle.identity().digest.clone();
    let info = handle
        .describe()
        .await
        .expect("describe() of the active version");
    (info.name, digest)
}
