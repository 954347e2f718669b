//! The transition matrices, as data.
//!
//! Each table is a list of rows: *from these states*, *on these (normalised)
//! event kinds*, *with this evidence*, the outcome is *this*, with *these
//! effects*. The first row whose states, kinds and evidence all match wins.
//! When rows match the state and kind but none accepts the evidence, the
//! event is rejected as `EvidenceNotAllowed`; when no row matches at all, it
//! is rejected as `NoRule` (the tests check that every state × kind of an
//! aggregate has a row).
//!
//! Read against seed 001 §3. Differences from the seed's table, on purpose:
//!
//! - CREATED accepts PSP outcomes like SUBMITTED does: a PSP answer is proof
//!   the request left, and a money fact must never be refused. Likewise a
//!   `RESULT_UNKNOWN` from CREATED becomes UNKNOWN: if the host ever called
//!   the PSP without first recording ATTEMPT_SUBMITTED, losing the "we may have
//!   sent it" fact could let a second charge through.
//! - UNKNOWN is left only on *verified* evidence (webhook or query) or an
//!   operator correction (seed §4, §5): the sync path is what produced the
//!   UNKNOWN, so a sync answer after it is refused and a query follows.
//! - Operator evidence (a two-person-approved correction, seed §10) may move
//!   any non-terminal state to a terminal outcome, including closing an
//!   UNKNOWN. It may not report progress, and it can never leave a terminal
//!   state: a terminal state contradicted by an operator is a reconciliation
//!   case, corrected by a new money movement (e.g. a refund), never an edit.
//! - Reconciliation evidence (a settlement report's line, issue 14) is
//!   accepted wherever any evidence is, and closes an UNKNOWN only as the
//!   success the PSP booked (payment, refund, capture): a settlement report
//!   shows money that moved, so it proves no failure. Like an operator's, it
//!   never reports progress and never leaves a terminal state.
//! - RESULT_UNKNOWN from REQUIRES_ACTION or AUTHORIZED is stale: we already
//!   know more than "no answer", and the scanner queries those states anyway.

use crate::decision::OutboxEvent;
use crate::event::{EventKind, EvidenceSource};
use crate::state::{AttemptState, CaptureState, RefundState};

/// What a matching row does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<S> {
    /// Apply: move to this state (may equal the current one).
    To(S),
    /// Ignore: the same result was already established.
    Duplicate,
    /// Ignore: older news than the current state.
    Stale,
    /// Needs reconciliation: the event contradicts an established result.
    Conflict,
}

/// The effect templates a row names; `decide` fills in the amounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fx {
    /// Authorization of the attempt's amount.
    RecordAuthorization,
    /// Sale: authorized = captured = the attempt's amount.
    RecordSale,
    VoidAuthorization,
    /// Capture reservation → captured, the capture's amount.
    SettleCapture,
    ReleaseCapture,
    /// Refund reservation → refunded, the refund's amount.
    SettleRefund,
    ReleaseRefund,
    ScheduleQuery,
    /// The host recorded a void of the authorization as sent.
    RecordVoidRequest,
    Emit(OutboxEvent),
}

/// One row of a transition matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row<S: 'static> {
    pub from: &'static [S],
    pub kinds: &'static [EventKind],
    pub evidence: &'static [EvidenceSource],
    pub outcome: Outcome<S>,
    pub effects: &'static [Fx],
    pub rule: &'static str,
}

impl<S: PartialEq> Row<S> {
    fn covers(&self, state: &S, kind: EventKind) -> bool {
        self.from.contains(state) && self.kinds.contains(&kind)
    }
}

/// How a lookup ends when no row applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    EvidenceNotAllowed,
    NoRule,
}

/// The first row matching state, kind and evidence.
pub fn resolve<S: PartialEq>(
    table: &'static [Row<S>],
    state: S,
    kind: EventKind,
    evidence: EvidenceSource,
) -> Result<&'static Row<S>, Miss> {
    let mut covered = false;
    for row in table {
        if row.covers(&state, kind) {
            if row.evidence.contains(&evidence) {
                return Ok(row);
            }
            covered = true;
        }
    }
    Err(if covered {
        Miss::EvidenceNotAllowed
    } else {
        Miss::NoRule
    })
}

