//! Connector accounts and API keys as the payment path reads them, kept for a
//! short time.
//!
//! A payment used to read its connector account five or six times (routing
//! twice, credentials before the attempt and before the call, each opening
//! the sealed secrets again; the webhook route once more) and its merchant's
//! routing configuration twice: about a tenth of its statements. The payment
//! path now asks through [`AccountCache`] instead. Every merchant request also
//! read its API key and merchant: [`Store::authenticate_api_key_cached`] keeps a
//! key that authenticated under its peppered hash (never the key itself), and
//! never keeps a key that did not, so a new key works at once and a flood of
//! guesses fills nothing.
//!
//! What stays exact:
//! - Every write to `connector_accounts` or `routing_configs` through this
//!   process's store (create, config, status, pause, resume, secret rotation,
//!   reseal, routing), every key revocation and every merchant update moves
//!   the generation, and an entry read under an older generation is never
//!   used: a key revoked or a merchant disabled through this process is
//!   refused by its next request.
//! - An entry lives at most `ttl` on the store's clock, so a change made by
//!   another gateway instance on the same database (a key revoked there too)
//!   is seen within `ttl`.
//! - A rotation window's end is applied on every read ([`valid_now`] on the
//!   cached versions), not when the entry was filled.
//! - At most [`MAX_ENTRIES`] entries per map; a full map is emptied.
//!
//! What it does not do: cache anything across tenants by a key another
//! tenant could name (keys are account and merchant ids the caller already
//! scoped), or keep a secret anywhere but this process's memory, where the
//! store keeps the opened secrets of a call anyway.
//!
//! [`valid_now`]: crate::secrets::valid_now

