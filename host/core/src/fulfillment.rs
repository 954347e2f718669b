//! Guaranteed fulfillment or refund (issue 7, seed 000 §1, §4, §7, §8, §11).
//!
//! A payment may carry a fulfillment block: a business key (`biz_key`, the
//! merchant's stable business goal, possibly served by several payments), a
//! fulfillment deadline (`biz_deadline_time`, kept apart from every retry
//! schedule) and a mode (push: the merchant confirms through the API; pull:
//! Sluice calls the merchant's business action with the attempt reference as
//! the idempotency key, then reads the business fact).
//!
//! Fulfillment is its own lifecycle on the order, next to the payment states
//! (which it never changes):
//!
//! | state                  | meaning                                     | left by                                  |
//! |------------------------|---------------------------------------------|------------------------------------------|
//! | `pending_payment`      | the payment has not succeeded yet           | the payment's success                    |
//! | `awaiting_fulfillment` | money taken, business outcome not proven    | an attributed fact, a push, the deadline |
//! | `fulfilled`            | the goal was reached by **this** payment    | never (terminal; seed's BIZ_SUCCESS)     |
//! | `compensating`         | a compensation refund was decided           | the refund's definitive outcome          |
//! | `compensated`          | the compensation refund succeeded           | never (terminal; seed's REFUNDED)        |
//! | `manual_review`        | automation is frozen, a human decides       | an operator resolution only              |
//!
//! The rules, as the seed states them (§7's table):
//!
//! | business fact                                   | decision                                            |
//! |-------------------------------------------------|-----------------------------------------------------|
//! | fulfilled, attributed to this attempt           | `fulfilled`                                         |
//! | fulfilled, attributed to a sibling attempt      | compensate, reason `fulfilled_elsewhere`            |
//! | not fulfilled, before the deadline              | keep asking with backoff                            |
//! | not fulfilled, read before the deadline settled | read the fact once more (`ReadFactOnceMore`)        |
//! | not fulfilled, read after the deadline settled  | compensate, reason `fulfillment_deadline_passed`    |
//! | no answer (timeout, error)                      | never "not fulfilled": ask again; a human if it lasts |
//! | fulfilled without attribution, or to a stranger | freeze: `manual_review` + contradiction alert       |
//!
//! The deadline "settles" `action_timeout_ms` after `biz_deadline_time`: no
//! business action is started at or after the deadline, and the last call
//! started before it may still be running for up to its timeout. Only a read
//! that *started* after that instant can prove "still not fulfilled"; a read
//! that started earlier (a late, stale answer) only triggers one more read.
//!
//! In push mode Sluice cannot read the business: the merchant's confirmation
//! *is* the fact, and a confirmation must land before the deadline settles.
//! The merchant's safe protocol is "confirm, then grant only if the
//! confirmation was accepted"; a refused confirmation says the money is being
//! (or was) returned, so the entitlement must not be granted.
//!
//! Once `fulfilled`, no automatic input (scanner, stale message, late pull
//! answer, retried request) can ever lead to a refund: they are ignored, and a
//! fact that contradicts the recorded attribution is `NeedsReview` (recorded,
//! alerted, nothing moves). After-sales refunds are a separate, explicit
//! merchant refund with its own reason; the store additionally refuses the
//! compensation reservation for a fulfilled order.
//!
//! Like the rest of the core this is pure: `now_ms` is a parameter and the
//! decision is data. The store applies it through the one door (CAS on the
//! fulfillment version, history row, outbox event) and executes the effects.

use serde::{Deserialize, Serialize};

use crate::decision::IgnoreReason;

/// How the business fact is learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FulfillmentMode {
    /// The merchant confirms through `POST /v1/payments/{id}/fulfillment`.
    Push,
    /// Sluice calls the merchant's business action, then reads the fact.
    Pull,
}

impl FulfillmentMode {
    pub const ALL: &'static [FulfillmentMode] = &[FulfillmentMode::Push, FulfillmentMode::Pull];

    pub fn as_str(&self) -> &'static str {
        match self {
            FulfillmentMode::Push => "push",
            FulfillmentMode::Pull => "pull",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|mode| mode.as_str() == text)
    }
}

impl std::fmt::Display for FulfillmentMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The fulfillment lifecycle of one payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FulfillmentState {
    /// The payment has not succeeded yet: there is nothing to fulfil.
    PendingPayment,
    /// Money taken; whether the business goal was reached is not proven.
    AwaitingFulfillment,
    /// The business goal was reached and attributed to this payment.
    Fulfilled,
    /// A compensation refund was decided and is in flight.
    Compensating,
    /// The compensation refund succeeded: the money is back.
    Compensated,
    /// Automation is frozen; only an operator resolution moves it.
    ManualReview,
}

impl FulfillmentState {
    pub const ALL: &'static [FulfillmentState] = &[
        FulfillmentState::PendingPayment,
        FulfillmentState::AwaitingFulfillment,
        FulfillmentState::Fulfilled,
        FulfillmentState::Compensating,
        FulfillmentState::Compensated,
        FulfillmentState::ManualReview,
    ];

    /// The stored name of the state.
    pub fn as_str(&self) -> &'static str {
        match self {
            FulfillmentState::PendingPayment => "pending_payment",
            FulfillmentState::AwaitingFulfillment => "awaiting_fulfillment",
            FulfillmentState::Fulfilled => "fulfilled",
            FulfillmentState::Compensating => "compensating",
            FulfillmentState::Compensated => "compensated",
            FulfillmentState::ManualReview => "manual_review",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|state| state.as_str() == text)
    }

    /// `fulfilled` and `compensated` are never left.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            FulfillmentState::Fulfilled | FulfillmentState::Compensated
        )
    }
}

