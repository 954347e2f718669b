//! `sluice demo`: the gateway plus a built-in sandbox PSP and a demo merchant
//! with one connector account per adapter and a second Stripe-format account,
//! so a newcomer can try a payment with one curl; a routing rule sends EUR
//! payments without `connector_account` to the first Stripe-format account and
//! fails over to the second one on a cascadable decline (README).

use sluice_core::{RouteConditions, RouteRule, RoutingConfig, WeightedAccount};
use sluice_sandbox_psp::{
    Format, SandboxConfig, SandboxHandle, WebhookTarget, DEFAULT_ADYEN_API_KEY,
    DEFAULT_STRIPE_API_KEY,
};
use sluice_store::{ApiKeyPepper, NewConnectorAccount, Store, StoreError};

/// The Stripe-format webhook secret the sandbox signs with in the demo.
const DEMO_STRIPE_WEBHOOK_SECRET: &str = "whsec_sluice_demo";
/// The Adyen-format HMAC key (hex) the sandbox signs with in the demo.
const DEMO_ADYEN_HMAC_KEY: &str =
    "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

/// The API key of the sandbox's second Stripe-format account.
pub const DEMO_SECOND_STRIPE_API_KEY: &str = "sk_test_sluice_sandbox_b";
/// Its webhook secret.
const DEMO_SECOND_STRIPE_WEBHOOK_SECRET: &str = "whsec_sluice_demo_b";

/// Why the demo could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot start the sandbox PSP: {0}")]
    Sandbox(String),
    #[error("cannot create the demo merchant: {0}")]
    Store(#[from] StoreError),
}

/// What the demo created, for the banner.
pub struct DemoSetup {
    pub sandbox: SandboxHandle,
    pub merchant_id: String,
    pub api_key: String,
    /// (adapter, connector account id)
    pub accounts: Vec<(String, String)>,
}

/// An operator the demo created for the console: (name, key shown once).
pub type DemoOperator = (String, String);

/// Two operators, so the console's two-person rule can be tried: one
/// proposes a review resolution, the other approves it. Operator names are
/// unique and the data dir outlives a demo run, so each run's names carry a
/// suffix of its own (from the demo merchant's id, minted fresh each run).
pub async fn create_operators(
    store: &Store,
    pepper: &ApiKeyPepper,
    setup: &DemoSetup,
) -> Result<Vec<DemoOperator>, DemoError> {
    let suffix: String = setup
        .merchant_id
        .chars()
        .rev()
        .take(6)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let mut operators = Vec::new();
    for name in ["alice", "bob"] {
        let issued = store
            .create_operator(&format!("{name}-{suffix}"), pepper)
            .await?;
        operators.push((issued.operator.name.clone(), issued.key.clone()));
    }
    Ok(operators)
}

/// How the demo's sandbox PSP behaves beyond its defaults.
#[derive(Debug, Clone, Copy)]
pub struct DemoOptions {
    /// How many of the sandbox's webhook requests may be in flight at once
    /// (`SandboxConfig::webhook_senders`): 1 sends them in order.
    pub webhook_senders: usize,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self { webhook_senders: 1 }
    }
}

/// Start the sandbox PSP and create a demo merchant whose connector
/// accounts point at it; the sandbox's webhooks go to `gateway_url`.
pub async fn set_up(
    store: &Store,
    pepper: &ApiKeyPepper,
    gateway_url: &str,
) -> Result<DemoSetup, DemoError> {
    set_up_with(store, pepper, gateway_url, DemoOptions::default()).await
}

/// [`set_up`] with a sandbox set up as `options` say.
pub async fn set_up_with(
    store: &Store,
    pepper: &ApiKeyPepper,
    gateway_url: &str,
    options: DemoOptions,
) -> Result<DemoSetup, DemoError> {
    let sandbox = sluice_sandbox_psp::start(SandboxConfig {
        stripe_api_keys: vec![
            DEFAULT_STRIPE_API_KEY.to_owned(),
            DEMO_SECOND_STRIPE_API_KEY.to_owned(),
        ],
        webhook_senders: options.webhook_senders,
        ..SandboxConfig::default()
    })
    .await
    .map_err(|e| DemoError::Sandbox(e.to_string()))?;
    let merchant = store.create_merchant("Demo merchant").await?;
    let key = store.issue_api_key(&merchant.id, "demo", pepper).await?;
    let mut accounts = Vec::new();
    for (name, adapter, base_url, api_key, secret, format) in [
        (
            "stripe",
            "stripe",
            sandbox.base_url_stripe(),
            DEFAULT_STRIPE_API_KEY,
            DEMO_STRIPE_WEBHOOK_SECRET,
            Format::Stripe,
        ),
        (
            "adyen",
            "adyen",
            sandbox.base_url_adyen(),
            DEFAULT_ADYEN_API_KEY,
            DEMO_ADYEN_HMAC_KEY,
            Format::Adyen,
        ),
        (
            "stripe-b",
            "stripe",
            sandbox.base_url_stripe(),
            DEMO_SECOND_STRIPE_API_KEY,
            DEMO_SECOND_STRIPE_WEBHOOK_SECRET,
            Format::Stripe,
        ),
    ] {
        let mut config = serde_json::json!({ "base_url": base_url });
        if adapter == "adyen" {
            config["merchant_account"] = serde_json::json!("SluiceDemo");
        }
        let account = store
            .create_connector_account(&NewConnectorAccount {
                merchant_id: merchant.id.clone(),
                adapter: adapter.into(),
                label: format!("demo {name} (sandbox PSP)"),
                config,
                secrets: serde_json::json!({ "api_key": api_key, "webhook_secret": secret }),
            })
            .await?;
        sandbox.set_webhook_target(
            name,
            WebhookTarget {
                url: format!("{gateway_url}/webhooks/{adapter}/{}", account.id),
                secret: secret.into(),
                format,
                api_key: Some(api_key.into()),
            },
        );
        accounts.push((name.to_owned(), account.id));
    }
    store
        .put_routing_config(&merchant.id, &demo_routing(&accounts))
        .await?;
    Ok(DemoSetup {
        sandbox,
        merchant_id: merchant.id,
        api_key: key.plaintext,
        accounts,
    })
}

