//! One pending row (attempt, capture or refund) as the scanner sees it, read
//! from the primary, and the scheduling-only writes the scanner makes.

use sluice_core::{PendingItem, PendingState};
use sluice_orchestrator::Target;
use sluice_store::{Capture, PaymentAttempt, PendingKind, Refund, Store, StoreError};

/// A pending row, whatever its aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub kind: PendingKind,
    pub id: String,
    pub payment_id: String,
    pub attempt_id: String,
    pub adapter: String,
    pub reference: String,
    pub state: PendingState,
    pub created_at: i64,
    pub next_retry_time: Option<i64>,
    pub retry_count: i64,
    pub last_psp_call_at: Option<i64>,
    pub expires_at: Option<i64>,
    /// Attempts only: the connector account (its authorization validity).
    pub connector_account_id: Option<String>,
    /// Attempts only: when the authorization was recorded.
    pub authorized_at: Option<i64>,
    /// Attempts only: when a void was recorded as sent.
    pub void_requested_at: Option<i64>,
}

impl From<PaymentAttempt> for Due {
    fn from(a: PaymentAttempt) -> Self {
        Due {
            kind: PendingKind::Attempt,
            attempt_id: a.id.clone(),
            id: a.id,
            payment_id: a.payment_id,
            adapter: a.adapter,
            reference: a.reference,
            state: PendingState::Attempt(a.state),
            created_at: a.created_at,
            next_retry_time: a.next_retry_time,
            retry_count: a.retry_count,
            last_psp_call_at: a.last_psp_call_at,
            expires_at: a.expires_at,
            connector_account_id: Some(a.connector_account_id),
            authorized_at: a.authorized_at,
            void_requested_at: a.void_requested_at,
        }
    }
}

impl From<Capture> for Due {
    fn from(c: Capture) -> Self {
        Due {
            kind: PendingKind::Capture,
            id: c.id,
            payment_id: c.payment_id,
            attempt_id: c.attempt_id,
            adapter: c.adapter,
            reference: c.reference,
            state: PendingState::Capture(c.state),
            created_at: c.created_at,
            next_retry_time: c.next_retry_time,
            retry_count: c.retry_count,
            last_psp_call_at: c.last_psp_call_at,
            expires_at: None,
            connector_account_id: None,
            authorized_at: None,
            void_requested_at: None,
        }
    }
}

impl From<Refund> for Due {
    fn from(r: Refund) -> Self {
        Due {
            kind: PendingKind::Refund,
            id: r.id,
            payment_id: r.payment_id,
            attempt_id: r.attempt_id,
            adapter: r.adapter,
            reference: r.reference,
            state: PendingState::Refund(r.state),
            created_at: r.created_at,
            next_retry_time: r.next_retry_time,
            retry_count: r.retry_count,
            last_psp_call_at: r.last_psp_call_at,
            expires_at: None,
            connector_account_id: None,
            authorized_at: None,
            void_requested_at: None,
        }
    }
}

impl Due {
    /// The core's view of the row. `authorization_validity_ms`: the
    /// connector's, for an AUTHORIZED attempt (None: the policy's default).
    pub fn pending_item(
        &self,
        in_manual_review: bool,
        authorization_validity_ms: Option<i64>,
    ) -> PendingItem {
        PendingItem {
            last_attempt_at_ms: self.last_psp_call_at,
            retry_count: u32::try_from(self.retry_count.max(0)).unwrap_or(u32::MAX),
            expires_at_ms: self.expires_at,
            in_manual_review,
            authorized_at_ms: self.authorized_at,
            authorization_validity_ms,
            void_requested_at_ms: self.void_requested_at,
            ..PendingItem::new(self.state, &self.reference, self.created_at)
        }
    }

    /// An AUTHORIZED attempt (its validity is watched).
    pub fn is_authorized(&self) -> bool {
        self.state == PendingState::Attempt(sluice_core::AttemptState::Authorized)
    }

    pub fn target(&self) -> Target {
        match self.kind {
            PendingKind::Attempt => Target::Attempt(self.id.clone()),
            PendingKind::Capture => Target::Capture(self.id.clone()),
            PendingKind::Refund => Target::Refund(self.id.clone()),
        }
    }

    /// Still in the pending set at `now`: not terminal and due.
    pub fn is_due(&self, now: i64) -> bool {
        !self.state.is_terminal() && self.next_retry_time.is_some_and(|t| t <= now)
    }
}

pub(crate) fn kind_label(kind: PendingKind) -> &'static str {
    match kind {
        PendingKind::Attempt => "attempt",
        PendingKind::Capture => "capture",
        PendingKind::Refund => "refund",
    }
}

fn table(kind: PendingKind) -> &'static str {
    match kind {
        PendingKind::Attempt => "payment_attempts",
        PendingKind::Capture => "captures",
        PendingKind::Refund => "refunds",
    }
}

/// Read one row from the primary, fresh.
pub(crate) async fn load(store: &Store, kind: PendingKind, id: &str) -> Result<Due, StoreError> {
    Ok(match kind {
        PendingKind::Attempt => store.get_attempt(id).await?.into(),
        PendingKind::Capture => store.get_capture(id).await?.into(),
        PendingKind::Refund => store.get_refund(id).await?.into(),
    })
}

/// Move a row's next look without counting a query or a PSP call: the store's
/// `reschedule` does both, which would wrongly restart the backoff of a row
/// the scanner only looked at. Scheduling only, never a state; a no-op when
/// someone else moved the row meanwhile (compare on the value read). `None`
/// parks the row outside the pending set (any later event through the door
/// schedules it again).
pub(crate) async fn set_next_look(
    store: &Store,
    due: &Due,
    next_retry_time: Option<i64>,
) -> Result<bool, sqlx::Error> {
    let Some(seen) = due.next_retry_time else {
        return Ok(false);
    };
    let sql = format!(
        "UPDATE {} SET next_retry_time = $2 WHERE id = $1 AND next_retry_time = $3",
        table(due.kind)
    );
    let done = sqlx::query(&sql)
        .bind(due.id.as_str())
        .bind(next_retry_time)
        .bind(seen)
        .execute(store.writer())
        .await?;
    Ok(done.rows_affected() > 0)
}