impl std::fmt::Display for FulfillmentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a payment's money goes back (visible to the client with `refunded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationReason {
    /// The deadline passed and the business goal was still not reached.
    FulfillmentDeadlinePassed,
    /// The business goal was reached, by another payment of the same biz_key.
    FulfilledElsewhere,
}

impl CompensationReason {
    pub const ALL: &'static [CompensationReason] = &[
        CompensationReason::FulfillmentDeadlinePassed,
        CompensationReason::FulfilledElsewhere,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            CompensationReason::FulfillmentDeadlinePassed => "fulfillment_deadline_passed",
            CompensationReason::FulfilledElsewhere => "fulfilled_elsewhere",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| r.as_str() == text)
    }
}

impl std::fmt::Display for CompensationReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The compensation refund a payment started (at most one, ever).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Compensation {
    /// Always [`compensation_refund_reference`] of the attempt reference.
    pub refund_reference: String,
    pub reason: CompensationReason,
}

/// The stable refund reference of a payment's compensation refund.
///
/// Derived from the attempt reference (seed 000 §1: `r_{tradeOrderNo}`), so
/// every retry, every instance and every restart names the same refund and
/// the PSP's idempotency turns a repeated request into the same refund.
pub fn compensation_refund_reference(attempt_reference: &str) -> String {
    format!("cmp_{attempt_reference}")
}

/// What the store reads (inside the transaction) about a payment's fulfillment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FulfillmentSnapshot {
    pub state: FulfillmentState,
    /// CAS version of the fulfillment; bumped by every applied decision.
    pub version: i64,
    pub mode: FulfillmentMode,
    /// The merchant's stable business goal.
    pub biz_key: String,
    /// `biz_deadline_time`, unix milliseconds. No business action starts at
    /// or after it.
    pub deadline_ms: i64,
    /// The reference of the attempt that took the money (the seed's
    /// `trade_order_no`, the business's `resume_order_no`). Bound when the
    /// payment succeeds.
    pub attempt_reference: Option<String>,
    /// Every other attempt reference Sluice minted for the same `biz_key`
    /// (this payment's earlier attempts and other payments). A fact
    /// attributed to one of them means the goal was reached elsewhere; a fact
    /// attributed to a reference outside this list and ours is a contradiction.
    pub sibling_references: Vec<String>,
    /// How many business checks were scheduled so far (drives the backoff).
    pub checks: u32,
    pub compensation: Option<Compensation>,
    /// Why the fulfillment is (or was last) in manual review.
    pub review: Option<ReviewReason>,
}

impl FulfillmentSnapshot {
    /// The fulfillment of a payment that has not succeeded yet.
    pub fn new(mode: FulfillmentMode, biz_key: impl Into<String>, deadline_ms: i64) -> Self {
        FulfillmentSnapshot {
            state: FulfillmentState::PendingPayment,
            version: 0,
            mode,
            biz_key: biz_key.into(),
            deadline_ms,
            attempt_reference: None,
            sibling_references: Vec::new(),
            checks: 0,
            compensation: None,
            review: None,
        }
    }

    /// What the row holds after the store applied an `Apply` decision: the
    /// new state, the version bumped, and the bookkeeping effects recorded.
    /// Decisions other than `Apply` leave the snapshot as it is.
    pub fn applied(&self, decision: &FulfillmentDecision) -> FulfillmentSnapshot {
        let FulfillmentDecision::Apply {
            new_state, effects, ..
        } = decision
        else {
            return self.clone();
        };
        let mut next = self.clone();
        next.state = *new_state;
        next.version = self.version.saturating_add(1);
        for effect in effects {
            match effect {
                FulfillmentEffect::BindAttempt { attempt_reference } => {
                    next.attempt_reference = Some(attempt_reference.clone());
                }
                FulfillmentEffect::ScheduleCheck { checks, .. } => next.checks = *checks,
                FulfillmentEffect::StartCompensationRefund {
                    refund_reference,
                    reason,
                } => {
                    next.compensation = Some(Compensation {
                        refund_reference: refund_reference.clone(),
                        reason: *reason,
                    });
                }
                FulfillmentEffect::RecordReview { reason } => next.review = Some(reason.clone()),
                _ => {}
            }
        }
        next
    }

    fn is_sibling(&self, reference: &str) -> bool {
        self.sibling_references.iter().any(|r| r == reference)
    }
}

/// The knobs of the fulfillment checks. All durations in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FulfillmentPolicy {
    /// Wait before the second business check; doubles with every check.
    pub first_check_delay_ms: i64,
    /// Cap on the wait between two checks.
    pub max_check_delay_ms: i64,
    /// Budget of one business call. The deadline settles this long after
    /// `biz_deadline_time`, when no call Sluice started can still be running.
    pub action_timeout_ms: i64,
    /// How long after the deadline settled Sluice keeps asking a business
    /// that gives no explicit answer before handing it to a human (seed 000
    /// §7: "若业务事实本身长期无法确认，则保持 PAYED 并升级人工，禁止盲退").
    pub unanswered_review_after_ms: i64,
}