/// EUR payments without `connector_account` go to the first Stripe-format
/// account; a cascadable decline there fails over to the second one.
fn demo_routing(accounts: &[(String, String)]) -> RoutingConfig {
    let id = |name: &str| {
        accounts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| id.clone())
            .unwrap_or_default()
    };
    RoutingConfig {
        rules: vec![RouteRule {
            id: "eur-cards".into(),
            when: RouteConditions {
                currencies: vec!["EUR".into()],
                payment_method_types: vec!["card".into()],
                ..RouteConditions::default()
            },
            accounts: vec![
                WeightedAccount {
                    connector_account: id("stripe"),
                    weight: 1,
                },
                WeightedAccount {
                    connector_account: id("stripe-b"),
                    weight: 0,
                },
            ],
        }],
        ..RoutingConfig::default()
    }
}

/// The part of the banner that shows how to pay.
pub fn payment_banner(gateway_url: &str, setup: &DemoSetup) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "\nDemo merchant {}\n  API key: {}\n  sandbox PSP: {}\n",
        setup.merchant_id,
        setup.api_key,
        setup.sandbox.base_url()
    ));
    for (adapter, account) in &setup.accounts {
        out.push_str(&format!("  connector account {adapter}: {account}\n"));
    }
    let account = setup
        .accounts
        .first()
        .map(|(_, id)| id.as_str())
        .unwrap_or("<connector account>");
    out.push_str(&format!(
        "\nCreate and confirm a payment:\n  curl -s {gateway_url}/v1/payments \\\n    -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' \\\n    -H 'Idempotency-Key: demo-1' \\\n    -d '{{\"amount\": 1999, \"currency\": \"EUR\", \"merchant_order_no\": \"order-1\", \"capture_mode\": \"automatic\", \"connector_account\": \"{account}\", \"payment_method\": \"pm_card_visa\", \"confirm\": true}}'\n",
        setup.api_key
    ));
    out.push_str(&format!(
        "\nRouting: EUR payments without connector_account go to {} and fail over to {} on a \
         cascadable decline (try PUT {}/_sandbox/account_declines/{DEFAULT_STRIPE_API_KEY} \
         with {{\"decline\": \"issuer_unavailable\"}}).\n",
        setup
            .accounts
            .first()
            .map(|(_, id)| id.as_str())
            .unwrap_or("-"),
        setup
            .accounts
            .last()
            .map(|(_, id)| id.as_str())
            .unwrap_or("-"),
        setup.sandbox.base_url()
    ));
    out.push_str("\nOther test tokens: pm_card_chargeDeclined (decline), pm_sluice_commit_then_timeout (timeout that converges), pm_card_threeDSecureRequired (requires action).\n");
    out
}

/// The part of the banner that shows the operations console: where it is,
/// how to sign in, and a timeout converging in it.
pub fn console_banner(gateway_url: &str, setup: &DemoSetup, operators: &[DemoOperator]) -> String {
    let mut out = format!(
        "\nOperations console: {gateway_url}/console\n  Sign in with the admin token above and \
         one of these operator keys (one operator proposes a review resolution, the other \
         approves it):\n"
    );
    for (name, key) in operators {
        out.push_str(&format!("    {name:<14} {key}\n"));
    }
    let account = setup
        .accounts
        .first()
        .map(|(_, id)| id.as_str())
        .unwrap_or("<connector account>");
    out.push_str(&format!(
        "\nTry this: a timeout that converges. The sandbox charges this payment but holds its \
         answer past the gateway's call deadline (the curl returns after about 15 s):\n  \
         curl -s {gateway_url}/v1/payments \\\n    \
         -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' \\\n    \
         -H 'Idempotency-Key: demo-timeout-1' \\\n    -d '{{\"amount\": 2500, \"currency\": \"EUR\", \
         \"merchant_order_no\": \"timeout-1\", \"connector_account\": \"{account}\", \
         \"payment_method\": \"pm_sluice_commit_then_timeout\", \"confirm\": true}}'\n  \
         Meanwhile search timeout-1 in the console and reload: the attempt lane shows it \
         submitted, then SUCCEEDED by the PSP's webhook, then the call's timeout \
         (RESULT_UNKNOWN) ignored as stale, dashed. Had no webhook come, the next box would \
         show the recovery scanner's query with the attempt's reference and when it is due.\n",
        setup.api_key
    ));
    out
}
