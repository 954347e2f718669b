//! What happens next to a payment (issue 16; seed 001's closing test: "whether
//! a query is queued, whether money is reserved, and what the next recovery
//! step is"), computed from stored facts alone. Pure: the caller reads the
//! facts, passes the policies the workers run with and `now_ms`.
//!
//! Nothing here is a rule of its own. Every open attempt, capture and refund
//! is put through [`decide_recovery`] at the moment the scanner will next look
//! at it, and an open fulfillment through [`decide_fulfillment`] at its next
//! check and at the instant its deadline settles; this module only names
//! who acts (the mover), when, and with which reference. So the explanation
//! cannot drift from what the scanner and the fulfillment door will do.
//!
//! | open aggregate                                      | mover      |
//! |-----------------------------------------------------|------------|
//! | attempt CREATED / SUBMITTED / UNKNOWN, capture or refund CREATED / UNKNOWN | `scanner` (a query with the original reference) |
//! | attempt, capture or refund PROCESSING; attempt REQUIRES_ACTION | `webhook` (the PSP reports it; the scanner queries at the due time if it does not) |
//! | attempt AUTHORIZED within its validity             | `merchant` (capture or void), with the expiry as deadline |
//! | REQUIRES_ACTION or AUTHORIZED past its validity    | `deadline` (the scanner expires it)  |
//! | anything open past `max_unknown_age_ms`, not flagged | `scanner` (it raises the review flag; queries go on) |
//! | order CREATED, or PROCESSING with no open attempt   | `merchant` (confirm)         |
//! | fulfillment awaiting, push mode                     | `deadline` (the merchant's confirmation must land first) |
//! | fulfillment awaiting, pull mode                     | `scanner` (the business check) |
//! | fulfillment compensating                            | the compensation refund's mover |
//! | payment or fulfillment in manual review             | `operator` |
//! | nothing open                                        | `nothing`  |

use serde::{Deserialize, Serialize};

use crate::amounts::Amounts;
use crate::fulfillment::{
    decide_fulfillment, FulfillmentInput, FulfillmentMode, FulfillmentPolicy, FulfillmentSnapshot,
    FulfillmentState,
};
use crate::recovery::{
    authorization_expires_at, decide_recovery, PendingItem, PendingState, RecoveryAction,
    RecoveryPolicy,
};
use crate::state::{AttemptState, CaptureState, OrderState, RefundState};

/// Who moves an aggregate next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mover {
    /// The recovery scanner: a query with the original reference, an
    /// escalation, or a business check.
    Scanner,
    /// The PSP's webhook (the scanner queries at the due time if none comes).
    Webhook,
    /// A deadline: what happens at it is said in the step.
    Deadline,
    /// Operators: a proposal and a second operator's approval.
    Operator,
    /// The merchant: confirm, capture or void, confirm a fulfillment.
    Merchant,
    /// Nothing is left to happen.
    Nothing,
}

impl Mover {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mover::Scanner => "scanner",
            Mover::Webhook => "webhook",
            Mover::Deadline => "deadline",
            Mover::Operator => "operator",
            Mover::Merchant => "merchant",
            Mover::Nothing => "nothing",
        }
    }
}

/// The aggregates a step can be about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepAggregate {
    Order,
    Attempt,
    Capture,
    Refund,
    Fulfillment,
}

impl StepAggregate {
    pub fn as_str(&self) -> &'static str {
        match self {
            StepAggregate::Order => "order",
            StepAggregate::Attempt => "attempt",
            StepAggregate::Capture => "capture",
            StepAggregate::Refund => "refund",
            StepAggregate::Fulfillment => "fulfillment",
        }
    }
}

/// One open attempt, capture or refund as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFacts {
    pub id: String,
    /// The scanner's view of the row (state, reference, retry count, ...),
    /// `in_manual_review` set from the order.
    pub pending: PendingItem,
    /// The row's stored next look; None: outside the pending set.
    pub next_retry_time: Option<i64>,
    pub amount_minor: i64,
}

/// A review proposal still waiting for its second operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingProposal {
    pub id: String,
    pub outcome: String,
    pub target_type: String,
    pub target_id: String,
    pub reason_code: String,
    pub evidence_note: String,
    pub amount_minor: Option<i64>,
    pub proposed_by: String,
    pub proposed_at_ms: i64,
}