impl Default for FulfillmentPolicy {
    fn default() -> Self {
        FulfillmentPolicy {
            first_check_delay_ms: 5_000,
            max_check_delay_ms: 10 * 60_000,
            action_timeout_ms: 10_000,
            unanswered_review_after_ms: 24 * 3_600_000,
        }
    }
}

impl FulfillmentPolicy {
    /// When the deadline settles: the first instant a read can prove that
    /// the goal will not be reached any more.
    pub fn settles_at(&self, deadline_ms: i64) -> i64 {
        deadline_ms.saturating_add(self.action_timeout_ms.max(0))
    }

    /// The wait after `checks` checks: `first · 2^checks`, capped.
    pub fn check_delay(&self, checks: u32) -> i64 {
        let first = self.first_check_delay_ms.max(1);
        let cap = self.max_check_delay_ms.max(first);
        let factor = 1i64.checked_shl(checks.min(62)).unwrap_or(i64::MAX);
        first.saturating_mul(factor).min(cap)
    }

    /// When to check next, after `checks` checks, seen at `now_ms`: the
    /// backoff, but never past the deadline or the settling instant still
    /// ahead (so the deadline is acted on in time). Always after `now_ms`.
    pub fn next_check_at(&self, checks: u32, deadline_ms: i64, now_ms: i64) -> i64 {
        let by_backoff = now_ms.saturating_add(self.check_delay(checks));
        [deadline_ms, self.settles_at(deadline_ms)]
            .into_iter()
            .filter(|milestone| *milestone > now_ms)
            .fold(by_backoff, i64::min)
    }
}

/// What a read of the business fact returned.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusinessFact {
    /// The goal is reached. `attributed_to` is the attempt reference the
    /// business recorded with it (the seed's `resume_order_no`), if any.
    Fulfilled { attributed_to: Option<String> },
    /// An explicit answer: the goal is not reached (yet).
    NotFulfilled,
    /// No explicit answer. Never read as "not fulfilled".
    NoAnswer(NoAnswer),
}

/// Why a read produced no explicit answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoAnswer {
    Timeout,
    /// A transport error, a non-2xx, an unparseable or unsigned body.
    Error,
}

/// One read of the business fact.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FactReading {
    pub fact: BusinessFact,
    /// When the read was *started* (host clock, unix ms). A read that started
    /// before the deadline settled cannot prove that the goal was missed.
    pub read_started_at_ms: i64,
}

/// The definitive (or not) outcome of the compensation refund, as decided on
/// the refund aggregate by `decide_refund`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationRefundOutcome {
    Succeeded,
    /// Definitively failed: the same reference cannot succeed any more.
    Failed,
    /// Processing, unknown: the refund's own query path goes on.
    Unknown,
}

/// A controlled, two-person-approved resolution of a `manual_review`
/// (the store checks the approvals and records both people).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorResolution {
    /// Evidence shows this payment reached the goal.
    Fulfilled,
    /// Evidence shows the goal was missed: start the compensation refund.
    Compensate { reason: CompensationReason },
    /// The money was returned by a manual refund (the two-person refund
    /// flow), named here because the compensation refund itself failed.
    RefundedManually { refund_reference: String },
    /// The cause was fixed (e.g. the business repaired its attribution):
    /// hand the payment back to automation.
    ResumeAutomation,
}

/// Everything that can be decided on a fulfillment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FulfillmentInput {
    /// The payment succeeded with this attempt: start awaiting fulfillment.
    PaymentSucceeded { attempt_reference: String },
    /// A wake-up with no news: the scanner (a scheduled check, the
    /// deadline), a delayed message, a retried request.
    CheckDue,
    /// An answer (or no answer) from reading the business fact (pull).
    Fact(FactReading),
    /// The merchant confirms the goal reached, attributed to an attempt.
    PushConfirmation { attributed_to: String },
    /// The compensation refund's outcome.
    CompensationRefund {
        refund_reference: String,
        outcome: CompensationRefundOutcome,
    },
    /// An approved operator resolution.
    Operator(OperatorResolution),
}

/// Fulfillment events for the outbox (merchant webhooks, JetStream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FulfillmentEvent {
    Fulfilled,
    Compensating,
    Compensated,
    ManualReview,
}

impl FulfillmentEvent {
    /// The event type as merchants see it.
    pub fn as_str(&self) -> &'static str {
        match self {
            FulfillmentEvent::Fulfilled => "fulfillment.fulfilled",
            FulfillmentEvent::Compensating => "fulfillment.compensating",
            FulfillmentEvent::Compensated => "fulfillment.compensated",
            FulfillmentEvent::ManualReview => "fulfillment.manual_review",
        }
    }
}

impl std::fmt::Display for FulfillmentEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the store (or the fulfillment worker) does with an applied decision.
/// Bookkeeping effects are written in the same transaction; call, query and
/// refund effects are performed after commit, from the persisted row, so a
/// crash in between is recovered by the scanner.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FulfillmentEffect {
    /// Remember the attempt that took the money.
    BindAttempt { attempt_reference: String },
    /// Pull: call the merchant's business action, idempotent on the attempt
    /// reference, passing the deadline. Only ever decided before the deadline.
    CallBusinessAction {
        attempt_reference: String,
        deadline_ms: i64,
    },
    /// Pull: read the business fact (after the call, whatever it returned).
    QueryBusinessFact { attempt_reference: String },
    /// Pull, the deadline settled: read the fact one last time before any
    /// refund. Never calls the business action.
    ReadFactOnceMore { attempt_reference: String },
    /// Wake this fulfillment up at `at_ms` (store `next_check_at`) and record
    /// `checks` as the number of checks made.
    ScheduleCheck { at_ms: i64, checks: u32 },
    /// Reserve and create the compensation refund (the whole captured amount)
    /// under this reference, in the same transaction; the refund then follows
    /// its own lifecycle (UNKNOWN, queries) like any refund.
    StartCompensationRefund {
        refund_reference: String,
        reason: CompensationReason,
    },
    /// Remember why the fulfillment is in manual review.
    RecordReview { reason: ReviewReason },
    /// Count a contradictory business fact (alert metric).
    AlertContradictoryFact,
    /// Write this event to the outbox.
    Emit(FulfillmentEvent),
}

