//! The recovery scanner's policy (issue 6; seed 001 §9, seed 000 §9–§10) and
//! the outbox delivery schedule. Pure: `now_ms` and the jitter are inputs.
//!
//! The scanner reads the dynamic pending set (non-terminal attempts, refunds
//! and captures whose `next_retry_time` has passed) and asks
//! [`decide_recovery`] what to do with each item:
//!
//! | item state                                   | action                                                     |
//! |----------------------------------------------|------------------------------------------------------------|
//! | attempt CREATED / SUBMITTED, past its timeout | `QueryPsp` with the original reference                    |
//! | attempt PROCESSING, past its timeout          | `QueryPsp`                                                 |
//! | refund / capture CREATED or PROCESSING, past its timeout | `QueryPsp` with the original refund / capture reference |
//! | any UNKNOWN, due by its backoff               | `QueryWithBackoff` (exponential, jittered, capped)         |
//! | any UNKNOWN older than `max_unknown_age_ms`   | `EscalateToManualReview` (querying goes on, slowly)        |
//! | anything else still open (not AUTHORIZED) older than `max_unknown_age_ms` | `EscalateToManualReview` once, then the same queries and expiry |
//! | attempt REQUIRES_ACTION past its expiry       | `ExpireRequiresAction`: close the attempt, order EXPIRED   |
//! | attempt AUTHORIZED, within its validity       | `NotYet` until the authorization expires (the merchant captures or voids meanwhile) |
//! | attempt AUTHORIZED, past its validity         | `ExpireAuthorization`: query, then void what the PSP still holds |
//! | attempt AUTHORIZED with a void recorded as sent | `QueryPsp` after the send timeout (the orchestrator re-sends the void, same key, while the PSP still holds the funds); `EscalateToManualReview` once the void is older than `max_unknown_age_ms` |
//! | anything not due yet                          | `NotYet { next_retry_at_ms }`                              |
//! | any terminal state                            | `Nothing`                                                  |
//!
//! An authorization's validity is `authorized_at + validity` (the connector
//! account's or adapter's setting, else `authorization_validity_ms`, 7 days:
//! Stripe cancels an uncaptured PaymentIntent after 7 days, card schemes hold
//! most authorizations 7 days or more). At expiry the scanner first queries:
//! the PSP may have expired it already (PAYMENT_CANCELED closes the attempt and
//! the order), or it was captured elsewhere (PAYMENT_SUCCEEDED). Only if the
//! PSP still holds the funds is the authorization voided, recorded as sent
//! through the door first, so the order always reaches CANCELED (or a person,
//! if the PSP never confirms the void) with the reason in its history.
//!
//! [`decide_resend`] is the one exception to "never send again", and it sends
//! nothing new: after a query proved the PSP has no such payment (seed 000 §6:
//! "渠道明确表示不存在且协议允许安全重试时，才可以使用相同单号再次发起扣款"), the
//! original request is re-sent with the same reference (the PSP's idempotency
//! key) while the attempt is younger than the PSP's key retention. A capture
//! is re-sent the same way when the query shows the payment still authorized
//! and the capture still open: a process killed between recording it as sent
//! and sending it left the PSP without it, and the same key either returns
//! the PSP's stored answer or captures once.
//!
//! No action ever creates a new charge, refund or capture: an unresolved
//! outcome is only ever queried with the reference it was sent with (seed
//! 001 §9: "存在未收敛的 UNKNOWN Attempt 时，不自动创建可能导致再次扣款的新 Attempt").
//! Every action that keeps the item pending names its next retry time, always
//! strictly after `now_ms`, so a row is never scanned in a tight loop.
//!
//! Jitter is an input in `[0, 1)` drawn by the caller (one draw per item), so
//! thousands of items that went UNKNOWN in the same PSP outage do not come
//! back in one wave (seed 000 §15: "重试预算与退避不能形成第二次洪峰").
//! Out-of-range or NaN jitter is clamped, never a panic.

use serde::{Deserialize, Serialize};

use crate::decision::Aggregate;
use crate::state::{AttemptState, CaptureState, RefundState};

/// The state of a pending item, by aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PendingState {
    Attempt(AttemptState),
    Refund(RefundState),
    Capture(CaptureState),
}