/// Everything the explanation is computed from, read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentFacts {
    pub order_id: String,
    pub order_state: OrderState,
    pub amounts: Amounts,
    pub manual_review: bool,
    pub manual_review_reason: Option<String>,
    pub attempts: Vec<ItemFacts>,
    pub captures: Vec<ItemFacts>,
    pub refunds: Vec<ItemFacts>,
    pub fulfillment: Option<FulfillmentFacts>,
    pub pending_proposals: Vec<PendingProposal>,
}

/// A payment's fulfillment as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FulfillmentFacts {
    pub snapshot: FulfillmentSnapshot,
    pub next_check_at_ms: Option<i64>,
    /// What a compensation could still return (the payment's refundable amount).
    pub refundable_minor: i64,
}

/// The policies the workers run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExplainPolicy {
    pub recovery: RecoveryPolicy,
    pub fulfillment: FulfillmentPolicy,
}

/// A deadline ahead of a step, and what happens when it comes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadlineAhead {
    pub at_ms: i64,
    pub then: String,
}

/// Who moves one open aggregate next, when, and with what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepAhead {
    pub aggregate: StepAggregate,
    pub id: String,
    /// The aggregate's stored state (`UNKNOWN`, `awaiting_fulfillment`, ...).
    pub state: String,
    pub mover: Mover,
    /// A stable name of what happens: `query_psp`, `await_webhook`, ...
    pub action: &'static str,
    /// When it happens (unix ms); None when only an outside party can act.
    pub due_at_ms: Option<i64>,
    /// The reference the PSP (or the business) is contacted with.
    pub reference: Option<String>,
    /// Queries (or business checks) made so far.
    pub tries: Option<u32>,
    /// The un-jittered wait after the next query (the scanner waits between
    /// half of it and all of it).
    pub backoff_ms: Option<i64>,
    pub deadline: Option<DeadlineAhead>,
    pub explanation: String,
}

/// One amount the payment holds, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hold {
    /// `authorization`, `capture_reservation` or `refund_reservation`.
    pub kind: &'static str,
    pub aggregate_id: String,
    pub amount_minor: i64,
    pub reason: String,
}

/// The money the payment holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MoneyHeld {
    /// Authorised at the PSP, neither captured nor reserved for a capture.
    pub authorized_minor: i64,
    pub capture_reserved_minor: i64,
    pub refund_reserved_minor: i64,
    pub holds: Vec<Hold>,
}

/// The manual review of a payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReviewNext {
    pub reason: Option<String>,
    pub pending_proposals: Vec<PendingProposal>,
    /// What the review waits for, in words.
    pub awaiting: String,
}

/// The `next` section of a timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NextExplanation {
    /// Who moves the payment next, all aggregates together.
    pub mover: Mover,
    /// The earliest due time of any step.
    pub due_at_ms: Option<i64>,
    pub summary: String,
    pub steps: Vec<StepAhead>,
    pub money_held: MoneyHeld,
    pub review: Option<ReviewNext>,
}

/// What happens next to the payment `facts` describe, at `now_ms`.
pub fn explain_next(facts: &PaymentFacts, policy: &ExplainPolicy, now_ms: i64) -> NextExplanation {
    let mut steps: Vec<StepAhead> = Vec::new();
    let items = [
        (StepAggregate::Attempt, &facts.attempts),
        (StepAggregate::Capture, &facts.captures),
        (StepAggregate::Refund, &facts.refunds),
    ];
    for (aggregate, rows) in items {
        steps.extend(
            rows.iter()
                .filter_map(|item| item_step(aggregate, item, &policy.recovery, now_ms)),
        );
    }
    if let Some(step) = order_step(facts, &steps) {
        steps.insert(0, step);
    }
    if let Some(fulfillment) = &facts.fulfillment {
        steps.extend(fulfillment_step(fulfillment, &steps, policy, now_ms));
    }
    // A proposal can be made on an UNKNOWN the scanner has not flagged yet:
    // it waits for a second operator all the same.
    let in_review = facts.manual_review || !facts.pending_proposals.is_empty();
    let review = in_review.then(|| review_next(facts));
    let due_at_ms = steps.iter().filter_map(|s| s.due_at_ms).min();
    let mover = overall_mover(facts, &steps);
    NextExplanation {
        mover,
        due_at_ms,
        summary: summary(mover, &steps, review.as_ref()),
        money_held: money_held(facts, &steps),
        steps,
        review,
    }
}