/// Why a human must look. Also the reason of `NeedsReview`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum ReviewReason {
    #[error("the business reports the goal reached but names no payment")]
    FactWithoutAttribution,
    #[error("the business attributes the goal to {reference:?}, which is no attempt of this business key")]
    FactAttributedToUnknown { reference: String },
    #[error("the business gave no explicit answer for too long after the deadline")]
    FactUnavailable,
    #[error("nothing is left to compensate with: the merchant's own refunds already returned all {refunded_minor} captured")]
    NothingLeftToRefund { refunded_minor: i64 },
    #[error("the compensation refund {refund_reference} failed definitively")]
    CompensationRefundFailed { refund_reference: String },
    #[error("the business reports the goal reached by this payment, but its compensation refund already started")]
    FulfilledWhileCompensating,
    #[error("the business reports the goal reached by this payment, but its compensation refund succeeded")]
    FulfilledAfterCompensation,
    #[error("the fulfillment is recorded for {recorded:?}, the business now reports {reported:?}")]
    AttributionChanged {
        recorded: String,
        reported: Option<String>,
    },
}

/// Why an input is refused. For a push confirmation this is the API's error,
/// and it says what happened to the money.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum FulfillmentRefusal {
    #[error("the payment has not succeeded: there is nothing to fulfil yet")]
    PaymentNotSucceeded,
    #[error("too late: a compensation refund ({reason}) is in progress under {refund_reference}; the money is being returned to the customer")]
    RefundInProgress {
        refund_reference: String,
        reason: CompensationReason,
    },
    #[error("too late: the payment was refunded ({reason}) under {refund_reference}; the money is back with the customer")]
    Refunded {
        refund_reference: String,
        reason: CompensationReason,
    },
    #[error("the fulfillment is under manual review ({}); an operator decides, the money has not moved", .0.as_ref().map_or_else(|| "no reason recorded".to_owned(), ToString::to_string))]
    UnderReview(Option<ReviewReason>),
    #[error("already fulfilled, attributed to {attributed_to}")]
    AlreadyFulfilled { attributed_to: String },
    #[error("{reference:?} is not an attempt of this business goal")]
    UnknownAttempt { reference: String },
    #[error("the payment succeeded with {expected:?}, not {got:?}")]
    AttemptMismatch { expected: String, got: String },
    #[error("the compensation refund is {expected:?}, not {got:?}")]
    NotTheCompensationRefund { expected: String, got: String },
    #[error("no compensation refund was started")]
    NoCompensationRefund,
    #[error("a compensation refund ({refund_reference}) already exists; a failed one is replaced by a manual refund")]
    CompensationAlreadyStarted { refund_reference: String },
    #[error("the fulfillment is {0}, not under manual review")]
    NotUnderReview(FulfillmentState),
    #[error("a read started at {read_started_at_ms} cannot be decided at {now_ms}")]
    ReadInTheFuture {
        read_started_at_ms: i64,
        now_ms: i64,
    },
}

/// The answer to "what does this input do to this fulfillment?", in the
/// style of [`crate::Decision`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum FulfillmentDecision {
    /// Move to `new_state` (possibly the same state, e.g. a check scheduled)
    /// and execute `effects`. `rule` is the text for the history row.
    Apply {
        new_state: FulfillmentState,
        effects: Vec<FulfillmentEffect>,
        rule: &'static str,
    },
    /// Nothing changes; recorded and acknowledged.
    Ignore(IgnoreReason),
    /// Not acceptable here; nothing changes. For a merchant call, a 409/422.
    Reject(FulfillmentRefusal),
    /// Evidence contradicts an established outcome. Nothing changes (a
    /// terminal state is never left, a refund in flight is not stopped); the
    /// store records it and raises the contradiction alert.
    NeedsReview(ReviewReason),
}

impl FulfillmentDecision {
    pub fn is_apply(&self) -> bool {
        matches!(self, FulfillmentDecision::Apply { .. })
    }

    /// The effects to execute: empty unless the decision is `Apply`.
    pub fn effects(&self) -> &[FulfillmentEffect] {
        match self {
            FulfillmentDecision::Apply { effects, .. } => effects,
            _ => &[],
        }
    }

    /// The state after the decision, if it moves one.
    pub fn new_state(&self) -> Option<FulfillmentState> {
        match self {
            FulfillmentDecision::Apply { new_state, .. } => Some(*new_state),
            _ => None,
        }
    }

    /// The compensation refund this decision starts, if any.
    pub fn starts_compensation(&self) -> Option<&str> {
        self.effects().iter().find_map(|effect| match effect {
            FulfillmentEffect::StartCompensationRefund {
                refund_reference, ..
            } => Some(refund_reference.as_str()),
            _ => None,
        })
    }