impl PendingState {
    pub fn aggregate(&self) -> Aggregate {
        match self {
            PendingState::Attempt(_) => Aggregate::Attempt,
            PendingState::Refund(_) => Aggregate::Refund,
            PendingState::Capture(_) => Aggregate::Capture,
        }
    }

    pub fn is_terminal(&self) -> bool {
        match self {
            PendingState::Attempt(s) => s.is_terminal(),
            PendingState::Refund(s) => s.is_terminal(),
            PendingState::Capture(s) => s.is_terminal(),
        }
    }

    pub fn is_unknown(&self) -> bool {
        matches!(
            self,
            PendingState::Attempt(AttemptState::Unknown)
                | PendingState::Refund(RefundState::Unknown)
                | PendingState::Capture(CaptureState::Unknown)
        )
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            PendingState::Attempt(s) => s.as_str(),
            PendingState::Refund(s) => s.as_str(),
            PendingState::Capture(s) => s.as_str(),
        }
    }
}

/// What the scanner read about one pending item (from the primary).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingItem {
    pub state: PendingState,
    /// The host's stable reference (attempt, refund or capture): the only
    /// thing a query may use.
    pub reference: String,
    pub created_at_ms: i64,
    /// The last request or query sent to the PSP for this item, if any.
    pub last_attempt_at_ms: Option<i64>,
    /// Queries made so far (drives the backoff).
    pub retry_count: u32,
    /// REQUIRES_ACTION: when the customer's step expires, if the PSP said.
    pub expires_at_ms: Option<i64>,
    /// Already flagged for an operator (so it is not escalated again).
    pub in_manual_review: bool,
    /// AUTHORIZED: when the authorization was recorded (None: use creation).
    pub authorized_at_ms: Option<i64>,
    /// AUTHORIZED: how long this connector's authorizations hold (None: the
    /// policy's `authorization_validity_ms`).
    pub authorization_validity_ms: Option<i64>,
    /// AUTHORIZED: when a void was recorded as sent, if one was.
    pub void_requested_at_ms: Option<i64>,
}

impl PendingItem {
    /// A pending item with only its state, reference and creation time; the
    /// other facts are filled in with struct-update syntax where known.
    pub fn new(state: PendingState, reference: &str, created_at_ms: i64) -> Self {
        PendingItem {
            state,
            reference: reference.to_owned(),
            created_at_ms,
            last_attempt_at_ms: None,
            retry_count: 0,
            expires_at_ms: None,
            in_manual_review: false,
            authorized_at_ms: None,
            authorization_validity_ms: None,
            void_requested_at_ms: None,
        }
    }
}

/// The knobs of the recovery scanner. All durations in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryPolicy {
    /// A request sent (or about to be) with no answer for this long is queried.
    pub submitted_timeout_ms: i64,
    /// A PSP that said "processing" is asked again after this long.
    pub processing_timeout_ms: i64,
    /// First backoff step for queries; doubles with every query.
    pub base_backoff_ms: i64,
    /// Cap of the backoff.
    pub max_backoff_ms: i64,
    /// An UNKNOWN older than this (since the item was created) goes to an
    /// operator; queries go on at the capped backoff.
    pub max_unknown_age_ms: i64,
    /// REQUIRES_ACTION expiry when the PSP named none.
    pub requires_action_ttl_ms: i64,
    /// How long an authorization holds when its connector names no validity.
    pub authorization_validity_ms: i64,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        RecoveryPolicy {
            submitted_timeout_ms: 30_000,
            processing_timeout_ms: 2 * 60_000,
            base_backoff_ms: 15_000,
            max_backoff_ms: 3_600_000,
            max_unknown_age_ms: 24 * 3_600_000,
            requires_action_ttl_ms: 3_600_000,
            authorization_validity_ms: DEFAULT_AUTHORIZATION_VALIDITY_MS,
        }
    }
}

/// Seven days: Stripe cancels an uncaptured PaymentIntent after 7 days, and
/// card schemes guarantee most authorizations at least that long.
pub const DEFAULT_AUTHORIZATION_VALIDITY_MS: i64 = 7 * 24 * 3_600_000;

