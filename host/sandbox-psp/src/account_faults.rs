//! Per-account transport faults (`PUT /_sandbox/account_faults/{account}`,
//! [`crate::SandboxHandle::set_account_faults`]): one PSP account slow,
//! failing with 5xx or hanging while the others answer normally, so tests
//! and the demo can show breakers opening, routing going around an account
//! and bulkheads holding. The account is named as for `account_declines`:
//! the Stripe-format API key, the Adyen-format merchant account.
//!
//! Applied before the request reaches its handler, to every call at the
//! account (payments, captures, refunds, queries alike): a 5xx or a hang
//! here has executed nothing. Deterministic, because the simulator replays
//! seeds: the 5xx falls on every Nth call of the account, counted in the
//! order the sandbox saw them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::app::{respond, App};
use crate::util::lock;

/// The body size the Adyen-format layer reads to find the merchant account;
/// a larger body is passed on untouched, without faults.
const MAX_PEEK_BYTES: usize = 1 << 20;
/// How long a hanging call is held (the sandbox's shutdown ends it sooner).
const HANG: Duration = Duration::from_secs(24 * 3600);

/// The faults of one account.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccountFaults {
    /// Added to every call before anything else happens.
    pub latency_ms: u64,
    /// Every Nth call answers HTTP 500 before anything executes (1: every
    /// call, 2: every second one, ...; 0: never).
    pub server_error_every: u32,
    /// Calls are held without an answer (the client's timeout ends them).
    pub hang: bool,
}

/// An account's faults and what they did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountFaultState {
    pub faults: AccountFaults,
    /// Calls at the account since its faults were set.
    pub calls: u64,
    /// Of those, answered with the fault's 500.
    pub server_errors: u64,
}

/// What the layer does with one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Verdict {
    delay: Duration,
    hang: bool,
    server_error: bool,
}

impl AccountFaultState {
    fn next_call(&mut self) -> Verdict {
        self.calls += 1;
        let every = u64::from(self.faults.server_error_every);
        let server_error = every > 0 && self.calls.is_multiple_of(every);
        if server_error {
            self.server_errors += 1;
        }
        Verdict {
            delay: Duration::from_millis(self.faults.latency_ms),
            hang: self.faults.hang,
            server_error,
        }
    }
}

pub(crate) type FaultMap = BTreeMap<String, AccountFaultState>;

/// Layer of the Stripe-format routes: the account is the Bearer API key.
pub(crate) async fn stripe_layer(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Response {
    let account = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::to_owned);
    apply(&app, account, request, next, crate::stripe::api_error).await
}

/// Layer of the Adyen-format routes: the account is the body's
/// `merchantAccount` (every payment and modification request names it).
pub(crate) async fn adyen_layer(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Response {
    if lock(&app.account_faults).is_empty() {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_PEEK_BYTES).await else {
        return respond(crate::adyen::server_error(), &[]);
    };
    let account = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("merchantAccount")?.as_str().map(str::to_owned));
    let request = Request::from_parts(parts, Body::from(bytes));
    apply(&app, account, request, next, crate::adyen::server_error).await
}

async fn apply(
    app: &Arc<App>,
    account: Option<String>,
    request: Request,
    next: Next,
    server_error: fn() -> crate::app::Answer,
) -> Response {
    let verdict = account.and_then(|account| {
        lock(&app.account_faults)
            .get_mut(&account)
            .map(AccountFaultState::next_call)
    });
    let Some(verdict) = verdict else {
        return next.run(request).await;
    };
    if !verdict.delay.is_zero() {
        app.sleep_unless_shutdown(verdict.delay).await;
    }
    if verdict.hang {
        app.sleep_unless_shutdown(HANG).await;
        return respond(server_error(), &[]);
    }
    if verdict.server_error {
        return respond(server_error(), &[]);
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nth_call_of_the_account_fails_and_the_others_pass() {
        let mut state = AccountFaultState {
            faults: AccountFaults {
                server_error_every: 3,
                ..AccountFaults::default()
            },
            ..AccountFaultState::default()
        };
        let failed: Vec<bool> = (0..7).map(|_| state.next_call().server_error).collect();
        assert_eq!(failed, [false, false, true, false, false, true, false]);
        assert_eq!((state.calls, state.server_errors), (7, 2));
    }

    #[test]
    fn faults_default_to_none_and_unknown_fields_are_refused() {
        let none: AccountFaults = serde_json::from_str("{}").unwrap();
        assert_eq!(none, AccountFaults::default());
        let mut state = AccountFaultState::default();
        assert!(!state.next_call().server_error, "0 means never");
        assert!(serde_json::from_str::<AccountFaults>(r#"{"latency":1}"#).is_err());
    }
}
