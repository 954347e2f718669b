//! Merchant administration under `/admin` (behind the admin token, which the
//! caller of [`crate::admin_router`] supplies): merchants, their API keys
//! (shown once, in plain text, when issued) and their connector accounts
//! (secrets go in, never out, and never into a log).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use sluice_store::{ApiKeyRecord, ConnectorAccount, Merchant, NewConnectorAccount};
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, OptionalJson};
use crate::limits::{self, RateLimit};
use crate::payments::json;
use crate::requests::{self as req};
use crate::MerchantApiState;

const MAX_NAME_CHARS: usize = 200;
const MAX_LABEL_CHARS: usize = 100;
const MAX_SETTINGS: usize = 50;
const MAX_SETTING_KEY_CHARS: usize = 64;
const MAX_SETTING_VALUE_CHARS: usize = 8192;

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateMerchantRequest {
    #[schema(schema_with = merchant_name_schema)]
    pub name: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MerchantView {
    pub id: String,
    /// Always `merchant`.
    pub object: String,
    pub name: String,
    /// `active` or `disabled`.
    pub status: String,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MerchantList {
    pub object: String,
    pub data: Vec<MerchantView>,
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueApiKeyRequest {
    /// What the key is for, e.g. `production backend`.
    #[schema(schema_with = optional_label_schema)]
    pub label: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApiKeyView {
    pub id: String,
    /// Always `api_key`.
    pub object: String,
    pub merchant_id: String,
    /// The first characters of the key, to recognise it.
    pub key_prefix: String,
    pub label: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A freshly issued key: `key` is shown this once and never again.
#[derive(Serialize, ToSchema)]
pub struct IssuedApiKeyView {
    #[serde(flatten)]
    pub record: ApiKeyView,
    /// The API key in plain text. Store it now: only its keyed hash is kept.
    pub key: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApiKeyList {
    pub object: String,
    pub data: Vec<ApiKeyView>,
}

/// A connector account: which adapter, its settings and its secrets.
#[derive(Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateConnectorAccountRequest {
    /// The adapter's name, e.g. `stripe` or `adyen`.
    #[schema(schema_with = adapter_schema)]
    pub adapter: String,
    /// Unique per merchant.
    #[schema(schema_with = label_schema)]
    pub label: String,
    /// Non-secret settings, e.g. `base_url`, `merchant_account`, and the
    /// host's own keys (`webhook_burst`, `webhook_per_second`, ...).
    #[serde(default)]
    #[schema(schema_with = config_schema)]
    pub config: BTreeMap<String, String>,
    /// Secrets, e.g. `api_key`, `webhook_secret`. Never returned or logged.
    #[serde(default)]
    #[schema(schema_with = secrets_schema)]
    pub secrets: BTreeMap<String, String>,
}

impl std::fmt::Debug for CreateConnectorAccountRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateConnectorAccountRequest")
            .field("adapter", &self.adapter)
            .field("label", &self.label)
            .field("config", &self.config)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A connector account's new non-secret settings.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectorAccountConfigRequest {
    /// Replaces the account's settings as a whole (a key left out is removed).
    #[schema(schema_with = config_schema)]
    pub config: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConnectorAccountView {
    pub id: String,
    /// Always `connector_account`.
    pub object: String,
    pub merchant_id: String,
    pub adapter: String,
    pub label: String,
    pub config: BTreeMap<String, String>,
    /// `active` or `disabled`.
    pub status: String,
    /// Where the PSP posts its webhooks for this account.
    pub webhook_path: String,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConnectorAccountList {
    pub object: String,
    pub data: Vec<ConnectorAccountView>,
}

impl From<&Merchant> for MerchantView {
    fn from(m: &Merchant) -> Self {
        MerchantView {
            id: m.id.clone(),
            object: "merchant".into(),
            name: m.name.clone(),
            status: m.status.clone(),
            created_at: m.created_at,
            updated_at: m.updated_at,
        }
    }
}

impl From<&ApiKeyRecord> for ApiKeyView {
    fn from(k: &ApiKeyRecord) -> Self {
        ApiKeyView {
            id: k.id.clone(),
            object: "api_key".into(),
            merchant_id: k.merchant_id.clone(),
            key_prefix: k.key_prefix.clone(),
            label: k.label.clone(),
            created_at: k.created_at,
            revoked_at: k.revoked_at,
        }
    }
}

impl From<&ConnectorAccount> for ConnectorAccountView {
    fn from(a: &ConnectorAccount) -> Self {
        let config = a
            .config
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.as_str()
                                .map(str::to_owned)
                                .unwrap_or_else(|| v.to_string()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        ConnectorAccountView {
            id: a.id.clone(),
            object: "connector_account".into(),
            merchant_id: a.merchant_id.clone(),
            adapter: a.adapter.clone(),
            label: a.label.clone(),
            config,
            status: a.status.clone(),
            webhook_path: format!("/webhooks/{}/{}", a.adapter, a.id),
            created_at: a.created_at,
            updated_at: a.updated_at,
        }
    }
}

// The schemas of the fields above (`schema_with` drops doc comments).
use crate::openapi::fields::{described, required_text};

fn merchant_name_schema() -> utoipa::openapi::Object {
    described(required_text(MAX_NAME_CHARS, false), "The merchant's name.")
}

fn label_schema() -> utoipa::openapi::Object {
    described(
        required_text(MAX_LABEL_CHARS, false),
        "Unique per merchant.",
    )
}

fn optional_label_schema() -> utoipa::openapi::Object {
    described(
        required_text(MAX_LABEL_CHARS, true),
        "What the key is for, e.g. `production backend`.",
    )
}

fn adapter_schema() -> utoipa::openapi::Object {
    described(
        crate::openapi::fields::adapter_name(),
        "The adapter's name, e.g. `stripe` or `adyen`.",
    )
}

/// What [`settings`] accepts.
fn settings_schema(description: &str) -> utoipa::openapi::Object {
    described(
        crate::openapi::fields::string_map(
            MAX_SETTINGS,
            MAX_SETTING_KEY_CHARS,
            MAX_SETTING_VALUE_CHARS,
            false,
            false,
        ),
        description,
    )
}

/// [`account_config`]: settings, with the webhook limit keys' rule stated.
fn config_schema() -> utoipa::openapi::Object {
    use crate::openapi::fields::webhook_rate;
    let mut schema = settings_schema(
        "Non-secret settings, e.g. `base_url`, `merchant_account`, and the host's own keys of \
         the account, among them its PSP webhook limit, which wins over the gateway's `[webhooks]`.",
    );
    for (key, description) in [
        (
            limits::WEBHOOK_BURST_KEY,
            "Webhooks the account may send at once (its PSP webhook route's burst).",
        ),
        (
            limits::WEBHOOK_PER_SECOND_KEY,
            "Refill of the account's webhook bucket, webhooks per second.",
        ),
    ] {
        schema
            .properties
            .insert(key.to_owned(), webhook_rate(description).into());
    }
    schema
}

fn secrets_schema() -> utoipa::openapi::Object {
    settings_schema("Secrets, e.g. `api_key`, `webhook_secret`. Never returned or logged.")
}

fn merchant_id_or_404(id: &str) -> Result<&str, ApiError> {
    if req::looks_like_id(id) {
        Ok(id)
    } else {
        Err(ApiError::not_found("resource_missing", "no such merchant"))
    }
}

/// Adapter names as the runtime accepts them: lower-case letters, digits, `-`.
pub fn valid_adapter_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= crate::openapi::fields::MAX_ADAPTER_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn settings(map: &BTreeMap<String, String>, param: &str) -> Result<serde_json::Value, ApiError> {
    if map.len() > MAX_SETTINGS {
        return Err(ApiError::invalid(
            "parameter_invalid",
            param,
            format!("{param} may hold at most {MAX_SETTINGS} entries"),
        ));
    }
    let mut out = serde_json::Map::new();
    for (key, value) in map {
        // The key is named in errors; the value never is (it may be a secret).
        let key = req::required_text(key, param, MAX_SETTING_KEY_CHARS)?;
        if value.chars().count() > MAX_SETTING_VALUE_CHARS {
            return Err(ApiError::invalid(
                "string_too_long",
                &format!("{param}.{key}"),
                format!("{param}.{key} must be at most {MAX_SETTING_VALUE_CHARS} characters"),
            ));
        }
        out.insert(key, serde_json::Value::String(value.clone()));
    }
    Ok(serde_json::Value::Object(out))
}

/// [`settings`] of a connector account's `config`, with the host's keys
/// checked: a webhook limit out of range is refused naming its key.
fn account_config(map: &BTreeMap<String, String>) -> Result<serde_json::Value, ApiError> {
    let config = settings(map, "config")?;
    if let Some(key) = limits::invalid_rate_key(map) {
        let max = limits::MAX_WEBHOOK_RATE;
        return Err(ApiError::invalid(
            "parameter_invalid",
            &format!("config.{key}"),
            format!("config.{key} must be a whole number from 1 to {max}, in decimal digits"),
        ));
    }
    Ok(config)
}

/// Create a merchant.
#[utoipa::path(
    post, path = "/admin/merchants", tag = "admin",
    request_body = CreateMerchantRequest,
    responses((status = 201, body = MerchantView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn create_merchant(
    State(state): State<MerchantApiState>,
    ApiJson(body): ApiJson<CreateMerchantRequest>,
) -> Result<Response, ApiError> {
    let name = req::required_text(&body.name, "name", MAX_NAME_CHARS)?;
    let merchant = state.store.create_merchant(&name).await?;
    tracing::info!(merchant = %merchant.id, "merchant created");
    Ok(json(StatusCode::CREATED, &MerchantView::from(&merchant)))
}

/// List merchants.
#[utoipa::path(
    get, path = "/admin/merchants", tag = "admin",
    responses((status = 200, body = MerchantList), (status = 401, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn list_merchants(State(state): State<MerchantApiState>) -> Result<Response, ApiError> {
    let merchants = state.store.list_merchants().await?;
    Ok(json(
        StatusCode::OK,
        &MerchantList {
            object: "list".into(),
            data: merchants.iter().map(MerchantView::from).collect(),
        },
    ))
}

/// One merchant.
#[utoipa::path(
    get, path = "/admin/merchants/{merchant_id}", tag = "admin",
    params(("merchant_id" = String, Path)),
    responses((status = 200, body = MerchantView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn get_merchant(
    State(state): State<MerchantApiState>,
    ApiPath(merchant_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let merchant = state
        .store
        .get_merchant(merchant_id_or_404(&merchant_id)?)
        .await?;
    Ok(json(StatusCode::OK, &MerchantView::from(&merchant)))
}

/// Issue an API key. The response is the only time the key is shown.
#[utoipa::path(
    post, path = "/admin/merchants/{merchant_id}/api_keys", tag = "admin",
    params(("merchant_id" = String, Path)),
    request_body = IssueApiKeyRequest,
    responses((status = 201, body = IssuedApiKeyView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn issue_api_key(
    State(state): State<MerchantApiState>,
    ApiPath(merchant_id): ApiPath<String>,
    OptionalJson(body): OptionalJson<IssueApiKeyRequest>,
) -> Result<Response, ApiError> {
    let merchant_id = merchant_id_or_404(&merchant_id)?;
    let label = req::optional_text(body.label.as_deref(), "label", MAX_LABEL_CHARS)?
        .unwrap_or_else(|| "default".into());
    let issued = state
        .store
        .issue_api_key(merchant_id, &label, &state.pepper)
        .await?;
    tracing::info!(merchant = %merchant_id, key_id = %issued.record.id, "API key issued");
    Ok(json(
        StatusCode::CREATED,
        &IssuedApiKeyView {
            record: ApiKeyView::from(&issued.record),
            key: issued.plaintext.clone(),
        },
    ))
}

/// List a merchant's API keys (never the keys themselves).
#[utoipa::path(
    get, path = "/admin/merchants/{merchant_id}/api_keys", tag = "admin",
    params(("merchant_id" = String, Path)),
    responses((status = 200, body = ApiKeyList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn list_api_keys(
    State(state): State<MerchantApiState>,
    ApiPath(merchant_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let merchant_id = merchant_id_or_404(&merchant_id)?;
    state.store.get_merchant(merchant_id).await?;
    let keys = state.store.list_api_keys(merchant_id).await?;
    Ok(json(
        StatusCode::OK,
        &ApiKeyList {
            object: "list".into(),
            data: keys.iter().map(ApiKeyView::from).collect(),
        },
    ))
}

/// Revoke an API key (idempotent). It never authenticates again.
#[utoipa::path(
    delete, path = "/admin/merchants/{merchant_id}/api_keys/{key_id}", tag = "admin",
    params(("merchant_id" = String, Path), ("key_id" = String, Path)),
    responses((status = 200, body = ApiKeyView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn revoke_api_key(
    State(state): State<MerchantApiState>,
    ApiPath((merchant_id, key_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let merchant_id = merchant_id_or_404(&merchant_id)?;
    if !req::looks_like_id(&key_id) {
        return Err(ApiError::not_found("resource_missing", "no such api key"));
    }
    state.store.revoke_api_key(merchant_id, &key_id).await?;
    tracing::info!(merchant = %merchant_id, key_id = %key_id, "API key revoked");
    let keys = state.store.list_api_keys(merchant_id).await?;
    let record = keys
        .iter()
        .find(|k| k.id == key_id)
        .ok_or_else(|| ApiError::not_found("resource_missing", "no such api key"))?;
    Ok(json(StatusCode::OK, &ApiKeyView::from(record)))
}

/// Create a connector account. Its secrets are stored, never returned.
#[utoipa::path(
    post, path = "/admin/merchants/{merchant_id}/connector_accounts", tag = "admin",
    params(("merchant_id" = String, Path)),
    request_body = CreateConnectorAccountRequest,
    responses((status = 201, body = ConnectorAccountView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn create_connector_account(
    State(state): State<MerchantApiState>,
    ApiPath(merchant_id): ApiPath<String>,
    ApiJson(body): ApiJson<CreateConnectorAccountRequest>,
) -> Result<Response, ApiError> {
    let merchant_id = merchant_id_or_404(&merchant_id)?;
    if !valid_adapter_name(&body.adapter) {
        return Err(ApiError::invalid(
            "adapter_name_invalid",
            "adapter",
            "adapter must be 1 to 64 lower-case letters, digits or '-'",
        ));
    }
    let label = req::required_text(&body.label, "label", MAX_LABEL_CHARS)?;
    let config = account_config(&body.config)?;
    let secrets = settings(&body.secrets, "secrets")?;
    let account = state
        .store
        .create_connector_account(&NewConnectorAccount {
            merchant_id: merchant_id.to_owned(),
            adapter: body.adapter.clone(),
            label,
            config,
            secrets,
        })
        .await?;
    tracing::info!(merchant = %merchant_id, connector_account = %account.id, adapter = %account.adapter,
        "connector account created");
    Ok(json(
        StatusCode::CREATED,
        &ConnectorAccountView::from(&account),
    ))
}

/// List a merchant's connector accounts (without secrets).
#[utoipa::path(
    get, path = "/admin/merchants/{merchant_id}/connector_accounts", tag = "admin",
    params(("merchant_id" = String, Path)),
    responses((status = 200, body = ConnectorAccountList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn list_connector_accounts(
    State(state): State<MerchantApiState>,
    ApiPath(merchant_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let merchant_id = merchant_id_or_404(&merchant_id)?;
    state.store.get_merchant(merchant_id).await?;
    let accounts = state.store.list_connector_accounts(merchant_id).await?;
    Ok(json(
        StatusCode::OK,
        &ConnectorAccountList {
            object: "list".into(),
            data: accounts.iter().map(ConnectorAccountView::from).collect(),
        },
    ))
}

/// Replace a connector account's non-secret settings (its secrets change
/// through rotation). A new webhook limit applies to the account's next
/// webhook: at once on this instance, within 10 s on other gateway instances.
#[utoipa::path(
    put, path = "/admin/merchants/{merchant_id}/connector_accounts/{account_id}/config", tag = "admin",
    params(("merchant_id" = String, Path), ("account_id" = String, Path)),
    request_body = ConnectorAccountConfigRequest,
    responses(
        (status = 200, body = ConnectorAccountView),
        (status = 400, description = "A malformed setting, e.g. a webhook limit out of range; nothing changed", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "No such merchant, or no such connector account of it", body = ErrorBody),
    ),
    security(("admin_token" = []))
)]
pub async fn put_connector_account_config(
    State(state): State<MerchantApiState>,
    ApiPath((merchant_id, account_id)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<ConnectorAccountConfigRequest>,
) -> Result<Response, ApiError> {
    let merchant_id = merchant_id_or_404(&merchant_id)?;
    if !req::looks_like_id(&account_id) {
        return Err(ApiError::not_found(
            "resource_missing",
            "no such connector account",
        ));
    }
    let config = account_config(&body.config)?;
    // Scoped to the merchant: another merchant's account is a 404, unchanged.
    state
        .store
        .get_connector_account(&account_id, Some(merchant_id))
        .await?;
    let account = state
        .store
        .update_connector_account(&account_id, Some(&config), None, None)
        .await?;
    let limiter = state.webhook_limiter();
    limiter.set_limit(
        &limits::limit_key(&account.adapter, &account.id),
        RateLimit::for_account(limiter.default_limit(), &account.config),
        std::time::Instant::now(),
    );
    tracing::info!(merchant = %merchant_id, connector_account = %account.id, "connector account config replaced");
    Ok(json(StatusCode::OK, &ConnectorAccountView::from(&account)))
}
