//! Where an event lands, inside the tenant boundary.
//!
//! An event from a webhook, or from the answer to a call, came through one
//! connector account; it may only touch aggregates of that account
//! (architecture invariant 8). Every lookup by a reference the event names
//! (attempt, action, PSP, PSP payment) finds the row and the account it
//! belongs to in one query; a row of another account is refused with
//! [`StoreError::OutOfScope`], never used. References minted by the host for
//! the aggregate a call was about ([`EventTarget::Attempt`], `Refund`,
//! `Capture`) are the host's own and need no scope.

use super::{find_row, EventTarget, Located};
use crate::db::Conn;
use crate::payments::{
    attempt_from, attempt_head_in, capture_from, AttemptKey, AttemptRead, PaymentAttempt,
    ATTEMPT_COLS, CAPTURE_COLS,
};
use crate::StoreError;
use sluice_core::{route_event, Aggregate, EventKind, PaymentEvent};
use sqlx::Row;

/// The connector account an event came through (a webhook's route account,
/// or the account of the call whose answer is parsed) and its adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountScope {
    pub account_id: String,
    pub adapter: String,
}

impl AccountScope {
    pub fn new(account_id: impl Into<String>, adapter: impl Into<String>) -> AccountScope {
        AccountScope {
            account_id: account_id.into(),
            adapter: adapter.into(),
        }
    }
}

/// The tables an event can name a row of, and how each reaches its account.
#[derive(Debug, Clone, Copy)]
enum Table {
    Attempts,
    Refunds,
    Captures,
}

impl Table {
    fn entity(self) -> &'static str {
        match self {
            Table::Attempts => "attempt",
            Table::Refunds => "refund",
            Table::Captures => "capture",
        }
    }

    /// `id, payment_id, account_id` of the rows `WHERE t.{column} = $1`.
    /// Our references are unique across adapters; PSP references only at one
    /// adapter (`AND t.adapter = $2`, a filter on the few rows the index on
    /// `psp_reference` finds; refunds' unique index covers both).
    fn scoped_select(self, column: &str) -> String {
        let (from, account) = match self {
            Table::Attempts => ("payment_attempts t", "t.connector_account_id"),
            Table::Refunds => (
                "refunds t JOIN payment_attempts a ON a.id = t.attempt_id",
                "a.connector_account_id",
            ),
            Table::Captures => (
                "captures t JOIN payment_attempts a ON a.id = t.attempt_id",
                "a.connector_account_id",
            ),
        };
        let adapter = if column == "reference" {
            "$2 = $2"
        } else {
            "t.adapter = $2"
        };
        format!(
            "SELECT t.id AS id, t.payment_id AS payment_id, {account} AS account_id \
             FROM {from} WHERE t.{column} = $1 AND {adapter}"
        )
    }
}

/// The statements that find an event's rows by PSP reference at one adapter
/// (`$1` the reference, `$2` the adapter), each with the table it reads: for
/// the tests that pin them to an index whatever the tables hold.
pub fn psp_reference_lookups() -> Vec<(&'static str, String)> {
    vec![
        ("payment_attempts", attempt_select("psp_reference")),
        ("refunds", Table::Refunds.scoped_select("psp_reference")),
    ]
}

/// A row an event named, inside the scope.
struct Found {
    id: String,
    payment_id: String,
}