/// What the scanner does with one item.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RecoveryAction {
    /// Query the PSP with the original reference; store `next_retry_at_ms`.
    QueryPsp {
        reference: String,
        next_retry_at_ms: i64,
    },
    /// UNKNOWN: query with the original reference, next time after a longer,
    /// jittered wait.
    QueryWithBackoff {
        reference: String,
        next_retry_at_ms: i64,
    },
    /// UNKNOWN for too long (or a capture or refund still open that long):
    /// flag for an operator (with the timeline). The
    /// item stays pending and is still queried at `next_retry_at_ms`.
    EscalateToManualReview {
        reference: String,
        age_ms: i64,
        next_retry_at_ms: i64,
    },
    /// The customer's step expired: query once more (the customer may have
    /// finished), then cancel it at the PSP with the original reference; the
    /// PSP's cancel closes the attempt through the one door and the order
    /// becomes EXPIRED (`OrderCommand::Expire`). If that does not finish,
    /// the item is back at `next_retry_at_ms`.
    ExpireRequiresAction {
        reference: String,
        next_retry_at_ms: i64,
    },
    /// The authorization's validity ended (`expired_at_ms`): query once more
    /// (the PSP may have expired or captured it), then void what the PSP
    /// still holds, recorded as sent through the door before the call. If that
    /// does not finish, the item is back at `next_retry_at_ms` and follows the
    /// void.
    ExpireAuthorization {
        reference: String,
        expired_at_ms: i64,
        next_retry_at_ms: i64,
    },
    /// Not due yet.
    NotYet { next_retry_at_ms: i64 },
    /// Nothing for the scanner: terminal, or waiting on the merchant.
    Nothing,
}

impl RecoveryAction {
    /// When the item must be looked at again, if it stays pending.
    pub fn next_retry_at_ms(&self) -> Option<i64> {
        match self {
            RecoveryAction::QueryPsp {
                next_retry_at_ms, ..
            }
            | RecoveryAction::QueryWithBackoff {
                next_retry_at_ms, ..
            }
            | RecoveryAction::EscalateToManualReview {
                next_retry_at_ms, ..
            }
            | RecoveryAction::ExpireRequiresAction {
                next_retry_at_ms, ..
            }
            | RecoveryAction::ExpireAuthorization {
                next_retry_at_ms, ..
            }
            | RecoveryAction::NotYet { next_retry_at_ms } => Some(*next_retry_at_ms),
            RecoveryAction::Nothing => None,
        }
    }

    /// The reference the PSP is contacted with now, if it is contacted.
    pub fn psp_reference_used(&self) -> Option<&str> {
        match self {
            RecoveryAction::QueryPsp { reference, .. }
            | RecoveryAction::QueryWithBackoff { reference, .. }
            | RecoveryAction::ExpireRequiresAction { reference, .. }
            | RecoveryAction::ExpireAuthorization { reference, .. } => Some(reference),
            RecoveryAction::EscalateToManualReview { .. }
            | RecoveryAction::NotYet { .. }
            | RecoveryAction::Nothing => None,
        }
    }

    /// A short stable label for metrics (`scanner_actions_total{action=...}`).
    pub fn label(&self) -> &'static str {
        match self {
            RecoveryAction::QueryPsp { .. } => "query_psp",
            RecoveryAction::QueryWithBackoff { .. } => "query_with_backoff",
            RecoveryAction::EscalateToManualReview { .. } => "escalate_to_manual_review",
            RecoveryAction::ExpireRequiresAction { .. } => "expire_requires_action",
            RecoveryAction::ExpireAuthorization { .. } => "expire_authorization",
            RecoveryAction::NotYet { .. } => "not_yet",
            RecoveryAction::Nothing => "nothing",
        }
    }
}

const PPM: i64 = 1_000_000;

/// A jitter in `[0, 1)` as parts per million; NaN and out-of-range values
/// are clamped (NaN counts as 0).
fn jitter_ppm(jitter: f64) -> i64 {
    if jitter.is_nan() || jitter <= 0.0 {
        0
    } else if jitter >= 1.0 {
        PPM - 1
    } else {
        // In (0, 1): the product is in (0, 1e6), exact enough and in range.
        ((jitter * PPM as f64) as i64).clamp(0, PPM - 1)
    }
}

