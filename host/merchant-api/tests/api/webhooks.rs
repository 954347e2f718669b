//! `POST /webhooks/{adapter}/{connector_account}` through real HTTP.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};
use sluice_merchant_api::limits::RateLimit;
use sluice_merchant_api::ApiConfig;

/// A payment whose attempt is UNKNOWN (the PSP committed, the answer was
/// lost): (payment id, attempt reference, PSP payment id).
async fn unknown_payment(
    gw: &Gateway,
    m: &TestMerchant,
    order_no: &str,
) -> (String, String, String) {
    gw.psp.set_mode(
        PspRoute::Payments,
        Mode::TimeoutAfterCommit(Duration::from_secs(3)),
    );
    let mut body = payment_body(order_no, 1000);
    body["connector_account"] = json!(m.account);
    body["confirm"] = json!(true);
    let p = gw
        .post(&m.key, "/v1/payments", &body)
        .await
        .expect(201)
        .json();
    gw.psp.set_mode(PspRoute::Payments, Mode::Succeed);
    assert_eq!(p["status"], "processing", "{p}");
    let reference = p["attempts"][0]["reference"].as_str().unwrap().to_owned();
    let psp_id = gw.psp.payments_for(&reference)[0].id.clone();
    (p["id"].as_str().unwrap().to_owned(), reference, psp_id)
}

fn succeeded_event(event_id: &str, psp_id: &str, reference: &str) -> Value {
    json!({
        "id": event_id,
        "type": "payment.succeeded",
        "data": {"id": psp_id, "reference": reference, "amount": 1000, "currency": "EUR", "status": "succeeded"}
    })
}

async fn inbox_rows(gw: &Gateway, verification: &str) -> i64 {
    use sqlx::Row;
    sqlx::query("SELECT COUNT(*) FROM webhook_inbox WHERE verification = $1")
        .bind(verification)
        .fetch_one(gw.store().pool())
        .await
        .unwrap()
        .try_get::<i64, _>(0)
        .unwrap()
}

