//! Guaranteed fulfillment or refund (issue 7): the effects of fulfillment
//! decisions, performed after the store's fulfillment door committed them.
//!
//! - [`Orchestrator::confirm_fulfillment`]: the merchant's push confirmation.
//! - [`Orchestrator::check_fulfillment`]: a wake-up (the scanner, at a
//!   scheduled check or the deadline). In pull mode it calls the merchant's
//!   business action (idempotent on the attempt reference) and reads the
//!   business fact; the answer goes back through the door as a `Fact`.
//! - A compensation refund the door created is sent through the normal
//!   refund path (`advance` on the refund: SUBMITTED before the call, UNKNOWN
//!   and queries with the same reference); its definitive outcome reaches the
//!   fulfillment inside the payment door's own transaction.
//!
//! Pull calls are signed exactly like outgoing merchant webhooks
//! (`Sluice-Signature`, `sluice_delivery::signature`), have their own budget
//! (the endpoint's `timeout_ms`, capped by the policy's `action_timeout_ms`,
//! which is what the deadline's settling assumes), and a timeout or any
//! error is `NoAnswer`, never "not fulfilled".

use std::time::Duration;

use sluice_core::{
    BusinessFact, FactReading, FulfillmentDecision, FulfillmentEffect, FulfillmentInput, NoAnswer,
};
use sluice_delivery::signature::{sign, SIGNATURE_HEADER};
use sluice_store::{FulfillmentApplied, FulfillmentEndpoint, Provenance};

use crate::{Advanced, Orchestrator, OrchestratorError, Target, Trigger};

/// The header naming the attempt reference on pull calls: the business's
/// idempotency key (seed 000's `resume_order_no`).
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// Everything one fulfillment step did.
#[derive(Debug, Clone)]
pub struct FulfillmentStep {
    /// The decision on the input that started the step.
    pub first: FulfillmentApplied,
    /// Pull: the decision on the business fact read afterwards.
    pub fact: Option<FulfillmentApplied>,
    /// The compensation refund sent, if a decision started one.
    pub refund: Option<Advanced>,
}

impl FulfillmentStep {
    /// The decision the caller reports (the fact's, when one was read).
    pub fn last(&self) -> &FulfillmentApplied {
        self.fact.as_ref().unwrap_or(&self.first)
    }

    /// Whether any decision raised the contradictory-fact alert.
    pub fn alert(&self) -> bool {
        self.first.alert || self.fact.as_ref().is_some_and(|f| f.alert)
    }
}

impl Orchestrator {
    /// The merchant confirms the goal reached, attributed to an attempt
    /// reference. Idempotent; refused (with what happened to the money) once
    /// a compensation refund started.
    pub async fn confirm_fulfillment(
        &self,
        merchant_id: &str,
        payment_id: &str,
        attributed_to: &str,
    ) -> Result<FulfillmentStep, OrchestratorError> {
        // Scope: another merchant's payment does not exist for this one.
        self.store()
            .get_payment(Some(merchant_id), payment_id)
            .await?;
        let applied = self
            .store()
            .apply_fulfillment(
                payment_id,
                &FulfillmentInput::PushConfirmation {
                    attributed_to: attributed_to.to_owned(),
                },
                &Provenance::actor(&format!("merchant:{merchant_id}")),
            )
            .await?;
        let step = self.follow(applied, Trigger::Api).await;
        if let FulfillmentDecision::Reject(refusal) = &step.first.decision {
            return Err(OrchestratorError::FulfillmentRefused(refusal.clone()));
        }
        Ok(step)
    }

    /// Wake a fulfillment up (`CheckDue`) and carry out what it decides.
    pub async fn check_fulfillment(
        &self,
        payment_id: &str,
        trigger: Trigger,
    ) -> Result<FulfillmentStep, OrchestratorError> {
        let applied = self
            .store()
            .apply_fulfillment(
                payment_id,
                &FulfillmentInput::CheckDue,
                &Provenance::actor(trigger.actor()),
            )
            .await?;
        let mut step = self.follow(applied, trigger).await;
        if let Some(reading) = self.pull_effects(&step.first, trigger).await? {
            let fact = self
                .store()
                .apply_fulfillment(
                    payment_id,
                    &FulfillmentInput::Fact(reading),
                    &Provenance::actor(trigger.actor()),
                )
                .await?;
            let followed = self.follow(fact, trigger).await;
            step.fact = Some(followed.first);
            step.refund = step.refund.or(followed.refund);
        }
        Ok(step)
    }

