//! Merchants, their API keys (stored only as a keyed hash) and their connector
//! accounts (PSP credentials; secrets only through an internal accessor).

use crate::db::{int, json, opt_int, opt_text, text};
use crate::{ids, Store, StoreError};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use sqlx::any::AnyRow;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merchant {
    pub id: String,
    pub name: String,
    /// `active` or `disabled`.
    pub status: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// An API key as the store knows it: never the key itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: String,
    pub merchant_id: String,
    /// The first characters of the key, for people to recognise it.
    pub key_prefix: String,
    pub label: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A freshly issued key. `plaintext` exists only here, once.
#[derive(Clone)]
pub struct IssuedApiKey {
    pub record: ApiKeyRecord,
    pub plaintext: String,
}

impl std::fmt::Debug for IssuedApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedApiKey")
            .field("record", &self.record)
            .field("plaintext", &"<redacted>")
            .finish()
    }
}

/// The server-side secret that keys API-key hashes, so a leaked table alone
/// cannot be brute-forced.
#[derive(Clone)]
pub struct ApiKeyPepper(Vec<u8>);

impl ApiKeyPepper {
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<Self, StoreError> {
        let secret = secret.into();
        if secret.len() < 16 {
            return Err(StoreError::Config(
                "the API key pepper must be at least 16 bytes".into(),
            ));
        }
        Ok(ApiKeyPepper(secret))
    }

    /// hex(HMAC-SHA256(pepper, key)).
    pub fn hash(&self, key: &str) -> String {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(key.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

impl std::fmt::Debug for ApiKeyPepper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKeyPepper(<redacted>)")
    }
}

/// A connector account without its secrets: safe to show to clients.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectorAccount {
    pub id: String,
    pub merchant_id: String,
    pub adapter: String,
    pub label: String,
    pub config: serde_json::Value,
    /// `active` or `disabled`.
    pub status: String,
    /// Set while an operator has paused the account for new attempts.
    pub paused: Option<AccountPause>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// An operator's pause of a connector account (migration 0016).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountPause {
    pub reason: String,
    pub at_ms: i64,
}

/// Config and secrets of one connector account, for the adapter runtime only.
#[derive(Clone, PartialEq)]
pub struct ConnectorCredentials {
    pub connector_account_id: String,
    /// The tenant the account belongs to (never changes).
    pub merchant_id: String,
    pub adapter: String,
    pub config: serde_json::Value,
    pub secrets: serde_json::Value,
}

impl std::fmt::Debug for ConnectorCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorCredentials")
            .field("connector_account_id", &self.connector_account_id)
            .field("merchant_id", &self.merchant_id)
            .field("adapter", &self.adapter)
            .field("config", &self.config)
            .field("secrets", &"<redacted>")
            .finish()
    }
}

/// What to create a connector account with.
#[derive(Debug, Clone)]
pub struct NewConnectorAccount {
    pub merchant_id: String,
    pub adapter: String,
    pub label: String,
    pub config: serde_json::Value,
    pub secrets: serde_json::Value,
}

const MERCHANT_COLS: &str = "id, name, status, created_at, updated_at";
const KEY_COLS: &str = "id, merchant_id, key_prefix, label, created_at, revoked_at";
const ACCOUNT_COLS: &str = "id, merchant_id, adapter, label, config_json, status, \
     paused_reason, paused_at, created_at, updated_at";

fn merchant_from(row: &AnyRow) -> Result<Merchant, StoreError> {
    Ok(Merchant {
        id: text(row, "id")?,
        name: text(row, "name")?,
        status: text(row, "status")?,
        created_at: int(row, "created_at")?,
        updated_at: int(row, "updated_at")?,
    })
}

fn key_from(row: &AnyRow) -> Result<ApiKeyRecord, StoreError> {
    Ok(ApiKeyRecord {
        id: text(row, "id")?,
        merchant_id: text(row, "merchant_id")?,
        key_prefix: text(row, "key_prefix")?,
        label: text(row, "label")?,
        created_at: int(row, "created_at")?,
        revoked_at: opt_int(row, "revoked_at")?,
    })
}

fn account_from(row: &AnyRow) -> Result<ConnectorAccount, StoreError> {
    Ok(ConnectorAccount {
        id: text(row, "id")?,
        merchant_id: text(row, "merchant_id")?,
        adapter: text(row, "adapter")?,
        label: text(row, "label")?,
        config: json(row, "connector_accounts", "config_json")?,
        status: text(row, "status")?,
        paused: match (opt_text(row, "paused_reason")?, opt_int(row, "paused_at")?) {
            (Some(reason), Some(at_ms)) => Some(AccountPause { reason, at_ms }),
            _ => None,
        },
        created_at: int(row, "created_at")?,
        updated_at: int(row, "updated_at")?,
    })
}

fn check_status(status: &str) -> Result<(), StoreError> {
    match status {
        "active" | "disabled" => Ok(()),
        other => Err(StoreError::Config(format!(
            "status must be active or disabled, got {other:?}"
        ))),
    }
}