/// The payment's mover: an operator while it is in review, else the mover
/// of the step due first (a step without a due time last), else nothing.
fn overall_mover(facts: &PaymentFacts, steps: &[StepAhead]) -> Mover {
    if facts.manual_review
        || !facts.pending_proposals.is_empty()
        || steps
            .iter()
            .any(|s| s.aggregate == StepAggregate::Fulfillment && s.mover == Mover::Operator)
    {
        return Mover::Operator;
    }
    steps
        .iter()
        .min_by_key(|s| s.due_at_ms.unwrap_or(i64::MAX))
        .map_or(Mover::Nothing, |s| s.mover)
}

fn summary(mover: Mover, steps: &[StepAhead], review: Option<&ReviewNext>) -> String {
    if let Some(review) = review {
        return format!("in manual review: {}", review.awaiting);
    }
    let first = steps
        .iter()
        .filter(|s| s.mover == mover)
        .min_by_key(|s| s.due_at_ms.unwrap_or(i64::MAX));
    match first {
        Some(step) => step.explanation.clone(),
        None => "nothing left: every aggregate of the payment is settled".to_owned(),
    }
}

/// When the scanner next looks at `item` and what the policy makes it do
/// then: `decide_recovery` at the stored look (or now, if that passed); a
/// `NotYet` is followed as the scanner would follow it, by looking again at
/// the time it names (each hop lands on a due time, so two or three suffice).
fn next_look(item: &ItemFacts, policy: &RecoveryPolicy, now_ms: i64) -> (i64, RecoveryAction) {
    let mut at = item.next_retry_time.unwrap_or(now_ms).max(now_ms);
    // Jitter 0: the earliest the scanner may act; the real wait is at most
    // twice the backoff's floor.
    let mut action = decide_recovery(&item.pending, at, 0.0, policy);
    for _ in 0..4 {
        match action {
            RecoveryAction::NotYet { next_retry_at_ms } if next_retry_at_ms > at => {
                at = next_retry_at_ms;
                action = decide_recovery(&item.pending, at, 0.0, policy);
            }
            _ => break,
        }
    }
    (at, action)
}

/// The step of one attempt, capture or refund; None when it is terminal.
fn item_step(
    aggregate: StepAggregate,
    item: &ItemFacts,
    policy: &RecoveryPolicy,
    now_ms: i64,
) -> Option<StepAhead> {
    let state = item.pending.state;
    if state.is_terminal() {
        return None;
    }
    let reference = item.pending.reference.clone();
    let tries = item.pending.retry_count;
    let mut step = StepAhead {
        aggregate,
        id: item.id.clone(),
        state: state.as_str().to_owned(),
        mover: Mover::Scanner,
        action: "query_psp",
        due_at_ms: None,
        reference: Some(reference.clone()),
        tries: Some(tries),
        backoff_ms: Some(policy.nominal_backoff(tries.saturating_add(1))),
        deadline: None,
        explanation: String::new(),
    };
    if item.next_retry_time.is_none() {
        step.mover = Mover::Webhook;
        step.action = "await_event";
        step.explanation = format!(
            "{} {} is {}, outside the scanner's pending set: the next webhook or command moves it",
            aggregate.as_str(),
            item.id,
            state.as_str()
        );
        return Some(step);
    }
    let (at, action) = next_look(item, policy, now_ms);
    step.due_at_ms = Some(at);
    describe_action(&mut step, item, &action, policy, now_ms);
    Some(step)
}

