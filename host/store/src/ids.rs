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
pub(crate) fn webhook_body() -> String {
    mint("whb")
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

/// The capture and refund references sent to the PSP as idempotency keys,
/// for a request without an `Idempotency-Key` (an operator's manual refund, an
/// internal caller): minted once when the reservation commits, in the same
/// transaction, and reused by every retry and query.
pub(crate) fn capture_reference() -> String {
    mint("capref")
}
pub(crate) fn refund_reference() -> String {
    mint("rfdref")
}

/// The refund reference of the merchant's request `key` on `payment_id`:
/// a replay of the same request derives the same reference, so it finds the
/// same reservation and sends the same PSP idempotency key (seed 000 §1).
pub fn keyed_refund_reference(payment_id: &str, key: &str) -> String {
    keyed("rfdref", payment_id, key)
}

/// The capture reference of the merchant's request `key` on `payment_id`
/// (see [`keyed_refund_reference`]).
pub fn keyed_capture_reference(payment_id: &str, key: &str) -> String {
    keyed("capref", payment_id, key)
}

/// `<prefix>_<32 hex>`: the first 128 bits of sha256 over the length-prefixed
/// prefix, payment id and key. Bounded (39 characters, within every PSP's
/// idempotency-key and reference limits), safe in any header or JSON field
/// whatever the key contains, and it does not reveal the merchant's key.
fn keyed(prefix: &str, payment_id: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in [prefix, payment_id, key] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    format!("{prefix}_{}", hex::encode(&digest[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_reference_is_stable_bounded_and_distinct_per_payment_key_and_kind() {
        let a = keyed_refund_reference("pay_1", "key-1");
        assert_eq!(a, keyed_refund_reference("pay_1", "key-1"));
        assert!(a.starts_with("rfdref_") && a.len() == 39, "{a}");
        assert!(a[7..].bytes().all(|b| b.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, keyed_refund_reference("pay_2", "key-1"));
        assert_ne!(a, keyed_refund_reference("pay_1", "key-2"));
        assert_ne!(a[7..], keyed_capture_reference("pay_1", "key-1")[7..]);
        // Length prefixes: moving characters between the parts changes it.
        assert_ne!(
            keyed_refund_reference("pay_1k", "ey"),
            keyed_refund_reference("pay_1", "key")
        );
        let long = keyed_capture_reference("pay_1", &"k".repeat(255));
        assert!(long.starts_with("capref_") && long.len() == 39, "{long}");
    }
}
