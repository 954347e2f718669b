//! The fixture format of the conformance kit (`docs/adapters.md`, "Golden
//! fixtures"): a directory holding `account.json` (the connector account the
//! calls serve) and one JSON file per recorded exchange, webhook or settlement
//! report, with what the adapter must make of it. Bodies are inline (`body`),
//! base64 (`body_base64`) or a file next to the fixture (`body_file`), so a
//! PSP's real traffic captured once is a regression suite.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;
use sluice_adapter_runtime::{ConnectorAccountScope, Header, OperationContext};

use crate::KitError;

/// At most this many fixture files are read from one directory: a limit on
/// everything, and a directory of more is a mistake worth hearing about.
pub const MAX_FIXTURES: usize = 500;

/// `account.json`: the connector account every call of the run serves.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountFile {
    #[serde(default = "default_account_id")]
    pub account_id: String,
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// A secret is a string, or its valid versions newest first.
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretValue>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SecretValue {
    One(String),
    Versions(Vec<String>),
}

fn default_account_id() -> String {
    "acct_conformance".into()
}

impl AccountFile {
    /// The account a kit run uses when no fixtures name one: a base URL the
    /// requests must stay under and two secrets the outputs must never show.
    pub fn standard() -> AccountFile {
        AccountFile {
            account_id: default_account_id(),
            config: BTreeMap::from([("base_url".into(), "https://psp.conformance.test/".into())]),
            secrets: BTreeMap::from([
                (
                    "api_key".into(),
                    SecretValue::One("sk_conformance_5d1f0c9a7b3e".into()),
                ),
                (
                    "webhook_secret".into(),
                    SecretValue::One("whsec_conformance_8e2a4c6b".into()),
                ),
            ]),
        }
    }

    pub fn scope(&self) -> ConnectorAccountScope {
        let mut scope = ConnectorAccountScope::new(self.account_id.clone());
        for (key, value) in &self.config {
            scope = scope.with_config(key.clone(), value.clone());
        }
        for (key, value) in &self.secrets {
            scope = match value {
                SecretValue::One(v) => scope.with_secret(key.clone(), v.clone()),
                SecretValue::Versions(vs) => scope.with_secret_versions(key.clone(), vs.clone()),
            };
        }
        scope
    }

    /// Every secret value, for the scan of what the adapter returned.
    pub fn secret_values(&self) -> Vec<String> {
        self.secrets
            .values()
            .flat_map(|v| match v {
                SecretValue::One(v) => vec![v.clone()],
                SecretValue::Versions(vs) => vs.clone(),
            })
            .filter(|v| !v.is_empty())
            .collect()
    }

    /// The same account with every secret replaced by another value: what a
    /// webhook signed by someone else's secret is checked against.
    pub fn with_other_secrets(&self) -> AccountFile {
        let mut other = self.clone();
        for value in other.secrets.values_mut() {
            let swap = |v: &String| other_secret(v);
            *value = match value {
                SecretValue::One(v) => SecretValue::One(swap(v)),
                SecretValue::Versions(vs) => SecretValue::Versions(vs.iter().map(swap).collect()),
            };
        }
        other
    }
}

/// Another value of the same shape (hex stays hex, so the keyring can still
/// decode it and the webhook is refused for its MAC, not for a broken key).
fn other_secret(value: &str) -> String {
    value
        .chars()
        .map(|c| match c {
            '0'..='8' | 'a'..='e' | 'A'..='E' => char::from(c as u8 + 1),
            '9' => '0',
            'f' => 'a',
            'F' => 'A',
            c => c,
        })
        .collect()
}

/// A body: inline text, base64, or a file relative to the fixture.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct BodySource {
    pub body: Option<String>,
    pub body_base64: Option<String>,
    pub body_file: Option<PathBuf>,
}

impl BodySource {
    fn bytes(&self, dir: &Path) -> Result<Vec<u8>, String> {
        match (&self.body, &self.body_base64, &self.body_file) {
            (Some(text), None, None) => Ok(text.clone().into_bytes()),
            (None, Some(b64), None) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("body_base64: {e}")),
            (None, None, Some(file)) => {
                std::fs::read(dir.join(file)).map_err(|e| format!("{}: {e}", file.display()))
            }
            (None, None, None) => Ok(Vec::new()),
            _ => Err("give at most one of body, body_base64 and body_file".into()),
        }
    }
}

/// A recorded PSP answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedResponse {
    pub status: u16,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(flatten)]
    pub body: BodySource,
}

/// A recorded webhook, as the PSP posted it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedWebhook {
    #[serde(default = "post")]
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(flatten)]
    pub body: BodySource,
}

fn post() -> String {
    "POST".into()
}

/// What the built request must be: only what is given is compared.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedRequest {
    pub method: Option<String>,
    pub url: Option<String>,
    /// Header names compare case-insensitively; values exactly.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body_contains: Vec<String>,
}