use crate::merchants::{
    ApiKeyPepper, ApiKeyRecord, ConnectorAccount, ConnectorCredentials, Merchant,
};
use crate::routing::StoredRouting;
use crate::{Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Bound on each map of the cache: merchants and accounts a process serves
/// at once are far fewer; a map at this size is emptied, not grown.
pub const MAX_ENTRIES: usize = 4096;

/// The default time an entry is trusted without reading the row again.
pub const DEFAULT_TTL: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct AccountCache {
    ttl_ms: i64,
    generation: AtomicU64,
    maps: Mutex<Maps>,
}

#[derive(Debug, Default)]
struct Maps {
    /// Credentials by account id, the secrets with every stored version.
    credentials: HashMap<String, Entry<ConnectorCredentials>>,
    /// The merchant's accounts by merchant id.
    accounts: HashMap<String, Entry<Arc<Vec<ConnectorAccount>>>>,
    /// The merchant's routing configuration (None: it has none) by merchant id.
    routing: HashMap<String, Entry<Option<StoredRouting>>>,
    /// Keys that authenticated, with their merchant, by the key's peppered hash.
    api_keys: HashMap<String, Entry<(Merchant, ApiKeyRecord)>>,
}

#[derive(Debug)]
struct Entry<T> {
    generation: u64,
    filled_at_ms: i64,
    value: T,
}

impl AccountCache {
    pub(crate) fn new(ttl: Duration) -> AccountCache {
        AccountCache {
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            generation: AtomicU64::new(0),
            maps: Mutex::new(Maps::default()),
        }
    }

    /// Called by every write to `connector_accounts` through the store.
    pub(crate) fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Maps> {
        // A panic while holding the lock leaves only whole entries behind
        // (each insert is one statement), so a poisoned map is still sound.
        self.maps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fresh<T: Clone>(&self, entry: Option<&Entry<T>>, now_ms: i64) -> Option<T> {
        let entry = entry?;
        let young =
            now_ms.saturating_sub(entry.filled_at_ms) < self.ttl_ms && now_ms >= entry.filled_at_ms;
        (entry.generation == self.generation() && young).then(|| entry.value.clone())
    }
}

fn insert<T>(map: &mut HashMap<String, Entry<T>>, key: &str, entry: Entry<T>) {
    if map.len() >= MAX_ENTRIES && !map.contains_key(key) {
        map.clear();
    }
    map.insert(key.to_owned(), entry);
}

impl Store {
    /// The entry of `key` in the map `pick` selects while it is fresh, else
    /// `fetch`'s answer, kept under the generation read before fetching (a
    /// write that lands meanwhile makes it stale at once).
    async fn cached<T, F>(
        &self,
        pick: fn(&mut Maps) -> &mut HashMap<String, Entry<T>>,
        key: &str,
        fetch: F,
    ) -> Result<T, StoreError>
    where
        T: Clone,
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        let cache = &self.account_cache;
        let now = self.now_ms();
        if let Some(hit) = cache.fresh(pick(&mut cache.maps()).get(key), now) {
            return Ok(hit);
        }
        let generation = cache.generation();
        let value = fetch.await?;
        let entry = Entry {
            generation,
            filled_at_ms: now,
            value: value.clone(),
        };
        insert(pick(&mut cache.maps()), key, entry);
        Ok(value)
    }

    /// [`Store::connector_credentials`] for the payment path: from the cache
    /// while its entry is fresh (see the module doc), the row otherwise.
    pub async fn connector_credentials_cached(
        &self,
        account_id: &str,
    ) -> Result<ConnectorCredentials, StoreError> {
        let fetch = self.connector_credentials_all_versions(account_id);
        let all = self
            .cached(|m| &mut m.credentials, account_id, fetch)
            .await?;
        Ok(ConnectorCredentials {
            secrets: crate::secrets::valid_now(&all.secrets, self.now_ms()),
            ..all
        })
    }

    /// [`Store::list_connector_accounts`] for routing: from the cache while
    /// its entry is fresh (see the module doc), the rows otherwise.
    pub async fn list_connector_accounts_cached(
        &self,
        merchant_id: &str,
    ) -> Result<Arc<Vec<ConnectorAccount>>, StoreError> {
        let fetch = async { Ok(Arc::new(self.list_connector_accounts(merchant_id).await?)) };
        self.cached(|m| &mut m.accounts, merchant_id, fetch).await
    }

    /// [`Store::routing_config`] for routing: from the cache while its entry
    /// is fresh (see the module doc), the row otherwise.
    pub async fn routing_config_cached(
        &self,
        merchant_id: &str,
    ) -> Result<Option<StoredRouting>, StoreError> {
        let fetch = self.routing_config(merchant_id);
        self.cached(|m| &mut m.routing, merchant_id, fetch).await
    }

    /// [`Store::authenticate_api_key`] for the merchant API: a key that
    /// authenticated is kept while fresh (see the module doc); one that did
    /// not is read again every time.
    pub async fn authenticate_api_key_cached(
        &self,
        presented: &str,
        pepper: &ApiKeyPepper,
    ) -> Result<Option<(Merchant, ApiKeyRecord)>, StoreError> {
        let hash = pepper.hash(presented);
        let cache = &self.account_cache;
        let now = self.now_ms();
        if let Some(hit) = cache.fresh(cache.maps().api_keys.get(&hash), now) {
            return Ok(Some(hit));
        }
        let generation = cache.generation();
        let Some(found) = self.api_key_by_hash(&hash).await? else {
            return Ok(None);
        };
        let entry = Entry {
            generation,
            filled_at_ms: now,
            value: found.clone(),
        };
        insert(&mut cache.maps().api_keys, &hash, entry);
        Ok(Some(found))
    }

    /// One connector account, scoped to its merchant when `merchant_id` is
    /// given, through the merchant's cached list when the merchant is known.
    pub async fn connector_account_cached(
        &self,
        account_id: &str,
        merchant_id: &str,
    ) -> Result<ConnectorAccount, StoreError> {
        self.list_connector_accounts_cached(merchant_id)
            .await?
            .iter()
            .find(|a| a.id == account_id)
            .cloned()
            .ok_or_else(|| StoreError::not_found("connector account", account_id))
    }
}