/// The row of `table` whose `column` is `key` (a PSP reference: at the
/// scope's adapter) within the scope's account. When only other accounts
/// have such a row, the event is refused: it names another tenant's money.
async fn find_scoped(
    tx: &mut Conn,
    scope: &AccountScope,
    table: Table,
    column: &str,
    key: &str,
) -> Result<Option<Found>, StoreError> {
    let rows = sqlx::query(&table.scoped_select(column))
        .bind(key)
        .bind(&scope.adapter)
        .fetch_all(&mut *tx)
        .await?;
    let found = rows
        .iter()
        .map(|row| {
            let found = Found {
                id: row.try_get("id")?,
                payment_id: row.try_get("payment_id")?,
            };
            Ok((found, row.try_get::<String, _>("account_id")?))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    in_scope(found, scope, table.entity(), key)
}

/// The one of `rows` (each with its account) that belongs to the scope's
/// account. When only other accounts have one, the event is refused: it
/// names another tenant's money.
fn in_scope<T>(
    rows: Vec<(T, String)>,
    scope: &AccountScope,
    entity: &'static str,
    key: &str,
) -> Result<Option<T>, StoreError> {
    let mut outside = false;
    for (row, account) in rows {
        if account == scope.account_id {
            // Unique per account (references are unique, PSP references
            // unique per account: migration 0011), so this is the one.
            return Ok(Some(row));
        }
        outside = true;
    }
    if outside {
        return Err(StoreError::OutOfScope {
            entity,
            key: key.to_owned(),
            account: scope.account_id.clone(),
        });
    }
    Ok(None)
}

pub(super) async fn locate(
    tx: &mut Conn,
    target: &EventTarget,
    event: &PaymentEvent,
) -> Result<Located, StoreError> {
    match target {
        EventTarget::Attempt(reference) => {
            own(tx, Aggregate::Attempt, "payment_attempts", reference).await
        }
        EventTarget::Refund(reference) => own(tx, Aggregate::Refund, "refunds", reference).await,
        EventTarget::Capture(reference) => own(tx, Aggregate::Capture, "captures", reference).await,
        EventTarget::PspReference {
            scope,
            psp_reference,
        } => locate_by_psp(tx, scope, psp_reference, event).await,
        EventTarget::FromEvent { scope } => locate_from_event(tx, scope, event).await,
    }
}

/// The aggregate a call was about, by the host's own reference.
async fn own(
    tx: &mut Conn,
    aggregate: Aggregate,
    table: &str,
    reference: &str,
) -> Result<Located, StoreError> {
    let (id, payment_id) = find_row(tx, table, "reference", reference)
        .await?
        .ok_or_else(|| StoreError::not_found(entity_name(aggregate), reference))?;
    Ok(Located {
        aggregate,
        id,
        payment_id,
    })
}

fn entity_name(aggregate: Aggregate) -> &'static str {
    match aggregate {
        Aggregate::Order => "payment",
        Aggregate::Attempt => "attempt",
        Aggregate::Refund => "refund",
        Aggregate::Capture => "capture",
    }
}

fn is_refund_kind(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::RefundProcessing
            | EventKind::RefundSucceeded
            | EventKind::RefundFailed
            | EventKind::RefundUnknown
    )
}

async fn locate_by_psp(
    tx: &mut Conn,
    scope: &AccountScope,
    psp_reference: &str,
    event: &PaymentEvent,
) -> Result<Located, StoreError> {
    if is_refund_kind(event.kind) {
        let refund = find_scoped(tx, scope, Table::Refunds, "psp_reference", psp_reference)
            .await?
            .ok_or_else(|| StoreError::not_found("refund", psp_reference))?;
        return Ok(located(Aggregate::Refund, refund));
    }
    let attempt = scoped_attempt(tx, scope, "psp_reference", psp_reference)
        .await?
        .ok_or_else(|| StoreError::not_found("attempt", psp_reference))?;
    route_from_attempt(tx, scope, attempt, event).await
}

fn located(aggregate: Aggregate, found: Found) -> Located {
    Located {
        aggregate,
        id: found.id,
        payment_id: found.payment_id,
    }
}

async fn locate_from_event(
    tx: &mut Conn,
    scope: &AccountScope,
    event: &PaymentEvent,
) -> Result<Located, StoreError> {
    if is_refund_kind(event.kind) {
        return refund_from_event(tx, scope, event).await;
    }
    let mut attempt = None;
    if let Some(reference) = &event.attempt_reference {
        attempt = scoped_attempt(tx, scope, "reference", reference).await?;
    }
    match attempt {
        Some(attempt) => route_from_attempt(tx, scope, attempt, event).await,
        None => locate_by_psp_references(tx, scope, event).await,
    }
}