use EventKind as K;
use EvidenceSource as E;

/// Any evidence, including an operator's and a settlement report's.
pub const ANY: &[EvidenceSource] = &[
    E::SyncResponse,
    E::Webhook,
    E::Query,
    E::Operator,
    E::Reconciliation,
];
/// Evidence from the PSP (not an operator): progress may only be reported by the PSP.
pub const PSP: &[EvidenceSource] = &[E::SyncResponse, E::Webhook, E::Query];
/// Verified evidence that may resolve an UNKNOWN into progress.
pub const VERIFIED: &[EvidenceSource] = &[E::Webhook, E::Query];
/// Verified evidence or an operator correction: what may close an UNKNOWN.
pub const VERIFIED_OR_OPERATOR: &[EvidenceSource] = &[E::Webhook, E::Query, E::Operator];
/// What may close an UNKNOWN as a success: verified evidence, an operator
/// correction, or the PSP's settlement report booking the money.
pub const VERIFIED_OPERATOR_OR_SETTLED: &[EvidenceSource] =
    &[E::Webhook, E::Query, E::Operator, E::Reconciliation];

/// The event kinds an attempt decides on (after capture-mode normalisation).
pub const ATTEMPT_KINDS: &[EventKind] = &[
    K::AttemptSubmitted,
    K::PaymentProcessing,
    K::CustomerActionRequired,
    K::PaymentAuthorized,
    K::PaymentSucceeded,
    K::PaymentFailed,
    K::ResultUnknown,
    K::PaymentCanceled,
    K::Chargeback,
    K::VoidSubmitted,
];

/// The event kinds a refund decides on.
pub const REFUND_KINDS: &[EventKind] = &[
    K::RefundProcessing,
    K::RefundSucceeded,
    K::RefundFailed,
    K::RefundUnknown,
];

/// The event kinds a capture decides on. "Submitted" and "processing" are the
/// capture request's own progress; RESULT_UNKNOWN is the capture call's.
pub const CAPTURE_KINDS: &[EventKind] = &[
    K::AttemptSubmitted,
    K::PaymentProcessing,
    K::PaymentCaptured,
    K::CaptureFailed,
    K::ResultUnknown,
];

mod attempt {
    use super::*;
    use AttemptState as A;

    /// States before any result, in which a PSP answer is taken at its word.
    pub const OPEN: &[AttemptState] = &[A::Created, A::Submitted, A::Processing, A::RequiresAction];

    pub const SUCCESS_EFFECTS: &[Fx] = &[Fx::RecordSale, Fx::Emit(OutboxEvent::PaymentSucceeded)];
    pub const AUTHORIZED_EFFECTS: &[Fx] = &[
        Fx::RecordAuthorization,
        Fx::Emit(OutboxEvent::PaymentAuthorized),
    ];
    pub const FAILED_EFFECTS: &[Fx] = &[Fx::Emit(OutboxEvent::PaymentAttemptFailed)];
    pub const CANCELED_EFFECTS: &[Fx] = &[Fx::Emit(OutboxEvent::PaymentAttemptCanceled)];
    pub const ACTION_EFFECTS: &[Fx] = &[Fx::Emit(OutboxEvent::PaymentRequiresAction)];
    /// Non-final progress kinds: stale once the attempt is final.
    pub const PROGRESS: &[EventKind] = &[
        K::AttemptSubmitted,
        K::PaymentProcessing,
        K::CustomerActionRequired,
        K::ResultUnknown,
    ];
}

