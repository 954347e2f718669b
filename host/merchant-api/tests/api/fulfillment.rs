//! Guaranteed fulfillment or refund (issue 7) through the real system: the
//! merchant API over HTTP, the real Stripe-format adapter, the stateful
//! sandbox PSP, the recovery scanner waking due fulfillments, on SQLite and
//! PostgreSQL. The store's clock is the wall clock plus a skew the test moves
//! forward, so deadlines pass without sleeping.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use axum::middleware;
use serde_json::{json, Value};
use sluice_adapter_runtime::{AdapterRuntime, HttpResponse, RuntimeConfig};
use sluice_core::{FulfillmentPolicy, FulfillmentState, RefundState};
use sluice_merchant_api::{admin_router, router, MerchantApiState};
use sluice_orchestrator::transport::{CheckedRequest, TransportError};
use sluice_orchestrator::{CallBudget, Orchestrator, PspTransport, ReqwestTransport, Trigger};
use sluice_sandbox_psp::{
    Format, SandboxConfig, SandboxHandle, WebhookTarget, DEFAULT_STRIPE_API_KEY,
};
use sluice_scanner::{Scanner, ScannerConfig};
use sluice_store::Clock as _;
use tokio::sync::watch;

use crate::common::{
    adapters_dir, eventually, orchestrator_config, pepper, test_db, Backend, Reply, TestDb,
    ADMIN_TOKEN,
};

const STRIPE_WEBHOOK_SECRET: &str = "whsec_sluice_fulfillment_tests";
/// The deadline settles this long after it (the business call budget).
const ACTION_TIMEOUT_MS: i64 = 400;
const CONVERGE: Duration = Duration::from_secs(20);

/// Loses the answer of the next refund request after the sandbox committed it.
#[derive(Debug)]
struct LossyTransport {
    inner: ReqwestTransport,
    lose_next_refund: AtomicBool,
}

#[async_trait]
impl PspTransport for LossyTransport {
    async fn send(
        &self,
        request: &CheckedRequest,
        budget: &CallBudget,
    ) -> Result<HttpResponse, TransportError> {
        let is_refund =
            request.method == reqwest::Method::POST && request.url.path().ends_with("/v1/refunds");
        let answer = self.inner.send(request, budget).await;
        if is_refund && self.lose_next_refund.swap(false, Ordering::SeqCst) {
            return Err(TransportError::Timeout(budget.timeout));
        }
        answer
    }
}

fn cache_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("compile cache dir"))
        .path()
        .to_path_buf()
}

fn stripe_runtime() -> AdapterRuntime {
    let runtime = AdapterRuntime::new(RuntimeConfig {
        cache_dir: Some(cache_dir()),
        max_concurrent_instances: 16,
        ..RuntimeConfig::default()
    })
    .expect("adapter runtime");
    let path = adapters_dir().join("stripe.wasm");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}); build the adapters first: `cargo xtask build-adapters`",
            path.display()
        )
    });
    runtime
        .load("stripe", &bytes, None, true)
        .unwrap_or_else(|e| panic!("loading stripe: {e:?}"));
    runtime
}

/// A shop with a fulfillment-guaranteed product, behind the real API.
pub struct Shop {
    pub db: TestDb,
    pub sandbox: SandboxHandle,
    pub orch: Orchestrator,
    pub scanner: Scanner,
    pub registry: prometheus::Registry,
    transport: Arc<LossyTransport>,
    pub base: String,
    pub http: reqwest::Client,
    pub key: String,
    pub merchant_id: String,
    pub account: String,
    stop: watch::Sender<bool>,
}

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

