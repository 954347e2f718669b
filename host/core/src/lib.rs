//! Sluice's pure payment core.
//!
//! Everything here is deterministic: no IO, no clock, no randomness, no async.
//! Callers pass in a snapshot and a normalised event (or a command) and get
//! back a [`Decision`]; anything time-dependent (deadlines, expiry) is decided
//! by the caller and arrives as a command.
//!
//! # Where things live
//!
//! - [`matrix`]: the transition matrices **as data**: [`matrix::ATTEMPT_MATRIX`],
//!   [`matrix::REFUND_MATRIX`], [`matrix::CAPTURE_MATRIX`], one commented row
//!   per rule, to be audited against seed 001 §3. Its module doc lists where
//!   and why they go beyond the seed's table.
//! - [`decide`]: `decide_attempt`, `decide_refund`, `decide_capture` (the
//!   steps every decision follows) and [`decide::ORDER_MIRROR`], the table of
//!   how the order follows its current attempt.
//! - [`command`]: order commands (`StartAttempt`, `Cancel`, `Expire`,
//!   `GiveUp`) and the capture / refund / void requests with their amount
//!   reservations.
//! - [`amounts`]: the payment's amount summary and its invariants.
//! - [`projection`]: what a client is told.
//! - [`fulfillment`]: the fulfillment lifecycle of a payment that buys a
//!   business goal (issue 7): attribution, deadline, compensation refund.
//! - [`failure_table`]: per wire format, what a PSP's failure code means
//!   and whether routing may try another account after it (data, with a
//!   merchant override), and the one lookup [`classify_failure`].
//! - [`routing`]: a merchant's routing rules as data, the deterministic plan
//!   of accounts for a payment ([`plan_route`]) and the failover step
//!   ([`next_step`]): seed 001 §9's hard rule, never while an attempt is
//!   unresolved.
//! - [`breaker`]: the circuit breaker of a connector account (or an adapter)
//!   as a pure state machine over the host's clock: a window of call
//!   outcomes opens it, half-open probes close it.
//! - [`recovery`]: what the recovery scanner does with a pending attempt,
//!   refund or capture (issue 6), and the outbox redelivery schedule.
//! - [`explain`]: what happens next to a payment (issue 16): who moves each
//!   open aggregate, when, with which reference, and the money held, from
//!   stored facts and the recovery and fulfillment policies.
//! - [`reconcile`]: our records of one account and period against the PSP's
//!   settlement report, joined by stable identities only; every difference
//!   classified, with its one safe repair or none (issue 14).
//! - [`retry_budget`]: the scanner's retry budget per PSP, a token bucket
//!   over the caller's clock, and how far a row it refuses is pushed.
//!
//! # The one-door rule
//!
//! Nothing in Sluice changes a state except the store applying a decision
//! from this crate, inside one transaction: inbox dedupe → read snapshot →
//! `decide_*` → CAS on version(s) → append history → apply the effects
//! (amount movements, outbox events, query schedule) → commit. A decision
//! whose `cascade` names the order, or whose effects move money
//! ([`Effect::moves_money`]), also CASes the order row (its version guards the
//! amounts). A CAS that misses means "re-read and decide again", never "retry
//! the write". This crate never performs an effect itself.
//!
//! # Key choices
//!
//! - UNKNOWN lives only on attempts, refunds and captures; the order stays
//!   PROCESSING. UNKNOWN is left only on verified (webhook, query) or operator
//!   evidence.
//! - An attempt's FAILED is not the order's: the order stays PROCESSING, open
//!   for a new attempt, until the orchestrator sends `GiveUp` (→ FAILED),
//!   `Cancel` or `Expire`. A new attempt is allowed only when the latest one
//!   is FAILED or CANCELED, never while one is UNKNOWN.
//! - Terminal states are never left. Contradicting evidence (a success after
//!   a definitive failure, or the reverse) is `NeedsReconciliation`, never
//!   last-writer-wins; an operator cannot overwrite a terminal state either.
//! - Payment succeeded ≠ settled; a succeeded refund never touches the
//!   payment's state, only the amounts.

pub mod amounts;
pub mod breaker;
pub mod card_number;
pub mod command;
pub mod decide;
pub mod decision;
pub mod event;
pub mod explain;
pub mod failure_table;
pub mod fulfillment;
pub mod matrix;
pub mod money;
pub mod projection;
pub mod reconcile;
pub mod recovery;
pub mod retry_budget;
pub mod routing;
pub mod snapshot;
pub mod state;

pub use amounts::{AmountError, Amounts};
pub use breaker::{Breaker, BreakerPolicy, BreakerState, BreakerTransition, CallHealth};
pub use command::{
    cancel_unsent_refund, decide_order, request_capture, request_refund, request_void,
    OrderCommand, RequestRefused,
};
pub use decide::{decide_attempt, decide_capture, decide_refund, order_after, route_event};
pub use decision::{
    Aggregate, Cascade, Decision, Effect, IgnoreReason, OutboxEvent, ReconciliationReason,
    RejectReason,
};
pub use event::{
    EventIdentity, EventKind, EvidenceSource, Failure, FailureCategory, PaymentEvent,
    NOT_FOUND_CODE,
};
pub use explain::{
    explain_next, DeadlineAhead, ExplainPolicy, FulfillmentFacts, Hold, ItemFacts, MoneyHeld,
    Mover, NextExplanation, PaymentFacts, PendingProposal, ReviewNext, StepAggregate, StepAhead,
};
pub use failure_table::{
    classify_failure, FailureClass, FailureOverride, FailureVerdict, VerdictSource,
    CREDENTIALS_REFUSED_CODE,
};
pub use fulfillment::{
    compensation_refund_reference, decide_fulfillment, guard_compensation, BusinessFact,
    Compensation, CompensationReason, CompensationRefundOutcome, FactReading, FulfillmentDecision,
    FulfillmentEffect, FulfillmentEvent, FulfillmentInput, FulfillmentMode, FulfillmentPolicy,
    FulfillmentRefusal, FulfillmentSnapshot, FulfillmentState, NoAnswer, OperatorResolution,
    ReviewReason,
};
pub use money::{Currency, Money, MoneyError};
pub use projection::{
    client_status, refund_client_status, refund_reason, ClientStatus, PaymentView,
};
pub use reconcile::{
    reconcile, Difference, DifferenceClass, LineType, OurAction, OurAttempt, OurFulfillment,
    OurRecords, PspLine, Reconciliation, SafeRepair,
};
pub use recovery::{
    authorization_expires_at, decide_recovery, decide_resend, outbox_retry_delay,
    OutboxRetryPolicy, PendingItem, PendingState, RecoveryAction, RecoveryPolicy, Resend,
    ResendCheck, DEFAULT_AUTHORIZATION_VALIDITY_MS,
};
pub use retry_budget::{defer_delay_ms, RetryBudgetPolicy, TokenBucket};
pub use routing::{
    next_step, plan_route, AttemptFact, FailoverInput, NextStep, PlanEntry, RouteConditions,
    RouteInput, RouteRule, RoutingConfig, RoutingConfigError, RoutingPlan, Stop, WeightedAccount,
};
pub use snapshot::{AttemptSnapshot, CaptureMode, CaptureSnapshot, OrderSnapshot, RefundSnapshot};
pub use state::{AttemptState, CaptureState, OrderState, RefundState};
