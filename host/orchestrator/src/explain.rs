//! "What happens next to this payment?" (issue 16): the stored facts the
//! pure `sluice_core::explain_next` needs, read here, so the API and the CLI
//! share one reading. Reads only; changes nothing.

use sluice_core::{
    explain_next, ExplainPolicy, FulfillmentFacts, ItemFacts, NextExplanation, PaymentFacts,
    PendingItem, PendingProposal, PendingState, RecoveryPolicy,
};
use sluice_store::{Capture, PaymentAttempt, PaymentDetails, Proposal, Refund};

use crate::{Orchestrator, OrchestratorError};

/// A payment read at one moment and what happens next to it.
#[derive(Debug, Clone)]
pub struct Explained {
    pub details: PaymentDetails,
    pub next: NextExplanation,
    /// The host clock when the explanation was computed (unix ms).
    pub as_of_ms: i64,
}

impl Orchestrator {
    /// Explain what happens next to `payment_id` (scoped to `merchant_id` if
    /// given: another merchant's payment is `NotFound`), with the scanner's
    /// `recovery` policy and the store's fulfillment policy.
    pub async fn explain(
        &self,
        merchant_id: Option<&str>,
        payment_id: &str,
        recovery: &RecoveryPolicy,
    ) -> Result<Explained, OrchestratorError> {
        let store = self.store();
        let details = store.payment_details(merchant_id, payment_id).await?;
        // Three reads, not one transaction: each part is consistent in
        // itself, and a change between them shows up on the next read.
        let fulfillment = match store.fulfillment_snapshot(payment_id).await? {
            Some(snapshot) => Some(FulfillmentFacts {
                snapshot,
                next_check_at_ms: details.order.fulfillment.next_check_at,
                refundable_minor: details.amounts.refundable_minor(),
            }),
            None => None,
        };
        let pending_proposals = store
            .proposals_for_payment(payment_id)
            .await?
            .iter()
            .filter(|p| p.status == "proposed")
            .map(pending_proposal)
            .collect();
        let in_review = details.order.manual_review;
        let mut attempts = Vec::with_capacity(details.attempts.len());
        for attempt in &details.attempts {
            attempts.push(self.attempt_facts(attempt, in_review).await?);
        }
        let facts = PaymentFacts {
            order_id: details.order.id.clone(),
            order_state: details.order.state,
            amounts: details.amounts.to_core()?,
            manual_review: in_review,
            manual_review_reason: details.order.manual_review_reason.clone(),
            attempts,
            captures: details
                .captures
                .iter()
                .map(|c| capture_facts(c, in_review))
                .collect(),
            refunds: details
                .refunds
                .iter()
                .map(|r| refund_facts(r, in_review))
                .collect(),
            fulfillment,
            pending_proposals,
        };
        let policy = ExplainPolicy {
            recovery: *recovery,
            fulfillment: *store.fulfillment_policy(),
        };
        let as_of_ms = self.now_ms();
        let next = explain_next(&facts, &policy, as_of_ms);
        Ok(Explained {
            details,
            next,
            as_of_ms,
        })
    }

    /// An attempt as the scanner sees it; an open authorization with its
    /// connector's validity, as the scanner reads it.
    async fn attempt_facts(
        &self,
        a: &PaymentAttempt,
        in_review: bool,
    ) -> Result<ItemFacts, OrchestratorError> {
        let validity = if a.state == sluice_core::AttemptState::Authorized {
            self.connector_recovery(&a.connector_account_id)
                .await?
                .authorization_validity_ms()
        } else {
            None
        };
        let pending = PendingItem {
            last_attempt_at_ms: a.last_psp_call_at,
            retry_count: retries(a.retry_count),
            expires_at_ms: a.expires_at,
            in_manual_review: in_review,
            authorized_at_ms: a.authorized_at,
            authorization_validity_ms: validity,
            void_requested_at_ms: a.void_requested_at,
            ..PendingItem::new(PendingState::Attempt(a.state), &a.reference, a.created_at)
        };
        Ok(ItemFacts {
            id: a.id.clone(),
            pending,
            next_retry_time: a.next_retry_time,
            amount_minor: a.amount.amount_minor,
        })
    }
}

fn retries(count: i64) -> u32 {
    u32::try_from(count.max(0)).unwrap_or(u32::MAX)
}

fn capture_facts(c: &Capture, in_review: bool) -> ItemFacts {
    ItemFacts {
        id: c.id.clone(),
        pending: PendingItem {
            last_attempt_at_ms: c.last_psp_call_at,
            retry_count: retries(c.retry_count),
            in_manual_review: in_review,
            ..PendingItem::new(PendingState::Capture(c.state), &c.reference, c.created_at)
        },
        next_retry_time: c.next_retry_time,
        amount_minor: c.amount.amount_minor,
    }
}

fn refund_facts(r: &Refund, in_review: bool) -> ItemFacts {
    ItemFacts {
        id: r.id.clone(),
        pending: PendingItem {
            last_attempt_at_ms: r.last_psp_call_at,
            retry_count: retries(r.retry_count),
            in_manual_review: in_review,
            ..PendingItem::new(PendingState::Refund(r.state), &r.reference, r.created_at)
        },
        next_retry_time: r.next_retry_time,
        amount_minor: r.amount.amount_minor,
    }
}

fn pending_proposal(p: &Proposal) -> PendingProposal {
    PendingProposal {
        id: p.id.clone(),
        outcome: p.outcome.clone(),
        target_type: p.target_type.clone(),
        target_id: p.target_id.clone(),
        reason_code: p.reason_code.clone(),
        evidence_note: p.evidence_note.clone(),
        amount_minor: p.amount_minor,
        proposed_by: p.proposed_by.clone(),
        proposed_at_ms: p.proposed_at,
    }
}
