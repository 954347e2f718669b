//! Webhooks on the simulated network: the PSP's genuine ones (late,
//! duplicated, reordered, retried until acknowledged, occasionally given up
//! on) and the hostile tenant's forgeries, correctly signed with its own
//! secret on its own route, naming another tenant's references.

use serde_json::{json, Value};
use sluice_adapter_runtime::{Header, WebhookRequest};
use sluice_orchestrator::WebhookOutcome;
use sluice_sandbox_psp::{
    adyen_hmac_signature, stripe_signature_header, AdyenSignedFields, CapturedWebhook, Format,
    Payment,
};

use crate::check::Snapshot;
use crate::net::NetMode;
use crate::ops::error_label;
use crate::world::{Account, Psp, World, HONEST};
use crate::SimError;

/// What the network does with one queued webhook this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Deliver,
    /// Delivered, and the PSP sends it again later anyway.
    Duplicate,
    /// Not this time (late; the PSP retries).
    Later,
    /// The PSP gave up on it: only a query can find what it said.
    GiveUp,
}

const FATES: &[(u64, Fate)] = &[
    (70, Fate::Deliver),
    (10, Fate::Duplicate),
    (18, Fate::Later),
    (2, Fate::GiveUp),
];

impl World {
    /// Delivers queued webhooks in a random order; `all` delivers every one
    /// exactly once, in order (the convergence phase).
    pub async fn deliver_webhooks(&mut self, all: bool) -> Result<(), SimError> {
        self.collect_webhooks();
        let queued = std::mem::take(&mut self.in_flight);
        let mut order: Vec<usize> = (0..queued.len()).collect();
        if !all {
            for i in (1..order.len()).rev() {
                let j = self.rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        let mut again = Vec::new();
        for index in order {
            let webhook = queued[index].clone();
            let fate = if all {
                Fate::Deliver
            } else {
                self.rng.weighted(FATES).unwrap_or(Fate::Later)
            };
            let acknowledged = match fate {
                Fate::Later => false,
                Fate::GiveUp => {
                    self.trace.line("webhook given up by the PSP");
                    true
                }
                Fate::Deliver | Fate::Duplicate => match self.deliver(&webhook).await? {
                    Some(acked) => acked && fate == Fate::Deliver,
                    // Killed mid-delivery: nothing was acknowledged.
                    None => false,
                },
            };
            if !acknowledged {
                again.push(webhook);
            }
        }
        again.append(&mut self.in_flight);
        self.in_flight = again;
        Ok(())
    }

    /// One delivery attempt of a genuine webhook; Some(acknowledged).
    async fn deliver(&mut self, webhook: &CapturedWebhook) -> Result<Option<bool>, SimError> {
        let Some(account) = self.account(&webhook.connector).cloned() else {
            return Err(SimError::Setup(format!("no account {}", webhook.connector)));
        };
        let kinds: Vec<&str> = webhook.events.iter().map(|e| e.kind.as_str()).collect();
        let label = format!("webhook {} {:?}", self.account_label(&account.id), kinds);
        let request = self.resigned(webhook, &account);
        self.bodies
            .insert(body_digest(&request.body), webhook.events.len());
        let Some(outcome) = self.ingest(&account, request).await? else {
            self.trace.line(format!("{label} -> killed"));
            return Ok(None);
        };
        let acked = matches!(outcome, WebhookOutcome::Accepted { .. });
        let line = outcome_line(&outcome);
        self.trace.line(format!("{label} -> {line}"));
        if !acked {
            self.violation(format!(
                "a genuine, correctly signed webhook was refused: {line}"
            ));
        }
        Ok(Some(acked))
    }

    /// Stripe signs every delivery anew with the time it is sent.
    fn resigned(&self, webhook: &CapturedWebhook, account: &Account) -> WebhookRequest {
        let mut headers: Vec<Header> = webhook
            .headers
            .iter()
            .filter(|(name, _)| name != "stripe-signature")
            .map(|(name, value)| Header {
                name: name.clone(),
                value: value.clone(),
            })
            .collect();
        if account.psp == Psp::Stripe {
            headers.push(Header {
                name: "stripe-signature".into(),
                value: stripe_signature_header(
                    &account.webhook_secret,
                    self.now_ms().div_euclid(1000),
                    webhook.body.as_bytes(),
                ),
            });
        }
        WebhookRequest {
            method: "POST".into(),
            path: format!("/webhooks/{}/{}", account.psp.adapter(), account.id),
            headers,
            body: webhook.body.as_bytes().to_vec(),
        }
    }

    async fn ingest(
        &mut self,
        account: &Account,
        request: WebhookRequest,
    ) -> Result<Option<WebhookOutcome>, SimError> {
        self.ingests += 1;
        let orch = self.gw.orch.clone();
        let adapter = account.psp.adapter();
        let outcome = self
            .guarded(orch.ingest_webhook(adapter, &account.id, request))
            .await?;
        match outcome {
            None => Ok(None),
            Some(Ok(outcome)) => Ok(Some(outcome)),
            Some(Err(error)) => {
                self.trace
                    .line(format!("webhook ingest failed: {}", error_label(&error)));
                Ok(Some(WebhookOutcome::NotFound))
            }
        }
    }

    /// The hostile tenant forges an event about an honest tenant's payment
    /// and posts it, correctly signed with its own secret, to its own route.
    /// Nothing of the honest tenants may change.
    pub async fn forge(&mut self) -> Result<(), SimError> {
        let victims: Vec<Payment> = self
            .sandbox
            .payments()
            .into_iter()
            .filter(|p| self.is_honest_key(&p.api_key))
            .collect();
        let Some(victim) = self.rng.pick(&victims).cloned() else {
            return Ok(());
        };
        let mode = self.mode();
        self.set_mode(NetMode {
            fault_per_mille: 0,
            crashes: false,
        });
        let result = self.forge_against(&victim).await;
        self.set_mode(mode);
        result
    }

    async fn forge_against(&mut self, victim: &Payment) -> Result<(), SimError> {
        self.drain_inbox().await?;
        let before = Snapshot::take(self).await?;
        let hostile = self.tenants[HONEST].clone();
        let psp = match victim.format {
            Format::Stripe => Psp::Stripe,
            Format::Adyen => Psp::Adyen,
        };
        let Some(account) = hostile.accounts.iter().find(|a| a.psp == psp).cloned() else {
            return Ok(());
        };
        let (kind, body) = match psp {
            Psp::Stripe => self.forged_stripe(victim),
            Psp::Adyen => self.forged_adyen(victim, &account),
        };
        let mut headers = vec![Header {
            name: "content-type".into(),
            value: "application/json".into(),
        }];
        if psp == Psp::Stripe {
            headers.push(Header {
                name: "stripe-signature".into(),
                value: stripe_signature_header(
                    &account.webhook_secret,
                    self.now_ms().div_euclid(1000),
                    body.as_bytes(),
                ),
            });
        }
        let request = WebhookRequest {
            method: "POST".into(),
            path: format!("/webhooks/{}/{}", psp.adapter(), account.id),
            headers,
            body: body.into_bytes(),
        };
        self.bodies.insert(body_digest(&request.body), 1);
        let outcome = self.ingest(&account, request).await?;
        let line = outcome.as_ref().map(outcome_line).unwrap_or_default();
        self.trace
            .line(format!("step forge M-{} {kind} -> {line}", psp.adapter()));
        self.drain_inbox().await?;
        let after = Snapshot::take(self).await?;
        for change in before.changes(&after, self) {
            self.violation(format!(
                "a forged {kind} from the hostile tenant changed another tenant's money: {change}"
            ));
        }
        Ok(())
    }

    /// Processes the inbox until nothing is due.
    pub async fn drain_inbox(&mut self) -> Result<(), SimError> {
        for _ in 0..50 {
            let orch = self.gw.orch.clone();
            match self.guarded(orch.process_inbox_once()).await? {
                Some(Ok(round)) if round.claimed > 0 => continue,
                Some(Err(error)) => {
                    self.trace
                        .line(format!("inbox failed: {}", error_label(&error)));
                    return Ok(());
                }
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    fn is_honest_key(&self, api_key: &str) -> bool {
        self.tenants[..HONEST]
            .iter()
            .flat_map(|t| &t.accounts)
            .any(|a| a.api_key == api_key)
    }

    fn forged_stripe(&self, victim: &Payment) -> (&'static str, String) {
        let kinds = [
            "payment_intent.succeeded",
            "payment_intent.payment_failed",
            "payment_intent.canceled",
            "payment_intent.amount_capturable_updated",
        ];
        let kind = *self.rng.pick(&kinds).unwrap_or(&kinds[0]);
        let status = match kind {
            "payment_intent.succeeded" => "succeeded",
            "payment_intent.payment_failed" => "requires_payment_method",
            "payment_intent.canceled" => "canceled",
            _ => "requires_capture",
        };
        // The attacker may know the attempt reference too: it is no secret.
        let metadata = if self.rng.chance(500) {
            json!({ "sluice_attempt_reference": victim.reference })
        } else {
            json!({})
        };
        let event = json!({
            "id": format!("evt_forged_{}", self.rng.next_u64()),
            "object": "event",
            "type": kind,
            "created": self.now_ms().div_euclid(1000),
            "data": { "object": {
                "id": victim.id,
                "object": "payment_intent",
                "amount": victim.amount,
                "amount_received": if status == "succeeded" { victim.amount } else { 0 },
                "amount_capturable": if status == "requires_capture" { victim.amount } else { 0 },
                "currency": victim.currency.to_lowercase(),
                "status": status,
                "metadata": metadata,
                "last_payment_error": if status == "requires_payment_method" {
                    json!({ "code": "card_declined", "decline_code": "generic_decline" })
                } else { Value::Null },
            }},
            "livemode": false,
        });
        (kind, event.to_string())
    }

    fn forged_adyen(&self, victim: &Payment, account: &Account) -> (&'static str, String) {
        let codes = ["AUTHORISATION", "CANCELLATION", "REFUND", "CAPTURE"];
        let code = *self.rng.pick(&codes).unwrap_or(&codes[0]);
        let success = self.rng.chance(600);
        // Either the hostile account's own code (the adapter accepts it) or
        // the victim's (the adapter must refuse a foreign merchant account).
        let merchant_account = if self.rng.chance(700) {
            account.merchant_account.clone()
        } else {
            victim.merchant_account.clone().unwrap_or_default()
        };
        let reference = if self.rng.chance(500) {
            victim.reference.clone()
        } else {
            format!("forged-{}", self.rng.next_u64())
        };
        let (psp_reference, original) = if code == "AUTHORISATION" {
            (victim.id.clone(), String::new())
        } else {
            (
                format!("FORGED{}", self.rng.below(1_000_000)),
                victim.id.clone(),
            )
        };
        let fields = AdyenSignedFields {
            psp_reference: &psp_reference,
            original_reference: &original,
            merchant_account_code: &merchant_account,
            merchant_reference: &reference,
            value: victim.amount,
            currency: &victim.currency,
            event_code: code,
            success,
        };
        let signature = adyen_hmac_signature(&account.webhook_secret, &fields).unwrap_or_default();
        let mut item = json!({
            "additionalData": { "hmacSignature": signature },
            "amount": { "currency": victim.currency, "value": victim.amount },
            "eventCode": code,
            "eventDate": "2026-01-01T00:00:00+00:00",
            "merchantAccountCode": merchant_account,
            "merchantReference": reference,
            "paymentMethod": "visa",
            "pspReference": psp_reference,
            "success": if success { "true" } else { "false" },
            "reason": "",
        });
        if !original.is_empty() {
            item["originalReference"] = json!(original);
        }
        let body = json!({ "live": "false", "notificationItems": [ { "NotificationRequestItem": item } ] });
        (code, body.to_string())
    }
}

/// The inbox's `payload_digest` of a body.
fn body_digest(body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(body))
}

fn outcome_line(outcome: &WebhookOutcome) -> String {
    match outcome {
        WebhookOutcome::Accepted { receipts, .. } => format!(
            "accepted {} ({} duplicate)",
            receipts.len(),
            receipts.iter().filter(|r| r.duplicate).count()
        ),
        WebhookOutcome::Rejected { kind, .. } => format!("rejected {}", kind.as_str()),
        WebhookOutcome::NotFound => "not_found".into(),
    }
}
