//! The tenant boundary over real HTTP (issue 11 §1; architecture invariant 8).
//!
//! Two merchants on one gateway (`server::start`, the real Stripe-format and
//! Adyen-format components, the sandbox PSP), each with its own connector
//! account per adapter and its own webhook secret. Merchant A has money in
//! every open shape: a succeeded payment with a pending refund, an
//! authorization waiting for capture, a payment waiting for the customer's
//! 3-D Secure step. Merchant B, the attacker, posts correctly signed
//! webhooks to its own routes for every event kind the adapters emit,
//! naming A's aggregates every way an event can (attempt reference, action
//! reference, PSP reference, PSP payment reference). Nothing of A's may
//! change, nothing is charged or refunded at the PSP, each refusal is kept
//! as evidence and the inbox rows are quarantined with the reason.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use sluice_sandbox_psp::{
    adyen_hmac_signature, stripe_signature_header, AdyenSignedFields, RefundBehaviour,
    SandboxConfig, SandboxHandle, DEFAULT_ADYEN_API_KEY, DEFAULT_STRIPE_API_KEY,
};
use sluice_server::server::RunningServer;
use sqlx::Row;

use crate::common::{self, ADMIN_TOKEN};
use crate::pg::TestDatabase;
use crate::system::{call_ok, real_adapters};

const A_STRIPE_SECRET: &str = "whsec_tenant_a_0123456789";
const B_STRIPE_SECRET: &str = "whsec_tenant_b_9876543210";
const A_ADYEN_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
const B_ADYEN_KEY: &str = "0B1EB0C71FC68D9D0C057550C48EC2ACF6BA05644782DEF547AAA06C910C4393";

/// One merchant with a Stripe-format and an Adyen-format account.
struct Tenant {
    key: String,
    stripe: String,
    adyen: String,
    adyen_merchant_account: String,
    stripe_secret: &'static str,
    adyen_key: &'static str,
}

struct World {
    server: RunningServer,
    sandbox: SandboxHandle,
    http: reqwest::Client,
    a: Tenant,
    b: Tenant,
    _data: tempfile::TempDir,
    _adapters: tempfile::TempDir,
    _pg: Option<TestDatabase>,
}

impl World {
    async fn start(pg: Option<TestDatabase>) -> World {
        let sandbox = sluice_sandbox_psp::start(SandboxConfig {
            seed: Some(7),
            // A's pending refund stays pending until the test settles it, so
            // the snapshots compare a still state.
            late_webhook_delay: None,
            ..SandboxConfig::default()
        })
        .await
        .expect("sandbox PSP");
        let data = tempfile::tempdir().expect("data dir");
        let adapters = real_adapters();
        let mut config = common::config(data.path(), Some(adapters.path().to_path_buf()));
        if let Some(pg) = &pg {
            config.database_url = sluice_server::config::Secret::new(pg.url.clone());
        }
        let server = common::start(&config).await;
        let http = reqwest::Client::new();
        let a = tenant(&server, &sandbox, "A", A_STRIPE_SECRET, A_ADYEN_KEY).await;
        let b = tenant(&server, &sandbox, "B", B_STRIPE_SECRET, B_ADYEN_KEY).await;
        // The PSP's genuine webhooks go to A's routes, signed with A's secrets.
        for (adapter, account, secret, format, api_key) in [
            (
                "stripe",
                &a.stripe,
                a.stripe_secret,
                sluice_sandbox_psp::Format::Stripe,
                DEFAULT_STRIPE_API_KEY,
            ),
            (
                "adyen",
                &a.adyen,
                a.adyen_key,
                sluice_sandbox_psp::Format::Adyen,
                DEFAULT_ADYEN_API_KEY,
            ),
        ] {
            sandbox.set_webhook_target(
                adapter,
                sluice_sandbox_psp::WebhookTarget {
                    url: format!("{}/webhooks/{adapter}/{account}", server.url()),
                    secret: secret.into(),
                    format,
                    api_key: Some(api_key.into()),
                },
            );
        }
        World {
            server,
            sandbox,
            http,
            a,
            b,
            _data: data,
            _adapters: adapters,
            _pg: pg,
        }
    }

