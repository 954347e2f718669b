//! Where the store seals its secrets, how legacy plaintext rows are sealed at start-up,
//! and the versions of a connector account's secrets during a rotation window.
//!
//! A connector account's `secrets_json` column holds one sealed JSON object. Each
//! name maps to a string (one version), an array of strings (valid versions, newest
//! first) or, once rotated through [`Store::rotate_connector_secret`], to
//! `{"versions": [{"value": .., "valid_until": ms|null}, ..]}`, newest first.
//! [`Store::connector_credentials`] hands the orchestrator only the versions valid
//! now (a string or an array), which is what its keyring reads.

use crate::db::text;
use crate::secret_box::{self, needs_reseal, ENVELOPE_PREFIX};
use crate::{Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The longest rotation window the admin API accepts: 30 days.
pub const MAX_ROTATION_WINDOW_MS: i64 = 30 * 24 * 3_600_000;
/// The longest secret value accepted.
pub const MAX_SECRET_LEN: usize = 4096;

/// One sealed column: its table, the row's key column and the context of a row.
struct SealedColumn {
    table: &'static str,
    key: &'static str,
    column: &'static str,
}

const SEALED_COLUMNS: &[SealedColumn] = &[
    SealedColumn {
        table: "connector_accounts",
        key: "id",
        column: "secrets_json",
    },
    SealedColumn {
        table: "webhook_endpoints",
        key: "id",
        column: "secret",
    },
    SealedColumn {
        table: "merchant_fulfillment_endpoints",
        key: "merchant_id",
        column: "secret",
    },
    SealedColumn {
        table: "webhook_bodies",
        key: "id",
        column: "sealed_body",
    },
];

/// The associated data of a sealed value: where it lives.
pub fn secret_context(table: &str, column: &str, row_key: &str) -> String {
    format!("{table}.{column}:{row_key}")
}

pub(crate) fn connector_context(account_id: &str) -> String {
    secret_context("connector_accounts", "secrets_json", account_id)
}

/// The context of a merchant webhook endpoint's signing secret.
pub fn webhook_endpoint_context(endpoint_id: &str) -> String {
    secret_context("webhook_endpoints", "secret", endpoint_id)
}

pub(crate) fn fulfillment_context(merchant_id: &str) -> String {
    secret_context("merchant_fulfillment_endpoints", "secret", merchant_id)
}

/// What [`Store::reseal_secrets`] did, per table (no values).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResealReport {
    /// (table, rows sealed or re-sealed under the current master key)
    pub tables: Vec<(&'static str, u64)>,
}

impl ResealReport {
    pub fn total(&self) -> u64 {
        self.tables.iter().map(|(_, n)| n).sum()
    }
}

/// One version of a secret in the rotation form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Version {
    value: String,
    #[serde(default)]
    valid_until: Option<i64>,
}

/// What a rotation left: the versions of the secret, newest first (no values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRotation {
    pub account_id: String,
    pub name: String,
    /// `valid_until` of each version, newest first; `None` for the new one.
    pub versions: Vec<Option<i64>>,
}

/// A stored secret entry as its versions (everything is valid forever unless the
/// rotation form says otherwise).
fn versions_of(entry: &Value) -> Option<Vec<Version>> {
    let forever = |value: &str| Version {
        value: value.to_owned(),
        valid_until: None,
    };
    match entry {
        Value::String(s) => Some(vec![forever(s)]),
        Value::Array(items) => Some(
            items
                .iter()
                .filter_map(Value::as_str)
                .map(forever)
                .collect(),
        ),
        Value::Object(map) => serde_json::from_value(map.get("versions")?.clone()).ok(),
        _ => None,
    }
}

/// The secrets valid at `now`, in the orchestrator's form: a string for one
/// version, an array (newest first) for several.
pub(crate) fn valid_now(secrets: &Value, now: i64) -> Value {
    let mut out = serde_json::Map::new();
    for (name, entry) in secrets.as_object().into_iter().flatten() {
        let Some(versions) = versions_of(entry) else {
            continue;
        };
        let mut valid: Vec<Value> = versions
            .into_iter()
            .filter(|v| v.valid_until.is_none_or(|until| until > now))
            .map(|v| Value::String(v.value))
            .collect();
        match valid.len() {
            0 => {}
            1 => {
                out.insert(name.clone(), valid.remove(0));
            }
            _ => {
                out.insert(name.clone(), Value::Array(valid));
            }
        }
    }
    Value::Object(out)
}

fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::InvalidRequest(msg.into())
}

/// `secrets` with `name` rotated to `value`: the versions valid now stay valid until
/// `now + window_ms` at the latest, expired ones are dropped.
fn rotated(
    secrets: &Value,
    name: &str,
    value: &str,
    now: i64,
    window_ms: i64,
) -> Result<(Value, Vec<Option<i64>>), StoreError> {
    let mut map = secrets.as_object().cloned().unwrap_or_default();
    let entry = map
        .get(name)
        .ok_or_else(|| StoreError::not_found("connector account secret", name))?;
    let current = versions_of(entry).ok_or_else(|| {
        StoreError::corrupt("connector_accounts", "a secret entry of no known form")
    })?;
    let until = now.saturating_add(window_ms);
    let mut versions = vec![Version {
        value: value.to_owned(),
        valid_until: None,
    }];
    for old in current {
        if old.valid_until.is_some_and(|t| t <= now) {
            continue;
        }
        if old.value == value {
            return Err(StoreError::Conflict(format!(
                "the new value of {name} is one of its valid versions; a rotation needs a new secret"
            )));
        }
        if window_ms > 0 {
            let valid_until = Some(old.valid_until.map_or(until, |t| t.min(until)));
            versions.push(Version {
                value: old.value,
                valid_until,
            });
        }
    }
    let summary = versions.iter().map(|v| v.valid_until).collect();
    let entry = serde_json::json!({ "versions": versions });
    map.insert(name.to_owned(), entry);
    Ok((Value::Object(map), summary))
}

impl Store {
    /// `plaintext` sealed for `context` (see [`secret_context`]) under the current
    /// master key: the only form in which a secret is written.
    pub fn seal_secret(&self, context: &str, plaintext: &[u8]) -> Result<String, StoreError> {
        Ok(secret_box::seal(&*self.secret_box, context, plaintext)?)
    }

    /// A stored secret opened (a legacy plaintext row comes back as it is).
    pub fn open_secret(&self, context: &str, stored: &str) -> Result<Vec<u8>, StoreError> {
        Ok(secret_box::open(&*self.secret_box, context, stored)?.plaintext)
    }

    /// [`Store::open_secret`] for a secret that is text.
    pub fn open_secret_text(&self, context: &str, stored: &str) -> Result<String, StoreError> {
        String::from_utf8(self.open_secret(context, stored)?)
            .map_err(|_| StoreError::corrupt("secret", format!("{context} is not UTF-8")))
    }

    pub(crate) fn seal_json(&self, context: &str, value: &Value) -> Result<String, StoreError> {
        self.seal_secret(context, value.to_string().as_bytes())
    }

    pub(crate) fn open_json(&self, context: &str, stored: &str) -> Result<Value, StoreError> {
        let raw = self.open_secret(context, stored)?;
        serde_json::from_slice(&raw)
            .map_err(|e| StoreError::corrupt("connector_accounts", format!("secrets: {e}")))
    }

    /// Seals every legacy plaintext secret and re-seals every value sealed under a
    /// previous master key, under the current one. Run at every start-up, after the
    /// migrations: from then on the database holds no secret in clear. A value that
    /// does not open (a wrong master key) stops it with [`StoreError::Secret`],
    /// before anything is served. Each row is updated only if it still holds what was
    /// read, so two instances starting at once do not undo each other.
    pub async fn reseal_secrets(&self) -> Result<ResealReport, StoreError> {
        let mut report = ResealReport::default();
        for sealed in SEALED_COLUMNS {
            let count = self.reseal_column(sealed).await?;
            report.tables.push((sealed.table, count));
        }
        Ok(report)
    }

