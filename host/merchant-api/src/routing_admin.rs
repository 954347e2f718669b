//! A merchant's routing configuration (issue 13), set by an administrator:
//! ordered rules on currency, amount range, payment method type and
//! metadata, each with weighted connector accounts, a fallback chain, and
//! the merchant's overrides of the failure table. `POST /v1/payments`
//! without `connector_account` routes by it (`sluice_core::plan_route`),
//! and a definitive failure with a cascadable code fails over along it
//! within the same confirm (`sluice_core::next_step`).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use sluice_core::{
    FailureClass, FailureOverride, RouteConditions, RouteRule, RoutingConfig, RoutingConfigError,
    WeightedAccount,
};
use sluice_store::{StoreError, StoredRouting};
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath};
use crate::payments::json;
use crate::requests as req;
use crate::MerchantApiState;

/// When a rule applies; every condition that is given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteConditionsBody {
    /// ISO 4217 codes; empty or absent: any currency.
    #[serde(default)]
    #[schema(schema_with = currencies_schema)]
    pub currencies: Vec<String>,
    /// Inclusive lower bound in minor units.
    #[serde(default, deserialize_with = "req::optional_integer")]
    #[schema(minimum = 0)]
    pub min_amount_minor: Option<i64>,
    /// Inclusive upper bound in minor units (not below `min_amount_minor`).
    #[serde(default, deserialize_with = "req::optional_integer")]
    #[schema(minimum = 0)]
    pub max_amount_minor: Option<i64>,
    /// E.g. `card`; empty or absent: any type.
    #[serde(default)]
    #[schema(schema_with = payment_method_types_schema)]
    pub payment_method_types: Vec<String>,
    /// Metadata keys whose values must be equal.
    #[serde(default)]
    #[schema(schema_with = metadata_schema)]
    pub metadata: BTreeMap<String, String>,
}

/// One connector account of a rule with its share of first attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WeightedAccountBody {
    /// One of the merchant's connector accounts.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[\x21-\x7e]+$")]
    pub connector_account: String,
    /// Relative share of first attempts (0: only ever a failover target).
    /// The split is deterministic per payment id.
    #[serde(deserialize_with = "req::integer")]
    #[schema(minimum = 0, maximum = 1000000)]
    pub weight: i64,
}

/// One routing rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteRuleBody {
    /// Unique in the configuration; recorded in each attempt's history.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[\x21-\x7e]+$")]
    pub id: String,
    #[serde(default)]
    pub when: RouteConditionsBody,
    /// 1 to 16 accounts, each once; their weights must not all be 0.
    #[schema(min_items = 1, max_items = 16)]
    pub accounts: Vec<WeightedAccountBody>,
}

/// The merchant's own reading of one failure code of one adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailureOverrideBody {
    /// The adapter's name, e.g. `stripe`.
    #[schema(schema_with = crate::openapi::fields::adapter_name)]
    pub adapter: String,
    /// The adapter's `failure.code`, e.g. `processing_error` or `4`.
    #[schema(schema_with = failure_code_schema)]
    pub code: String,
    /// `issuer_unavailable`, `processor_unavailable`, `processing_error`,
    /// `credentials_refused`, `insufficient_funds`, `lost_or_stolen_card`,
    /// `fraud`, `issuer_declined`, `invalid_card`, `authentication_failed`,
    /// `invalid_request` or `unclassified`.
    #[schema(schema_with = failure_class_schema)]
    pub class: FailureClass,
    /// Whether routing may try another account after this code.
    pub cascade: bool,
}

/// A routing configuration, as set and as shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoutingConfigBody {
    /// Tried in order; the first whose conditions hold chooses.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub rules: Vec<RouteRuleBody>,
    /// Accounts tried after the chosen rule's (also when no rule holds).
    #[serde(default)]
    #[schema(schema_with = fallback_schema)]
    pub fallback: Vec<String>,
    #[serde(default)]
    #[schema(max_items = 64)]
    pub failure_overrides: Vec<FailureOverrideBody>,
    /// How long after the first attempt a failover may still start
    /// (default 60000; 0 turns failover off).
    #[serde(default, deserialize_with = "req::optional_integer")]
    #[schema(minimum = 0, maximum = 3600000)]
    pub failover_window_ms: Option<i64>,
}