dual_test! {
    async fn a_verified_webhook_is_in_the_inbox_before_its_ack_and_a_duplicate_gets_the_same_ack(&gw) {
        let m = gw.merchant("Acme").await;
        let (payment_id, reference, psp_id) = unknown_payment(gw, &m, "wh-1").await;
        let event = succeeded_event("evt_1", &psp_id, &reference);

        let ack = gw.webhook(&m.account, &event).await.expect(200);
        assert_eq!(ack.bytes, br#"{"received":true}"#, "the adapter's ack, byte for byte");
        assert_eq!(ack.headers.get("content-type").unwrap(), "application/json");
        assert_eq!(inbox_rows(gw, "verified").await, 1, "durably recorded when the 2xx arrives");

        let duplicate = gw.webhook(&m.account, &event).await.expect(200);
        assert_eq!(duplicate.bytes, ack.bytes);
        assert_eq!(inbox_rows(gw, "verified").await, 1);
        let counts = gw.state.webhook_metrics().snapshot();
        assert_eq!((counts.accepted, counts.duplicates), (1, 1));

        let round = gw.orch.process_inbox_once().await.unwrap();
        assert_eq!(round.applied, 1);
        let p = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.json();
        assert_eq!(p["status"], "succeeded", "the verified webhook resolved the UNKNOWN: {p}");
        let timeline = gw.get(&m.key, &format!("/v1/payments/{payment_id}/timeline")).await.json();
        let from_webhook: Vec<&Value> = timeline["data"].as_array().unwrap().iter()
            .filter(|e| e["provider_event_id"] == "evt_1" && e["aggregate_type"] == "attempt")
            .collect();
        assert_eq!(from_webhook.len(), 1, "applied once: {timeline}");
        assert_eq!(from_webhook[0]["source"], "webhook");
        assert_eq!(from_webhook[0]["accepted"], true);
        assert_eq!(from_webhook[0]["adapter"]["name"], ADAPTER);
        assert_eq!(gw.psp.payments().len(), 1);

        // Redelivered after processing: the same ack, nothing applied again.
        gw.webhook(&m.account, &event).await.expect(200);
        assert_eq!(gw.orch.process_inbox_once().await.unwrap().claimed, 0);
    }
}

dual_test! {
    async fn a_webhook_failing_verification_is_refused_by_kind_changes_nothing_and_is_counted(&gw) {
        let m = gw.merchant("Acme").await;
        let (payment_id, reference, psp_id) = unknown_payment(gw, &m, "wh-2").await;
        let body = serde_json::to_vec(&succeeded_event("evt_bad", &psp_id, &reference)).unwrap();
        let now = sluice_store::SystemClock.now_ms() / 1000;

        let wrong_secret = sign("whsec_someone_else", now, &body);
        let refused = gw.webhook_signed(ADAPTER, &m.account, &wrong_secret, &body).await;
        let error = refused.expect_error(401, "webhook_bad_signature");
        assert!(!refused.text().contains(&wrong_secret) && !refused.text().contains(WEBHOOK_SECRET), "{error}");
        assert!(refused.headers.get("www-authenticate").is_none());

        let mut tampered = body.clone();
        tampered.extend_from_slice(b" ");
        gw.webhook_signed(ADAPTER, &m.account, &sign(WEBHOOK_SECRET, now, &body), &tampered)
            .await
            .expect_error(401, "webhook_bad_signature");
        gw.webhook_signed(ADAPTER, &m.account, &sign(WEBHOOK_SECRET, now - 3600, &body), &body)
            .await
            .expect_error(401, "webhook_stale_timestamp");
        let garbage = b"not json".to_vec();
        gw.webhook_signed(ADAPTER, &m.account, &sign(WEBHOOK_SECRET, now, &garbage), &garbage)
            .await
            .expect_error(400, "webhook_malformed");

        let counts = gw.state.webhook_metrics().snapshot();
        assert_eq!((counts.rejected_bad_signature, counts.rejected_stale_timestamp, counts.rejected_malformed), (2, 1, 1));
        assert_eq!(counts.rejected(), 4);
        assert_eq!(counts.accepted, 0);
        assert_eq!(inbox_rows(gw, "verified").await, 0, "nothing reached the state machine");
        assert_eq!(gw.orch.process_inbox_once().await.unwrap().applied, 0);
        let p = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.json();
        assert_eq!(p["status"], "processing");
        let registry = prometheus::Registry::new();
        gw.state.register_metrics(&registry).unwrap();
        let family = registry.gather().into_iter().find(|f| f.name() == "sluice_webhooks_total").unwrap();
        let bad = family.get_metric().iter()
            .find(|m| m.get_label()[0].value() == "rejected_bad_signature")
            .unwrap();
        assert_eq!(bad.get_counter().get_value(), 2.0);
    }
}

dual_test! {
    async fn a_webhook_for_an_unknown_adapter_or_account_is_404(&gw) {
        let m = gw.merchant("Acme").await;
        let event = json!({"id": "evt_x", "type": "payment.succeeded", "data": {}});
        let bytes = serde_json::to_vec(&event).unwrap();
        let signature = sign(WEBHOOK_SECRET, sluice_store::SystemClock.now_ms() / 1000, &bytes);
        for (adapter, account) in [
            ("stripe", m.account.as_str()),
            (ADAPTER, "ca_missing"),
            ("Not-A-Name", m.account.as_str()),
        ] {
            gw.webhook_signed(adapter, account, &signature, &bytes).await.expect_error(404, "resource_missing");
        }
        assert_eq!(gw.state.webhook_metrics().snapshot().not_found, 3);
        assert_eq!(gw.count("webhook_inbox").await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_webhook_route_has_a_body_limit_and_a_per_account_rate_limit() {
    let config = ApiConfig {
        webhook_rate_limit: RateLimit {
            burst: 2,
            per_second: 1,
        },
        ..ApiConfig::default()
    };
    let gw = Gateway::start_with(test_db(Backend::Sqlite).await, config).await;
    let m = gw.merchant("Acme").await;
    // The oversized delivery takes the first token of the burst of 2.
    let huge = vec![b'x'; sluice_merchant_api::MAX_WEBHOOK_BODY_BYTES + 1];
    let too_big = gw
        .webhook_signed(ADAPTER, &m.account, &sign(WEBHOOK_SECRET, 0, &huge), &huge)
        .await;
    too_big.expect_error(413, "body_too_large");
    let event = json!({"id": "evt_rl", "type": "customer.updated", "data": {}});
    gw.webhook(&m.account, &event).await.expect(200);
    let limited = gw.webhook(&m.account, &event).await;
    limited.expect_error(429, "rate_limited");
    assert!(limited.headers.get("retry-after").is_some());
    assert_eq!(gw.state.webhook_metrics().snapshot().rate_limited, 1);
    // Another account has a bucket of its own.
    let other = gw.merchant("Globex").await;
    gw.webhook(&other.account, &event).await.expect(200);
}

/// The gateway default of the per-account limit tests below: a burst of 3,
/// refilled once a second, so a few quick webhooks reach it.
const DEFAULT_BURST: usize = 3;

async fn limited_gateway(backend: Backend, refresh: Duration) -> Gateway {
    let config = ApiConfig {
        webhook_rate_limit: RateLimit {
            burst: u32::try_from(DEFAULT_BURST).unwrap(),
            per_second: 1,
        },
        webhook_limit_refresh: refresh,
        ..ApiConfig::default()
    };
    Gateway::start_with(test_db(backend).await, config).await
}

/// `dual_test!` over [`limited_gateway`], with the default refresh of limits.
macro_rules! limited_test {
    (async fn $name:ident(&$gw:ident) $body:block) => {
        mod $name {
            use super::*;

            async fn run($gw: &Gateway) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_sqlite() {
                run(&limited_gateway(Backend::Sqlite, Duration::from_secs(10)).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_postgres() {
                run(&limited_gateway(Backend::Postgres, Duration::from_secs(10)).await).await;
            }
        }
    };
}

/// A second connector account of `m`, created with `config` on top of the fake PSP's URL.
async fn account_with(gw: &Gateway, m: &TestMerchant, label: &str, config: Value) -> Reply {
    let mut settings = json!({"base_url": gw.psp.base_url()});
    for (key, value) in config.as_object().unwrap() {
        settings[key] = value.clone();
    }
    gw.admin_post(
        &format!("/admin/merchants/{}/connector_accounts", m.id),
        &json!({
            "adapter": ADAPTER,
            "label": label,
            "config": settings,
            "secrets": {"api_key": API_KEY, "webhook_secret": WEBHOOK_SECRET}
        }),
    )
    .await
}

fn config_path(m: &TestMerchant, account: &str) -> String {
    format!(
        "/admin/merchants/{}/connector_accounts/{account}/config",
        m.id
    )
}

/// Statuses of `n` webhooks sent one after the other to `account`.
async fn burst(gw: &Gateway, account: &str, n: usize) -> Vec<u16> {
    let event = json!({"id": "evt_burst", "type": "customer.updated", "data": {}});
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        statuses.push(gw.webhook(account, &event).await.status);
    }
    statuses
}

limited_test! {
    async fn an_account_with_a_raised_webhook_limit_takes_a_burst_the_default_refuses(&gw) {
        let m = gw.merchant("Acme").await;
        let big = account_with(gw, &m, "big", json!({"webhook_burst": "12"})).await.expect(201).json();
        assert_eq!(big["config"]["webhook_burst"], "12");
        let big = big["id"].as_str().unwrap();
        assert_eq!(burst(gw, big, 12).await, vec![200; 12], "the raised burst");
        // The merchant's other account is on the gateway's default.
        let mut expected = vec![200; DEFAULT_BURST];
        expected.push(429);
        assert_eq!(burst(gw, &m.account, DEFAULT_BURST + 1).await, expected);
        let small = account_with(gw, &m, "small", json!({"webhook_burst": "1"})).await.expect(201).json();
        assert_eq!(burst(gw, small["id"].as_str().unwrap(), 2).await, vec![200, 429], "a lowered burst");
        assert_eq!(gw.state.webhook_metrics().snapshot().rate_limited, 2);
    }
}

limited_test! {
    async fn a_changed_webhook_limit_applies_to_the_next_webhook_and_never_grants_more_than_its_burst(&gw) {
        let m = gw.merchant("Acme").await;
        let mut expected = vec![200; DEFAULT_BURST];
        expected.push(429);
        assert_eq!(burst(gw, &m.account, DEFAULT_BURST + 1).await, expected);
        let raised = json!({"config": {"base_url": gw.psp.base_url(), "webhook_burst": "10"}});
        let view = gw.admin_put(&config_path(&m, &m.account), &raised).await.expect(200).json();
        assert_eq!((view["id"].as_str(), &view["config"]["webhook_burst"]), (Some(m.account.as_str()), &json!("10")));
        // What was spent stays spent: 10 minus the 3 already taken, at once.
        assert_eq!(burst(gw, &m.account, 7).await, vec![200; 7]);
        // Cut to 1 with 10 spent: nothing is left, the next one waits for the refill.
        let lowered = json!({"config": {"base_url": gw.psp.base_url(), "webhook_burst": "1"}});
        gw.admin_put(&config_path(&m, &m.account), &lowered).await.expect(200);
        gw.webhook(&m.account, &json!({"id": "evt_cut", "type": "customer.updated", "data": {}}))
            .await
            .expect_error(429, "rate_limited");
        // Payments still work with the replaced config (base_url kept).
        let mut body = payment_body("after-config", 1000);
        body["confirm"] = json!(true);
        let payment = gw.post(&m.key, "/v1/payments", &body).await.expect(201).json();
        assert_eq!(payment["status"], "succeeded", "{payment}");
    }
}

limited_test! {
    async fn a_webhook_limit_out_of_range_is_refused_naming_its_key_and_changes_nothing(&gw) {
        let m = gw.merchant("Acme").await;
        let accounts = format!("/admin/merchants/{}/connector_accounts", m.id);
        for (key, value) in [
            ("webhook_burst", "0"),
            ("webhook_burst", "1000001"),
            ("webhook_burst", "-5"),
            ("webhook_burst", "12.5"),
            ("webhook_burst", " 7"),
            ("webhook_burst", "07"),
            ("webhook_per_second", "many"),
            ("webhook_per_second", ""),
        ] {
            let created = account_with(gw, &m, "refused", json!({ key: value })).await;
            let error = created.expect_error(400, "parameter_invalid");
            assert_eq!(error["param"], format!("config.{key}"), "{value:?}");
            let replaced = gw
                .admin_put(&config_path(&m, &m.account), &json!({"config": { key: value }}))
                .await;
            assert_eq!(replaced.expect_error(400, "parameter_invalid")["param"], format!("config.{key}"));
        }
        let list = gw.admin_get(&accounts).await.expect(200).json();
        let data = list["data"].as_array().unwrap();
        assert_eq!(data.len(), 1, "nothing created: {list}");
        assert_eq!(data[0]["config"], json!({"base_url": gw.psp.base_url()}), "nothing replaced");
        // The bounds themselves are accepted.
        let edge = json!({"webhook_burst": "1000000", "webhook_per_second": "1"});
        account_with(gw, &m, "edge", edge).await.expect(201);
        // The account's limit is still the default.
        let mut expected = vec![200; DEFAULT_BURST];
        expected.push(429);
        assert_eq!(burst(gw, &m.account, DEFAULT_BURST + 1).await, expected);
    }
}

limited_test! {
    async fn only_the_merchants_own_account_has_its_config_replaced(&gw) {
        let m = gw.merchant("Acme").await;
        let other = gw.merchant("Globex").await;
        let body = json!({"config": {"webhook_burst": "50"}});
        gw.admin_put(&config_path(&m, &other.account), &body).await.expect_error(404, "resource_missing");
        gw.admin_put(&config_path(&m, "ca_missing"), &body).await.expect_error(404, "resource_missing");
        let theirs = gw.admin_get(&format!("/admin/merchants/{}/connector_accounts", other.id)).await.expect(200).json();
        assert_eq!(theirs["data"][0]["config"], json!({"base_url": gw.psp.base_url()}));
        gw.admin_put(&config_path(&m, &m.account), &json!({"config": {}, "secrets": {}}))
            .await
            .expect_error(400, "unknown_parameter");
    }
}

/// A limit changed by another gateway instance: written to the database
/// without passing this instance's admin API.
async fn set_burst_elsewhere(gw: &Gateway, account: &str, burst: &str) {
    let config = json!({"base_url": gw.psp.base_url(), "webhook_burst": burst});
    gw.store()
        .update_connector_account(account, Some(&config), None, None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_webhook_route_reads_an_accounts_limit_once_per_refresh_interval_not_per_webhook() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let gw = limited_gateway(backend, Duration::from_secs(3600)).await;
        let m = gw.merchant("Acme").await;
        assert_eq!(burst(&gw, &m.account, 1).await, vec![200]);
        // Another instance raises it; this one keeps the limit it read.
        set_burst_elsewhere(&gw, &m.account, "50").await;
        let mut expected = vec![200; DEFAULT_BURST - 1];
        expected.push(429);
        assert_eq!(
            burst(&gw, &m.account, DEFAULT_BURST).await,
            expected,
            "{backend:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limit_changed_by_another_instance_applies_once_the_read_is_older_than_the_refresh() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        // A zero refresh: every webhook finds its read stale.
        let gw = limited_gateway(backend, Duration::ZERO).await;
        let m = gw.merchant("Acme").await;
        assert_eq!(burst(&gw, &m.account, 1).await, vec![200]);
        set_burst_elsewhere(&gw, &m.account, "50").await;
        assert_eq!(
            burst(&gw, &m.account, 10).await,
            vec![200; 10],
            "{backend:?}"
        );
    }
}
