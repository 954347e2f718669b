//! Identities minted by the store. Every id is minted once, persisted in the
//! same transaction that creates its row, and never re-minted: retries and
//! queries reuse the stored value (seed 000 §1, seed 001 §4).

use crate::env::Env;

/// The instant a write decides at and the environment its new ids come from,
/// handed together to the helpers that write rows inside a transaction, so
/// an id is never minted from anything but the store's environment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At<'a> {
    pub now: i64,
    pub env: &'a Env,
}

/// A time-ordered id with a readable prefix, e.g. `pay_0190...`, from the
/// environment's clock and id generator (seeded in the simulator).
pub(crate) fn mint(env: &Env, prefix: &str) -> String {
    format!("{prefix}_{}", env.uuid_v7().simple())
}

pub(crate) fn merchant(env: &Env) -> String {
    mint(env, "mer")
}
pub(crate) fn api_key(env: &Env) -> String {
    mint(env, "key")
}
pub(crate) fn connector_account(env: &Env) -> String {
    mint(env, "ca")
}
pub(crate) fn payment(env: &Env) -> String {
    mint(env, "pay")
}
pub(crate) fn attempt(env: &Env) -> String {
    mint(env, "att")
}
pub(crate) fn capture(env: &Env) -> String {
    mint(env, "cap")
}
pub(crate) fn refund(env: &Env) -> String {
    mint(env, "rfd")
}
pub(crate) fn inbox(env: &Env) -> String {
    mint(env, "inb")
}
pub(crate) fn webhook_body(env: &Env) -> String {
    mint(env, "whb")
}
pub(crate) fn scope_refusal(env: &Env) -> String {
    mint(env, "scr")
}
pub(crate) fn outbox_event(env: &Env) -> String {
    mint(env, "evt")
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
pub(crate) fn capture_reference(env: &Env) -> String {
    mint(env, "capref")
}
pub(crate) fn refund_reference(env: &Env) -> String {
    mint(env, "rfdref")
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
