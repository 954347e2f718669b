//! Identities minted by the store. Every id is minted once, persisted in the
//! same transaction that creates its row, and never re-minted: retries and
//! queries reuse the stored value (seed 000 §1, seed 001 §4).

use uuid::Uuid;

/// A time-ordered id with a readable prefix, e.g. `pay_0190...`.
pub(crate) fn mint(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::now_v7().simple())
}

pub(crate) fn merchant() -> String {
    mint("mer")
}
pub(crate) fn api_key() -> String {
    mint("key")
}
pub(crate) fn connector_account() -> String {
    mint("ca")
}
pub(crate) fn payment() -> String {
    mint("pay")
}
pub(crate) fn attempt() -> String {
    mint("att")
}
pub(crate) fn capture() -> String {
    mint("cap")
}
pub(crate) fn refund() -> String {
    mint("rfd")
}
pub(crate) fn inbox() -> String {
    mint("inb")
}
pub(crate) fn scope_refusal() -> String {
    mint("scr")
}
pub(crate) fn outbox_event() -> String {
    mint("evt")
}

/// The attempt reference sent to the PSP as idempotency key and merchant
/// reference. Derived from the payment id and attempt number, so it can always
/// be recomputed from persisted facts; it is also stored on the row.
pub(crate) fn attempt_reference(payment_id: &str, attempt_no: i64) -> String {
    format!("{payment_id}_a{attempt_no}")
}

/// The capture and refund references sent to the PSP as idempotency keys.
/// Minted once when the reservation commits, reused by every retry and query.
pub(crate) fn capture_reference() -> String {
    mint("capref")
}
pub(crate) fn refund_reference() -> String {
    mint("rfdref")
}