    async fn pay(&self, account: &str, order_no: &str, method: &str, capture: &str) -> Value {
        let body = json!({
            "amount": 1000, "currency": "EUR", "merchant_order_no": order_no,
            "connector_account": account, "payment_method": method, "capture_mode": capture,
            "return_url": "https://shop.example/return", "confirm": true,
        });
        self.merchant_call(Method::POST, "/v1/payments", Some(body))
            .await
    }

    async fn merchant_call(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.server.url());
        let mut request = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.a.key);
        if method == Method::POST {
            request = request.header("Idempotency-Key", uuid::Uuid::new_v4().to_string());
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("merchant call");
        let status = response.status();
        let json: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {json}");
        json
    }

    /// Everything of A's payment that an event could change: the resource and
    /// the length of its timeline.
    async fn snapshot(&self, ids: &[String]) -> Vec<String> {
        let mut seen = Vec::new();
        for id in ids {
            let mut payment = self
                .merchant_call(Method::GET, &format!("/v1/payments/{id}"), None)
                .await;
            // Derived from the clock, not from stored state.
            payment.as_object_mut().map(|p| p.remove("poll_after_ms"));
            let timeline = self
                .merchant_call(Method::GET, &format!("/v1/payments/{id}/timeline"), None)
                .await;
            let rows = timeline["data"].as_array().map_or(0, Vec::len);
            seen.push(format!("{payment} timeline={rows}"));
        }
        seen
    }

    async fn post_webhook(
        &self,
        adapter: &str,
        account: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> u16 {
        let mut request = self
            .http
            .post(format!(
                "{}/webhooks/{adapter}/{account}",
                self.server.url()
            ))
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        request
            .send()
            .await
            .expect("webhook post")
            .status()
            .as_u16()
    }

    /// Work the inbox until nothing is due (rows that wait for a retry are left).
    async fn drain_inbox(&self) {
        let orchestrator = &self.server.services().orchestrator;
        for _ in 0..200 {
            let round = orchestrator
                .process_inbox_once()
                .await
                .expect("inbox round");
            if round.claimed == 0
                && self
                    .inbox_count("status IN ('pending', 'processing')")
                    .await
                    == 0
            {
                return;
            }
        }
        panic!("the inbox did not drain");
    }

    async fn inbox_count(&self, condition: &str) -> i64 {
        let store = self.server.services().orchestrator.store();
        sqlx::query(&format!(
            "SELECT COUNT(*) FROM webhook_inbox WHERE {condition}"
        ))
        .fetch_one(store.pool())
        .await
        .expect("inbox count")
        .try_get::<i64, _>(0)
        .expect("count")
    }

    /// Waits for the sandbox's genuine webhooks to be acknowledged and applied.
    async fn settle(&self) {
        assert!(
            self.sandbox
                .wait_webhooks_idle(Duration::from_secs(20))
                .await,
            "sandbox webhooks idle"
        );
        self.drain_inbox().await;
    }
}

async fn tenant(
    server: &RunningServer,
    sandbox: &SandboxHandle,
    name: &str,
    stripe_secret: &'static str,
    adyen_key: &'static str,
) -> Tenant {
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", server.url());
    let merchant = call_ok(
        &client,
        Method::POST,
        &url("/admin/merchants"),
        ADMIN_TOKEN,
        Some(json!({"name": name})),
    )
    .await;
    let id = merchant["id"].as_str().expect("merchant id").to_owned();
    let key = call_ok(
        &client,
        Method::POST,
        &url(&format!("/admin/merchants/{id}/api_keys")),
        ADMIN_TOKEN,
        Some(json!({"label": "k"})),
    )
    .await;
    let adyen_merchant_account = format!("Tenant{name}ECOM");
    let mut accounts = Vec::new();
    for (adapter, base_url, api_key, secret) in [
        (
            "stripe",
            sandbox.base_url_stripe(),
            DEFAULT_STRIPE_API_KEY,
            stripe_secret,
        ),
        (
            "adyen",
            sandbox.base_url_adyen(),
            DEFAULT_ADYEN_API_KEY,
            adyen_key,
        ),
    ] {
        let mut config = json!({"base_url": base_url});
        if adapter == "adyen" {
            config["merchant_account"] = json!(adyen_merchant_account);
        }
        let account = call_ok(
            &client,
            Method::POST,
            &url(&format!("/admin/merchants/{id}/connector_accounts")),
            ADMIN_TOKEN,
            Some(
                json!({"adapter": adapter, "label": adapter, "config": config,
                        "secrets": {"api_key": api_key, "webhook_secret": secret}}),
            ),
        )
        .await;
        accounts.push(account["id"].as_str().expect("account id").to_owned());
    }
    Tenant {
        key: key["key"].as_str().expect("api key").to_owned(),
        stripe: accounts[0].clone(),
        adyen: accounts[1].clone(),
        adyen_merchant_account,
        stripe_secret,
        adyen_key,
    }
}