/// What the host's own attempt reference an event names finds
/// ([`by_own_reference`]).
pub(super) enum OwnReference {
    /// The event is about that attempt: the attempt, its payment and the
    /// inbox row's status as one statement read them.
    Head(Box<AttemptRead>),
    /// The event is about one of that attempt's captures or, when no
    /// attempt has that reference, where the PSP's references it names lead.
    Located(Located),
    /// The event names no attempt reference, or is a refund's.
    Unnamed,
}

/// An event from a webhook or an answer that names the host's own attempt
/// reference is, nearly always, about that attempt: read it with its payment
/// in the one statement that reads them anyway ([`attempt_head_in`]) instead
/// of locating it first, and check its account as [`scoped_attempt`] does. A
/// row of another account refuses the event ([`StoreError::OutOfScope`]);
/// our references are unique across adapters, so there is at most one row.
pub(super) async fn by_own_reference(
    tx: &mut Conn,
    target: &EventTarget,
    event: &PaymentEvent,
    inbox: Option<&str>,
) -> Result<OwnReference, StoreError> {
    let (EventTarget::FromEvent { scope }, Some(reference)) =
        (target, event.attempt_reference.as_deref())
    else {
        return Ok(OwnReference::Unnamed);
    };
    if is_refund_kind(event.kind) {
        return Ok(OwnReference::Unnamed);
    }
    let Some(read) = attempt_head_in(tx, AttemptKey::Reference, reference, inbox).await? else {
        let located = locate_by_psp_references(tx, scope, event).await?;
        return Ok(OwnReference::Located(located));
    };
    let account = read.head.attempt.connector_account_id.clone();
    in_scope(
        vec![((), account)],
        scope,
        Table::Attempts.entity(),
        reference,
    )?;
    match route_event(event, read.head.attempt.capture_mode) {
        Aggregate::Attempt | Aggregate::Order => Ok(OwnReference::Head(Box::new(read))),
        _ => route_from_attempt(tx, scope, read.head.attempt, event)
            .await
            .map(OwnReference::Located),
    }
}

/// An event's attempt by the PSP's references it names (its payment's
/// first), within the scope: for an event that names no attempt of ours.
async fn locate_by_psp_references(
    tx: &mut Conn,
    scope: &AccountScope,
    event: &PaymentEvent,
) -> Result<Located, StoreError> {
    let mut attempt = None;
    for psp in [&event.psp_payment_reference, &event.psp_reference]
        .into_iter()
        .flatten()
    {
        if attempt.is_none() {
            attempt = scoped_attempt(tx, scope, "psp_reference", psp).await?;
        }
    }
    let attempt = attempt.ok_or_else(|| {
        let named = event
            .attempt_reference
            .as_deref()
            .or(event.psp_reference.as_deref());
        StoreError::not_found("attempt", named.unwrap_or("-"))
    })?;
    route_from_attempt(tx, scope, attempt, event).await
}

/// A refund event's refund: by our refund reference, else the PSP's.
async fn refund_from_event(
    tx: &mut Conn,
    scope: &AccountScope,
    event: &PaymentEvent,
) -> Result<Located, StoreError> {
    let by = match (&event.action_reference, &event.psp_reference) {
        (Some(reference), _) => ("reference", reference),
        (None, Some(psp)) => ("psp_reference", psp),
        (None, None) => return Err(StoreError::not_found("refund", "-")),
    };
    find_scoped(tx, scope, Table::Refunds, by.0, by.1)
        .await?
        .map(|found| located(Aggregate::Refund, found))
        .ok_or_else(|| StoreError::not_found("refund", by.1))
}