/// The merchant's routing configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RoutingConfigView {
    /// Always `routing_config`.
    pub object: String,
    pub merchant_id: String,
    /// 0 when none was ever set; +1 with every replacement.
    pub version: i64,
    pub updated_at: Option<i64>,
    pub config: RoutingConfigBody,
}

impl From<RoutingConfigBody> for RoutingConfig {
    fn from(body: RoutingConfigBody) -> Self {
        RoutingConfig {
            rules: body
                .rules
                .into_iter()
                .map(|r| RouteRule {
                    id: r.id,
                    when: RouteConditions {
                        currencies: r.when.currencies,
                        min_amount_minor: r.when.min_amount_minor,
                        max_amount_minor: r.when.max_amount_minor,
                        payment_method_types: r.when.payment_method_types,
                        metadata: r.when.metadata,
                    },
                    accounts: r
                        .accounts
                        .into_iter()
                        .map(|a| WeightedAccount {
                            connector_account: a.connector_account,
                            // In range: `check_fields` refused any other weight.
                            weight: u32::try_from(a.weight).unwrap_or(0),
                        })
                        .collect(),
                })
                .collect(),
            fallback: body.fallback,
            failure_overrides: body
                .failure_overrides
                .into_iter()
                .map(|o| FailureOverride {
                    adapter: o.adapter,
                    code: o.code,
                    class: o.class,
                    cascade: o.cascade,
                })
                .collect(),
            failover_window_ms: body
                .failover_window_ms
                .unwrap_or(sluice_core::routing::DEFAULT_FAILOVER_WINDOW_MS),
        }
    }
}

impl From<&RoutingConfig> for RoutingConfigBody {
    fn from(config: &RoutingConfig) -> Self {
        // The stored form is the request's, through serde: same field names.
        serde_json::to_value(config)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default()
    }
}

fn view(merchant_id: &str, stored: Option<&StoredRouting>) -> RoutingConfigView {
    RoutingConfigView {
        object: "routing_config".into(),
        merchant_id: merchant_id.to_owned(),
        version: stored.map_or(0, |s| s.version),
        updated_at: stored.map(|s| s.updated_at),
        config: stored
            .map(|s| RoutingConfigBody::from(&s.config))
            .unwrap_or_default(),
    }
}

/// The request field a refusal of the core is about.
fn refusal(error: &RoutingConfigError) -> ApiError {
    let param = match error {
        RoutingConfigError::TooManyRules
        | RoutingConfigError::BadRuleId { .. }
        | RoutingConfigError::DuplicateRuleId(_)
        | RoutingConfigError::BadAccounts(_)
        | RoutingConfigError::BadWeights(_)
        | RoutingConfigError::BadAmountRange(_)
        | RoutingConfigError::BadCurrency { .. } => "rules",
        RoutingConfigError::BadFallback => "fallback",
        RoutingConfigError::BadWindow => "failover_window_ms",
        RoutingConfigError::BadOverride(_) => "failure_overrides",
    };
    ApiError::invalid("routing_config_invalid", param, error.to_string())
}

/// Longest rule id, connector account or payment method type in a configuration.
const MAX_TOKEN_CHARS: usize = 64;
/// Longest failure code of an override.
const MAX_CODE_CHARS: usize = 128;
const MAX_CURRENCIES: usize = 32;
const MAX_METHOD_TYPES: usize = 16;
const MAX_METADATA_CONDITIONS: usize = 16;
const MAX_WEIGHT: i64 = 1_000_000;

/// Visible ASCII, 1 to [`MAX_TOKEN_CHARS`]: a rule id, an account, a method type.
fn token(value: &str, param: &str) -> Result<(), ApiError> {
    let visible = value.bytes().all(|b| b.is_ascii_graphic());
    if value.is_empty() || value.len() > MAX_TOKEN_CHARS || !visible {
        return Err(ApiError::invalid(
            "string_invalid",
            param,
            format!("{param} must be 1 to {MAX_TOKEN_CHARS} visible ASCII characters"),
        ));
    }
    Ok(())
}