/// A's references: every name an event could use for A's aggregates.
#[derive(Debug, Default)]
struct Names {
    attempt_references: Vec<String>,
    action_references: Vec<String>,
    psp_payment_references: Vec<String>,
    psp_refund_references: Vec<String>,
}

impl Names {
    /// What the payments show, plus the PSP's ids of their refunds (which the
    /// PSP, and an attacker reading its own dashboard leaks, knows).
    fn of(payments: &[Value], sandbox: &SandboxHandle) -> Names {
        let mut names = Names::default();
        let text = |v: &Value| v.as_str().map(str::to_owned);
        for p in payments {
            for attempt in p["attempts"].as_array().into_iter().flatten() {
                names.attempt_references.extend(text(&attempt["reference"]));
                names
                    .psp_payment_references
                    .extend(text(&attempt["psp_reference"]));
            }
            for refund in p["refunds"].as_array().into_iter().flatten() {
                let reference = text(&refund["reference"]);
                let at_psp = sandbox
                    .refunds()
                    .into_iter()
                    .filter(|r| r.reference == reference);
                names.psp_refund_references.extend(at_psp.map(|r| r.id));
                names.action_references.extend(reference);
            }
            for capture in p["captures"].as_array().into_iter().flatten() {
                names.action_references.extend(text(&capture["reference"]));
            }
        }
        names
    }
}

const STRIPE_INTENT_EVENTS: &[(&str, &str)] = &[
    ("payment_intent.succeeded", "succeeded"),
    ("payment_intent.payment_failed", "requires_payment_method"),
    ("payment_intent.processing", "processing"),
    ("payment_intent.requires_action", "requires_action"),
    (
        "payment_intent.amount_capturable_updated",
        "requires_capture",
    ),
    ("payment_intent.canceled", "canceled"),
];
const STRIPE_REFUND_EVENTS: &[(&str, &str)] = &[
    ("refund.updated", "failed"),
    ("refund.failed", "failed"),
    ("refund.created", "succeeded"),
    ("charge.refund.updated", "canceled"),
];

/// Every Stripe-format event body B can sign that names one of A's aggregates.
fn stripe_attacks(names: &Names) -> Vec<Value> {
    let mut bodies = Vec::new();
    let intent = |id: &str, status: &str, metadata: Value| {
        json!({"id": id, "object": "payment_intent", "status": status, "amount": 1000,
               "amount_received": 1000, "amount_capturable": 1000, "currency": "eur",
               "capture_method": "automatic", "metadata": metadata})
    };
    for (kind, status) in STRIPE_INTENT_EVENTS {
        for psp in &names.psp_payment_references {
            bodies.push((kind.to_string(), intent(psp, status, json!({}))));
        }
        for reference in &names.attempt_references {
            bodies.push((
                kind.to_string(),
                intent(
                    "pi_attacker",
                    status,
                    json!({"sluice_attempt_reference": reference}),
                ),
            ));
        }
    }
    let refund = |id: &str, status: &str, pi: &str, metadata: Value| {
        json!({"id": id, "object": "refund", "status": status, "amount": 1000, "currency": "eur",
               "payment_intent": pi, "failure_reason": "lost_or_stolen_card", "metadata": metadata})
    };
    for (kind, status) in STRIPE_REFUND_EVENTS {
        for psp in &names.psp_refund_references {
            bodies.push((
                kind.to_string(),
                refund(psp, status, "pi_attacker", json!({})),
            ));
        }
        for reference in &names.action_references {
            bodies.push((
                kind.to_string(),
                refund(
                    "re_attacker",
                    status,
                    "pi_attacker",
                    json!({"sluice_refund_reference": reference}),
                ),
            ));
        }
        for pi in &names.psp_payment_references {
            bodies.push((
                kind.to_string(),
                refund("re_attacker_2", status, pi, json!({})),
            ));
        }
    }
    for pi in &names.psp_payment_references {
        bodies.push((
            "charge.dispute.created".into(),
            json!({"id": "dp_attacker", "object": "dispute",
            "status": "needs_response", "amount": 1000, "currency": "eur", "payment_intent": pi}),
        ));
        bodies.push(("charge.refunded".into(), json!({"id": "ch_attacker", "object": "charge",
            "payment_intent": pi, "refunds": {"object": "list", "data": [refund("re_attacker_3", "succeeded", pi, json!({}))]}})));
    }
    bodies
        .into_iter()
        .enumerate()
        .map(|(n, (kind, object))| {
            json!({"id": format!("evt_attack_{n}"), "object": "event",
            "type": kind, "created": 1_700_000_000, "data": {"object": object}})
        })
        .collect()
}