macro_rules! shop_test {
    ($(#[$meta:meta])* async fn $name:ident($shop:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($shop: &Shop) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_sqlite() {
                run(&Shop::open(test_db(Backend::Sqlite).await).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_postgres() {
                run(&Shop::open(test_db(Backend::Postgres).await).await).await;
            }
        }
    };
}

impl Shop {
    pub async fn open(mut db: TestDb) -> Shop {
        db.store = db.store.clone().with_fulfillment_policy(FulfillmentPolicy {
            first_check_delay_ms: 200,
            max_check_delay_ms: 2_000,
            action_timeout_ms: ACTION_TIMEOUT_MS,
            unanswered_review_after_ms: 60_000,
        });
        let sandbox = sluice_sandbox_psp::start(SandboxConfig {
            late_webhook_delay: Some(Duration::from_millis(300)),
            seed: Some(11),
            ..SandboxConfig::default()
        })
        .await
        .expect("sandbox PSP");
        let runtime = tokio::task::spawn_blocking(stripe_runtime)
            .await
            .expect("runtime task");
        let transport = Arc::new(LossyTransport {
            inner: ReqwestTransport::new().expect("transport"),
            lose_next_refund: AtomicBool::new(false),
        });
        let orch = Orchestrator::new(
            db.store.clone(),
            runtime,
            transport.clone(),
            Arc::new(db.clock.clone()),
            orchestrator_config(),
        );
        let registry = prometheus::Registry::new();
        let scanner = Scanner::with_metrics(
            orch.clone(),
            ScannerConfig {
                lease: Duration::from_secs(5),
                ..ScannerConfig::default()
            },
            &registry,
        )
        .expect("scanner");
        let state = MerchantApiState::new(orch.clone(), pepper());
        let app = router(state.clone()).merge(admin_router(
            state,
            middleware::from_fn(
                |request: axum::extract::Request, next: middleware::Next| async move {
                    let ok = request
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        == Some(format!("Bearer {ADMIN_TOKEN}").as_str());
                    if ok {
                        next.run(request).await
                    } else {
                        axum::response::IntoResponse::into_response(
                            axum::http::StatusCode::UNAUTHORIZED,
                        )
                    }
                },
            ),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let (stop, stopped) = watch::channel(false);
        let processor = orch.clone();
        tokio::spawn(async move { processor.run_inbox_processor(stopped).await });
        let http = reqwest::Client::new();
        let admin = |path: &str, body: Value| {
            http.post(format!("{base}{path}"))
                .bearer_auth(ADMIN_TOKEN)
                .json(&body)
                .send()
        };
        let merchant: Value = admin("/admin/merchants", json!({"name": "Renewals Ltd"}))
            .await
            .expect("merchant")
            .json()
            .await
            .expect("merchant json");
        let merchant_id = merchant["id"].as_str().expect("id").to_owned();
        let key: Value = admin(
            &format!("/admin/merchants/{merchant_id}/api_keys"),
            json!({"label": "shop"}),
        )
        .await
        .expect("key")
        .json()
        .await
        .expect("key json");
        let account: Value = admin(
            &format!("/admin/merchants/{merchant_id}/connector_accounts"),
            json!({
                "adapter": "stripe",
                "label": "stripe",
                "config": {"base_url": sandbox.base_url_stripe()},
                "secrets": {"api_key": DEFAULT_STRIPE_API_KEY, "webhook_secret": STRIPE_WEBHOOK_SECRET}
            }),
        )
        .await
        .expect("account")
        .json()
        .await
        .expect("account json");
        let account = account["id"].as_str().expect("account id").to_owned();
        let shop = Shop {
            db,
            sandbox,
            orch,
            scanner,
            registry,
            transport,
            base,
            http,
            key: key["key"].as_str().expect("api key").to_owned(),
            merchant_id,
            account,
            stop,
        };
        shop.webhooks_on();
        shop
    }

    fn webhooks_on(&self) {
        self.sandbox.set_webhook_target(
            "stripe",
            WebhookTarget {
                url: format!("{}/webhooks/stripe/{}", self.base, self.account),
                secret: STRIPE_WEBHOOK_SECRET.into(),
                format: Format::Stripe,
                api_key: Some(DEFAULT_STRIPE_API_KEY.into()),
            },
        );
    }

    fn webhooks_off(&self) {
        self.sandbox.remove_webhook_target("stripe");
    }

    fn lose_next_refund_answer(&self) {
        self.transport
            .lose_next_refund
            .store(true, Ordering::SeqCst);
    }

    pub fn now_ms(&self) -> i64 {
        self.db.clock.now_ms()
    }

    pub async fn post(&self, path: &str, idem: Option<&str>, body: &Value) -> Reply {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .json(body);
        if let Some(idem) = idem {
            request = request.header("Idempotency-Key", idem);
        }
        read(request.send().await.expect("HTTP")).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        let request = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        read(request.send().await.expect("HTTP")).await
    }

    /// Pay for a goal with a push-mode fulfillment deadline `in_ms` ahead.
    pub async fn pay(&self, order_no: &str, biz_key: &str, in_ms: i64) -> Value {
        self.pay_with(order_no, biz_key, in_ms, "push").await
    }

    pub async fn pay_with(&self, order_no: &str, biz_key: &str, in_ms: i64, mode: &str) -> Value {
        let body = json!({
            "amount": 1200,
            "currency": "EUR",
            "merchant_order_no": order_no,
            "payment_method": "pm_card_visa",
            "connector_account": self.account,
            "confirm": true,
            "fulfillment": {"biz_key": biz_key, "deadline": self.now_ms() + in_ms, "mode": mode}
        });
        let reply = self.post("/v1/payments", None, &body).await.expect(201);
        let payment = reply.json();
        assert_eq!(payment["status"], "succeeded", "{payment}");
        assert_eq!(
            payment["fulfillment"]["state"], "awaiting_fulfillment",
            "{payment}"
        );
        payment
    }

    pub async fn payment(&self, id: &str) -> Value {
        self.get(&format!("/v1/payments/{id}"))
            .await
            .expect(200)
            .json()
    }

    pub async fn fulfillment_state(&self, id: &str) -> FulfillmentState {
        self.db
            .store
            .fulfillment_snapshot(id)
            .await
            .unwrap()
            .expect("fulfillment block")
            .state
    }

    /// Let the deadline pass and settle.
    pub fn pass_deadline(&self, in_ms: i64) {
        self.db.clock.advance(in_ms + ACTION_TIMEOUT_MS + 1);
    }

    /// Scanner rounds, moving the clock on between them, until `done`.
    pub async fn scan_until<F, Fut>(&self, what: &str, mut done: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = std::time::Instant::now() + CONVERGE;
        loop {
            self.scanner.scan_once().await.expect("scanner round");
            if done().await {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            self.db.clock.advance(1_000);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn read(response: reqwest::Response) -> Reply {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("body").to_vec();
    Reply {
        status,
        headers,
        bytes,
    }
}

fn attempt_reference(payment: &Value) -> String {
    payment["attempts"][0]["reference"]
        .as_str()
        .expect("attempt reference")
        .to_owned()
}

fn id_of(payment: &Value) -> String {
    payment["id"].as_str().expect("payment id").to_owned()
}

shop_test! {
    async fn the_deadline_passes_and_exactly_one_compensation_refund_converges_through_a_lost_refund_response(shop) {
        // Only the host's own query may learn the refund's outcome.
        shop.webhooks_off();
        let payment = shop.pay("renew-1", "subscription-1", 2_000).await;
        let id = id_of(&payment);
        let reference = attempt_reference(&payment);
        let refund_reference = sluice_core::compensation_refund_reference(&reference);
        shop.lose_next_refund_answer();
        shop.pass_deadline(2_000);
        let report = shop.scanner.scan_once().await.expect("scanner round");
        assert_eq!(report.fulfillment_checks, 1, "{report:?}");
        assert_eq!(shop.fulfillment_state(&id).await, FulfillmentState::Compensating);
        // The sandbox refunded; Sluice lost the answer: UNKNOWN, same reference.
        let refund = shop.db.store.get_refund_by_reference(&refund_reference).await.unwrap();
        assert_eq!(refund.state, RefundState::Unknown, "{refund:?}");
        assert_eq!(shop.sandbox.refund_count(&refund_reference), 1);
        // Client view: not refunded before the refund is proven.
        let view = shop.payment(&id).await;
        assert_eq!(view["status"], "succeeded", "{view}");
        assert!(view["status_reason"].is_null(), "{view}");
        // The recovery scanner queries with the original reference.
        shop.scan_until("the compensation to settle", || async {
            shop.fulfillment_state(&id).await == FulfillmentState::Compensated
        })
        .await;
        let view = shop.payment(&id).await;
        assert_eq!(view["status"], "refunded", "{view}");
        assert_eq!(view["status_reason"], "fulfillment_deadline_passed", "{view}");
        assert_eq!(view["fulfillment"]["state"], "compensated", "{view}");
        assert_eq!(view["fulfillment"]["compensation_refund_reference"], refund_reference.as_str());
        assert_eq!(view["amounts"]["refunded"], 1200, "{view}");
        assert_eq!(view["refunds"].as_array().unwrap().len(), 1, "{view}");
        assert_eq!(shop.sandbox.refund_count(&refund_reference), 1);
        // A confirmation now is refused and says where the money is.
        let late = shop
            .post(&format!("/v1/payments/{id}/fulfillment"), Some("late-1"), &json!({"attempt_reference": reference}))
            .await;
        let error = late.expect_error(409, "fulfillment_refunded");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("money is back with the customer"), "{message}");
        // More rounds change nothing: still exactly one refund.
        shop.db.clock.advance(60_000);
        shop.scanner.scan_once().await.expect("scanner round");
        assert_eq!(shop.sandbox.refund_count(&refund_reference), 1);
        assert_eq!(shop.db.store.list_refunds(&id).await.unwrap().len(), 1);
    }
}

shop_test! {
    async fn a_push_before_the_deadline_fulfils_and_no_refund_ever_follows(shop) {
        let payment = shop.pay("renew-2", "subscription-2", 5_000).await;
        let id = id_of(&payment);
        let reference = attempt_reference(&payment);
        let path = format!("/v1/payments/{id}/fulfillment");
        let body = json!({"attempt_reference": reference});
        // An unknown attempt is refused and changes nothing.
        let stranger = shop.post(&path, None, &json!({"attempt_reference": "att_stranger"})).await;
        stranger.expect_error(409, "fulfillment_attempt_unknown");
        assert_eq!(shop.fulfillment_state(&id).await, FulfillmentState::AwaitingFulfillment);
        let confirmed = shop.post(&path, Some("confirm-2"), &body).await.expect(200).json();
        assert_eq!(confirmed["fulfillment"]["state"], "fulfilled", "{confirmed}");
        assert_eq!(confirmed["status"], "succeeded", "{confirmed}");
        // The same request again replays; a new one is an idempotent no-op.
        let replay = shop.post(&path, Some("confirm-2"), &body).await.expect(200).json();
        assert_eq!(replay["fulfillment"]["state"], "fulfilled");
        let again = shop.post(&path, Some("confirm-2b"), &body).await.expect(200).json();
        assert_eq!(again["fulfillment"]["state"], "fulfilled");
        // Once fulfilled, another attribution is refused.
        let stranger = shop.post(&path, None, &json!({"attempt_reference": "att_stranger"})).await;
        stranger.expect_error(409, "fulfillment_already_fulfilled");
        // Long after the deadline: the scanner finds nothing, a stale task does nothing.
        shop.pass_deadline(5_000);
        shop.db.clock.advance(60_000);
        let report = shop.scanner.scan_once().await.expect("scanner round");
        assert_eq!(report.fulfillment_checks, 0, "{report:?}");
        let stale = shop.orch.check_fulfillment(&id, Trigger::Scanner).await.unwrap();
        assert_eq!(stale.first.decision.label(), "ignored_stale");
        assert_eq!(shop.fulfillment_state(&id).await, FulfillmentState::Fulfilled);
        assert!(shop.db.store.list_refunds(&id).await.unwrap().is_empty());
        assert!(shop.sandbox.refunds().is_empty());
        let view = shop.payment(&id).await;
        assert_eq!(view["status"], "succeeded", "{view}");
    }
}

shop_test! {
    async fn a_push_racing_the_compensation_decision_over_http_has_exactly_one_winner(shop) {
        let mut pushes_won = 0;
        for round in 0..3 {
            let payment = shop.pay(&format!("race-{round}"), &format!("goal-{round}"), 1_000).await;
            let id = id_of(&payment);
            let reference = attempt_reference(&payment);
            shop.pass_deadline(1_000);
            let path = format!("/v1/payments/{id}/fulfillment");
            let body = json!({"attempt_reference": reference});
            let (pushed, checked) = tokio::join!(
                shop.post(&path, None, &body),
                shop.scanner.check_fulfillment(&id),
            );
            checked.expect("scanner check");
            let refunds = shop.db.store.list_refunds(&id).await.unwrap();
            match pushed.status {
                200 => {
                    pushes_won += 1;
                    assert_eq!(pushed.json()["fulfillment"]["state"], "fulfilled");
                    assert!(refunds.is_empty(), "round {round}: a fulfilled payment is never refunded");
                    assert_eq!(shop.fulfillment_state(&id).await, FulfillmentState::Fulfilled);
                }
                409 => {
                    let code = pushed.json()["error"]["code"].as_str().unwrap().to_owned();
                    assert!(
                        code == "fulfillment_compensation_in_progress" || code == "fulfillment_refunded",
                        "round {round}: {}", pushed.text()
                    );
                    let message = pushed.json()["error"]["message"].as_str().unwrap().to_owned();
                    assert!(message.contains("money"), "{message}");
                    assert_eq!(refunds.len(), 1, "round {round}");
                }
                other => panic!("round {round}: unexpected {other}: {}", pushed.text()),
            }
        }
        eprintln!("the push won {pushes_won} of 3 races");
        // Whatever won, every compensation converges to exactly one refund.
        eventually(CONVERGE, "compensations to settle", || async {
            let mut settled = true;
            for round in 0..3 {
                let payment = shop
                    .db
                    .store
                    .get_payment_by_order_no(&shop.merchant_id, &format!("race-{round}"))
                    .await
                    .unwrap();
                let state = shop.fulfillment_state(&payment.id).await;
                if state == FulfillmentState::Compensating {
                    settled = false;
                }
            }
            settled.then_some(())
        })
        .await;
    }
}

// ---- pull mode ---------------------------------------------------------------

const PULL_SECRET: &str = "fsec_renewals_ltd_0123456789";
/// The endpoint's own budget (below the policy's action timeout).
const PULL_TIMEOUT_MS: i64 = 300;

/// What the in-test business does with `fulfillment.execute` and answers to
/// `fulfillment.query`.
#[derive(Debug, Default)]
struct Business {
    /// biz_key → the attempt reference the goal was reached with.
    goals: std::collections::HashMap<String, String>,
    /// Commit the action, then hold the answer longer than Sluice waits.
    hang_after_commit: bool,
    /// Answer every query with this body instead of the truth.
    fixed_answer: Option<Value>,
    /// Goals the business never manages to reach (the action does nothing).
    never: std::collections::HashSet<String>,
    /// Business actions received per biz_key.
    executes_for: std::collections::HashMap<String, u32>,
    executes: u32,
    queries: u32,
    bad_signatures: u32,
}

type SharedBusiness = Arc<std::sync::Mutex<Business>>;

async fn business_endpoint(
    axum::extract::State(business): axum::extract::State<SharedBusiness>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let signature = headers
        .get(sluice_delivery::signature::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let now = sluice_store::SystemClock.now_ms() / 1000;
    let verified = sluice_delivery::signature::verify(PULL_SECRET, signature, &body, now, 600);
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    let attempt = request["attempt_reference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let idempotency = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if verified.is_err() || idempotency != attempt || attempt.is_empty() {
        business.lock().unwrap().bad_signatures += 1;
        return axum::http::StatusCode::UNAUTHORIZED.into_response();
    }
    let biz_key = request["biz_key"].as_str().unwrap_or_default().to_owned();
    match request["type"].as_str() {
        Some("fulfillment.execute") => {
            let hang = {
                let mut b = business.lock().unwrap();
                b.executes += 1;
                *b.executes_for.entry(biz_key.clone()).or_default() += 1;
                // Idempotent on the goal: reached once, by the first attempt.
                if !b.never.contains(&biz_key) {
                    b.goals.entry(biz_key).or_insert(attempt);
                }
                b.hang_after_commit
            };
            if hang {
                tokio::time::sleep(Duration::from_millis(3 * PULL_TIMEOUT_MS as u64)).await;
            }
            axum::Json(json!({"ok": true})).into_response()
        }
        Some("fulfillment.query") => {
            let mut b = business.lock().unwrap();
            b.queries += 1;
            let answer = match (&b.fixed_answer, b.goals.get(&biz_key)) {
                (Some(fixed), _) => fixed.clone(),
                (None, Some(by)) => json!({"status": "fulfilled", "attributed_to": by}),
                (None, None) => json!({"status": "not_fulfilled"}),
            };
            axum::Json(answer).into_response()
        }
        _ => axum::http::StatusCode::BAD_REQUEST.into_response(),
    }
}

impl Shop {
    /// Serve the merchant's business on 127.0.0.1 and configure it as the
    /// merchant's fulfillment endpoint through the admin API.
    async fn business(&self) -> SharedBusiness {
        let business = SharedBusiness::default();
        let app = axum::Router::new()
            .route("/fulfillment", axum::routing::post(business_endpoint))
            .with_state(business.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!(
            "http://{}/fulfillment",
            listener.local_addr().expect("addr")
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let reply = self
            .http
            .put(format!(
                "{}/admin/merchants/{}/fulfillment_endpoint",
                self.base, self.merchant_id
            ))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"url": url, "secret": PULL_SECRET, "timeout_ms": PULL_TIMEOUT_MS}))
            .send()
            .await
            .expect("configure endpoint");
        let reply = read(reply).await.expect(200);
        assert_eq!(reply.json()["secret_set"], true);
        assert!(
            reply.json().get("secret").is_none(),
            "the secret is never shown"
        );
        business
    }

    fn alerts(&self) -> f64 {
        self.registry
            .gather()
            .iter()
            .find(|f| f.name() == "sluice_fulfillment_contradictory_facts_total")
            .map(|f| f.get_metric()[0].get_counter().get_value())
            .unwrap_or(0.0)
    }
}

shop_test! {
    async fn a_pull_response_lost_after_the_business_committed_ends_fulfilled_without_a_refund(shop) {
        let business = shop.business().await;
        business.lock().unwrap().hang_after_commit = true;
        let payment = shop.pay_with("pull-1", "season-ticket-1", 5_000, "pull").await;
        let id = id_of(&payment);
        let reference = attempt_reference(&payment);
        shop.scan_until("the business fact to be read", || async {
            shop.fulfillment_state(&id).await == FulfillmentState::Fulfilled
        })
        .await;
        {
            let b = business.lock().unwrap();
            assert!(b.executes >= 1, "{b:?}");
            assert_eq!(b.goals.get("season-ticket-1"), Some(&reference));
            assert_eq!(b.bad_signatures, 0, "every call is signed and keyed by the attempt");
        }
        // Deadline long gone: nothing moves, never a refund.
        shop.pass_deadline(5_000);
        shop.db.clock.advance(60_000);
        shop.scanner.scan_once().await.expect("scanner round");
        assert_eq!(shop.fulfillment_state(&id).await, FulfillmentState::Fulfilled);
        assert!(shop.db.store.list_refunds(&id).await.unwrap().is_empty());
        assert!(shop.sandbox.refunds().is_empty());
        let view = shop.payment(&id).await;
        assert_eq!(view["status"], "succeeded", "{view}");
        assert_eq!(view["fulfillment"]["state"], "fulfilled", "{view}");
    }
}

shop_test! {
    async fn a_late_fulfilled_for_attempt_1_after_attempt_2_reached_the_goal_refunds_attempt_1_and_keeps_attempt_2(shop) {
        let business = shop.business().await;
        let first = shop.pay_with("pull-2a", "renewal-2027", 5_000, "pull").await;
        let second = shop.pay_with("pull-2b", "renewal-2027", 5_000, "pull").await;
        let (first_id, second_id) = (id_of(&first), id_of(&second));
        let second_reference = attempt_reference(&second);
        // The goal was reached with attempt 2.
        business
            .lock()
            .unwrap()
            .goals
            .insert("renewal-2027".into(), second_reference.clone());
        shop.scan_until("both fulfillments to settle", || async {
            shop.fulfillment_state(&first_id).await == FulfillmentState::Compensated
                && shop.fulfillment_state(&second_id).await == FulfillmentState::Fulfilled
        })
        .await;
        let refunded = shop.payment(&first_id).await;
        assert_eq!(refunded["status"], "refunded", "{refunded}");
        assert_eq!(refunded["status_reason"], "fulfilled_elsewhere", "{refunded}");
        let refund_reference = sluice_core::compensation_refund_reference(&attempt_reference(&first));
        assert_eq!(shop.sandbox.refund_count(&refund_reference), 1);
        let kept = shop.payment(&second_id).await;
        assert_eq!(kept["status"], "succeeded", "{kept}");
        assert_eq!(kept["fulfillment"]["state"], "fulfilled", "{kept}");
        assert!(kept["refunds"].as_array().unwrap().is_empty(), "{kept}");
    }
}

shop_test! {
    async fn a_contradictory_business_fact_freezes_automation_for_manual_review_with_an_alert(shop) {
        let business = shop.business().await;
        business.lock().unwrap().fixed_answer = Some(json!({"status": "fulfilled"}));
        let payment = shop.pay_with("pull-3", "gift-card-3", 5_000, "pull").await;
        let id = id_of(&payment);
        shop.scan_until("the contradiction to be recorded", || async {
            shop.fulfillment_state(&id).await == FulfillmentState::ManualReview
        })
        .await;
        assert_eq!(shop.alerts(), 1.0);
        // Frozen: the deadline passes and nothing is refunded.
        shop.pass_deadline(5_000);
        shop.db.clock.advance(60_000);
        shop.scanner.scan_once().await.expect("scanner round");
        assert_eq!(shop.fulfillment_state(&id).await, FulfillmentState::ManualReview);
        assert!(shop.db.store.list_refunds(&id).await.unwrap().is_empty());
        let view = shop.payment(&id).await;
        assert_eq!(view["fulfillment"]["state"], "manual_review", "{view}");
        let reason = view["fulfillment"]["review_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("names no payment"), "{view}");
        // A confirmation is refused: the money has not moved, a human decides.
        let refused = shop
            .post(&format!("/v1/payments/{id}/fulfillment"), None, &json!({"attempt_reference": attempt_reference(&payment)}))
            .await;
        let error = refused.expect_error(409, "fulfillment_under_review");
        assert!(error["message"].as_str().unwrap().contains("money has not moved"), "{error}");
    }
}

shop_test! {
    /// Seed 000 §11, "one lost response through the whole chain", end to end.
    async fn seed_000_section_11_a_lost_payment_response_and_a_lost_renewal_response_end_in_one_charge_and_business_success(shop) {
        let business = shop.business().await;
        business.lock().unwrap().hang_after_commit = true;
        // No PSP webhook: only Sluice's own queries may learn the outcome.
        shop.webhooks_off();
        // The user renews task 73: goal biz-R-73. The wallet charges, the
        // answer is lost: Sluice answers processing, creates no attempt 2.
        let body = json!({
            "amount": 1990,
            "currency": "EUR",
            "merchant_order_no": "task-73",
            "payment_method": "pm_sluice_commit_then_timeout",
            "connector_account": shop.account,
            "confirm": true,
            "fulfillment": {"biz_key": "biz-R-73", "deadline": shop.now_ms() + 20_000, "mode": "pull"}
        });
        let created = shop.post("/v1/payments", Some("renew-task-73"), &body).await.expect(201).json();
        assert_eq!(created["status"], "processing", "{created}");
        let id = id_of(&created);
        let reference = attempt_reference(&created);
        // A delayed wake-up and the scanner run at the same moment; both ask
        // the PSP with the same reference; one CAS wins, one charge only.
        let attempt_id = created["attempts"][0]["id"].as_str().unwrap().to_owned();
        shop.db.clock.advance(5_000);
        let (scanned, woken) = tokio::join!(
            shop.scanner.scan_once(),
            shop.orch.advance(sluice_orchestrator::Target::Attempt(attempt_id), Trigger::Operator),
        );
        scanned.expect("scanner round");
        woken.expect("advance");
        shop.scan_until("the payment to be proven", || async {
            shop.payment(&id).await["status"] == "succeeded"
        })
        .await;
        shop.webhooks_on();
        let paid = shop.payment(&id).await;
        assert_eq!(paid["attempts"].as_array().unwrap().len(), 1, "{paid}");
        assert_eq!(shop.sandbox.charge_count(&reference), 1);
        // The renewal is called with the attempt reference; the business
        // commits resume_order_no = our reference, the RPC answer is lost.
        // Sluice reads the business fact instead of refunding on the error.
        shop.scan_until("the business fact to prove the renewal", || async {
            shop.fulfillment_state(&id).await == FulfillmentState::Fulfilled
        })
        .await;
        assert_eq!(business.lock().unwrap().goals.get("biz-R-73"), Some(&reference));
        // An old scanner task runs late with its stale view: nothing happens.
        let stale = shop.orch.check_fulfillment(&id, Trigger::Scanner).await.unwrap();
        assert_eq!(stale.first.decision.label(), "ignored_stale");
        let polled = shop.payment(&id).await;
        assert_eq!(polled["status"], "succeeded", "{polled}");
        assert_eq!(polled["fulfillment"]["state"], "fulfilled", "{polled}");
        assert!(polled["refunds"].as_array().unwrap().is_empty());

        // The failure branch: renewal 74 never completes before its deadline.
        {
            let mut b = business.lock().unwrap();
            b.hang_after_commit = false;
            b.never.insert("biz-R-74".into());
        }
        let failing = shop.pay_with("task-74", "biz-R-74", 3_000, "pull").await;
        let failing_id = id_of(&failing);
        let refund_reference = sluice_core::compensation_refund_reference(&attempt_reference(&failing));
        shop.scan_until("the renewal to be tried", || async {
            business.lock().unwrap().executes_for.get("biz-R-74").copied().unwrap_or(0) >= 1
        })
        .await;
        assert_eq!(shop.fulfillment_state(&failing_id).await, FulfillmentState::AwaitingFulfillment);
        // The deadline arrives: no more business calls; read once more, refund;
        // the refund's answer is lost and the same refund reference is queried.
        shop.pass_deadline(3_000);
        let calls_at_deadline = business.lock().unwrap().executes_for["biz-R-74"];
        shop.lose_next_refund_answer();
        shop.scan_until("the compensation refund to settle", || async {
            shop.fulfillment_state(&failing_id).await == FulfillmentState::Compensated
        })
        .await;
        assert_eq!(business.lock().unwrap().executes_for["biz-R-74"], calls_at_deadline,
            "no business action is started at or after the deadline");
        assert_eq!(shop.sandbox.refund_count(&refund_reference), 1);
        let refunded = shop.payment(&failing_id).await;
        assert_eq!(refunded["status"], "refunded", "{refunded}");
        assert_eq!(refunded["status_reason"], "fulfillment_deadline_passed", "{refunded}");
        // Renewal 73 kept its money throughout.
        assert!(shop.db.store.list_refunds(&id).await.unwrap().is_empty());
    }
}

impl Shop {
    /// A new operator, created through the admin API; returns their key.
    async fn operator_key(&self, name: &str) -> String {
        let reply = self
            .http
            .post(format!("{}/admin/operators", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"name": name}))
            .send()
            .await
            .expect("create operator");
        let issued = read(reply).await.expect(201).json();
        issued["key"].as_str().expect("key shown once").to_owned()
    }

    async fn as_operator(&self, key: &str, path: &str, body: &Value) -> Reply {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .header("Sluice-Operator-Key", key)
            .json(body);
        read(request.send().await.expect("HTTP")).await
    }
}

shop_test! {
    async fn two_operators_resolve_a_frozen_fulfillment_over_http_and_the_compensation_refund_returns_the_money(shop) {
        let business = shop.business().await;
        business.lock().unwrap().fixed_answer = Some(json!({"status": "fulfilled"}));
        let payment = shop.pay_with("pull-op", "gift-card-op", 5_000, "pull").await;
        let id = id_of(&payment);
        let reference = attempt_reference(&payment);
        shop.scan_until("the contradiction to be recorded", || async {
            shop.fulfillment_state(&id).await == FulfillmentState::ManualReview
        })
        .await;

        let alice = shop.operator_key("alice").await;
        let bob = shop.operator_key("bob").await;
        let proposals = format!("/admin/review/payments/{id}/proposals");
        shop.as_operator(&alice, &proposals, &json!({
            "outcome": "fulfillment_compensate",
            "reason_code": "whatever",
            "evidence_note": "the business cannot say who got the card"
        }))
        .await
        .expect_error(400, "proposal_invalid");
        let proposal = shop
            .as_operator(&alice, &proposals, &json!({
                "outcome": "fulfillment_compensate",
                "reason_code": "fulfillment_deadline_passed",
                "evidence_note": "the business's ledger has no gift card for this payment"
            }))
            .await
            .expect(201)
            .json();
        let approve = format!("/admin/review/proposals/{}/approve", proposal["id"].as_str().unwrap());
        shop.as_operator(&alice, &approve, &json!({})).await.expect_error(403, "same_operator");
        assert!(shop.db.store.list_refunds(&id).await.unwrap().is_empty(), "one person moves no money");

        let applied = shop.as_operator(&bob, &approve, &json!({"note": "checked"})).await.expect(200).json();
        assert_eq!(applied["status"], "applied", "{applied}");
        // The approval sent the compensation refund; the sandbox refunds it once.
        let refund_reference = sluice_core::compensation_refund_reference(&reference);
        shop.scan_until("the compensation to settle", || async {
            shop.fulfillment_state(&id).await == FulfillmentState::Compensated
        })
        .await;
        assert_eq!(shop.sandbox.refund_count(&refund_reference), 1);
        let view = shop.payment(&id).await;
        assert_eq!(view["status"], "refunded", "{view}");
        assert_eq!(view["status_reason"], "fulfillment_deadline_passed", "{view}");
        assert_eq!(view["amounts"]["refunded"], 1200, "{view}");
        let timeline = shop.db.store.timeline(&id).await.unwrap();
        let resolution = timeline
            .iter()
            .find(|h| h.event_kind == "FULFILLMENT_OPERATOR")
            .expect("the resolution is in the history");
        assert_eq!(resolution.actor.as_deref(), Some("operator:alice+operator:bob"));
    }
}