/// One fixture file.
#[derive(Debug, Clone, Deserialize)]
pub struct FixtureFile {
    pub name: String,
    #[serde(flatten)]
    pub kind: FixtureKind,
}

/// Expected events, lines and failures are JSON objects compared as subsets
/// of what the adapter returned (serialised with the contract's field names),
/// so a fixture states what matters and nothing else.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FixtureKind {
    Exchange {
        /// Boxed: it is most of the variant's size.
        context: Box<OperationContext>,
        #[serde(default)]
        request: Option<ExpectedRequest>,
        #[serde(default)]
        response: Option<RecordedResponse>,
        #[serde(default)]
        events: Option<Vec<Value>>,
        /// The `failure` parse-response returns instead of events.
        #[serde(default)]
        failure: Option<Value>,
    },
    Webhook {
        /// The host clock during the call (signature tolerances).
        now_unix_millis: Option<i64>,
        /// How long after `now_unix_millis` the adapter must refuse this
        /// webhook as stale; the standard suite checks it past the window.
        replay_window_ms: Option<i64>,
        webhook: RecordedWebhook,
        accepted: bool,
        #[serde(default)]
        events: Option<Vec<Value>>,
    },
    Settlement {
        #[serde(flatten)]
        report: BodySource,
        #[serde(default)]
        lines: Option<Vec<Value>>,
        #[serde(default)]
        line_count: Option<usize>,
    },
}

/// A fixture with its bodies read.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub file: PathBuf,
    pub name: String,
    pub kind: FixtureKind,
    /// The response, webhook or report body.
    pub body: Vec<u8>,
}

impl Fixture {
    pub fn headers(map: &BTreeMap<String, String>) -> Vec<Header> {
        map.iter()
            .map(|(name, value)| Header {
                name: name.clone(),
                value: value.clone(),
            })
            .collect()
    }
}

/// The fixtures of `dir`: its `account.json` and every other `*.json` file,
/// in file name order.
pub fn load(dir: &Path) -> Result<(AccountFile, Vec<Fixture>), KitError> {
    let account_path = dir.join("account.json");
    let account = match std::fs::read(&account_path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| KitError::Fixture(account_path.clone(), e.to_string()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => AccountFile::standard(),
        Err(e) => return Err(KitError::Fixture(account_path, e.to_string())),
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| KitError::Fixture(dir.to_path_buf(), e.to_string()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| p.file_name().is_some_and(|n| n != "account.json"))
        .collect();
    files.sort();
    if files.len() > MAX_FIXTURES {
        return Err(KitError::Fixture(
            dir.to_path_buf(),
            format!("{} fixtures, at most {MAX_FIXTURES}", files.len()),
        ));
    }
    let fixtures = files
        .into_iter()
        .map(|file| read_fixture(dir, file))
        .collect::<Result<_, _>>()?;
    Ok((account, fixtures))
}

fn read_fixture(dir: &Path, file: PathBuf) -> Result<Fixture, KitError> {
    let bad = |message: String| KitError::Fixture(file.clone(), message);
    let bytes = std::fs::read(&file).map_err(|e| bad(e.to_string()))?;
    let parsed: FixtureFile = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    let body = match &parsed.kind {
        FixtureKind::Exchange { response, .. } => match response {
            Some(r) => r.body.bytes(dir),
            None => Ok(Vec::new()),
        },
        FixtureKind::Webhook { webhook, .. } => webhook.body.bytes(dir),
        FixtureKind::Settlement { report, .. } => report.bytes(dir),
    }
    .map_err(bad)?;
    Ok(Fixture {
        file,
        name: parsed.name,
        kind: parsed.kind,
        body,
    })
}

/// Whether `actual` holds everything `expected` states: objects by their
/// keys (recursively), everything else by equality.
pub fn subset(expected: &Value, actual: &Value) -> Result<(), String> {
    match (expected, actual) {
        (Value::Object(want), Value::Object(have)) => {
            for (key, value) in want {
                let got = have.get(key).unwrap_or(&Value::Null);
                subset(value, got).map_err(|e| format!("{key}: {e}"))?;
            }
            Ok(())
        }
        _ if expected == actual => Ok(()),
        _ => Err(format!(
            "expected {expected}, got {}",
            crate::standard::clip(&actual.to_string())
        )),
    }
}

/// Compare expected items with actual ones, one to one in order.
pub fn list_subset(expected: &[Value], actual: &[Value], what: &str) -> Result<(), String> {
    if expected.len() != actual.len() {
        return Err(format!(
            "expected {} {what}, got {}: {}",
            expected.len(),
            actual.len(),
            crate::standard::clip(&Value::Array(actual.to_vec()).to_string())
        ));
    }
    for (i, (want, have)) in expected.iter().zip(actual).enumerate() {
        subset(want, have).map_err(|e| format!("{what} {i}: {e}"))?;
    }
    Ok(())
}