fn at_most(len: usize, max: usize, param: &str) -> Result<(), ApiError> {
    if len > max {
        return Err(ApiError::invalid(
            "routing_config_invalid",
            param,
            format!("{param} holds at most {max} entries"),
        ));
    }
    Ok(())
}

fn check_conditions(when: &RouteConditionsBody, at: &str) -> Result<(), ApiError> {
    at_most(
        when.currencies.len(),
        MAX_CURRENCIES,
        &format!("{at}.currencies"),
    )?;
    for currency in &when.currencies {
        req::currency(currency, &format!("{at}.currencies"))?;
    }
    let types = &when.payment_method_types;
    at_most(
        types.len(),
        MAX_METHOD_TYPES,
        &format!("{at}.payment_method_types"),
    )?;
    for kind in types {
        token(kind, &format!("{at}.payment_method_types"))?;
    }
    at_most(
        when.metadata.len(),
        MAX_METADATA_CONDITIONS,
        &format!("{at}.metadata"),
    )?;
    for (key, value) in &when.metadata {
        let param = format!("{at}.metadata");
        req::required_text(key, &param, req::MAX_METADATA_KEY_CHARS)?;
        req::text(value, &param, req::MAX_METADATA_VALUE_CHARS)?;
    }
    Ok(())
}

/// Every field on its own, as the OpenAPI document states it (400); what
/// relates fields to each other is [`RoutingConfig::validate`]'s.
fn check_fields(body: &RoutingConfigBody) -> Result<(), ApiError> {
    for (index, rule) in body.rules.iter().enumerate() {
        let at = format!("rules[{index}]");
        token(&rule.id, &format!("{at}.id"))?;
        check_conditions(&rule.when, &format!("{at}.when"))?;
        for account in &rule.accounts {
            token(&account.connector_account, &format!("{at}.accounts"))?;
            if !(0..=MAX_WEIGHT).contains(&account.weight) {
                return Err(ApiError::invalid(
                    "parameter_invalid",
                    &format!("{at}.accounts"),
                    format!("a weight is between 0 and {MAX_WEIGHT}"),
                ));
            }
        }
    }
    for account in &body.fallback {
        token(account, "fallback")?;
    }
    for (index, o) in body.failure_overrides.iter().enumerate() {
        let at = format!("failure_overrides[{index}]");
        if !crate::admin::valid_adapter_name(&o.adapter) {
            return Err(ApiError::invalid(
                "adapter_name_invalid",
                &format!("{at}.adapter"),
                "an adapter name is 1 to 64 of a-z, 0-9 and -",
            ));
        }
        req::required_text(&o.code, &format!("{at}.code"), MAX_CODE_CHARS)?;
    }
    Ok(())
}

fn merchant_or_404(id: &str) -> Result<&str, ApiError> {
    if req::looks_like_id(id) {
        Ok(id)
    } else {
        Err(ApiError::not_found("resource_missing", "no such merchant"))
    }
}