/// Fill in mover, action and words from the policy's action at the next look.
fn describe_action(
    step: &mut StepAhead,
    item: &ItemFacts,
    action: &RecoveryAction,
    policy: &RecoveryPolicy,
    now_ms: i64,
) {
    let what = format!("{} {}", step.aggregate.as_str(), item.id);
    let reference = &item.pending.reference;
    match action {
        RecoveryAction::EscalateToManualReview { age_ms, .. } => {
            step.action = "escalate_to_review";
            step.explanation = format!(
                "{what} has been open {} s, past the {} s limit: the scanner flags the payment for an operator, and goes on querying with {reference}",
                age_ms / 1000,
                policy.max_unknown_age_ms / 1000
            );
        }
        RecoveryAction::ExpireRequiresAction { .. } => {
            step.mover = Mover::Deadline;
            step.action = "expire_requires_action";
            step.explanation = format!(
                "the customer's step of {what} expired: the scanner queries {reference} once more, cancels it at the PSP and expires the order"
            );
        }
        RecoveryAction::ExpireAuthorization { expired_at_ms, .. } => {
            step.mover = Mover::Deadline;
            step.action = "expire_authorization";
            step.deadline = Some(DeadlineAhead {
                at_ms: *expired_at_ms,
                then: "the scanner queries the authorization and voids what the PSP still holds"
                    .to_owned(),
            });
            step.explanation = format!(
                "the authorization of {what} is past its validity: the scanner queries {reference} and voids what the PSP still holds"
            );
        }
        RecoveryAction::NotYet { .. } | RecoveryAction::Nothing => {
            step.action = "await_event";
            step.explanation = format!("{what} waits for the next event");
        }
        RecoveryAction::QueryPsp { .. } | RecoveryAction::QueryWithBackoff { .. } => {
            query_words(step, item, policy);
        }
    }
    awaiting_outsiders(step, item, action, policy, now_ms);
}

/// A query is due: say who is expected to answer before it.
fn query_words(step: &mut StepAhead, item: &ItemFacts, policy: &RecoveryPolicy) {
    let what = format!("{} {}", step.aggregate.as_str(), item.id);
    let reference = &item.pending.reference;
    let tries = item.pending.retry_count;
    if reported_by_webhook(item.pending.state) {
        step.mover = Mover::Webhook;
        step.action = "await_webhook";
        step.explanation = format!(
            "{what} is {} at the PSP: its webhook reports the outcome; if none arrives, the scanner queries {reference} at the due time",
            item.pending.state.as_str()
        );
    } else if matches!(
        item.pending.state,
        PendingState::Attempt(AttemptState::Authorized)
    ) {
        step.action = "query_void";
        step.explanation = format!(
            "a void of {what} is recorded as sent: the scanner queries {reference} (and sends the same void again) until the PSP confirms it"
        );
    } else {
        step.explanation = format!(
            "the outcome of {what} ({}) is not proven: the scanner queries the PSP with {reference} at the due time ({tries} queries so far; then it waits about {} s)",
            item.pending.state.as_str(),
            policy.nominal_backoff(tries.saturating_add(1)) / 1000
        );
    }
}

/// An AUTHORIZED attempt within its validity and a REQUIRES_ACTION step
/// still open: someone outside acts first, the scanner only at the deadline
/// (the step's due time, where the policy's hops landed).
fn awaiting_outsiders(
    step: &mut StepAhead,
    item: &ItemFacts,
    action: &RecoveryAction,
    policy: &RecoveryPolicy,
    now_ms: i64,
) {
    let what = format!("{} {}", step.aggregate.as_str(), item.id);
    let state = item.pending.state;
    if matches!(action, RecoveryAction::EscalateToManualReview { .. }) {
        return;
    }
    if state == PendingState::Attempt(AttemptState::Authorized)
        && item.pending.void_requested_at_ms.is_none()
    {
        let expires = authorization_expires_at(&item.pending, policy);
        step.deadline = Some(DeadlineAhead {
            at_ms: expires,
            then: "the scanner queries the authorization and voids what the PSP still holds"
                .to_owned(),
        });
        if now_ms < expires {
            step.mover = Mover::Merchant;
            step.action = "capture_or_void";
            step.explanation = format!(
                "{what} holds an authorization: the merchant captures or voids it before it expires"
            );
        }
    } else if state == PendingState::Attempt(AttemptState::RequiresAction) {
        let expires = step.due_at_ms.unwrap_or(now_ms);
        step.deadline = Some(DeadlineAhead {
            at_ms: expires,
            then: "the scanner cancels the step at the PSP and expires the order".to_owned(),
        });
        if now_ms < expires {
            step.mover = Mover::Webhook;
            step.action = "await_customer";
            step.explanation = format!(
                "{what} waits for the customer's step; the PSP's webhook reports its outcome"
            );
        }
    }
}

/// States in which the PSP said it is working on it and reports by webhook.
fn reported_by_webhook(state: PendingState) -> bool {
    matches!(
        state,
        PendingState::Attempt(AttemptState::Processing)
            | PendingState::Refund(RefundState::Processing)
            | PendingState::Capture(CaptureState::Processing)
    )
}