    /// Send the compensation refund a decision created. A failure here is
    /// logged: the refund is due in the recovery scanner's set already.
    async fn follow(&self, applied: FulfillmentApplied, trigger: Trigger) -> FulfillmentStep {
        let mut refund = None;
        if let Some(created) = &applied.compensation_refund {
            match self
                .advance(Target::Refund(created.id.clone()), trigger)
                .await
            {
                Ok(advanced) => refund = Some(advanced),
                Err(error) => tracing::warn!(
                    payment_id = %applied.payment_id, refund_id = %created.id, error = %error,
                    "compensation refund not sent yet; the recovery scanner will send it"
                ),
            }
        }
        FulfillmentStep {
            first: applied,
            fact: None,
            refund,
        }
    }

    /// Pull mode: call the business action and/or read the fact, as the
    /// decision asks. Returns the reading to decide on, if one was asked for.
    async fn pull_effects(
        &self,
        applied: &FulfillmentApplied,
        trigger: Trigger,
    ) -> Result<Option<FactReading>, OrchestratorError> {
        let effects = applied.effects();
        let wants_call = effects.iter().find_map(|e| match e {
            FulfillmentEffect::CallBusinessAction {
                attempt_reference,
                deadline_ms,
            } => Some((attempt_reference.clone(), *deadline_ms)),
            _ => None,
        });
        let wants_read = effects.iter().find_map(|e| match e {
            FulfillmentEffect::QueryBusinessFact { attempt_reference }
            | FulfillmentEffect::ReadFactOnceMore { attempt_reference } => {
                Some(attempt_reference.clone())
            }
            _ => None,
        });
        if wants_call.is_none() && wants_read.is_none() {
            return Ok(None);
        }
        let endpoint = self
            .store()
            .fulfillment_endpoint(&applied.merchant_id)
            .await?;
        let Some(endpoint) = endpoint else {
            tracing::warn!(payment_id = %applied.payment_id, %trigger,
                "pull-mode fulfillment without a configured endpoint: no answer");
            return Ok(wants_read.map(|_| FactReading {
                fact: BusinessFact::NoAnswer(NoAnswer::Error),
                read_started_at_ms: self.now_ms(),
            }));
        };
        let snapshot = &applied.snapshot;
        let base = serde_json::json!({
            "payment_id": applied.payment_id,
            "biz_key": snapshot.biz_key,
            "deadline": snapshot.deadline_ms,
        });
        if let Some((attempt_reference, deadline_ms)) = wants_call {
            // The core only asks for a call before the deadline; the host's
            // clock is checked again right before sending.
            if self.now_ms() < deadline_ms {
                let mut body = base.clone();
                body["type"] = "fulfillment.execute".into();
                body["attempt_reference"] = attempt_reference.clone().into();
                let outcome = self.pull_call(&endpoint, &attempt_reference, &body).await;
                tracing::info!(payment_id = %applied.payment_id, attempt_reference = %attempt_reference,
                    ok = outcome.is_ok(), "business action called");
            }
        }
        let Some(attempt_reference) = wants_read else {
            return Ok(None);
        };
        let mut body = base;
        body["type"] = "fulfillment.query".into();
        body["attempt_reference"] = attempt_reference.clone().into();
        let read_started_at_ms = self.now_ms();
        let fact = match self.pull_call(&endpoint, &attempt_reference, &body).await {
            Ok(answer) => parse_fact(&answer),
            Err(no_answer) => BusinessFact::NoAnswer(no_answer),
        };
        tracing::info!(payment_id = %applied.payment_id, attempt_reference = %attempt_reference,
            fact = ?fact, "business fact read");
        Ok(Some(FactReading {
            fact,
            read_started_at_ms,
        }))
    }