    /// One line for the history: the rule applied, or why not.
    pub fn explain(&self) -> String {
        match self {
            FulfillmentDecision::Apply { rule, .. } => (*rule).to_owned(),
            FulfillmentDecision::Ignore(reason) => reason.to_string(),
            FulfillmentDecision::Reject(reason) => reason.to_string(),
            FulfillmentDecision::NeedsReview(reason) => reason.to_string(),
        }
    }

    /// `applied`, `ignored_duplicate`, `ignored_stale`, `rejected`, `needs_review`.
    pub fn label(&self) -> &'static str {
        match self {
            FulfillmentDecision::Apply { .. } => "applied",
            FulfillmentDecision::Ignore(IgnoreReason::Duplicate) => "ignored_duplicate",
            FulfillmentDecision::Ignore(IgnoreReason::Stale) => "ignored_stale",
            FulfillmentDecision::Reject(_) => "rejected",
            FulfillmentDecision::NeedsReview(_) => "needs_review",
        }
    }
}

/// Guard a decision against the payment's money: a compensation refund needs
/// money to return. When the merchant's own refunds (after-sales, with their
/// own reason) already returned everything captured and nothing is in
/// flight, there is nothing to compensate with, and `compensated` would claim
/// a refund that never happened: the decision becomes a manual review (no
/// alert: nothing contradicts, a person only confirms where the money went).
/// With a refund still reserved the decision stands; its reservation then
/// waits for that refund's outcome. Pure: the store passes the amounts it
/// read in the decision's transaction.
pub fn guard_compensation(
    decision: FulfillmentDecision,
    refundable_minor: i64,
    refund_reserved_minor: i64,
    refunded_minor: i64,
) -> FulfillmentDecision {
    if decision.starts_compensation().is_none() || refundable_minor > 0 || refund_reserved_minor > 0
    {
        return decision;
    }
    D::Apply {
        new_state: S::ManualReview,
        effects: vec![
            Fx::RecordReview {
                reason: ReviewReason::NothingLeftToRefund { refunded_minor },
            },
            Fx::Emit(FulfillmentEvent::ManualReview),
        ],
        rule: "nothing left to compensate with: merchant refunds already returned the money",
    }
}

use FulfillmentDecision as D;
use FulfillmentEffect as Fx;
use FulfillmentState as S;

/// Decide what an input does to a payment's fulfillment, at `now_ms`.
pub fn decide_fulfillment(
    snapshot: &FulfillmentSnapshot,
    input: &FulfillmentInput,
    now_ms: i64,
    policy: &FulfillmentPolicy,
) -> FulfillmentDecision {
    let ctx = Ctx {
        s: snapshot,
        now_ms,
        policy,
    };
    match snapshot.state {
        S::PendingPayment => ctx.pending(input),
        S::AwaitingFulfillment => ctx.awaiting(input),
        S::Fulfilled => ctx.fulfilled(input),
        S::Compensating => ctx.compensating(input),
        S::Compensated => ctx.compensated(input),
        S::ManualReview => ctx.manual_review(input),
    }
}

struct Ctx<'a> {
    s: &'a FulfillmentSnapshot,
    now_ms: i64,
    policy: &'a FulfillmentPolicy,
}

/// Where a fulfillment stands against its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Business actions may still be started.
    BeforeDeadline,
    /// No new action; calls started before the deadline may still run.
    Settling,
    /// A read started now proves whether the goal was reached.
    Settled,
}

