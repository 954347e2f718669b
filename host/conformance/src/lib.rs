//! The adapter conformance kit (issue 15): `sluice adapter test x.wasm
//! [--fixtures DIR] [--junit FILE]` checks any component against the contract
//! `sluice:psp@0.2.x`, without a gateway or a PSP.
//!
//! Two suites run in the real sandbox (the runtime the gateway uses, with its
//! limits):
//! - the **standard suite** every adapter must pass, whatever its PSP
//!   (`standard.rs`): `describe` is sane and cheap; every declared operation
//!   builds a request under `base_url` keyed by its reference; the same input
//!   gives the same output; a 5xx, an empty answer and garbage parse to
//!   unknown, never to a failure; a webhook signed with another secret or
//!   without its signature is refused, a stale one too when the fixture
//!   states a replay window; nothing returned or logged holds a secret or a
//!   card number; every call stays within the sandbox's limits;
//! - the adapter's own **golden fixtures** (`fixtures.rs`): recorded
//!   exchanges, webhooks and settlement reports with what they must give.
//!
//! The result is a [`Report`]: a table for a terminal, JUnit XML for CI, and
//! [`Report::passed`] for the exit code.

pub mod fixtures;
mod report;
pub mod scan;
mod standard;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_adapter_runtime::{
    AdapterHandle, AdapterRuntime, ConnectorAccountScope, HttpResponse, LoadError, RuntimeConfig,
    SandboxLimits, WebhookRequest,
};

pub use report::{Case, Outcome, Report};

use crate::fixtures::{AccountFile, Fixture, FixtureKind};

/// 2024-12-01T00:00:00Z: the host clock of calls whose fixture names none.
pub const DEFAULT_NOW_MS: i64 = 1_733_011_200_000;

/// Why the kit could not run at all (a finding is a failed case instead).
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error("cannot read {0}: {1}")]
    Io(PathBuf, String),
    #[error("fixture {0}: {1}")]
    Fixture(PathBuf, String),
    #[error("cannot start the adapter runtime: {0}")]
    Runtime(String),
}

/// What to check.
#[derive(Debug, Clone)]
pub struct KitOptions {
    pub wasm: PathBuf,
    pub fixtures: Option<PathBuf>,
    /// The sandbox limits the adapter will be loaded with in the gateway;
    /// None: the gateway's defaults.
    pub limits: Option<SandboxLimits>,
}

/// One run of the kit: the loaded component, the account its calls serve and
/// everything it returned so far (for the secrets scan).
pub(crate) struct Kit {
    pub handle: AdapterHandle,
    pub account: AccountFile,
    pub scope: ConnectorAccountScope,
    pub fixtures: Vec<Fixture>,
    pub clock: Arc<AtomicI64>,
    /// Every output of the adapter, as text, with where it came from.
    pub outputs: Vec<(String, String)>,
    pub report: Report,
}

/// Run both suites on `options.wasm`.
pub async fn run(options: &KitOptions) -> Result<Report, KitError> {
    let wasm = std::fs::read(&options.wasm)
        .map_err(|e| KitError::Io(options.wasm.clone(), e.to_string()))?;
    let (account, fixtures) = match &options.fixtures {
        Some(dir) => fixtures::load(dir)?,
        None => (AccountFile::standard(), Vec::new()),
    };
    let clock = Arc::new(AtomicI64::new(DEFAULT_NOW_MS));
    let runtime = runtime(&clock)?;
    let log = scan::LogCapture::global();
    let log_mark = log.as_ref().map_or(0, scan::LogCapture::mark);
    let mut report = Report::new(component_name(&options.wasm));
    let started = Instant::now();
    let loaded = load(&runtime, &options.wasm, &wasm, options.limits);
    report.push(Case {
        suite: "standard".into(),
        name: "the component loads as a psp-adapter".into(),
        outcome: match &loaded {
            Ok(_) => Outcome::Passed,
            Err(e) => Outcome::Failed(e.to_string()),
        },
        elapsed: started.elapsed(),
    });
    let Ok(handle) = loaded else {
        return Ok(report);
    };
    let mut kit = Kit {
        handle,
        scope: account.scope(),
        account,
        fixtures,
        clock,
        outputs: Vec::new(),
        report,
    };
    standard::run(&mut kit).await;
    kit.run_fixtures().await;
    let logged = log.as_ref().map(|l| l.since(log_mark));
    standard::no_leaks(&mut kit, logged);
    Ok(kit.report)
}

fn runtime(clock: &Arc<AtomicI64>) -> Result<AdapterRuntime, KitError> {
    let tick = Arc::clone(clock);
    AdapterRuntime::new(RuntimeConfig {
        max_concurrent_instances: 2,
        clock: Arc::new(move || tick.load(Ordering::Relaxed)),
        ..RuntimeConfig::default()
    })
    .map_err(|e| KitError::Runtime(e.to_string()))
}

fn component_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "adapter".into())
}

/// Load under the file's name; an adapter describing itself otherwise is
/// loaded again under the name it gives (the kit checks the component, not
/// the file name).
fn load(
    runtime: &AdapterRuntime,
    path: &Path,
    wasm: &[u8],
    limits: Option<SandboxLimits>,
) -> Result<AdapterHandle, LoadError> {
    let mut name = component_name(path).to_ascii_lowercase().replace(
        |c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "-",
    );
    name.truncate(64);
    let info = match runtime.load(&name, wasm, limits, true) {
        Err(LoadError::NameMismatch { got, .. }) => {
            name = got;
            runtime.load(&name, wasm, limits, true)?
        }
        other => other?,
    };
    runtime
        .version(&name, &info.digest)
        .ok_or(LoadError::UnknownVersion {
            name,
            digest: info.digest,
        })
}

