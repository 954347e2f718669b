//! A merchant's routing configuration (issue 13, migration 0015): stored as
//! the JSON of `sluice_core::RoutingConfig`, validated by the core and checked
//! against the merchant's own connector accounts before it is written, so a
//! configuration can never route to another merchant's account.

use sluice_core::RoutingConfig;

use crate::db::{int, text};
use crate::error::StoreError;
use crate::Store;

/// A stored routing configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRouting {
    pub merchant_id: String,
    pub config: RoutingConfig,
    /// 1 for the first configuration, +1 for every replacement.
    pub version: i64,
    pub updated_at: i64,
}

impl Store {
    /// Replace the merchant's routing configuration. Refused (`InvalidRequest`)
    /// when the core finds it malformed or it names an account that is not
    /// the merchant's; nothing is written then.
    pub async fn put_routing_config(
        &self,
        merchant_id: &str,
        config: &RoutingConfig,
    ) -> Result<StoredRouting, StoreError> {
        config
            .validate()
            .map_err(|e| StoreError::InvalidRequest(e.to_string()))?;
        self.get_merchant(merchant_id).await?;
        let own = self.list_connector_accounts(merchant_id).await?;
        if let Some(foreign) = config
            .accounts()
            .into_iter()
            .find(|id| !own.iter().any(|a| a.id == *id))
        {
            return Err(StoreError::InvalidRequest(format!(
                "connector account {foreign} is not one of this merchant's"
            )));
        }
        let json = serde_json::to_string(config)
            .map_err(|e| StoreError::InvalidRequest(format!("routing config: {e}")))?;
        let now = self.now_ms();
        sqlx::query(
            "INSERT INTO routing_configs (merchant_id, config_json, version, updated_at) \
             VALUES ($1, $2, 1, $3) ON CONFLICT (merchant_id) DO UPDATE SET \
             config_json = excluded.config_json, version = routing_configs.version + 1, \
             updated_at = excluded.updated_at",
        )
        .bind(merchant_id)
        .bind(&json)
        .bind(now)
        .execute(&self.writer)
        .await?;
        self.account_cache.invalidate();
        tracing::info!(merchant = %merchant_id, rules = config.rules.len(), "routing configuration replaced");
        self.routing_config(merchant_id)
            .await?
            .ok_or_else(|| StoreError::not_found("routing config", merchant_id))
    }

    /// The merchant's routing configuration, if one was ever stored.
    pub async fn routing_config(
        &self,
        merchant_id: &str,
    ) -> Result<Option<StoredRouting>, StoreError> {
        let row = sqlx::query(
            "SELECT merchant_id, config_json, version, updated_at FROM routing_configs \
             WHERE merchant_id = $1",
        )
        .bind(merchant_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let raw = text(&row, "config_json")?;
        let config = serde_json::from_str(&raw)
            .map_err(|e| StoreError::corrupt("routing_configs", format!("config_json: {e}")))?;
        Ok(Some(StoredRouting {
            merchant_id: text(&row, "merchant_id")?,
            config,
            version: int(&row, "version")?,
            updated_at: int(&row, "updated_at")?,
        }))
    }
}