impl Store {
    pub async fn create_merchant(&self, name: &str) -> Result<Merchant, StoreError> {
        let now = self.now_ms();
        let merchant = Merchant {
            id: ids::merchant(&self.env),
            name: name.to_owned(),
            status: "active".into(),
            created_at: now,
            updated_at: now,
        };
        sqlx::query(
            "INSERT INTO merchants (id, name, status, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&merchant.id)
        .bind(&merchant.name)
        .bind(&merchant.status)
        .bind(now)
        .bind(now)
        .execute(&self.writer)
        .await?;
        Ok(merchant)
    }

    pub async fn get_merchant(&self, merchant_id: &str) -> Result<Merchant, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {MERCHANT_COLS} FROM merchants WHERE id = $1"
        ))
        .bind(merchant_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("merchant", merchant_id))?;
        merchant_from(&row)
    }

    pub async fn list_merchants(&self) -> Result<Vec<Merchant>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {MERCHANT_COLS} FROM merchants ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(merchant_from).collect()
    }

    /// Rename and/or enable/disable a merchant.
    pub async fn update_merchant(
        &self,
        merchant_id: &str,
        name: Option<&str>,
        status: Option<&str>,
    ) -> Result<Merchant, StoreError> {
        if let Some(status) = status {
            check_status(status)?;
        }
        let done = sqlx::query(
            "UPDATE merchants SET name = COALESCE($2, name), status = COALESCE($3, status), \
             updated_at = $4 WHERE id = $1",
        )
        .bind(merchant_id)
        .bind(name)
        .bind(status)
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        // A disabled merchant's keys stop at once (the cached API keys).
        self.account_cache.invalidate();
        if done.rows_affected() == 0 {
            return Err(StoreError::not_found("merchant", merchant_id));
        }
        self.get_merchant(merchant_id).await
    }

    /// Mint a new API key for a merchant. The plaintext is returned once and
    /// only its keyed hash is stored.
    pub async fn issue_api_key(
        &self,
        merchant_id: &str,
        label: &str,
        pepper: &ApiKeyPepper,
    ) -> Result<IssuedApiKey, StoreError> {
        let mut secret = [0u8; 24];
        rand::rng().fill_bytes(&mut secret);
        let plaintext = format!("sk_sluice_{}", hex::encode(secret));
        let record = ApiKeyRecord {
            id: ids::api_key(&self.env),
            merchant_id: merchant_id.to_owned(),
            key_prefix: plaintext[..16].to_owned(),
            label: label.to_owned(),
            created_at: self.now_ms(),
            revoked_at: None,
        };
        let inserted = sqlx::query(
            "INSERT INTO api_keys (id, merchant_id, key_hash, key_prefix, label, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&record.id)
        .bind(&record.merchant_id)
        .bind(pepper.hash(&plaintext))
        .bind(&record.key_prefix)
        .bind(&record.label)
        .bind(record.created_at)
        .execute(&self.writer)
        .await;
        match inserted.map_err(StoreError::from) {
            Ok(_) => Ok(IssuedApiKey { record, plaintext }),
            Err(e) if e.db_is_fk_violation() => Err(StoreError::not_found("merchant", merchant_id)),
            Err(e) => Err(e),
        }
    }

    /// The merchant an API key belongs to, if the key is known, not revoked and
    /// its merchant is active.
    pub async fn authenticate_api_key(
        &self,
        presented: &str,
        pepper: &ApiKeyPepper,
    ) -> Result<Option<(Merchant, ApiKeyRecord)>, StoreError> {
        self.api_key_by_hash(&pepper.hash(presented)).await
    }

    /// The active key with this peppered hash and its active merchant.
    pub(crate) async fn api_key_by_hash(
        &self,
        key_hash: &str,
    ) -> Result<Option<(Merchant, ApiKeyRecord)>, StoreError> {
        let row = sqlx::query(
            "SELECT k.id, k.merchant_id, k.key_prefix, k.label, k.created_at, k.revoked_at, \
                    m.name, m.status, m.created_at AS m_created_at, m.updated_at AS m_updated_at \
             FROM api_keys k JOIN merchants m ON m.id = k.merchant_id \
             WHERE k.key_hash = $1 AND k.revoked_at IS NULL AND m.status = 'active'",
        )
        .bind(key_hash)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let key = key_from(&row)?;
        let merchant = Merchant {
            id: key.merchant_id.clone(),
            name: text(&row, "name")?,
            status: text(&row, "status")?,
            created_at: int(&row, "m_created_at")?,
            updated_at: int(&row, "m_updated_at")?,
        };
        Ok(Some((merchant, key)))
    }

    pub async fn list_api_keys(&self, merchant_id: &str) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {KEY_COLS} FROM api_keys WHERE merchant_id = $1 ORDER BY id"
        ))
        .bind(merchant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(key_from).collect()
    }

    /// Revoke a key; idempotent. Revoked keys never authenticate again.
    pub async fn revoke_api_key(&self, merchant_id: &str, key_id: &str) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $3) \
             WHERE id = $1 AND merchant_id = $2",
        )
        .bind(key_id)
        .bind(merchant_id)
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        // A revoked key stops at once (the cached API keys).
        self.account_cache.invalidate();
        if done.rows_affected() == 0 {
            return Err(StoreError::not_found("api key", key_id));
        }
        Ok(())
    }

    pub async fn create_connector_account(
        &self,
        new: &NewConnectorAccount,
    ) -> Result<ConnectorAccount, StoreError> {
        let now = self.now_ms();
        let account = ConnectorAccount {
            id: ids::connector_account(&self.env),
            merchant_id: new.merchant_id.clone(),
            adapter: new.adapter.clone(),
            label: new.label.clone(),
            config: new.config.clone(),
            status: "active".into(),
            paused: None,
            created_at: now,
            updated_at: now,
        };
        let inserted = sqlx::query(
            "INSERT INTO connector_accounts \
             (id, merchant_id, adapter, label, config_json, secrets_json, status, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&account.id)
        .bind(&account.merchant_id)
        .bind(&account.adapter)
        .bind(&account.label)
        .bind(new.config.to_string())
        .bind(self.seal_json(&crate::secrets::connector_context(&account.id), &new.secrets)?)
        .bind(&account.status)
        .bind(now)
        .bind(now)
        .execute(&self.writer)
        .await;
        self.account_cache.invalidate();
        match inserted.map_err(StoreError::from) {
            Ok(_) => Ok(account),
            Err(e) if e.is_unique_violation() => Err(StoreError::Conflict(format!(
                "merchant already has a connector account labelled {:?}",
                new.label
            ))),
            Err(e) if e.db_is_fk_violation() => {
                Err(StoreError::not_found("merchant", &new.merchant_id))
            }
            Err(e) => Err(e),
        }
    }

    /// A connector account without secrets. `merchant_id` scopes the lookup
    /// when given (client-facing reads); None is for internal callers.
    pub async fn get_connector_account(
        &self,
        account_id: &str,
        merchant_id: Option<&str>,
    ) -> Result<ConnectorAccount, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ACCOUNT_COLS} FROM connector_accounts \
             WHERE id = $1 AND ($2 IS NULL OR merchant_id = $2)"
        ))
        .bind(account_id)
        .bind(merchant_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("connector account", account_id))?;
        account_from(&row)
    }

    pub async fn list_connector_accounts(
        &self,
        merchant_id: &str,
    ) -> Result<Vec<ConnectorAccount>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {ACCOUNT_COLS} FROM connector_accounts WHERE merchant_id = $1 ORDER BY id"
        ))
        .bind(merchant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(account_from).collect()
    }

    /// Replace config and/or secrets, or enable/disable the account.
    pub async fn update_connector_account(
        &self,
        account_id: &str,
        config: Option<&serde_json::Value>,
        secrets: Option<&serde_json::Value>,
        status: Option<&str>,
    ) -> Result<ConnectorAccount, StoreError> {
        if let Some(status) = status {
            check_status(status)?;
        }
        let context = crate::secrets::connector_context(account_id);
        let sealed = secrets.map(|s| self.seal_json(&context, s)).transpose()?;
        let done = sqlx::query(
            "UPDATE connector_accounts SET config_json = COALESCE($2, config_json), \
             secrets_json = COALESCE($3, secrets_json), status = COALESCE($4, status), \
             updated_at = $5 WHERE id = $1",
        )
        .bind(account_id)
        .bind(config.map(|c| c.to_string()))
        .bind(sealed)
        .bind(status)
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        self.account_cache.invalidate();
        if done.rows_affected() == 0 {
            return Err(StoreError::not_found("connector account", account_id));
        }
        self.get_connector_account(account_id, None).await
    }

    /// Config and secrets for the adapter runtime, opened from their sealed form, with
    /// only the versions valid now (a rotation window past its end drops the old
    /// one). Internal only: never send the result to a client or a log.
    pub async fn connector_credentials(
        &self,
        account_id: &str,
    ) -> Result<ConnectorCredentials, StoreError> {
        let all = self.connector_credentials_all_versions(account_id).await?;
        Ok(ConnectorCredentials {
            secrets: crate::secrets::valid_now(&all.secrets, self.now_ms()),
            ..all
        })
    }

    /// The account's credentials with every stored secret version, valid now
    /// or not: what the account cache keeps (it filters on every read).
    pub(crate) async fn connector_credentials_all_versions(
        &self,
        account_id: &str,
    ) -> Result<ConnectorCredentials, StoreError> {
        let row = sqlx::query(
            "SELECT id, merchant_id, adapter, config_json, secrets_json \
             FROM connector_accounts WHERE id = $1",
        )
        .bind(account_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("connector account", account_id))?;
        let id = text(&row, "id")?;
        let sealed = text(&row, "secrets_json")?;
        let secrets = self.open_json(&crate::secrets::connector_context(&id), &sealed)?;
        Ok(ConnectorCredentials {
            connector_account_id: id,
            merchant_id: text(&row, "merchant_id")?,
            adapter: text(&row, "adapter")?,
            config: json(&row, "connector_accounts", "config_json")?,
            secrets,
        })
    }
}