/// `part` of `whole` in parts per million, without overflow.
fn scale(whole: i64, ppm: i64) -> i64 {
    let scaled = i128::from(whole) * i128::from(ppm) / i128::from(PPM);
    i64::try_from(scaled).unwrap_or(i64::MAX)
}

/// `base · 2^exponent`, capped at `cap` (both at least 1 ms).
fn exponential(base: i64, exponent: u32, cap: i64) -> i64 {
    let base = base.max(1);
    let cap = cap.max(base);
    let factor = 1i64.checked_shl(exponent.min(62)).unwrap_or(i64::MAX);
    base.saturating_mul(factor).min(cap)
}

impl RecoveryPolicy {
    /// The un-jittered backoff after `retries` queries: `base · 2^retries`,
    /// capped at `max_backoff_ms`.
    pub fn nominal_backoff(&self, retries: u32) -> i64 {
        exponential(self.base_backoff_ms, retries, self.max_backoff_ms)
    }

    /// The jittered backoff after `retries` queries ("equal jitter"): in
    /// `[nominal / 2, nominal)`, never 0, monotone in `retries` for a fixed
    /// jitter, never above `max_backoff_ms`.
    pub fn backoff_delay(&self, retries: u32, jitter: f64) -> i64 {
        let nominal = self.nominal_backoff(retries);
        let half = nominal / 2;
        (half + scale(nominal - half, jitter_ppm(jitter))).max(1)
    }

    /// The shortest backoff any jitter can give: an item scheduled with any
    /// jitter is due when its stored time comes.
    fn backoff_floor(&self, retries: u32) -> i64 {
        self.backoff_delay(retries, 0.0)
    }
}

/// What the recovery scanner does with `item` at `now_ms`.
pub fn decide_recovery(
    item: &PendingItem,
    now_ms: i64,
    jitter: f64,
    policy: &RecoveryPolicy,
) -> RecoveryAction {
    use AttemptState as A;
    if item.state.is_terminal() {
        return RecoveryAction::Nothing;
    }
    if item.state.is_unknown() {
        return unknown(item, now_ms, jitter, policy);
    }
    // Anything else still open past the same age goes to an operator too
    // (AUTHORIZED has its own watch): a capture or refund recorded as sent by
    // a process that died before sending stays PROCESSING (a query shows
    // nothing captured or refunded, which proves nothing either way) with its
    // amount reserved; an attempt whose PSP only reports by webhook, when
    // that webhook never came, is answered by every query with the original
    // reply (the simulator found both). Queries go on; the flag is raised once.
    if matches!(
        item.state,
        PendingState::Capture(_)
            | PendingState::Refund(_)
            | PendingState::Attempt(A::Created | A::Submitted | A::Processing | A::RequiresAction)
    ) {
        let age_ms = now_ms.saturating_sub(item.created_at_ms);
        if !item.in_manual_review && age_ms >= policy.max_unknown_age_ms {
            return RecoveryAction::EscalateToManualReview {
                reference: item.reference.clone(),
                age_ms,
                next_retry_at_ms: after(
                    now_ms,
                    policy.backoff_delay(item.retry_count.saturating_add(1), jitter),
                ),
            };
        }
    }
    match item.state {
        PendingState::Attempt(A::Authorized) => authorized(item, now_ms, jitter, policy),
        PendingState::Attempt(A::RequiresAction) => requires_action(item, now_ms, jitter, policy),
        PendingState::Attempt(A::Processing)
        | PendingState::Refund(RefundState::Processing)
        | PendingState::Capture(CaptureState::Processing) => {
            query_after(item, policy.processing_timeout_ms, now_ms, jitter, policy)
        }
        // CREATED / SUBMITTED: a request may have left without its answer
        // being recorded; a query with the same reference is always safe.
        _ => query_after(item, policy.submitted_timeout_ms, now_ms, jitter, policy),
    }
}

/// When the last contact (or the creation) was.
fn anchor(item: &PendingItem) -> i64 {
    item.last_attempt_at_ms.unwrap_or(item.created_at_ms)
}

fn after(now_ms: i64, delay_ms: i64) -> i64 {
    now_ms.saturating_add(delay_ms.max(1))
}