const ADYEN_EVENT_CODES: &[(&str, bool)] = &[
    ("AUTHORISATION", true),
    ("AUTHORISATION", false),
    ("CAPTURE", true),
    ("CAPTURE", false),
    ("CANCELLATION", true),
    ("REFUND", true),
    ("REFUND", false),
    ("REFUND_FAILED", true),
    ("CHARGEBACK", true),
];

/// (pspReference, originalReference, merchantReference) triples naming A's aggregates.
fn adyen_namings(names: &Names) -> Vec<(String, String, String)> {
    let mut namings = Vec::new();
    for psp in &names.psp_payment_references {
        namings.push((psp.clone(), String::new(), String::new()));
        namings.push(("ATTACKER0000001".into(), psp.clone(), String::new()));
    }
    for psp in &names.psp_refund_references {
        namings.push((psp.clone(), String::new(), String::new()));
    }
    for reference in names
        .attempt_references
        .iter()
        .chain(&names.action_references)
    {
        namings.push(("ATTACKER0000002".into(), String::new(), reference.clone()));
    }
    namings
}

/// A one-item Adyen notification signed with `key`, claiming `merchant_account`.
fn adyen_notification(
    key: &str,
    merchant_account: &str,
    code: &str,
    success: bool,
    naming: &(String, String, String),
) -> Value {
    let (psp, original, merchant_reference) = naming;
    let fields = AdyenSignedFields {
        psp_reference: psp,
        original_reference: original,
        merchant_account_code: merchant_account,
        merchant_reference,
        value: 1000,
        currency: "EUR",
        event_code: code,
        success,
    };
    let signature = adyen_hmac_signature(key, &fields).expect("hex key");
    json!({"live": "false", "notificationItems": [{"NotificationRequestItem": {
        "additionalData": {"hmacSignature": signature},
        "amount": {"currency": "EUR", "value": 1000},
        "eventCode": code, "eventDate": "2026-12-01T10:00:00+01:00",
        "merchantAccountCode": merchant_account, "merchantReference": merchant_reference,
        "originalReference": original, "pspReference": psp, "reason": "",
        "success": success.to_string(),
    }}]})
}

/// A's payments in every open shape, on one adapter; returns their ids.
async fn victims(world: &World, account: &str, prefix: &str) -> Vec<Value> {
    let paid = world
        .pay(
            account,
            &format!("{prefix}-paid"),
            "pm_card_visa",
            "automatic",
        )
        .await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    world
        .sandbox
        .set_refund_behaviour(RefundBehaviour::PendingThenSucceed);
    let id = paid["id"].as_str().expect("id");
    world
        .merchant_call(
            Method::POST,
            &format!("/v1/payments/{id}/refunds"),
            Some(json!({"amount": 300})),
        )
        .await;
    world.sandbox.set_refund_behaviour(RefundBehaviour::Succeed);
    let held = world
        .pay(account, &format!("{prefix}-held"), "pm_card_visa", "manual")
        .await;
    assert_eq!(held["status"], "authorized", "{held}");
    let waiting = world
        .pay(
            account,
            &format!("{prefix}-3ds"),
            "pm_card_threeDSecureRequired",
            "automatic",
        )
        .await;
    assert_eq!(waiting["status"], "requires_action", "{waiting}");
    world.settle().await;
    let mut settled = Vec::new();
    for p in [paid, held, waiting] {
        let id = p["id"].as_str().expect("id");
        settled.push(
            world
                .merchant_call(Method::GET, &format!("/v1/payments/{id}"), None)
                .await,
        );
    }
    settled
}

async fn refusals(world: &World, account: &str) -> usize {
    let store = world.server.services().orchestrator.store();
    store
        .scope_refusals(account, 1000)
        .await
        .expect("refusals")
        .len()
}

