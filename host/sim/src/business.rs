//! The merchants' businesses behind pull-mode fulfillment: the orchestrator's
//! `FulfillmentTransport`, answering in process. A business grants a goal
//! (`fulfillment.execute`) at most once per business key, only before the
//! deadline it is passed, and credits the attempt reference it was called
//! with (its idempotency key); `fulfillment.query` reports what it granted.
//! Its memory is the merchant's: it outlives every gateway incarnation.
//!
//! While faults are on, a call may fail (500), answer garbage, or hang past
//! the call's budget (virtual time moves by the budget); an execute may also
//! grant the goal and then lose its answer. It never lies: once granted, a
//! goal is reported, so the gateway may only compensate what it never got.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_core::NoAnswer;
use sluice_orchestrator::{FulfillmentRequest, FulfillmentResponse, FulfillmentTransport};
use sluice_store::{Clock, ManualClock};

use crate::net::NetMode;
use crate::rng::SimRng;
use crate::trace::Trace;

/// The secret a business checks its calls against (one per world: the
/// businesses share it, each verifies only its own calls' signatures).
pub const SECRET: &str = "whsec_sim_business";

/// What every business of the world remembers.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Goals granted: business key → the attempt reference credited.
    pub granted: BTreeMap<String, String>,
    /// Calls refused because they were not what the contract promises
    /// (unsigned, or the idempotency key is not the attempt reference).
    pub refused: Vec<String>,
}

/// The transport every gateway incarnation is given.
#[derive(Debug, Clone)]
pub struct SimBusiness {
    pub ledger: Arc<Mutex<Ledger>>,
    pub rng: SimRng,
    pub clock: ManualClock,
    pub trace: Trace,
    pub mode: Arc<Mutex<NetMode>>,
}

/// What a faulty call does instead of answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Error,
    Garbage,
    Hang,
    /// Execute: grant, then lose the answer.
    LoseAnswer,
}

impl SimBusiness {
    /// The businesses of one world, with nothing granted yet.
    pub fn new(rng: SimRng, clock: ManualClock, trace: Trace, mode: Arc<Mutex<NetMode>>) -> Self {
        SimBusiness {
            ledger: Arc::default(),
            rng,
            clock,
            trace,
            mode,
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // The ledger is plain data: a poisoned lock still holds it whole.
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fault(&self) -> Fault {
        let per_mille = self
            .mode
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fault_per_mille;
        if !self.rng.chance(per_mille) {
            return Fault::None;
        }
        match self.rng.below(4) {
            0 => Fault::Error,
            1 => Fault::Garbage,
            2 => Fault::Hang,
            _ => Fault::LoseAnswer,
        }
    }

    /// Refuses a call that breaks the contract, and says why.
    fn refusal(&self, request: &FulfillmentRequest, body: &serde_json::Value) -> Option<String> {
        let now = self.clock.now_ms().div_euclid(1000);
        if sluice_delivery::signature::verify(SECRET, &request.signature, &request.body, now, 300)
            .is_err()
        {
            return Some("a pull call whose Sluice-Signature does not verify".into());
        }
        let named = body.get("attempt_reference").and_then(|r| r.as_str());
        (named != Some(request.idempotency_key.as_str()))
            .then(|| "a pull call whose Idempotency-Key is not its attempt reference".into())
    }

    /// The business's answer to one well-formed call.
    fn answer(&self, body: &serde_json::Value, grant: bool) -> serde_json::Value {
        let text = |key: &str| body.get(key).and_then(|v| v.as_str()).unwrap_or_default();
        let (kind, biz_key, reference) = (text("type"), text("biz_key"), text("attempt_reference"));
        let deadline = body.get("deadline").and_then(|v| v.as_i64()).unwrap_or(0);
        let now = self.clock.now_ms();
        let mut ledger = self.ledger();
        let granted_before = ledger.granted.get(biz_key).cloned();
        let line = match (kind, &granted_before) {
            ("fulfillment.execute", None) if now < deadline && grant => {
                ledger
                    .granted
                    .insert(biz_key.to_owned(), reference.to_owned());
                "granted"
            }
            ("fulfillment.execute", None) if now < deadline => "could not deliver",
            ("fulfillment.execute", None) => "refused: past the deadline",
            ("fulfillment.execute", Some(r)) if r == reference => "already granted",
            ("fulfillment.execute", Some(_)) => "already granted to another payment",
            (_, Some(r)) if r == reference => "reports fulfilled",
            (_, Some(_)) => "reports fulfilled by another payment",
            (_, None) => "reports not fulfilled",
        };
        self.trace
            .line(format!("business {biz_key} {kind} -> {line}"));
        match ledger.granted.get(biz_key) {
            Some(r) => serde_json::json!({"status": "fulfilled", "attributed_to": r}),
            None => serde_json::json!({"status": "not_fulfilled"}),
        }
    }
}

#[async_trait::async_trait]
impl FulfillmentTransport for SimBusiness {
    async fn post(
        &self,
        request: &FulfillmentRequest,
        budget: Duration,
    ) -> Result<FulfillmentResponse, NoAnswer> {
        let body: serde_json::Value =
            serde_json::from_slice(&request.body).unwrap_or(serde_json::Value::Null);
        if let Some(why) = self.refusal(request, &body) {
            self.trace.line(format!("business refused {why}"));
            self.ledger().refused.push(why);
            return Ok(FulfillmentResponse {
                status: 401,
                body: Vec::new(),
            });
        }
        let fault = self.fault();
        let ok = |body: Vec<u8>| Ok(FulfillmentResponse { status: 200, body });
        match fault {
            Fault::Error => {
                self.trace.line("business answers 500");
                Ok(FulfillmentResponse {
                    status: 500,
                    body: Vec::new(),
                })
            }
            Fault::Garbage => {
                self.trace.line("business answers garbage");
                ok(b"{\"status\": \"maybe\"".to_vec())
            }
            Fault::Hang => {
                let ms = i64::try_from(budget.as_millis()).unwrap_or(i64::MAX);
                self.clock.advance(ms);
                self.trace
                    .line(format!("business hangs past the budget (+{ms} ms)"));
                Err(NoAnswer::Timeout)
            }
            Fault::None | Fault::LoseAnswer => {
                let grant = self.rng.chance(750);
                let answer = self.answer(&body, grant);
                if fault == Fault::LoseAnswer {
                    self.trace.line("business answer lost");
                    return Err(NoAnswer::Error);
                }
                ok(serde_json::to_vec(&answer).unwrap_or_default())
            }
        }
    }
}