    /// One signed call to the merchant's fulfillment endpoint, within its
    /// own budget, through the configured [`FulfillmentTransport`]. Any
    /// failure is `NoAnswer`.
    async fn pull_call(
        &self,
        endpoint: &FulfillmentEndpoint,
        attempt_reference: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, NoAnswer> {
        let policy_cap = self.store().fulfillment_policy().action_timeout_ms;
        let budget_ms = endpoint.timeout_ms.min(policy_cap).max(1);
        let budget = Duration::from_millis(u64::try_from(budget_ms).unwrap_or(1));
        let raw = serde_json::to_vec(body).map_err(|_| NoAnswer::Error)?;
        let timestamp = self.now_ms().div_euclid(1000);
        let request = FulfillmentRequest {
            url: endpoint.url.clone(),
            signature: sign(&endpoint.secret, timestamp, &raw),
            idempotency_key: attempt_reference.to_owned(),
            body: raw,
        };
        let transport = &self.inner.config.fulfillment_transport;
        let response = match tokio::time::timeout(budget, transport.post(&request, budget)).await {
            Ok(result) => result?,
            Err(_) => return Err(NoAnswer::Timeout),
        };
        if !(200..300).contains(&response.status) || response.body.len() > MAX_ANSWER_BYTES {
            return Err(NoAnswer::Error);
        }
        serde_json::from_slice::<serde_json::Value>(&response.body).map_err(|_| NoAnswer::Error)
    }
}

/// The largest business answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// One signed pull-mode call, ready to send: the transport adds no meaning,
/// it only moves these bytes with these headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FulfillmentRequest {
    pub url: String,
    /// The `Sluice-Signature` header, over the timestamp and `body`.
    pub signature: String,
    /// The `Idempotency-Key` header: the attempt reference.
    pub idempotency_key: String,
    /// JSON (`Content-Type: application/json`).
    pub body: Vec<u8>,
}

/// What the business answered: its HTTP status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FulfillmentResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Performs pull-mode calls to a merchant's business (the seam a
/// simulation replaces; production posts over HTTP). No answer within
/// `budget` is `NoAnswer::Timeout`, any other failure `NoAnswer::Error`;
/// the caller also bounds the whole call by `budget`.
#[async_trait::async_trait]
pub trait FulfillmentTransport: Send + Sync + std::fmt::Debug {
    async fn post(
        &self,
        request: &FulfillmentRequest,
        budget: Duration,
    ) -> Result<FulfillmentResponse, NoAnswer>;
}

/// The production transport: a signed HTTPS POST with reqwest.
#[derive(Debug, Clone, Default)]
pub struct HttpFulfillmentTransport {
    client: reqwest::Client,
}

#[async_trait::async_trait]
impl FulfillmentTransport for HttpFulfillmentTransport {
    async fn post(
        &self,
        request: &FulfillmentRequest,
        budget: Duration,
    ) -> Result<FulfillmentResponse, NoAnswer> {
        let response = self
            .client
            .post(&request.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, &request.signature)
            .header(IDEMPOTENCY_HEADER, &request.idempotency_key)
            .timeout(budget)
            .body(request.body.clone())
            .send()
            .await
            .map_err(classify)?;
        let status = response.status().as_u16();
        if !response.status().is_success() {
            return Ok(FulfillmentResponse {
                status,
                body: Vec::new(),
            });
        }
        let body = response.bytes().await.map_err(classify)?;
        Ok(FulfillmentResponse {
            status,
            body: body.to_vec(),
        })
    }
}

fn classify(error: reqwest::Error) -> NoAnswer {
    if error.is_timeout() {
        NoAnswer::Timeout
    } else {
        NoAnswer::Error
    }
}

/// The business's answer: `{"status": "fulfilled", "attributed_to": "..."}`
/// or `{"status": "not_fulfilled"}`. Anything else is no answer.
fn parse_fact(answer: &serde_json::Value) -> BusinessFact {
    match answer.get("status").and_then(|s| s.as_str()) {
        Some("fulfilled") => BusinessFact::Fulfilled {
            attributed_to: answer
                .get("attributed_to")
                .and_then(|a| a.as_str())
                .filter(|a| !a.is_empty())
                .map(str::to_owned),
        },
        Some("not_fulfilled") => BusinessFact::NotFulfilled,
        _ => BusinessFact::NoAnswer(NoAnswer::Error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_explicit_answer_is_a_business_fact() {
        let fulfilled = serde_json::json!({"status": "fulfilled", "attributed_to": "att_1"});
        assert_eq!(
            parse_fact(&fulfilled),
            BusinessFact::Fulfilled {
                attributed_to: Some("att_1".into())
            }
        );
        let unattributed = serde_json::json!({"status": "fulfilled", "attributed_to": ""});
        assert_eq!(
            parse_fact(&unattributed),
            BusinessFact::Fulfilled {
                attributed_to: None
            }
        );
        assert_eq!(
            parse_fact(&serde_json::json!({"status": "not_fulfilled"})),
            BusinessFact::NotFulfilled
        );
        for garbage in [
            serde_json::json!({}),
            serde_json::json!({"status": "maybe"}),
            serde_json::json!({"fulfilled": false}),
            serde_json::json!("not_fulfilled"),
        ] {
            assert_eq!(
                parse_fact(&garbage),
                BusinessFact::NoAnswer(NoAnswer::Error),
                "{garbage}"
            );
        }
    }
}
