//! The `Idempotency-Key` store shared by both formats.
//!
//! A key is claimed before the endpoint executes, held while it runs and then
//! completed with the exact response. Validation failures release the claim (the
//! PSPs save nothing when an endpoint never started executing).

use std::collections::HashMap;

use crate::config::{Format, IdempotencyScope};

/// A response saved for replay.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub status: u16,
    pub body: String,
}

/// What a request carried, to tell a replay from a misuse of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// `POST /v1/payment_intents`, `POST /v71/payments/X/captures`, ...
    pub endpoint: String,
    /// A canonical form of the parameters (sorted form pairs or canonical JSON).
    pub params: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlotKey {
    format: Format,
    api_key: String,
    /// Empty under `IdempotencyScope::PerApiKey`.
    endpoint: String,
    key: String,
}

impl SlotKey {
    pub fn new(
        scope: IdempotencyScope,
        format: Format,
        api_key: &str,
        endpoint: &str,
        key: &str,
    ) -> Self {
        let endpoint = match scope {
            IdempotencyScope::PerApiKey => String::new(),
            IdempotencyScope::PerEndpoint => endpoint.to_owned(),
        };
        Self {
            format,
            api_key: api_key.to_owned(),
            endpoint,
            key: key.to_owned(),
        }
    }
}

enum Slot {
    InFlight(Fingerprint),
    Done(Fingerprint, StoredResponse),
}

/// The outcome of claiming a key.
#[derive(Debug)]
pub enum Claim {
    /// First use: execute, then `complete` or `release`.
    Proceed,
    /// Seen before with the same request: answer this saved response.
    Replay(StoredResponse),
    /// The first request with this key is still executing.
    InUse,
    /// The key was first used on another endpoint.
    OtherEndpoint { first_endpoint: String },
    /// The key was first used with other parameters.
    OtherParams,
}

#[derive(Default)]
pub struct IdempotencyStore {
    slots: HashMap<SlotKey, Slot>,
}

impl IdempotencyStore {
    pub fn claim(&mut self, key: &SlotKey, fingerprint: &Fingerprint) -> Claim {
        let (first, saved) = match self.slots.get(key) {
            None => {
                self.slots
                    .insert(key.clone(), Slot::InFlight(fingerprint.clone()));
                return Claim::Proceed;
            }
            Some(Slot::InFlight(first)) => (first, None),
            Some(Slot::Done(first, response)) => (first, Some(response)),
        };
        if first.endpoint != fingerprint.endpoint {
            return Claim::OtherEndpoint {
                first_endpoint: first.endpoint.clone(),
            };
        }
        if first.params != fingerprint.params {
            return Claim::OtherParams;
        }
        match saved {
            Some(response) => Claim::Replay(response.clone()),
            None => Claim::InUse,
        }
    }

    pub fn complete(&mut self, key: &SlotKey, response: StoredResponse) {
        if let Some(slot) = self.slots.remove(key) {
            let fingerprint = match slot {
                Slot::InFlight(f) | Slot::Done(f, _) => f,
            };
            self.slots
                .insert(key.clone(), Slot::Done(fingerprint, response));
        }
    }

    /// Forget an in-flight claim whose request never started executing.
    pub fn release(&mut self, key: &SlotKey) {
        if matches!(self.slots.get(key), Some(Slot::InFlight(_))) {
            self.slots.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(endpoint: &str, params: &str) -> Fingerprint {
        Fingerprint {
            endpoint: endpoint.into(),
            params: params.into(),
        }
    }

    #[test]
    fn a_key_moves_from_in_use_to_replay_and_refuses_other_requests() {
        let mut store = IdempotencyStore::default();
        let key = SlotKey::new(
            IdempotencyScope::PerApiKey,
            Format::Stripe,
            "sk",
            "POST /a",
            "k1",
        );
        assert!(matches!(
            store.claim(&key, &fp("POST /a", "x=1")),
            Claim::Proceed
        ));
        assert!(matches!(
            store.claim(&key, &fp("POST /a", "x=1")),
            Claim::InUse
        ));
        store.complete(
            &key,
            StoredResponse {
                status: 200,
                body: "{}".into(),
            },
        );
        assert!(matches!(
            store.claim(&key, &fp("POST /a", "x=1")),
            Claim::Replay(StoredResponse { status: 200, .. })
        ));
        assert!(matches!(
            store.claim(&key, &fp("POST /a", "x=2")),
            Claim::OtherParams
        ));
        assert!(matches!(
            store.claim(&key, &fp("POST /b", "x=1")),
            Claim::OtherEndpoint { .. }
        ));
    }

    #[test]
    fn a_released_key_can_be_used_again() {
        let mut store = IdempotencyStore::default();
        let key = SlotKey::new(
            IdempotencyScope::PerEndpoint,
            Format::Adyen,
            "k",
            "POST /a",
            "k1",
        );
        assert!(matches!(
            store.claim(&key, &fp("POST /a", "1")),
            Claim::Proceed
        ));
        store.release(&key);
        assert!(matches!(
            store.claim(&key, &fp("POST /a", "2")),
            Claim::Proceed
        ));
    }
}