/// Replace a merchant's routing configuration. Every account it names must
/// be one of the merchant's (409 otherwise); nothing is written on a refusal.
#[utoipa::path(
    put, path = "/admin/merchants/{merchant_id}/routing", tag = "admin",
    params(("merchant_id" = String, Path)),
    request_body = RoutingConfigBody,
    responses(
        (status = 200, body = RoutingConfigView),
        (status = 400, description = "A malformed field, or a configuration that is malformed as a whole (duplicate rule ids, accounts or overrides, a rule's weights all 0, an empty amount range)", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "No such merchant", body = ErrorBody),
        (status = 409, description = "The configuration names an account that is not the merchant's", body = ErrorBody),
    ),
    security(("admin_token" = []))
)]
pub async fn put_routing_config(
    State(state): State<MerchantApiState>,
    ApiPath(merchant_id): ApiPath<String>,
    ApiJson(body): ApiJson<RoutingConfigBody>,
) -> Result<Response, ApiError> {
    let merchant_id = merchant_or_404(&merchant_id)?;
    check_fields(&body)?;
    let config = RoutingConfig::from(body);
    // Then existence: naming an account that is not the merchant's is a 409
    // whatever else the body says; only a configuration over the merchant's own
    // accounts is judged as a whole (400).
    state.store.get_merchant(merchant_id).await?;
    let own = state.store.list_connector_accounts(merchant_id).await?;
    if let Some(foreign) = config
        .accounts()
        .into_iter()
        .find(|id| !own.iter().any(|a| a.id == *id))
    {
        return Err(ApiError::state_conflict(
            "connector_account_unknown",
            "rules",
            format!("not a connector account of this merchant: {foreign}"),
        ));
    }
    config.validate().map_err(|e| refusal(&e))?;
    let stored = state
        .store
        .put_routing_config(merchant_id, &config)
        .await
        .map_err(|e| match e {
            StoreError::InvalidRequest(message) => {
                ApiError::invalid("routing_config_invalid", "rules", message)
            }
            other => other.into(),
        })?;
    tracing::info!(merchant = %merchant_id, version = stored.version, "routing configuration set");
    Ok(json(StatusCode::OK, &view(merchant_id, Some(&stored))))
}

/// A merchant's routing configuration (version 0 and empty when none was set:
/// payments then need `connector_account`, or the merchant's only account).
#[utoipa::path(
    get, path = "/admin/merchants/{merchant_id}/routing", tag = "admin",
    params(("merchant_id" = String, Path)),
    responses((status = 200, body = RoutingConfigView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("admin_token" = []))
)]
pub async fn get_routing_config(
    State(state): State<MerchantApiState>,
    ApiPath(merchant_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let merchant_id = merchant_or_404(&merchant_id)?;
    state.store.get_merchant(merchant_id).await?;
    let stored = state.store.routing_config(merchant_id).await?;
    Ok(json(StatusCode::OK, &view(merchant_id, stored.as_ref())))
}

/// The failure classes, as the enum the body accepts (so a schema-valid body
/// never names a class the server refuses).
fn failure_class_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([
            "issuer_unavailable",
            "processor_unavailable",
            "processing_error",
            "credentials_refused",
            "insufficient_funds",
            "lost_or_stolen_card",
            "fraud",
            "issuer_declined",
            "invalid_card",
            "authentication_failed",
            "invalid_request",
            "unclassified",
        ]))
        .description(Some("How routing reads this code."))
        .build()
}

fn array_of(items: utoipa::openapi::Object, max: usize, unique: bool) -> utoipa::openapi::Array {
    use utoipa::openapi::schema::ArrayBuilder;
    ArrayBuilder::new()
        .items(items)
        .max_items(Some(max))
        .unique_items(unique)
        .build()
}

fn token_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_TOKEN_CHARS))
        .pattern(Some(crate::openapi::fields::ID_PATTERN))
        .build()
}

fn currencies_schema() -> utoipa::openapi::Array {
    array_of(
        crate::openapi::fields::currency_code(false),
        MAX_CURRENCIES,
        false,
    )
}

fn payment_method_types_schema() -> utoipa::openapi::Array {
    array_of(token_schema(), MAX_METHOD_TYPES, false)
}

/// Accounts tried after the rule's, each once.
fn fallback_schema() -> utoipa::openapi::Array {
    array_of(
        token_schema(),
        sluice_core::routing::MAX_ACCOUNTS_PER_LIST,
        true,
    )
}

fn metadata_schema() -> utoipa::openapi::Object {
    crate::openapi::fields::string_map(
        MAX_METADATA_CONDITIONS,
        req::MAX_METADATA_KEY_CHARS,
        req::MAX_METADATA_VALUE_CHARS,
        true,
        false,
    )
}

fn failure_code_schema() -> utoipa::openapi::Object {
    crate::openapi::fields::required_text(MAX_CODE_CHARS, false)
}