fn query_after(
    item: &PendingItem,
    timeout_ms: i64,
    now_ms: i64,
    jitter: f64,
    policy: &RecoveryPolicy,
) -> RecoveryAction {
    let timeout_ms = timeout_ms.max(1);
    let due_at =
        anchor(item).saturating_add(timeout_ms.max(policy.backoff_floor(item.retry_count)));
    if now_ms < due_at {
        return RecoveryAction::NotYet {
            next_retry_at_ms: due_at,
        };
    }
    let wait = timeout_ms.max(policy.backoff_delay(item.retry_count.saturating_add(1), jitter));
    RecoveryAction::QueryPsp {
        reference: item.reference.clone(),
        next_retry_at_ms: after(now_ms, wait),
    }
}

fn unknown(
    item: &PendingItem,
    now_ms: i64,
    jitter: f64,
    policy: &RecoveryPolicy,
) -> RecoveryAction {
    let next_retry_at_ms = after(
        now_ms,
        policy.backoff_delay(item.retry_count.saturating_add(1), jitter),
    );
    let age_ms = now_ms.saturating_sub(item.created_at_ms);
    if !item.in_manual_review && age_ms >= policy.max_unknown_age_ms {
        return RecoveryAction::EscalateToManualReview {
            reference: item.reference.clone(),
            age_ms,
            next_retry_at_ms,
        };
    }
    let due_at = anchor(item).saturating_add(policy.backoff_floor(item.retry_count));
    if now_ms < due_at {
        return RecoveryAction::NotYet {
            next_retry_at_ms: due_at,
        };
    }
    RecoveryAction::QueryWithBackoff {
        reference: item.reference.clone(),
        next_retry_at_ms,
    }
}

fn requires_action(
    item: &PendingItem,
    now_ms: i64,
    jitter: f64,
    policy: &RecoveryPolicy,
) -> RecoveryAction {
    let expires_at = item.expires_at_ms.unwrap_or_else(|| {
        item.created_at_ms
            .saturating_add(policy.requires_action_ttl_ms.max(0))
    });
    if now_ms < expires_at {
        return RecoveryAction::NotYet {
            next_retry_at_ms: expires_at,
        };
    }
    RecoveryAction::ExpireRequiresAction {
        reference: item.reference.clone(),
        next_retry_at_ms: after(
            now_ms,
            policy.backoff_delay(item.retry_count.saturating_add(1), jitter),
        ),
    }
}

/// When `item`'s authorization stops being valid.
pub fn authorization_expires_at(item: &PendingItem, policy: &RecoveryPolicy) -> i64 {
    let validity = item
        .authorization_validity_ms
        .unwrap_or(policy.authorization_validity_ms)
        .max(0);
    item.authorized_at_ms
        .unwrap_or(item.created_at_ms)
        .saturating_add(validity)
}

/// An AUTHORIZED attempt: follow a void recorded as sent, else watch the
/// authorization's validity (module docs).
fn authorized(
    item: &PendingItem,
    now_ms: i64,
    jitter: f64,
    policy: &RecoveryPolicy,
) -> RecoveryAction {
    let next_retry_at_ms = after(
        now_ms,
        policy.backoff_delay(item.retry_count.saturating_add(1), jitter),
    );
    if let Some(requested_at) = item.void_requested_at_ms {
        let age_ms = now_ms.saturating_sub(requested_at);
        if !item.in_manual_review && age_ms >= policy.max_unknown_age_ms {
            return RecoveryAction::EscalateToManualReview {
                reference: item.reference.clone(),
                age_ms,
                next_retry_at_ms,
            };
        }
        return query_after(item, policy.submitted_timeout_ms, now_ms, jitter, policy);
    }
    let expired_at_ms = authorization_expires_at(item, policy);
    if now_ms < expired_at_ms {
        return RecoveryAction::NotYet {
            next_retry_at_ms: expired_at_ms,
        };
    }
    RecoveryAction::ExpireAuthorization {
        reference: item.reference.clone(),
        expired_at_ms,
        next_retry_at_ms,
    }
}