    async fn reseal_column(&self, sealed: &SealedColumn) -> Result<u64, StoreError> {
        let SealedColumn { table, key, column } = sealed;
        let current = format!("{ENVELOPE_PREFIX}{}:%", self.secret_box.current_key_id());
        let rows = sqlx::query(&format!(
            "SELECT {key} AS row_key, {column} AS stored FROM {table} WHERE {column} NOT LIKE $1"
        ))
        .bind(&current)
        .fetch_all(&self.pool)
        .await?;
        let mut count = 0;
        for row in rows {
            let (row_key, stored) = (text(&row, "row_key")?, text(&row, "stored")?);
            if !needs_reseal(&*self.secret_box, &stored) {
                continue;
            }
            let context = secret_context(table, column, &row_key);
            let plaintext = self.open_secret(&context, &stored)?;
            let resealed = self.seal_secret(&context, &plaintext)?;
            let done = sqlx::query(&format!(
                "UPDATE {table} SET {column} = $1 WHERE {key} = $2 AND {column} = $3"
            ))
            .bind(&resealed)
            .bind(&row_key)
            .bind(&stored)
            .execute(&self.writer)
            .await?;
            self.account_cache.invalidate();
            count += done.rows_affected();
        }
        if count > 0 {
            tracing::info!(
                table,
                rows = count,
                "secrets sealed under the current master key"
            );
        }
        Ok(count)
    }

    /// Rolls a connector account's secret `name` to `value`: the new version is used
    /// from now on, and the versions valid now keep verifying for `window_ms` more
    /// (0: at once only the new one). Refuses an unknown name, a value that is already
    /// valid, and a window outside 0..=30 days; nothing changes then.
    pub async fn rotate_connector_secret(
        &self,
        account_id: &str,
        name: &str,
        value: &str,
        window_ms: i64,
    ) -> Result<SecretRotation, StoreError> {
        if value.is_empty() || value.chars().count() > MAX_SECRET_LEN {
            return Err(invalid(format!(
                "value must be 1 to {MAX_SECRET_LEN} characters"
            )));
        }
        if !(0..=MAX_ROTATION_WINDOW_MS).contains(&window_ms) {
            return Err(invalid(format!(
                "window_ms must be between 0 and {MAX_ROTATION_WINDOW_MS}"
            )));
        }
        let row = sqlx::query("SELECT secrets_json FROM connector_accounts WHERE id = $1")
            .bind(account_id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("connector account", account_id))?;
        let stored = text(&row, "secrets_json")?;
        let context = connector_context(account_id);
        let secrets = self.open_json(&context, &stored)?;
        let now = self.now_ms();
        let (next, versions) = rotated(&secrets, name, value, now, window_ms)?;
        let done = sqlx::query(
            "UPDATE connector_accounts SET secrets_json = $1, updated_at = $2 \
             WHERE id = $3 AND secrets_json = $4",
        )
        .bind(self.seal_json(&context, &next)?)
        .bind(now)
        .bind(account_id)
        .bind(&stored)
        .execute(&self.writer)
        .await?;
        self.account_cache.invalidate();
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(
                "the account's secrets changed while rotating; retry".into(),
            ));
        }
        tracing::info!(
            connector_account = account_id,
            secret = name,
            window_ms,
            "connector secret rotated"
        );
        Ok(SecretRotation {
            account_id: account_id.to_owned(),
            name: name.to_owned(),
            versions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_rotation_keeps_the_valid_versions_until_the_window_ends_then_only_the_new_one() {
        let secrets = json!({ "webhook_secret": "old", "api_key": "k" });
        let (next, summary) = rotated(&secrets, "webhook_secret", "new", 1_000, 500).unwrap();
        assert_eq!(summary, vec![None, Some(1_500)]);
        assert_eq!(
            valid_now(&next, 1_499),
            json!({ "webhook_secret": ["new", "old"], "api_key": "k" })
        );
        assert_eq!(
            valid_now(&next, 1_500),
            json!({ "webhook_secret": "new", "api_key": "k" })
        );
        let (again, summary) = rotated(&next, "webhook_secret", "newer", 1_600, 500).unwrap();
        assert_eq!(summary, vec![None, Some(2_100)]);
        assert_eq!(
            valid_now(&again, 1_700)["webhook_secret"],
            json!(["newer", "new"])
        );
    }

    #[test]
    fn a_rotation_refuses_an_unknown_name_and_a_value_still_valid() {
        let secrets = json!({ "webhook_secret": ["a", "b"] });
        assert!(matches!(
            rotated(&secrets, "nope", "c", 0, 10),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            rotated(&secrets, "webhook_secret", "b", 0, 10),
            Err(StoreError::Conflict(_))
        ));
        let (next, summary) = rotated(&secrets, "webhook_secret", "c", 0, 0).unwrap();
        assert_eq!(summary, vec![None]);
        assert_eq!(valid_now(&next, 0), json!({ "webhook_secret": "c" }));
    }
}
