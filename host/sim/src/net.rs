//! The simulated network between the gateway and the in-process PSP.
//!
//! Every PSP call the orchestrator makes goes through [`SimNet`], which asks
//! the world's seeded generator what the network does to it: deliver it,
//! lose the request, lose the answer after the PSP committed, answer 5xx or
//! garbage, duplicate it, hang until the budget, or kill the gateway process
//! before or after the PSP's commit. Time spent waiting moves the virtual
//! clock; nothing here sleeps.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use sluice_adapter_runtime::{Header, HttpResponse};
use sluice_orchestrator::transport::{CallBudget, CheckedRequest, PspTransport, TransportError};
use sluice_store::ManualClock;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::rng::SimRng;
use crate::trace::Trace;

/// What the network does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetFault {
    Deliver,
    /// Connection refused: the PSP never saw it.
    DropRequest,
    /// The PSP executed it; the answer never arrived (timeout).
    LoseResponse,
    /// A proxy answered 503 before the PSP saw anything.
    ServerError,
    /// The PSP executed it; a proxy mangled the answer.
    Garbage,
    /// Sent twice (a retrying proxy); the second answer is returned.
    Duplicate,
    /// No answer at all until the call's budget ran out; the PSP never saw it.
    Hang,
    /// The gateway process dies before the request leaves.
    CrashBefore,
    /// The gateway process dies after the PSP committed, before the answer.
    CrashAfterCommit,
}

/// Every fault, the two kills last.
const FAULTS: &[NetFault] = &[
    NetFault::DropRequest,
    NetFault::LoseResponse,
    NetFault::ServerError,
    NetFault::Garbage,
    NetFault::Duplicate,
    NetFault::Hang,
    NetFault::CrashBefore,
    NetFault::CrashAfterCommit,
];

impl NetFault {
    /// Draws a fault with the world's fault rate (per mille of requests).
    fn draw(rng: &SimRng, per_mille: u64, crashes: bool) -> NetFault {
        if rng.below(1000) >= per_mille {
            return NetFault::Deliver;
        }
        // The kills come last, so without kills they are cut off.
        let faults = if crashes {
            FAULTS
        } else {
            &FAULTS[..FAULTS.len() - 2]
        };
        faults[rng.below(faults.len() as u64) as usize]
    }

    fn label(self) -> &'static str {
        match self {
            NetFault::Deliver => "deliver",
            NetFault::DropRequest => "drop_request",
            NetFault::LoseResponse => "lose_response",
            NetFault::ServerError => "server_error",
            NetFault::Garbage => "garbage",
            NetFault::Duplicate => "duplicate",
            NetFault::Hang => "hang",
            NetFault::CrashBefore => "crash_before_send",
            NetFault::CrashAfterCommit => "crash_after_psp_commit",
        }
    }
}

/// The kill switch of one gateway incarnation. Once thrown, every call in
/// flight on that incarnation hangs forever (the process is gone) and the
/// world drops the operation that was running.
#[derive(Debug, Clone)]
pub struct Crash {
    tx: Arc<watch::Sender<bool>>,
}

impl Crash {
    pub fn new() -> Self {
        Crash {
            tx: Arc::new(watch::channel(false).0),
        }
    }