/// What recovery knows after querying an attempt or a refund, to decide on a
/// re-send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResendCheck {
    /// The item's state after the query's answer went through the door.
    pub state: PendingState,
    /// The query's answer proved the PSP has no payment with the reference
    /// ([`crate::PaymentEvent::proves_absence`]).
    pub query_proved_absent: bool,
    /// When the item (and so its reference) was created: never later than
    /// the first request that carried the key.
    pub created_at_ms: i64,
    pub now_ms: i64,
    /// How long the connector's PSP honours an idempotency key (less a margin):
    /// the adapter's or connector account's `resend_window_ms`. None: the
    /// protocol makes no re-send safe.
    pub resend_window_ms: Option<i64>,
}

/// Whether to re-send an attempt's original request, and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resend {
    /// Re-send the original request with the same reference (same key).
    Resend,
    /// Do not; the attempt stays as it is, and recovery goes on querying.
    Keep { reason: &'static str },
}

/// Seed 000 §6: query by the original reference first; only where the PSP
/// clearly has no such payment and its protocol makes a retry safe (the same
/// idempotency key within the PSP's retention) is the original request sent
/// again. A key older than the retention could let a second charge through,
/// so an item outside the window is never re-sent: it goes on being queried
/// and reaches an operator by age like any UNKNOWN. Attempts (SUBMITTED or
/// UNKNOWN) and refunds (PROCESSING or UNKNOWN: recorded as sent) qualify; a
/// capture does not (the contract has no capture query that could prove one
/// absent).
pub fn decide_resend(check: &ResendCheck) -> Resend {
    let open = matches!(
        check.state,
        PendingState::Attempt(AttemptState::Submitted | AttemptState::Unknown)
            | PendingState::Refund(RefundState::Processing | RefundState::Unknown)
            | PendingState::Capture(CaptureState::Processing | CaptureState::Unknown)
    );
    if !open {
        return Resend::Keep {
            reason: "the PSP reported it, or nothing can prove it absent: nothing to re-send",
        };
    }
    if !check.query_proved_absent {
        return Resend::Keep {
            reason: "the query did not prove the PSP has no such payment",
        };
    }
    let Some(window) = check.resend_window_ms.filter(|w| *w > 0) else {
        return Resend::Keep {
            reason: "the connector declares no safe re-send window",
        };
    };
    let age = check.now_ms.saturating_sub(check.created_at_ms);
    if age < 0 || age >= window {
        return Resend::Keep {
            reason: "the attempt is older than the PSP's idempotency retention",
        };
    }
    Resend::Resend
}

/// The merchant-webhook (and JetStream) redelivery schedule: exponential from
/// `first_delay_ms`, capped at `max_delay_ms`, with up to +25 % jitter on top
/// (so jitter can only lengthen the span), and `max_deliveries` deliveries in
/// all, spanning at least three days, before the event is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxRetryPolicy {
    pub first_delay_ms: i64,
    pub max_delay_ms: i64,
    /// Deliveries in all, the first one included.
    pub max_deliveries: u32,
}

impl Default for OutboxRetryPolicy {
    /// 30 s, 1 min, 2 min, … 4 h 16 min, then every 6 h: 22 deliveries over
    /// 74.5 h without jitter, at most 93.2 h with it.
    fn default() -> Self {
        OutboxRetryPolicy {
            first_delay_ms: 30_000,
            max_delay_ms: 6 * 3_600_000,
            max_deliveries: 22,
        }
    }
}

impl OutboxRetryPolicy {
    /// The wait before the next delivery, after delivery number `attempt`
    /// (counting from 1; 0 is read as 1) failed. `None`: that was the last
    /// delivery, dead-letter the event.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Option<i64> {
        let attempt = attempt.max(1);
        if attempt >= self.max_deliveries {
            return None;
        }
        let nominal = exponential(self.first_delay_ms, attempt - 1, self.max_delay_ms);
        Some(nominal.saturating_add(scale(nominal, jitter_ppm(jitter)) / 4))
    }

    /// The time from the first delivery to the last, for a constant jitter.
    pub fn total_span_ms(&self, jitter: f64) -> i64 {
        (1..self.max_deliveries.max(1))
            .filter_map(|attempt| self.delay(attempt, jitter))
            .fold(0i64, i64::saturating_add)
    }
}

/// [`OutboxRetryPolicy::delay`] with the default schedule.
pub fn outbox_retry_delay(attempt: u32, jitter: f64) -> Option<i64> {
    OutboxRetryPolicy::default().delay(attempt, jitter)
}