/// The order's own step: the merchant confirms a payment with no live attempt.
fn order_step(facts: &PaymentFacts, item_steps: &[StepAhead]) -> Option<StepAhead> {
    let open_attempt = item_steps
        .iter()
        .any(|s| s.aggregate == StepAggregate::Attempt);
    let waits_for_merchant = matches!(facts.order_state, OrderState::Created)
        || (matches!(facts.order_state, OrderState::Processing) && !open_attempt);
    if !waits_for_merchant || open_attempt {
        return None;
    }
    Some(StepAhead {
        aggregate: StepAggregate::Order,
        id: facts.order_id.clone(),
        state: facts.order_state.as_str().to_owned(),
        mover: Mover::Merchant,
        action: "confirm",
        due_at_ms: None,
        reference: None,
        tries: None,
        backoff_ms: None,
        deadline: None,
        explanation: "no attempt is open: the merchant confirms the payment (again, with other payment details after a failure)".to_owned(),
    })
}

/// The fulfillment's step: what the fulfillment door decides at the next
/// check and when the deadline settles.
fn fulfillment_step(
    f: &FulfillmentFacts,
    item_steps: &[StepAhead],
    policy: &ExplainPolicy,
    now_ms: i64,
) -> Option<StepAhead> {
    let s = &f.snapshot;
    let mut step = StepAhead {
        aggregate: StepAggregate::Fulfillment,
        id: s.biz_key.clone(),
        state: s.state.as_str().to_owned(),
        mover: Mover::Deadline,
        action: "fulfillment_deadline",
        // An overdue check happens at the scanner's next round: now.
        due_at_ms: f.next_check_at_ms.map(|at| at.max(now_ms)),
        reference: s.attempt_reference.clone(),
        tries: Some(s.checks),
        backoff_ms: None,
        deadline: None,
        explanation: String::new(),
    };
    match s.state {
        FulfillmentState::Fulfilled | FulfillmentState::Compensated => return None,
        FulfillmentState::PendingPayment => {
            step.mover = Mover::Nothing;
            step.action = "await_payment";
            step.due_at_ms = None;
            step.explanation = format!(
                "fulfillment of {} starts when the payment succeeds (deadline {})",
                s.biz_key, s.deadline_ms
            );
            step.deadline = Some(deadline_ahead(f, policy));
        }
        FulfillmentState::AwaitingFulfillment => awaiting_words(&mut step, f, policy, now_ms),
        FulfillmentState::Compensating => {
            let refund = s.compensation.as_ref().map(|c| c.refund_reference.clone());
            let refund_step = item_steps.iter().find(|st| {
                st.aggregate == StepAggregate::Refund
                    && st.reference.is_some()
                    && st.reference == refund
            });
            step.mover = refund_step.map_or(Mover::Scanner, |st| st.mover);
            step.due_at_ms = refund_step.and_then(|st| st.due_at_ms);
            step.action = "await_compensation_refund";
            step.reference = refund.clone();
            step.explanation = format!(
                "the compensation refund {} returns the money; the fulfillment follows its outcome",
                refund.unwrap_or_default()
            );
        }
        FulfillmentState::ManualReview => {
            step.mover = Mover::Operator;
            step.action = "operator_resolution";
            step.due_at_ms = None;
            step.explanation = format!(
                "fulfillment frozen for an operator: {}",
                s.review
                    .as_ref()
                    .map_or_else(|| "no reason recorded".to_owned(), ToString::to_string)
            );
        }
    }
    Some(step)
}

fn awaiting_words(step: &mut StepAhead, f: &FulfillmentFacts, policy: &ExplainPolicy, now_ms: i64) {
    let s = &f.snapshot;
    step.deadline = Some(deadline_ahead(f, policy));
    let at = f.next_check_at_ms.unwrap_or(now_ms).max(now_ms);
    let at_check = decide_fulfillment(s, &FulfillmentInput::CheckDue, at, &policy.fulfillment);
    match s.mode {
        FulfillmentMode::Push => {
            step.explanation = format!(
                "the merchant confirms the fulfillment of {} before the deadline {}; at the next check: {}",
                s.biz_key,
                s.deadline_ms,
                at_check.explain()
            );
        }
        FulfillmentMode::Pull => {
            step.mover = Mover::Scanner;
            step.action = "fulfillment_check";
            step.backoff_ms = Some(policy.fulfillment.check_delay(s.checks));
            step.explanation = format!(
                "the scanner checks the business for {} at the due time: {}",
                s.biz_key,
                at_check.explain()
            );
        }
    }
}