    pub fn kill(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_dead(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once the incarnation is killed.
    pub async fn killed(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so `wait_for` can only end by the flag.
        let _ = rx.wait_for(|dead| *dead).await;
    }
}

impl Default for Crash {
    fn default() -> Self {
        Crash::new()
    }
}

/// The network's knobs, changed by the world between phases.
#[derive(Debug, Clone, Copy)]
pub struct NetMode {
    /// Faulty requests per thousand.
    pub fault_per_mille: u64,
    pub crashes: bool,
}

/// The PSP transport of one gateway incarnation.
#[derive(Debug)]
pub struct SimNet {
    router: Router,
    rng: SimRng,
    clock: ManualClock,
    trace: Trace,
    crash: Crash,
    mode: Arc<Mutex<NetMode>>,
}

impl SimNet {
    pub fn new(
        router: Router,
        rng: SimRng,
        clock: ManualClock,
        trace: Trace,
        crash: Crash,
        mode: Arc<Mutex<NetMode>>,
    ) -> Self {
        SimNet {
            router,
            rng,
            clock,
            trace,
            crash,
            mode,
        }
    }

    fn mode(&self) -> NetMode {
        *self.mode.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The request as the PSP's HTTP stack sees it, answered in process.
    async fn exchange(&self, request: &CheckedRequest) -> Result<HttpResponse, TransportError> {
        let mut builder = axum::http::Request::builder()
            .method(request.method.as_str())
            .uri(path_and_query(request));
        for header in &request.headers {
            builder = builder.header(header.name.as_str(), header.value.as_str());
        }
        let http_request = builder
            .body(Body::from(request.body.clone()))
            .map_err(|e| TransportError::Io(e.to_string()))?;
        let response = self
            .router
            .clone()
            .oneshot(http_request)
            .await
            .map_err(|e| TransportError::Io(e.to_string()))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter_map(|(name, value)| {
                Some(Header {
                    name: name.as_str().to_owned(),
                    value: value.to_str().ok()?.to_owned(),
                })
            })
            .collect();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| TransportError::Io(e.to_string()))?
            .to_bytes()
            .to_vec();
        Ok(HttpResponse {
            status,
            headers,
            body,
        })
    }

    /// Waits out the budget on the virtual clock.
    fn time_out(&self, budget: &CallBudget) -> TransportError {
        let ms = i64::try_from(budget.timeout.as_millis()).unwrap_or(i64::MAX);
        self.clock.advance(ms);
        TransportError::Timeout(budget.timeout)
    }

    /// The process is gone: nothing after this point runs.
    async fn die(&self) -> Result<HttpResponse, TransportError> {
        self.crash.kill();
        std::future::pending().await
    }
}

#[async_trait]
impl PspTransport for SimNet {
    async fn send(
        &self,
        request: &CheckedRequest,
        budget: &CallBudget,
    ) -> Result<HttpResponse, TransportError> {
        if self.crash.is_dead() {
            return std::future::pending().await;
        }
        let mode = self.mode();
        let fault = NetFault::draw(&self.rng, mode.fault_per_mille, mode.crashes);
        self.trace.line(format!(
            "net {} {} -> {}",
            request.method,
            route_of(request),
            fault.label()
        ));
        match fault {
            NetFault::Deliver => self.exchange(request).await,
            NetFault::DropRequest => Err(TransportError::Connect("connection refused".into())),
            NetFault::ServerError => Ok(HttpResponse {
                status: 503,
                headers: Vec::new(),
                body: b"upstream unavailable".to_vec(),
            }),
            NetFault::Hang => Err(self.time_out(budget)),
            NetFault::LoseResponse => {
                self.exchange(request).await?;
                Err(self.time_out(budget))
            }
            NetFault::Garbage => {
                let mut response = self.exchange(request).await?;
                response.body = b"<html>502 Bad Gateway</html>\0garbage".to_vec();
                Ok(response)
            }
            NetFault::Duplicate => {
                self.exchange(request).await?;
                self.exchange(request).await
            }
            NetFault::CrashBefore => self.die().await,
            NetFault::CrashAfterCommit => {
                self.exchange(request).await?;
                self.die().await
            }
        }
    }
}

fn path_and_query(request: &CheckedRequest) -> String {
    match request.url.query() {
        Some(query) => format!("{}?{query}", request.url.path()),
        None => request.url.path().to_owned(),
    }
}

/// The route without ids, for the trace: ids minted by the gateway are not
/// part of what a seed determines.
fn route_of(request: &CheckedRequest) -> String {
    request
        .url
        .path()
        .split('/')
        .filter(|part| !part.is_empty())
        .map(|part| {
            if part.len() > 8 && part.chars().any(|c| c.is_ascii_digit()) {
                "{id}"
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}