impl Kit {
    /// The loaded component.
    pub fn adapter(&self) -> &AdapterHandle {
        &self.handle
    }

    pub fn record(
        &mut self,
        suite: &str,
        name: impl Into<String>,
        started: Instant,
        result: Result<(), String>,
    ) {
        self.report.push(Case {
            suite: suite.into(),
            name: name.into(),
            outcome: match result {
                Ok(()) => Outcome::Passed,
                Err(reason) => Outcome::Failed(reason),
            },
            elapsed: started.elapsed(),
        });
    }

    pub fn skip(&mut self, suite: &str, name: impl Into<String>, reason: impl Into<String>) {
        self.report.push(Case {
            suite: suite.into(),
            name: name.into(),
            outcome: Outcome::Skipped(reason.into()),
            elapsed: Duration::ZERO,
        });
    }

    /// Keep an output for the secrets scan.
    pub fn witness(&mut self, source: impl Into<String>, output: &impl serde::Serialize) {
        let text = serde_json::to_string(output).unwrap_or_default();
        self.outputs.push((source.into(), text));
    }

    async fn run_fixtures(&mut self) {
        for fixture in self.fixtures.clone() {
            let started = Instant::now();
            let result = self.fixture(&fixture).await;
            let name = format!("{} ({})", fixture.name, file_name(&fixture.file));
            self.record("fixtures", name, started, result);
        }
    }

    async fn fixture(&mut self, fixture: &Fixture) -> Result<(), String> {
        self.clock.store(DEFAULT_NOW_MS, Ordering::Relaxed);
        match &fixture.kind {
            FixtureKind::Exchange {
                context,
                request,
                response,
                events,
                failure,
            } => {
                if let Some(expected) = request {
                    let built = standard::build(self, (**context).clone()).await?;
                    standard::request_matches(expected, &built)?;
                }
                let Some(response) = response else {
                    return Ok(());
                };
                let answer = HttpResponse {
                    status: response.status,
                    headers: Fixture::headers(&response.headers),
                    body: fixture.body.clone(),
                };
                let parsed = standard::parse(self, (**context).clone(), answer).await?;
                expect_parsed(&parsed, events.as_deref(), failure.as_ref())
            }
            FixtureKind::Webhook {
                now_unix_millis,
                webhook,
                accepted,
                events,
                ..
            } => {
                self.clock
                    .store(now_unix_millis.unwrap_or(DEFAULT_NOW_MS), Ordering::Relaxed);
                let request = WebhookRequest {
                    method: webhook.method.clone(),
                    path: webhook.path.clone(),
                    headers: Fixture::headers(&webhook.headers),
                    body: fixture.body.clone(),
                };
                let scope = self.scope.clone();
                let answer = standard::webhook(self, &scope, request).await?;
                expect_webhook(&answer, *accepted, events.as_deref())
            }
            FixtureKind::Settlement {
                lines, line_count, ..
            } => {
                let parsed = standard::settlement(self, fixture.body.clone()).await?;
                let parsed = parsed.map_err(|f| format!("the report was refused: {f:?}"))?;
                if let Some(count) = line_count {
                    if parsed.len() != *count {
                        return Err(format!("expected {count} lines, got {}", parsed.len()));
                    }
                }
                let actual: Vec<Value> = parsed.iter().map(to_value).collect();
                match lines {
                    Some(lines) => fixtures::list_subset(
                        lines,
                        &actual[..lines.len().min(actual.len())],
                        "line",
                    ),
                    None => Ok(()),
                }
            }
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub(crate) fn to_value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn expect_parsed(
    parsed: &standard::Parsed,
    events: Option<&[Value]>,
    failure: Option<&Value>,
) -> Result<(), String> {
    match (parsed, events, failure) {
        (Ok(actual), Some(expected), None) => {
            let actual: Vec<Value> = actual.iter().map(to_value).collect();
            fixtures::list_subset(expected, &actual, "event")
        }
        (Err(actual), None, Some(expected)) => fixtures::subset(expected, &to_value(actual)),
        (Ok(actual), None, Some(_)) => Err(format!(
            "expected a failure, got events {}",
            to_value(actual)
        )),
        (Err(actual), Some(_), None) => Err(format!(
            "expected events, got the failure {}",
            to_value(actual)
        )),
        (_, None, None) => Ok(()),
        (_, Some(_), Some(_)) => Err("a fixture states events or a failure, not both".into()),
    }
}

fn expect_webhook(
    answer: &standard::WebhookAnswer,
    accepted: bool,
    events: Option<&[Value]>,
) -> Result<(), String> {
    match (answer, accepted) {
        (Ok(acceptance), true) => match events {
            Some(expected) => {
                let actual: Vec<Value> = acceptance.events.iter().map(to_value).collect();
                fixtures::list_subset(expected, &actual, "event")
            }
            None => Ok(()),
        },
        (Err(rejection), true) => Err(format!("refused: {rejection:?}")),
        (Ok(acceptance), false) => Err(format!(
            "accepted with {} events; it must be refused",
            acceptance.events.len()
        )),
        (Err(_), false) => Ok(()),
    }
}