/// What the fulfillment door decides once the deadline settled.
fn deadline_ahead(f: &FulfillmentFacts, policy: &ExplainPolicy) -> DeadlineAhead {
    let s = &f.snapshot;
    let settles = policy.fulfillment.settles_at(s.deadline_ms);
    let mut awaiting = s.clone();
    awaiting.state = FulfillmentState::AwaitingFulfillment;
    let decision = decide_fulfillment(
        &awaiting,
        &FulfillmentInput::CheckDue,
        settles,
        &policy.fulfillment,
    );
    let then = match decision.starts_compensation() {
        Some(reference) => format!(
            "{}: refund {} (up to {} minor units) under {reference}",
            decision.explain(),
            s.biz_key,
            f.refundable_minor
        ),
        None => decision.explain(),
    };
    DeadlineAhead {
        at_ms: s.deadline_ms,
        then,
    }
}

fn review_next(facts: &PaymentFacts) -> ReviewNext {
    let awaiting = match facts.pending_proposals.first() {
        Some(p) => format!(
            "a second operator (not {}) approves or rejects proposal {}: {} of {} {} ({}: {})",
            p.proposed_by,
            p.id,
            p.outcome,
            p.target_type,
            p.target_id,
            p.reason_code,
            p.evidence_note
        ),
        None => format!(
            "an operator proposes a resolution ({})",
            facts
                .manual_review_reason
                .as_deref()
                .unwrap_or("no reason recorded")
        ),
    };
    ReviewNext {
        reason: facts.manual_review_reason.clone(),
        pending_proposals: facts.pending_proposals.clone(),
        awaiting,
    }
}