/// The PaymentAttempt matrix (seed 001 §3, extended to every state × kind).
#[rustfmt::skip]
pub static ATTEMPT_MATRIX: &[Row<AttemptState>] = {
    use attempt::*;
    use AttemptState as A;
    use Outcome::*;
    &[
        // --- ATTEMPT_SUBMITTED -------------------------------------------------
        // Seed §3 row 1: the request to the PSP is (about to be) sent. The host
        // records this before the call, so a crash after it leads to a query.
        Row { from: &[A::Created], kinds: &[K::AttemptSubmitted], evidence: PSP, outcome: To(A::Submitted), effects: &[], rule: "request to the PSP recorded as sent" },
        Row { from: &[A::Submitted], kinds: &[K::AttemptSubmitted], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already recorded as sent" },
        // Any later state already knows more than "sent".
        Row { from: &[A::Processing, A::RequiresAction, A::Authorized, A::Unknown], kinds: &[K::AttemptSubmitted], evidence: ANY, outcome: Stale, effects: &[], rule: "'submitted' is older news than the current state" },
        // --- PAYMENT_PROCESSING (non-final progress) ----------------------------
        // REQUIRES_ACTION → PROCESSING: the customer completed the action.
        Row { from: &[A::Created, A::Submitted, A::RequiresAction], kinds: &[K::PaymentProcessing], evidence: PSP, outcome: To(A::Processing), effects: &[], rule: "the PSP is working on the payment" },
        Row { from: &[A::Processing], kinds: &[K::PaymentProcessing], evidence: ANY, outcome: Duplicate, effects: &[], rule: "still processing" },
        // A verified "still processing" proves the PSP has the payment, which is
        // more than UNKNOWN knew; it still blocks any new attempt.
        Row { from: &[A::Unknown], kinds: &[K::PaymentProcessing], evidence: VERIFIED, outcome: To(A::Processing), effects: &[], rule: "verified: the PSP has the payment and is processing it" },
        // --- CUSTOMER_ACTION_REQUIRED --------------------------------------------
        // Seed §3 row 2 (SUBMITTED/PROCESSING → REQUIRES_ACTION): 3-D Secure / redirect.
        Row { from: &[A::Created, A::Submitted, A::Processing], kinds: &[K::CustomerActionRequired], evidence: PSP, outcome: To(A::RequiresAction), effects: ACTION_EFFECTS, rule: "waiting for the customer's 3-D Secure / redirect step" },
        Row { from: &[A::RequiresAction], kinds: &[K::CustomerActionRequired], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already waiting for the customer" },
        Row { from: &[A::Unknown], kinds: &[K::CustomerActionRequired], evidence: VERIFIED, outcome: To(A::RequiresAction), effects: ACTION_EFFECTS, rule: "verified: the PSP waits for the customer" },
        // --- PAYMENT_AUTHORIZED (manual capture only; automatic capture normalises it to PROCESSING) ---
        // Seed §3 row 3.
        Row { from: OPEN, kinds: &[K::PaymentAuthorized], evidence: PSP, outcome: To(A::Authorized), effects: AUTHORIZED_EFFECTS, rule: "funds held, awaiting capture (manual capture)" },
        Row { from: &[A::Unknown], kinds: &[K::PaymentAuthorized], evidence: VERIFIED, outcome: To(A::Authorized), effects: AUTHORIZED_EFFECTS, rule: "verified: funds held, awaiting capture" },
        Row { from: &[A::Authorized], kinds: &[K::PaymentAuthorized], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already authorized" },
        // Progress after an authorization is older news.
        Row { from: &[A::Authorized], kinds: &[K::PaymentProcessing, K::CustomerActionRequired, K::ResultUnknown], evidence: ANY, outcome: Stale, effects: &[], rule: "progress is older news than the authorization" },
        // --- PAYMENT_SUCCEEDED ----------------------------------------------------
        // Seed §3 row 4: money taken (sale). Operator may assert it (controlled correction).
        Row { from: OPEN, kinds: &[K::PaymentSucceeded], evidence: ANY, outcome: To(A::Succeeded), effects: SUCCESS_EFFECTS, rule: "money taken: the sale succeeded" },
        // Seed §5: a verified query or webhook success converges UNKNOWN to SUCCEEDED.
        Row { from: &[A::Unknown], kinds: &[K::PaymentSucceeded], evidence: VERIFIED_OPERATOR_OR_SETTLED, outcome: To(A::Succeeded), effects: SUCCESS_EFFECTS, rule: "verified success resolves UNKNOWN" },
        // The PSP reports the authorization captured. Amounts move only through
        // capture records, so this moves none (refunds check captured amounts,
        // so nothing can be over-refunded meanwhile).
        Row { from: &[A::Authorized], kinds: &[K::PaymentSucceeded], evidence: ANY, outcome: To(A::Succeeded), effects: &[Fx::Emit(OutboxEvent::PaymentSucceeded)], rule: "the authorization was captured; amounts follow the capture records" },
        Row { from: &[A::Succeeded], kinds: &[K::PaymentSucceeded], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already succeeded" },
        // --- PAYMENT_FAILED (definitive only; a non-definitive failure is normalised to RESULT_UNKNOWN) ---
        // Seed §3 row 5: only an explicit PSP failure. An attempt's FAILED is not the order's.
        Row { from: OPEN, kinds: &[K::PaymentFailed], evidence: ANY, outcome: To(A::Failed), effects: FAILED_EFFECTS, rule: "the PSP definitively refused the payment; the order stays open" },
        Row { from: &[A::Unknown], kinds: &[K::PaymentFailed], evidence: VERIFIED_OR_OPERATOR, outcome: To(A::Failed), effects: FAILED_EFFECTS, rule: "verified failure resolves UNKNOWN; the order stays open" },
        // Held funds are a positive fact; a lapsed authorization is CANCELED, not FAILED.
        Row { from: &[A::Authorized], kinds: &[K::PaymentFailed], evidence: ANY, outcome: Conflict, effects: &[], rule: "a failure contradicts the authorization" },
        Row { from: &[A::Failed], kinds: &[K::PaymentFailed], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already failed" },
        // --- RESULT_UNKNOWN -----------------------------------------------------
        // Seed §3 row 6: timeout, 5xx, ambiguous answer. Query with the same reference.
        Row { from: &[A::Submitted, A::Processing], kinds: &[K::ResultUnknown], evidence: PSP, outcome: To(A::Unknown), effects: &[Fx::ScheduleQuery], rule: "no answer: query with the original reference, never charge again" },
        // See the module doc: "we may have sent it" must not be lost.
        Row { from: &[A::Created], kinds: &[K::ResultUnknown], evidence: PSP, outcome: To(A::Unknown), effects: &[Fx::ScheduleQuery], rule: "no answer to a request that may have left: query, never charge again" },
        Row { from: &[A::Unknown], kinds: &[K::ResultUnknown], evidence: ANY, outcome: Duplicate, effects: &[], rule: "still unknown" },
        Row { from: &[A::RequiresAction], kinds: &[K::ResultUnknown], evidence: ANY, outcome: Stale, effects: &[], rule: "'no answer' is less than we know: the customer must act" },
        // --- PAYMENT_CANCELED ---------------------------------------------------
        // A void: the held funds are released and the order ends CANCELED.
        Row { from: &[A::Authorized], kinds: &[K::PaymentCanceled], evidence: ANY, outcome: To(A::Canceled), effects: &[Fx::VoidAuthorization, Fx::Emit(OutboxEvent::PaymentCanceled)], rule: "void: the authorization was released" },
        // Canceled before any money was held (abandoned 3-D Secure, merchant cancel,
        // PSP expiry): like a failure, the order stays open for the orchestrator.
        Row { from: OPEN, kinds: &[K::PaymentCanceled], evidence: ANY, outcome: To(A::Canceled), effects: CANCELED_EFFECTS, rule: "canceled before any money was held; the order stays open" },
        Row { from: &[A::Unknown], kinds: &[K::PaymentCanceled], evidence: VERIFIED_OR_OPERATOR, outcome: To(A::Canceled), effects: CANCELED_EFFECTS, rule: "verified cancellation resolves UNKNOWN; the order stays open" },
        Row { from: &[A::Canceled], kinds: &[K::PaymentCanceled], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already canceled" },
        // --- CHARGEBACK -----------------------------------------------------------
        Row { from: &[A::Succeeded], kinds: &[K::Chargeback], evidence: ANY, outcome: To(A::Succeeded), effects: &[Fx::Emit(OutboxEvent::PaymentDisputed)], rule: "chargeback recorded; the payment's success stands" },
        // A chargeback proves money was taken; anywhere else it contradicts what we know.
        Row { from: &[A::Created, A::Submitted, A::Processing, A::RequiresAction, A::Authorized, A::Unknown, A::Failed, A::Canceled], kinds: &[K::Chargeback], evidence: ANY, outcome: Conflict, effects: &[], rule: "a chargeback on a payment we do not know as succeeded" },
        // --- VOID_SUBMITTED (host-only) -----------------------------------------
        // The host records a void as sent before the call (like SUBMITTED for a
        // charge): the attempt stays AUTHORIZED (only the PSP's PAYMENT_CANCELED
        // releases the funds) and the scanner queries it until the PSP says.
        // Recording it twice is a duplicate (same event identity), so only one
        // caller sends.
        Row { from: &[A::Authorized], kinds: &[K::VoidSubmitted], evidence: PSP, outcome: To(A::Authorized), effects: &[Fx::RecordVoidRequest], rule: "void of the authorization recorded as sent: a crash after it converges by query" },
        // Only an authorization can be voided; anywhere else the request was
        // built from older news (the attempt moved meanwhile) and is not sent.
        Row { from: &[A::Created, A::Submitted, A::Processing, A::RequiresAction, A::Unknown, A::Succeeded, A::Failed, A::Canceled], kinds: &[K::VoidSubmitted], evidence: ANY, outcome: Stale, effects: &[], rule: "only an authorized attempt is voided" },
        // --- terminal states absorb ---------------------------------------------
        // Seed §3 row 7: late progress after SUCCEEDED is stale, never a rollback.
        Row { from: &[A::Succeeded], kinds: &[K::AttemptSubmitted, K::PaymentProcessing, K::CustomerActionRequired, K::PaymentAuthorized, K::ResultUnknown], evidence: ANY, outcome: Stale, effects: &[], rule: "progress after success is stale; never rolls back" },
        Row { from: &[A::Succeeded], kinds: &[K::PaymentFailed, K::PaymentCanceled], evidence: ANY, outcome: Conflict, effects: &[], rule: "a failure contradicts an established success" },
        Row { from: &[A::Failed], kinds: PROGRESS, evidence: ANY, outcome: Stale, effects: &[], rule: "progress after a definitive failure is stale" },
        // Both mean "no money moved".
        Row { from: &[A::Failed], kinds: &[K::PaymentCanceled], evidence: ANY, outcome: Stale, effects: &[], rule: "canceled and failed both mean no money moved" },
        Row { from: &[A::Failed], kinds: &[K::PaymentSucceeded, K::PaymentAuthorized], evidence: ANY, outcome: Conflict, effects: &[], rule: "money evidence contradicts a definitive failure" },
        Row { from: &[A::Canceled], kinds: PROGRESS, evidence: ANY, outcome: Stale, effects: &[], rule: "progress after cancellation is stale" },
        // An authorization report after the void is older news; a failure means no money either.
        Row { from: &[A::Canceled], kinds: &[K::PaymentAuthorized, K::PaymentFailed], evidence: ANY, outcome: Stale, effects: &[], rule: "older news than the cancellation" },
        Row { from: &[A::Canceled], kinds: &[K::PaymentSucceeded], evidence: ANY, outcome: Conflict, effects: &[], rule: "a success contradicts the cancellation" },
    ]
};

/// The RefundOrder matrix. CANCELED is reached only by the host's
/// `cancel_unsent_refund` command (a refund never sent to the PSP).
#[rustfmt::skip]
pub static REFUND_MATRIX: &[Row<RefundState>] = {
    use Outcome::*;
    use RefundState as R;
    const SETTLE: &[Fx] = &[Fx::SettleRefund, Fx::Emit(OutboxEvent::RefundSucceeded)];
    const RELEASE: &[Fx] = &[Fx::ReleaseRefund, Fx::Emit(OutboxEvent::RefundFailed)];
    &[
        Row { from: &[R::Created], kinds: &[K::RefundProcessing], evidence: PSP, outcome: To(R::Processing), effects: &[], rule: "the PSP accepted the refund and is working on it" },
        Row { from: &[R::Processing], kinds: &[K::RefundProcessing], evidence: ANY, outcome: Duplicate, effects: &[], rule: "still processing" },
        Row { from: &[R::Unknown], kinds: &[K::RefundProcessing], evidence: VERIFIED, outcome: To(R::Processing), effects: &[], rule: "verified: the PSP has the refund" },
        // Seed §6: success moves the reservation into refunded.
        Row { from: &[R::Created, R::Processing], kinds: &[K::RefundSucceeded], evidence: ANY, outcome: To(R::Succeeded), effects: SETTLE, rule: "refund succeeded: reservation becomes refunded" },
        Row { from: &[R::Unknown], kinds: &[K::RefundSucceeded], evidence: VERIFIED_OPERATOR_OR_SETTLED, outcome: To(R::Succeeded), effects: SETTLE, rule: "verified success resolves UNKNOWN: reservation becomes refunded" },
        // Seed §6: a definitive failure releases the reservation.
        Row { from: &[R::Created, R::Processing], kinds: &[K::RefundFailed], evidence: ANY, outcome: To(R::Failed), effects: RELEASE, rule: "refund definitively failed: reservation released" },
        Row { from: &[R::Unknown], kinds: &[K::RefundFailed], evidence: VERIFIED_OR_OPERATOR, outcome: To(R::Failed), effects: RELEASE, rule: "verified failure resolves UNKNOWN: reservation released" },
        // Seed §6: an unknown outcome keeps the reservation and queries.
        Row { from: &[R::Created, R::Processing], kinds: &[K::RefundUnknown], evidence: PSP, outcome: To(R::Unknown), effects: &[Fx::ScheduleQuery], rule: "no answer: keep the reservation, query with the refund reference" },
        Row { from: &[R::Unknown], kinds: &[K::RefundUnknown], evidence: ANY, outcome: Duplicate, effects: &[], rule: "still unknown" },
        Row { from: &[R::Succeeded], kinds: &[K::RefundSucceeded], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already succeeded" },
        Row { from: &[R::Succeeded], kinds: &[K::RefundProcessing, K::RefundUnknown], evidence: ANY, outcome: Stale, effects: &[], rule: "progress after success is stale" },
        Row { from: &[R::Succeeded], kinds: &[K::RefundFailed], evidence: ANY, outcome: Conflict, effects: &[], rule: "a failure contradicts an established refund" },
        Row { from: &[R::Failed], kinds: &[K::RefundFailed], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already failed" },
        Row { from: &[R::Failed], kinds: &[K::RefundProcessing, K::RefundUnknown], evidence: ANY, outcome: Stale, effects: &[], rule: "progress after failure is stale" },
        Row { from: &[R::Failed], kinds: &[K::RefundSucceeded], evidence: ANY, outcome: Conflict, effects: &[], rule: "a success contradicts a definitive failure (the reservation is gone)" },
        Row { from: &[R::Canceled], kinds: &[K::RefundProcessing, K::RefundUnknown, K::RefundFailed], evidence: ANY, outcome: Stale, effects: &[], rule: "nothing was sent; no money moved" },
        Row { from: &[R::Canceled], kinds: &[K::RefundSucceeded], evidence: ANY, outcome: Conflict, effects: &[], rule: "money moved for a refund we canceled unsent" },
    ]
};

/// The Capture matrix (manual capture; one row per capture command).
#[rustfmt::skip]
pub static CAPTURE_MATRIX: &[Row<CaptureState>] = {
    use CaptureState as C;
    use Outcome::*;
    const SETTLE: &[Fx] = &[Fx::SettleCapture, Fx::Emit(OutboxEvent::PaymentCaptured)];
    const RELEASE: &[Fx] = &[Fx::ReleaseCapture, Fx::Emit(OutboxEvent::CaptureFailed)];
    &[
        Row { from: &[C::Created], kinds: &[K::AttemptSubmitted, K::PaymentProcessing], evidence: PSP, outcome: To(C::Processing), effects: &[], rule: "capture request sent / being processed" },
        Row { from: &[C::Processing], kinds: &[K::AttemptSubmitted, K::PaymentProcessing], evidence: ANY, outcome: Duplicate, effects: &[], rule: "still processing" },
        Row { from: &[C::Unknown], kinds: &[K::PaymentProcessing], evidence: VERIFIED, outcome: To(C::Processing), effects: &[], rule: "verified: the PSP has the capture" },
        Row { from: &[C::Unknown], kinds: &[K::AttemptSubmitted], evidence: ANY, outcome: Stale, effects: &[], rule: "'submitted' is older news than UNKNOWN" },
        Row { from: &[C::Created, C::Processing], kinds: &[K::PaymentCaptured], evidence: ANY, outcome: To(C::Succeeded), effects: SETTLE, rule: "capture succeeded: reservation becomes captured" },
        Row { from: &[C::Unknown], kinds: &[K::PaymentCaptured], evidence: VERIFIED_OPERATOR_OR_SETTLED, outcome: To(C::Succeeded), effects: SETTLE, rule: "verified success resolves UNKNOWN: reservation becomes captured" },
        Row { from: &[C::Created, C::Processing], kinds: &[K::CaptureFailed], evidence: ANY, outcome: To(C::Failed), effects: RELEASE, rule: "capture definitively failed: reservation released" },
        Row { from: &[C::Unknown], kinds: &[K::CaptureFailed], evidence: VERIFIED_OR_OPERATOR, outcome: To(C::Failed), effects: RELEASE, rule: "verified failure resolves UNKNOWN: reservation released" },
        Row { from: &[C::Created, C::Processing], kinds: &[K::ResultUnknown], evidence: PSP, outcome: To(C::Unknown), effects: &[Fx::ScheduleQuery], rule: "no answer: keep the reservation, query" },
        Row { from: &[C::Unknown], kinds: &[K::ResultUnknown], evidence: ANY, outcome: Duplicate, effects: &[], rule: "still unknown" },
        Row { from: &[C::Succeeded], kinds: &[K::PaymentCaptured], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already captured" },
        Row { from: &[C::Succeeded], kinds: &[K::AttemptSubmitted, K::PaymentProcessing, K::ResultUnknown], evidence: ANY, outcome: Stale, effects: &[], rule: "progress after success is stale" },
        Row { from: &[C::Succeeded], kinds: &[K::CaptureFailed], evidence: ANY, outcome: Conflict, effects: &[], rule: "a failure contradicts an established capture" },
        Row { from: &[C::Failed], kinds: &[K::CaptureFailed], evidence: ANY, outcome: Duplicate, effects: &[], rule: "already failed" },
        Row { from: &[C::Failed], kinds: &[K::AttemptSubmitted, K::PaymentProcessing, K::ResultUnknown], evidence: ANY, outcome: Stale, effects: &[], rule: "progress after failure is stale" },
        Row { from: &[C::Failed], kinds: &[K::PaymentCaptured], evidence: ANY, outcome: Conflict, effects: &[], rule: "a success contradicts a definitive failure (the reservation is gone)" },
    ]
};

/// The evidence list of a row as text, for docs and the admin API.
fn evidence_text(evidence: &[EvidenceSource]) -> String {
    if evidence == ANY {
        return "any".to_owned();
    }
    evidence
        .iter()
        .map(|e| e.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Render a matrix as a Markdown table (one line per row, in match order),
/// so the audited table and the executed one are the same text.
pub fn to_markdown<S: std::fmt::Display>(table: &[Row<S>]) -> String {
    let mut out = String::from(
        "| from | event | evidence | outcome | effects | rule |\n|---|---|---|---|---|---|\n",
    );
    for row in table {
        let from: Vec<String> = row.from.iter().map(|s| s.to_string()).collect();
        let kinds: Vec<&str> = row.kinds.iter().map(|k| k.as_str()).collect();
        let outcome = match &row.outcome {
            Outcome::To(state) => format!("→ {state}"),
            Outcome::Duplicate => "ignore (duplicate)".to_owned(),
            Outcome::Stale => "ignore (stale)".to_owned(),
            Outcome::Conflict => "needs reconciliation".to_owned(),
        };
        let effects: Vec<String> = row
            .effects
            .iter()
            .map(|fx| match fx {
                Fx::Emit(event) => format!("emit {event}"),
                other => format!("{other:?}"),
            })
            .collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            from.join(", "),
            kinds.join(", "),
            evidence_text(row.evidence),
            outcome,
            effects.join(", "),
            row.rule
        ));
    }
    out
}