async fn another_merchants_signed_webhooks_never_move_a_merchants_money(world: World) {
    let stripe_victims = victims(&world, &world.a.stripe, "s").await;
    let adyen_victims = victims(&world, &world.a.adyen, "y").await;
    let ids: Vec<String> = stripe_victims
        .iter()
        .chain(&adyen_victims)
        .map(|p| p["id"].as_str().expect("id").to_owned())
        .collect();
    let charges_before = world.sandbox.charge_counts();
    let refunds_before = world.sandbox.refunds().len();
    let before = world.snapshot(&ids).await;
    let inbox_before = world.inbox_count("1 = 1").await;

    let stripe_names = Names::of(&stripe_victims, &world.sandbox);
    assert!(
        stripe_names.psp_refund_references.len() == 1
            && stripe_names.psp_payment_references.len() == 3,
        "{stripe_names:?}"
    );
    let stripe = stripe_attacks(&stripe_names);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    for body in &stripe {
        let bytes = serde_json::to_vec(body).expect("json");
        let signature = stripe_signature_header(world.b.stripe_secret, now, &bytes);
        let status = world
            .post_webhook(
                "stripe",
                &world.b.stripe,
                &[("stripe-signature", signature)],
                &bytes,
            )
            .await;
        assert_eq!(
            status, 200,
            "B's correctly signed webhook is accepted into B's inbox: {body}"
        );
    }
    let adyen_names = Names::of(&adyen_victims, &world.sandbox);
    let mut adyen = 0;
    for (code, success) in ADYEN_EVENT_CODES {
        for naming in adyen_namings(&adyen_names) {
            // Signed with B's own key; claiming B's merchant account, and A's.
            for merchant_account in [
                &world.b.adyen_merchant_account,
                &world.a.adyen_merchant_account,
            ] {
                let body = adyen_notification(
                    world.b.adyen_key,
                    merchant_account,
                    code,
                    *success,
                    &naming,
                );
                let bytes = serde_json::to_vec(&body).expect("json");
                world
                    .post_webhook("adyen", &world.b.adyen, &[], &bytes)
                    .await;
                adyen += 1;
            }
        }
    }
    world.drain_inbox().await;

    assert_eq!(
        world.snapshot(&ids).await,
        before,
        "none of A's payments, refunds or captures changed"
    );
    assert_eq!(
        world.sandbox.charge_counts(),
        charges_before,
        "nothing was charged"
    );
    assert_eq!(
        world.sandbox.refunds().len(),
        refunds_before,
        "nothing was refunded"
    );
    let hostile = world.inbox_count("1 = 1").await - inbox_before;
    assert!(
        hostile as usize >= stripe.len(),
        "{hostile} hostile inbox rows for {} Stripe-format and {adyen} Adyen-format posts",
        stripe.len()
    );
    assert_eq!(
        world.inbox_count("status = 'processed'").await,
        world
            .inbox_count(&format!(
                "status = 'processed' AND connector_account_id IN ('{}', '{}')",
                world.a.stripe, world.a.adyen
            ))
            .await,
        "no event through B's accounts was applied"
    );
    let quarantined = world.inbox_count(&format!(
        "status = 'quarantined' AND quarantine_reason LIKE '%not an aggregate of connector account%' \
         AND connector_account_id IN ('{}', '{}')", world.b.stripe, world.b.adyen)).await;
    let recorded = refusals(&world, &world.b.stripe).await + refusals(&world, &world.b.adyen).await;
    assert!(
        quarantined > 0 && recorded as i64 == quarantined,
        "every refusal quarantined ({quarantined}) and kept as evidence ({recorded})"
    );
    assert_eq!(
        refusals(&world, &world.a.stripe).await + refusals(&world, &world.a.adyen).await,
        0
    );
    let metrics = world
        .http
        .get(format!("{}/metrics", world.server.url()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("sluice_tenant_scope_refusals_total"),
        "the refusals are counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_merchants_signed_webhooks_never_move_a_merchants_money_on_sqlite() {
    another_merchants_signed_webhooks_never_move_a_merchants_money(World::start(None).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_merchants_signed_webhooks_never_move_a_merchants_money_on_postgres() {
    let pg = TestDatabase::create().await;
    another_merchants_signed_webhooks_never_move_a_merchants_money(World::start(Some(pg)).await)
        .await;
}
