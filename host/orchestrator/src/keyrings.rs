//! The connector accounts' keyrings, kept between calls. What a keyring builds on
//! its first use (the searchers of its redaction, BENCHMARKS.md: about 4 µs of a
//! 2 KB webhook call) is then built once per account's secrets instead of once per
//! call. An entry serves only the account it was built for, and only while that
//! account's valid secrets are exactly the ones it was built from: a rotation, or a
//! version leaving its window, builds a new one.

use std::collections::HashMap;
use std::sync::Mutex;

use sluice_adapter_runtime::Keyring;

/// At most this many accounts' keyrings are kept; past it the map starts over
/// (a keyring is cheap to build again, and a gateway has far fewer accounts).
const MAX_KEYRINGS: usize = 4096;

#[derive(Default)]
pub(crate) struct Keyrings {
    map: Mutex<HashMap<String, (serde_json::Value, Keyring)>>,
}

impl Keyrings {
    /// The keyring of `account_id` holding `secrets` (its currently valid ones).
    pub(crate) fn get(&self, account_id: &str, secrets: &serde_json::Value) -> Keyring {
        // A panic while the lock was held cannot leave the map inconsistent: every
        // entry is inserted whole.
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((built_from, keyring)) = map.get(account_id) {
            if built_from == secrets {
                return keyring.clone();
            }
        }
        let keyring = crate::orchestrator::keyring(secrets);
        if map.len() >= MAX_KEYRINGS {
            map.clear();
        }
        map.insert(account_id.to_owned(), (secrets.clone(), keyring.clone()));
        keyring
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_keyring_is_reused_only_for_the_same_account_and_the_same_secrets() {
        let keyrings = Keyrings::default();
        let a = json!({"api_key": "sk_account_a_secret"});
        let b = json!({"api_key": "sk_account_b_secret"});
        let first = keyrings.get("ca_a", &a);
        assert_eq!(keyrings.get("ca_a", &a), first);
        let other = keyrings.get("ca_b", &b);
        assert_eq!(other.current("api_key"), Some("sk_account_b_secret"));
        // The same secrets under another account still get that account's own entry.
        assert_eq!(
            keyrings.get("ca_b", &a).current("api_key"),
            Some("sk_account_a_secret")
        );
        assert_eq!(
            keyrings.get("ca_b", &b).current("api_key"),
            Some("sk_account_b_secret")
        );
        let rotated = json!({"api_key": ["sk_account_a_rotated", "sk_account_a_secret"]});
        let after = keyrings.get("ca_a", &rotated);
        assert_eq!(after.current("api_key"), Some("sk_account_a_rotated"));
        let mut echoed = b"sk_account_a_rotated".to_vec();
        assert_eq!(after.redact(&mut echoed), 1);
    }

    #[test]
    fn past_its_bound_the_map_starts_over_and_still_answers_right() {
        let keyrings = Keyrings::default();
        for i in 0..=MAX_KEYRINGS {
            keyrings.get(
                &format!("ca_{i}"),
                &json!({"api_key": format!("sk_{i:08}")}),
            );
        }
        let map = keyrings.map.lock().unwrap();
        assert!(map.len() <= MAX_KEYRINGS);
        drop(map);
        let again = keyrings.get("ca_7", &json!({"api_key": "sk_00000007"}));
        assert_eq!(again.current("api_key"), Some("sk_00000007"));
    }
}