impl Ctx<'_> {
    fn phase_at(&self, at_ms: i64) -> Phase {
        if at_ms < self.s.deadline_ms {
            Phase::BeforeDeadline
        } else if at_ms < self.policy.settles_at(self.s.deadline_ms) {
            Phase::Settling
        } else {
            Phase::Settled
        }
    }

    fn our_reference(&self) -> &str {
        // Bound in the same transaction that enters awaiting_fulfillment; the
        // empty string never equals a real attribution.
        self.s.attempt_reference.as_deref().unwrap_or("")
    }

    fn schedule_next(&self, checks: u32) -> FulfillmentEffect {
        FulfillmentEffect::ScheduleCheck {
            at_ms: self
                .policy
                .next_check_at(checks, self.s.deadline_ms, self.now_ms),
            checks: checks.saturating_add(1),
        }
    }

    fn wait_until(&self, at_ms: i64) -> FulfillmentEffect {
        FulfillmentEffect::ScheduleCheck {
            at_ms,
            checks: self.s.checks,
        }
    }

    fn stay(&self, effects: Vec<FulfillmentEffect>, rule: &'static str) -> FulfillmentDecision {
        D::Apply {
            new_state: S::AwaitingFulfillment,
            effects,
            rule,
        }
    }

    fn fulfil(&self, rule: &'static str) -> FulfillmentDecision {
        D::Apply {
            new_state: S::Fulfilled,
            effects: vec![Fx::Emit(FulfillmentEvent::Fulfilled)],
            rule,
        }
    }

    fn compensate(&self, reason: CompensationReason, rule: &'static str) -> FulfillmentDecision {
        D::Apply {
            new_state: S::Compensating,
            effects: vec![
                Fx::StartCompensationRefund {
                    refund_reference: compensation_refund_reference(self.our_reference()),
                    reason,
                },
                Fx::Emit(FulfillmentEvent::Compensating),
            ],
            rule,
        }
    }

    fn review(&self, reason: ReviewReason, alert: bool, rule: &'static str) -> FulfillmentDecision {
        let mut effects = vec![Fx::RecordReview { reason }];
        if alert {
            effects.push(Fx::AlertContradictoryFact);
        }
        effects.push(Fx::Emit(FulfillmentEvent::ManualReview));
        D::Apply {
            new_state: S::ManualReview,
            effects,
            rule,
        }
    }

    // ---- pending_payment ----------------------------------------------------

    fn pending(&self, input: &FulfillmentInput) -> FulfillmentDecision {
        use FulfillmentInput as I;
        match input {
            I::PaymentSucceeded { attempt_reference } => self.start(attempt_reference),
            I::CheckDue | I::Fact(_) => D::Ignore(IgnoreReason::Stale),
            I::PushConfirmation { .. } => D::Reject(FulfillmentRefusal::PaymentNotSucceeded),
            I::CompensationRefund { .. } => D::Reject(FulfillmentRefusal::NoCompensationRefund),
            I::Operator(_) => D::Reject(FulfillmentRefusal::NotUnderReview(self.s.state)),
        }
    }

    /// The payment succeeded: bind the attempt, then act as on a first check.
    fn start(&self, attempt_reference: &str) -> FulfillmentDecision {
        let mut bound = self.s.clone();
        bound.state = S::AwaitingFulfillment;
        bound.attempt_reference = Some(attempt_reference.to_owned());
        let ctx = Ctx { s: &bound, ..*self };
        match ctx.check() {
            D::Apply {
                new_state,
                mut effects,
                rule,
            } => {
                effects.insert(
                    0,
                    Fx::BindAttempt {
                        attempt_reference: attempt_reference.to_owned(),
                    },
                );
                D::Apply {
                    new_state,
                    effects,
                    rule,
                }
            }
            other => other,
        }
    }

    // ---- awaiting_fulfillment ----------------------------------------------

    fn awaiting(&self, input: &FulfillmentInput) -> FulfillmentDecision {
        use FulfillmentInput as I;
        match input {
            I::PaymentSucceeded { attempt_reference } => self.same_payment(attempt_reference),
            I::CheckDue => self.check(),
            I::Fact(reading) => self.fact(reading),
            I::PushConfirmation { attributed_to } => self.push(attributed_to),
            I::CompensationRefund { .. } => D::Reject(FulfillmentRefusal::NoCompensationRefund),
            I::Operator(_) => D::Reject(FulfillmentRefusal::NotUnderReview(self.s.state)),
        }
    }

    fn same_payment(&self, attempt_reference: &str) -> FulfillmentDecision {
        if attempt_reference == self.our_reference() {
            D::Ignore(IgnoreReason::Duplicate)
        } else {
            D::Reject(FulfillmentRefusal::AttemptMismatch {
                expected: self.our_reference().to_owned(),
                got: attempt_reference.to_owned(),
            })
        }
    }

    /// A wake-up: what to do next, by mode and deadline phase.
    fn check(&self) -> FulfillmentDecision {
        let settles_at = self.policy.settles_at(self.s.deadline_ms);
        let attempt_reference = self.our_reference().to_owned();
        match (self.s.mode, self.phase_at(self.now_ms)) {
            (FulfillmentMode::Pull, Phase::BeforeDeadline) => self.stay(
                vec![
                    Fx::CallBusinessAction {
                        attempt_reference: attempt_reference.clone(),
                        deadline_ms: self.s.deadline_ms,
                    },
                    Fx::QueryBusinessFact { attempt_reference },
                    self.schedule_next(self.s.checks),
                ],
                "before the deadline: call the business action with the attempt reference, then read the fact whatever the call returned",
            ),
            (_, Phase::Settling) | (FulfillmentMode::Push, Phase::BeforeDeadline) => self.stay(
                vec![self.wait_until(settles_at)],
                "wait until the deadline settles: no new business action, calls in flight may still commit",
            ),
            (FulfillmentMode::Pull, Phase::Settled) => self.stay(
                vec![
                    Fx::ReadFactOnceMore { attempt_reference },
                    self.schedule_next(self.s.checks),
                ],
                "the deadline passed: stop calling the business action, read the fact once more before any refund",
            ),
            // Push: the business fact is this very row; the CAS makes a
            // confirmation that lands first win over this decision.
            (FulfillmentMode::Push, Phase::Settled) => self.compensate(
                CompensationReason::FulfillmentDeadlinePassed,
                "the deadline passed without a confirmation: compensate",
            ),
        }
    }

    fn fact(&self, reading: &FactReading) -> FulfillmentDecision {
        if reading.read_started_at_ms > self.now_ms {
            return D::Reject(FulfillmentRefusal::ReadInTheFuture {
                read_started_at_ms: reading.read_started_at_ms,
                now_ms: self.now_ms,
            });
        }
        match &reading.fact {
            BusinessFact::Fulfilled { attributed_to } => self.attributed(attributed_to.as_deref()),
            BusinessFact::NotFulfilled => self.not_fulfilled(reading.read_started_at_ms),
            BusinessFact::NoAnswer(_) => self.no_answer(),
        }
    }

    /// A fact saying the goal is reached, by whom.
    fn attributed(&self, attributed_to: Option<&str>) -> FulfillmentDecision {
        match attributed_to {
            Some(r) if r == self.our_reference() => {
                self.fulfil("the business reached the goal with this payment")
            }
            Some(r) if self.s.is_sibling(r) => self.compensate(
                CompensationReason::FulfilledElsewhere,
                "the goal was reached by another payment of the same business key: this one must not claim it",
            ),
            Some(r) => self.review(
                ReviewReason::FactAttributedToUnknown {
                    reference: r.to_owned(),
                },
                true,
                "contradictory fact: attributed to an unknown reference; automation frozen",
            ),
            None => self.review(
                ReviewReason::FactWithoutAttribution,
                true,
                "contradictory fact: reached without attribution; automation frozen",
            ),
        }
    }

    fn not_fulfilled(&self, read_started_at_ms: i64) -> FulfillmentDecision {
        match (
            self.phase_at(read_started_at_ms),
            self.phase_at(self.now_ms),
        ) {
            (Phase::Settled, _) => self.compensate(
                CompensationReason::FulfillmentDeadlinePassed,
                "read after the deadline settled: still not fulfilled, compensate",
            ),
            (_, Phase::Settled) => self.read_once_more(
                "a 'not fulfilled' read before the deadline settled proves nothing now: read once more",
            ),
            _ => self.keep_asking("not fulfilled yet: ask again with backoff"),
        }
    }

    fn no_answer(&self) -> FulfillmentDecision {
        let give_up_at = self
            .policy
            .settles_at(self.s.deadline_ms)
            .saturating_add(self.policy.unanswered_review_after_ms.max(0));
        if self.now_ms >= give_up_at {
            return self.review(
                ReviewReason::FactUnavailable,
                false,
                "no explicit business answer long after the deadline: a human decides, never a blind refund",
            );
        }
        if self.phase_at(self.now_ms) == Phase::Settled {
            return self.read_once_more(
                "a timeout or an error is not 'not fulfilled': read once more later",
            );
        }
        self.keep_asking("a timeout or an error is not 'not fulfilled': ask again with backoff")
    }

    fn read_once_more(&self, rule: &'static str) -> FulfillmentDecision {
        self.stay(
            vec![
                Fx::ReadFactOnceMore {
                    attempt_reference: self.our_reference().to_owned(),
                },
                self.schedule_next(self.s.checks),
            ],
            rule,
        )
    }

    fn keep_asking(&self, rule: &'static str) -> FulfillmentDecision {
        self.stay(vec![self.schedule_next(self.s.checks)], rule)
    }

    fn push(&self, attributed_to: &str) -> FulfillmentDecision {
        if attributed_to == self.our_reference() {
            self.fulfil("the merchant confirmed the goal reached with this payment")
        } else if self.s.is_sibling(attributed_to) {
            self.compensate(
                CompensationReason::FulfilledElsewhere,
                "the merchant confirmed the goal reached by another payment: compensate this one",
            )
        } else {
            // A merchant's typo must not freeze automation: refuse the call.
            D::Reject(FulfillmentRefusal::UnknownAttempt {
                reference: attributed_to.to_owned(),
            })
        }
    }

    // ---- fulfilled ----------------------------------------------------------

    fn fulfilled(&self, input: &FulfillmentInput) -> FulfillmentDecision {
        use FulfillmentInput as I;
        let ours = self.our_reference();
        match input {
            I::PaymentSucceeded { attempt_reference } => self.same_payment(attempt_reference),
            I::CheckDue => D::Ignore(IgnoreReason::Stale),
            I::Fact(FactReading {
                fact: BusinessFact::Fulfilled { attributed_to },
                ..
            }) => {
                if attributed_to.as_deref() == Some(ours) {
                    D::Ignore(IgnoreReason::Duplicate)
                } else {
                    D::NeedsReview(ReviewReason::AttributionChanged {
                        recorded: ours.to_owned(),
                        reported: attributed_to.clone(),
                    })
                }
            }
            I::Fact(_) => D::Ignore(IgnoreReason::Stale),
            I::PushConfirmation { attributed_to } if attributed_to == ours => {
                D::Ignore(IgnoreReason::Duplicate)
            }
            I::PushConfirmation { .. } => D::Reject(FulfillmentRefusal::AlreadyFulfilled {
                attributed_to: ours.to_owned(),
            }),
            I::CompensationRefund { .. } => D::Reject(FulfillmentRefusal::NoCompensationRefund),
            I::Operator(_) => D::Reject(FulfillmentRefusal::NotUnderReview(self.s.state)),
        }
    }

    // ---- compensating / compensated ---------------------------------------

    fn compensating(&self, input: &FulfillmentInput) -> FulfillmentDecision {
        use FulfillmentInput as I;
        let Some(compensation) = &self.s.compensation else {
            return D::Reject(FulfillmentRefusal::NoCompensationRefund);
        };
        match input {
            I::PaymentSucceeded { attempt_reference } => self.same_payment(attempt_reference),
            // The refund's own recovery (UNKNOWN → query) drives it; a second
            // trigger must not start a second refund.
            I::CheckDue => D::Ignore(IgnoreReason::Duplicate),
            I::Fact(reading) => {
                self.fact_after_compensation(reading, ReviewReason::FulfilledWhileCompensating)
            }
            I::PushConfirmation { .. } => D::Reject(FulfillmentRefusal::RefundInProgress {
                refund_reference: compensation.refund_reference.clone(),
                reason: compensation.reason,
            }),
            I::CompensationRefund {
                refund_reference,
                outcome,
            } => self.refund_outcome(compensation, refund_reference, *outcome),
            I::Operator(_) => D::Reject(FulfillmentRefusal::NotUnderReview(self.s.state)),
        }
    }

    fn refund_outcome(
        &self,
        compensation: &Compensation,
        refund_reference: &str,
        outcome: CompensationRefundOutcome,
    ) -> FulfillmentDecision {
        if refund_reference != compensation.refund_reference {
            return D::Reject(FulfillmentRefusal::NotTheCompensationRefund {
                expected: compensation.refund_reference.clone(),
                got: refund_reference.to_owned(),
            });
        }
        match outcome {
            CompensationRefundOutcome::Succeeded => D::Apply {
                new_state: S::Compensated,
                effects: vec![Fx::Emit(FulfillmentEvent::Compensated)],
                rule: "the compensation refund succeeded: the money is back",
            },
            // Retrying the same reference replays the failure and a new
            // reference would be a second refund: a human decides.
            CompensationRefundOutcome::Failed => self.review(
                ReviewReason::CompensationRefundFailed {
                    refund_reference: refund_reference.to_owned(),
                },
                false,
                "the compensation refund failed definitively: a human decides",
            ),
            CompensationRefundOutcome::Unknown => D::Ignore(IgnoreReason::Duplicate),
        }
    }

    /// A business fact once the money is (being) returned: never moves the
    /// state; a fact crediting this payment contradicts the refund.
    fn fact_after_compensation(
        &self,
        reading: &FactReading,
        credited_to_us: ReviewReason,
    ) -> FulfillmentDecision {
        match &reading.fact {
            BusinessFact::Fulfilled {
                attributed_to: Some(r),
            } if self.s.is_sibling(r) => D::Ignore(IgnoreReason::Stale),
            BusinessFact::Fulfilled {
                attributed_to: Some(r),
            } if r == self.our_reference() => D::NeedsReview(credited_to_us),
            BusinessFact::Fulfilled {
                attributed_to: Some(r),
            } => D::NeedsReview(ReviewReason::FactAttributedToUnknown {
                reference: r.clone(),
            }),
            BusinessFact::Fulfilled {
                attributed_to: None,
            } => D::NeedsReview(ReviewReason::FactWithoutAttribution),
            BusinessFact::NotFulfilled | BusinessFact::NoAnswer(_) => {
                D::Ignore(IgnoreReason::Stale)
            }
        }
    }

    fn compensated(&self, input: &FulfillmentInput) -> FulfillmentDecision {
        use FulfillmentInput as I;
        let Some(compensation) = &self.s.compensation else {
            return D::Reject(FulfillmentRefusal::NoCompensationRefund);
        };
        match input {
            I::PaymentSucceeded { attempt_reference } => self.same_payment(attempt_reference),
            I::CheckDue => D::Ignore(IgnoreReason::Stale),
            I::Fact(reading) => {
                self.fact_after_compensation(reading, ReviewReason::FulfilledAfterCompensation)
            }
            I::PushConfirmation { .. } => D::Reject(FulfillmentRefusal::Refunded {
                refund_reference: compensation.refund_reference.clone(),
                reason: compensation.reason,
            }),
            I::CompensationRefund {
                refund_reference,
                outcome,
            } => {
                if *refund_reference != compensation.refund_reference {
                    D::Reject(FulfillmentRefusal::NotTheCompensationRefund {
                        expected: compensation.refund_reference.clone(),
                        got: refund_reference.clone(),
                    })
                } else if *outcome == CompensationRefundOutcome::Succeeded {
                    D::Ignore(IgnoreReason::Duplicate)
                } else {
                    D::Ignore(IgnoreReason::Stale)
                }
            }
            I::Operator(_) => D::Reject(FulfillmentRefusal::NotUnderReview(self.s.state)),
        }
    }

    // ---- manual_review ------------------------------------------------------

    fn manual_review(&self, input: &FulfillmentInput) -> FulfillmentDecision {
        use FulfillmentInput as I;
        match input {
            I::PaymentSucceeded { attempt_reference } => self.same_payment(attempt_reference),
            // Automation is frozen: news is recorded, nothing moves.
            I::CheckDue | I::Fact(_) | I::CompensationRefund { .. } => {
                D::Ignore(IgnoreReason::Stale)
            }
            I::PushConfirmation { .. } => {
                D::Reject(FulfillmentRefusal::UnderReview(self.s.review.clone()))
            }
            I::Operator(resolution) => self.resolve(resolution),
        }
    }

    fn resolve(&self, resolution: &OperatorResolution) -> FulfillmentDecision {
        match resolution {
            OperatorResolution::Fulfilled => {
                self.fulfil("an operator proved the goal reached by this payment")
            }
            OperatorResolution::Compensate { reason } => match &self.s.compensation {
                Some(existing) => D::Reject(FulfillmentRefusal::CompensationAlreadyStarted {
                    refund_reference: existing.refund_reference.clone(),
                }),
                None => self.compensate(*reason, "an operator decided to compensate"),
            },
            OperatorResolution::RefundedManually { .. } => D::Apply {
                new_state: S::Compensated,
                effects: vec![Fx::Emit(FulfillmentEvent::Compensated)],
                rule: "an operator recorded the manual refund that returned the money",
            },
            OperatorResolution::ResumeAutomation => match &self.s.compensation {
                Some(existing) => D::Reject(FulfillmentRefusal::CompensationAlreadyStarted {
                    refund_reference: existing.refund_reference.clone(),
                }),
                None => self.stay(
                    vec![self.wait_until(self.now_ms.saturating_add(1))],
                    "an operator handed the payment back to automation",
                ),
            },
        }
    }
}