/// The attempts whose `column` is `$1`. Our references are unique across
/// adapters; PSP references only at one adapter (`$2`: a filter on the few
/// rows the index on `psp_reference` finds).
fn attempt_select(column: &str) -> String {
    let adapter = if column == "reference" {
        "$2 = $2"
    } else {
        "adapter = $2"
    };
    format!("SELECT {ATTEMPT_COLS} FROM payment_attempts WHERE {column} = $1 AND {adapter}")
}

/// The scope's attempt whose `column` is `key`, read whole in the same
/// statement that checks its account.
async fn scoped_attempt(
    tx: &mut Conn,
    scope: &AccountScope,
    column: &str,
    key: &str,
) -> Result<Option<PaymentAttempt>, StoreError> {
    let rows = sqlx::query(&attempt_select(column))
        .bind(key)
        .bind(&scope.adapter)
        .fetch_all(&mut *tx)
        .await?;
    let attempts = rows
        .iter()
        .map(|row| {
            let attempt = attempt_from(row)?;
            let account = attempt.connector_account_id.clone();
            Ok((attempt, account))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    in_scope(attempts, scope, Table::Attempts.entity(), key)
}

/// Send the event to the attempt or, per the core's routing, to one of its captures.
async fn route_from_attempt(
    tx: &mut Conn,
    scope: &AccountScope,
    attempt: PaymentAttempt,
    event: &PaymentEvent,
) -> Result<Located, StoreError> {
    match route_event(event, attempt.capture_mode) {
        Aggregate::Capture => capture_for(tx, scope, &attempt, event).await,
        Aggregate::Refund => Err(StoreError::not_found(
            "refund",
            event.action_reference.as_deref().unwrap_or("-"),
        )),
        Aggregate::Attempt | Aggregate::Order => Ok(Located {
            aggregate: Aggregate::Attempt,
            id: attempt.id,
            payment_id: attempt.payment_id,
        }),
    }
}

/// The capture a capture event is about: named by its reference (a capture
/// of this attempt), or the one capture of the attempt in flight (or the one
/// with that PSP reference). Several candidates are never guessed between.
async fn capture_for(
    tx: &mut Conn,
    scope: &AccountScope,
    attempt: &PaymentAttempt,
    event: &PaymentEvent,
) -> Result<Located, StoreError> {
    if let Some(reference) = &event.action_reference {
        let capture = find_scoped(tx, scope, Table::Captures, "reference", reference)
            .await?
            .filter(|found| found.payment_id == attempt.payment_id)
            .ok_or_else(|| StoreError::not_found("capture", reference))?;
        return Ok(located(Aggregate::Capture, capture));
    }
    let id = capture_of_attempt(tx, attempt, event).await?;
    Ok(Located {
        aggregate: Aggregate::Capture,
        id,
        payment_id: attempt.payment_id.clone(),
    })
}

async fn capture_of_attempt(
    tx: &mut Conn,
    attempt: &PaymentAttempt,
    event: &PaymentEvent,
) -> Result<String, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {CAPTURE_COLS} FROM captures WHERE attempt_id = $1 ORDER BY created_at, id"
    ))
    .bind(&attempt.id)
    .fetch_all(&mut *tx)
    .await?;
    let captures = rows
        .iter()
        .map(capture_from)
        .collect::<Result<Vec<_>, _>>()?;
    let in_flight: Vec<_> = captures.iter().filter(|c| !c.state.is_terminal()).collect();
    let by_psp: Vec<_> = captures
        .iter()
        .filter(|c| c.psp_reference.is_some() && c.psp_reference == event.psp_reference)
        .collect();
    let candidates = if in_flight.len() == 1 {
        in_flight
    } else {
        by_psp
    };
    match candidates.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => Err(StoreError::not_found("capture", &attempt.reference)),
        _ => Err(StoreError::Conflict(format!(
            "{} captures of attempt {} could match; the event must name its capture reference",
            candidates.len(),
            attempt.reference
        ))),
    }
}