fn money_held(facts: &PaymentFacts, steps: &[StepAhead]) -> MoneyHeld {
    let amounts = &facts.amounts;
    let mut holds = Vec::new();
    let authorized = amounts.capturable();
    if authorized > 0 && !facts.order_state.is_terminal() {
        let attempt = facts
            .attempts
            .iter()
            .find(|a| a.pending.state == PendingState::Attempt(AttemptState::Authorized));
        let expiry = steps
            .iter()
            .find(|s| Some(&s.id) == attempt.map(|a| &a.id))
            .and_then(|s| s.deadline.as_ref());
        holds.push(Hold {
            kind: "authorization",
            aggregate_id: attempt.map_or_else(|| facts.order_id.clone(), |a| a.id.clone()),
            amount_minor: authorized,
            reason: match expiry {
                Some(d) => format!(
                    "authorised, not captured: capture or void it before {}",
                    d.at_ms
                ),
                None => "authorised, not captured".to_owned(),
            },
        });
    }
    for (kind, rows) in [
        ("capture_reservation", &facts.captures),
        ("refund_reservation", &facts.refunds),
    ] {
        for row in rows.iter().filter(|r| !r.pending.state.is_terminal()) {
            holds.push(Hold {
                kind,
                aggregate_id: row.id.clone(),
                amount_minor: row.amount_minor,
                reason: format!(
                    "reserved until the PSP's outcome of {} ({}) is known",
                    row.pending.reference,
                    row.pending.state.as_str()
                ),
            });
        }
    }
    MoneyHeld {
        authorized_minor: authorized.max(0),
        capture_reserved_minor: amounts.capture_reserved,
        refund_reserved_minor: amounts.refund_reserved,
        holds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fulfillment::FulfillmentSnapshot;

    const NOW: i64 = 1_000_000_000;

    fn item(state: PendingState, retry_count: u32, next: Option<i64>) -> ItemFacts {
        ItemFacts {
            id: "pay_1_a1".into(),
            pending: PendingItem {
                retry_count,
                // Long ago: the stored next look governs, not the backoff.
                last_attempt_at_ms: Some(NOW - 3_600_000),
                ..PendingItem::new(state, "pay_1_a1", NOW - 10_000)
            },
            next_retry_time: next,
            amount_minor: 500,
        }
    }

    fn facts(order_state: OrderState, attempts: Vec<ItemFacts>) -> PaymentFacts {
        PaymentFacts {
            order_id: "pay_1".into(),
            order_state,
            amounts: Amounts::default(),
            manual_review: false,
            manual_review_reason: None,
            attempts,
            captures: vec![],
            refunds: vec![],
            fulfillment: None,
            pending_proposals: vec![],
        }
    }

    fn explain(facts: &PaymentFacts) -> NextExplanation {
        explain_next(facts, &ExplainPolicy::default(), NOW)
    }

    #[test]
    fn an_unknown_attempt_is_queried_by_the_scanner_at_its_stored_time_with_its_reference() {
        let due = NOW + 20_000;
        let next = explain(&facts(
            OrderState::Processing,
            vec![item(
                PendingState::Attempt(AttemptState::Unknown),
                2,
                Some(due),
            )],
        ));
        assert_eq!(next.mover, Mover::Scanner);
        let step = &next.steps[0];
        assert_eq!(step.action, "query_psp");
        assert_eq!(step.due_at_ms, Some(due));
        assert_eq!(step.reference.as_deref(), Some("pay_1_a1"));
        assert_eq!(step.tries, Some(2));
        assert_eq!(
            step.backoff_ms,
            Some(RecoveryPolicy::default().nominal_backoff(3))
        );
    }

    #[test]
    fn an_overdue_query_is_due_now_not_in_the_past() {
        let next = explain(&facts(
            OrderState::Processing,
            vec![item(
                PendingState::Attempt(AttemptState::Unknown),
                0,
                Some(NOW - 5),
            )],
        ));
        assert_eq!(next.steps[0].due_at_ms, Some(NOW));
        assert_eq!(next.due_at_ms, Some(NOW));
    }

    #[test]
    fn a_processing_attempt_awaits_its_webhook_with_the_scanner_query_as_fallback() {
        let next = explain(&facts(
            OrderState::Processing,
            vec![item(
                PendingState::Attempt(AttemptState::Processing),
                0,
                Some(NOW),
            )],
        ));
        assert_eq!(next.mover, Mover::Webhook);
        assert_eq!(next.steps[0].action, "await_webhook");
        assert_eq!(next.steps[0].due_at_ms, Some(NOW));
    }

    #[test]
    fn an_authorization_waits_for_the_merchant_until_its_validity_ends() {
        let mut authorized = item(
            PendingState::Attempt(AttemptState::Authorized),
            0,
            Some(NOW),
        );
        authorized.pending.authorized_at_ms = Some(NOW - 10_000);
        let mut f = facts(OrderState::Authorized, vec![authorized]);
        f.amounts = Amounts::from_parts(500, 0, 0, 0, 0).unwrap();
        let next = explain(&f);
        let step = &next.steps[0];
        assert_eq!(step.mover, Mover::Merchant);
        assert_eq!(step.action, "capture_or_void");
        let expiry = NOW - 10_000 + RecoveryPolicy::default().authorization_validity_ms;
        assert_eq!(step.deadline.as_ref().map(|d| d.at_ms), Some(expiry));
        assert_eq!(step.due_at_ms, Some(expiry));
        assert_eq!(next.money_held.authorized_minor, 500);
        assert_eq!(next.money_held.holds[0].kind, "authorization");
    }

    #[test]
    fn a_payment_in_review_waits_for_the_second_operator_of_its_proposal() {
        let mut f = facts(
            OrderState::Processing,
            vec![item(
                PendingState::Attempt(AttemptState::Unknown),
                5,
                Some(NOW + 1),
            )],
        );
        f.manual_review = true;
        f.manual_review_reason = Some("UNKNOWN too long".into());
        f.pending_proposals.push(PendingProposal {
            id: "prop_1".into(),
            outcome: "attempt_succeeded".into(),
            target_type: "attempt".into(),
            target_id: "pay_1_a1".into(),
            reason_code: "psp_settlement_report".into(),
            evidence_note: "listed".into(),
            amount_minor: None,
            proposed_by: "alice".into(),
            proposed_at_ms: NOW - 1,
        });
        let next = explain(&f);
        assert_eq!(next.mover, Mover::Operator);
        let review = next.review.expect("review");
        assert!(review.awaiting.contains("prop_1"), "{}", review.awaiting);
        assert!(review.awaiting.contains("not alice"), "{}", review.awaiting);
        // Queries go on while the payment is in review.
        assert_eq!(next.steps[0].mover, Mover::Scanner);
    }

    #[test]
    fn a_processing_attempt_contacted_just_now_is_queried_after_the_processing_timeout() {
        let mut processing = item(
            PendingState::Attempt(AttemptState::Processing),
            0,
            Some(NOW),
        );
        processing.pending.last_attempt_at_ms = Some(NOW - 1_000);
        let next = explain(&facts(OrderState::Processing, vec![processing]));
        let expected = NOW - 1_000 + RecoveryPolicy::default().processing_timeout_ms;
        assert_eq!(next.steps[0].due_at_ms, Some(expected));
    }

    #[test]
    fn an_expired_customer_step_is_moved_by_its_deadline() {
        let mut step = item(
            PendingState::Attempt(AttemptState::RequiresAction),
            0,
            Some(NOW),
        );
        step.pending.expires_at_ms = Some(NOW - 1);
        let next = explain(&facts(OrderState::RequiresAction, vec![step]));
        assert_eq!(next.mover, Mover::Deadline);
        assert_eq!(next.steps[0].action, "expire_requires_action");
    }

    #[test]
    fn a_settled_payment_has_nothing_left() {
        let next = explain(&facts(
            OrderState::Succeeded,
            vec![item(
                PendingState::Attempt(AttemptState::Succeeded),
                0,
                None,
            )],
        ));
        assert_eq!(next.mover, Mover::Nothing);
        assert!(next.steps.is_empty());
        assert_eq!(next.due_at_ms, None);
        assert!(next.money_held.holds.is_empty());
    }

    #[test]
    fn an_open_refund_holds_its_reservation() {
        let mut f = facts(OrderState::Succeeded, vec![]);
        f.amounts = Amounts::from_parts(500, 0, 500, 200, 0).unwrap();
        f.refunds.push(ItemFacts {
            id: "re_1".into(),
            amount_minor: 200,
            ..item(PendingState::Refund(RefundState::Unknown), 1, Some(NOW + 5))
        });
        let next = explain(&f);
        assert_eq!(next.money_held.refund_reserved_minor, 200);
        assert_eq!(next.money_held.holds[0].kind, "refund_reservation");
        assert_eq!(next.steps[0].aggregate, StepAggregate::Refund);
    }

    #[test]
    fn a_push_fulfillment_is_moved_by_its_deadline_which_compensates() {
        let mut snapshot = FulfillmentSnapshot::new(FulfillmentMode::Push, "biz-1", NOW + 60_000);
        snapshot.state = FulfillmentState::AwaitingFulfillment;
        snapshot.attempt_reference = Some("pay_1_a1".into());
        let mut f = facts(OrderState::Succeeded, vec![]);
        f.fulfillment = Some(FulfillmentFacts {
            snapshot,
            next_check_at_ms: Some(NOW + 60_000),
            refundable_minor: 500,
        });
        let next = explain(&f);
        assert_eq!(next.mover, Mover::Deadline);
        let step = &next.steps[0];
        assert_eq!(step.aggregate, StepAggregate::Fulfillment);
        let deadline = step.deadline.as_ref().expect("deadline");
        assert_eq!(deadline.at_ms, NOW + 60_000);
        assert!(deadline.then.contains("cmp_pay_1_a1"), "{}", deadline.then);
    }

    #[test]
    fn an_overdue_fulfillment_check_is_due_now() {
        let mut snapshot = FulfillmentSnapshot::new(FulfillmentMode::Pull, "biz-2", NOW + 60_000);
        snapshot.state = FulfillmentState::AwaitingFulfillment;
        snapshot.attempt_reference = Some("pay_1_a1".into());
        let mut f = facts(OrderState::Succeeded, vec![]);
        f.fulfillment = Some(FulfillmentFacts {
            snapshot,
            next_check_at_ms: Some(NOW - 5_000),
            refundable_minor: 500,
        });
        let next = explain(&f);
        assert_eq!(next.mover, Mover::Scanner);
        assert_eq!(next.steps[0].action, "fulfillment_check");
        assert_eq!(next.steps[0].due_at_ms, Some(NOW));
    }

    #[test]
    fn a_created_order_waits_for_the_merchant_to_confirm() {
        let next = explain(&facts(OrderState::Created, vec![]));
        assert_eq!(next.mover, Mover::Merchant);
        assert_eq!(next.steps[0].action, "confirm");
    }
}
