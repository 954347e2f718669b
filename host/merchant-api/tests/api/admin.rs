//! Merchant administration: keys shown once, secrets never returned.

use crate::common::{API_KEY, WEBHOOK_SECRET};
use serde_json::json;

dual_test! {
    async fn the_admin_api_needs_the_admin_token(&gw) {
        let refused = gw
            .send(gw.http.post(gw.url("/admin/merchants")).header("content-type", "application/json").body(r#"{"name":"x"}"#))
            .await;
        assert_eq!(refused.status, 401);
        assert_eq!(gw.count("merchants").await, 0);
    }
}

dual_test! {
    async fn api_keys_are_shown_once_and_connector_secrets_never(&gw) {
        let m = gw.merchant("Acme").await;
        assert!(m.key.starts_with("sk_sluice_"));
        let keys = gw.admin_get(&format!("/admin/merchants/{}/api_keys", m.id)).await.expect(200);
        assert!(!keys.text().contains(&m.key), "the key is never listed");
        assert_eq!(keys.json()["data"][0]["id"], m.key_id.as_str());

        let accounts = gw.admin_get(&format!("/admin/merchants/{}/connector_accounts", m.id)).await.expect(200);
        assert!(!accounts.text().contains(API_KEY), "{}", accounts.text());
        assert!(!accounts.text().contains(WEBHOOK_SECRET), "{}", accounts.text());
        let account = &accounts.json()["data"][0];
        assert_eq!(account["adapter"], "test-well-behaved");
        assert_eq!(account["config"]["base_url"], gw.psp.base_url());
        assert_eq!(account["webhook_path"], format!("/webhooks/test-well-behaved/{}", m.account));
        let credentials = gw.store().connector_credentials(&m.account).await.unwrap();
        assert_eq!(credentials.secrets["api_key"], API_KEY, "secrets are stored");

        let duplicate = gw
            .admin_post(
                &format!("/admin/merchants/{}/connector_accounts", m.id),
                &json!({"adapter": "test-well-behaved", "label": "main", "secrets": {"api_key": "sk_other_secret"}}),
            )
            .await;
        duplicate.expect_error(409, "conflict");
        assert!(!duplicate.text().contains("sk_other_secret"));
        gw.admin_post(
            &format!("/admin/merchants/{}/connector_accounts", m.id),
            &json!({"adapter": "Bad Name", "label": "x"}),
        )
        .await
        .expect_error(400, "adapter_name_invalid");
        gw.admin_post("/admin/merchants/mer_missing/api_keys", &json!({}))
            .await
            .expect_error(404, "resource_missing");
        gw.admin_get("/admin/merchants/mer_missing").await.expect_error(404, "resource_missing");
        let listed = gw.admin_get("/admin/merchants").await.expect(200).json();
        assert_eq!(listed["data"][0]["id"], m.id.as_str());
    }
}

dual_test! {
    async fn a_routing_configuration_is_set_shown_and_routes_payments_that_name_no_account(&gw) {
        let m = gw.merchant("Acme").await;
        let other = gw.merchant("Other").await;
        let path = format!("/admin/merchants/{}/routing", m.id);
        let empty = gw.admin_get(&path).await.expect(200).json();
        assert_eq!((empty["version"].as_i64(), empty["config"]["rules"].as_array().map(Vec::len)), (Some(0), Some(0)));
        let second = gw.another_account(&m.id, "second").await;
        // With two accounts and no routing, a payment must name one.
        let mut body = crate::common::payment_body("route-0", 500);
        body["confirm"] = json!(true);
        gw.post(&m.key, "/v1/payments", &body).await.expect_error(409, "route_ambiguous");

        let put = |config: serde_json::Value| {
            let path = path.clone();
            async move { gw.admin_put(&path, &config).await }
        };
        let rule = |accounts: serde_json::Value| json!({"rules": [{"id": "eur", "when": {"currencies": ["EUR"]}, "accounts": accounts}]});
        put(rule(json!([{"connector_account": other.account, "weight": 1}]))).await.expect_error(409, "connector_account_unknown");
        put(rule(json!([{"connector_account": second, "weight": 0}]))).await.expect_error(400, "routing_config_invalid");
        let set = put(rule(json!([{"connector_account": second, "weight": 1}, {"connector_account": m.account, "weight": 0}])))
            .await
            .expect(200)
            .json();
        assert_eq!(set["version"], 1);
        assert_eq!(set["config"]["failover_window_ms"], 60000);
        assert_eq!(gw.admin_get(&path).await.expect(200).json(), set);

        let created = gw.post(&m.key, "/v1/payments", &body).await.expect(201).json();
        assert_eq!(created["attempts"][0]["connector_account"], second.as_str(), "{created}");
        let id = created["id"].as_str().unwrap();
        let timeline = gw.get(&m.key, &format!("/v1/payments/{id}/timeline")).await.expect(200).text();
        assert!(timeline.contains("rule eur: weighted split"), "{timeline}");
    }
}

dual_test! {
    async fn a_rule_on_payment_method_types_routes_payments_of_that_type_and_a_malformed_type_is_refused_with_nothing_written(&gw) {
        let m = gw.merchant("Acme").await;
        let second = gw.another_account(&m.id, "sepa").await;
        let config = json!({"rules": [
            {"id": "sepa", "when": {"payment_method_types": ["sepa_debit"]},
             "accounts": [{"connector_account": second, "weight": 1}]},
            {"id": "cards", "when": {"payment_method_types": ["card"]},
             "accounts": [{"connector_account": m.account, "weight": 1}]}
        ]});
        gw.admin_put(&format!("/admin/merchants/{}/routing", m.id), &config).await.expect(200);
        let account_of = |created: &serde_json::Value| created["attempts"][0]["connector_account"].as_str().map(str::to_owned);

        let mut sepa = crate::common::payment_body("type-sepa", 700);
        sepa["confirm"] = json!(true);
        sepa["payment_method_type"] = json!("sepa_debit");
        let created = gw.post(&m.key, "/v1/payments", &sepa).await.expect(201).json();
        assert_eq!(account_of(&created), Some(second.clone()), "{created}");
        assert_eq!(created["attempts"][0]["payment_method_type"], "sepa_debit");
        let id = created["id"].as_str().unwrap();
        let timeline = gw.get(&m.key, &format!("/v1/payments/{id}/timeline")).await.expect(200).text();
        assert!(timeline.contains("rule sepa"), "{timeline}");

        // No type is a card; a later confirm names its own type.
        let mut card = crate::common::payment_body("type-card", 700);
        card["confirm"] = json!(true);
        let created = gw.post(&m.key, "/v1/payments", &card).await.expect(201).json();
        assert_eq!(account_of(&created), Some(m.account.clone()), "{created}");
        assert_eq!(created["attempts"][0]["payment_method_type"], "card");
        let later = gw.post(&m.key, "/v1/payments", &crate::common::payment_body("type-later", 700)).await.expect(201).json();
        let confirm = format!("/v1/payments/{}/confirm", later["id"].as_str().unwrap());
        let confirmed = gw.post(&m.key, &confirm, &json!({"payment_method_type": "sepa_debit"})).await.expect(200).json();
        assert_eq!(account_of(&confirmed), Some(second.clone()), "{confirmed}");

        for bad in ["SEPA", "sepa-debit", "", "1card", &"x".repeat(41)] {
            let mut body = crate::common::payment_body("type-bad", 700);
            body["confirm"] = json!(true);
            body["payment_method_type"] = json!(bad);
            let refused = gw.post(&m.key, "/v1/payments", &body).await.expect_error(400, "string_invalid");
            assert_eq!(refused["param"], "payment_method_type", "{bad:?}: {refused}");
        }
        // Nothing was written: the order number is still free.
        gw.post(&m.key, "/v1/payments", &crate::common::payment_body("type-bad", 700)).await.expect(201);
    }
}

dual_test! {
    async fn every_field_of_a_routing_configuration_is_judged_before_anything_is_written(&gw) {
        let m = gw.merchant("Acme").await;
        let path = format!("/admin/merchants/{}/routing", m.id);
        let put = |config: serde_json::Value| {
            let path = path.clone();
            async move { gw.admin_put(&path, &config).await }
        };
        let overriding = |adapter: &str, code: String| {
            json!({"failure_overrides": [{"adapter": adapter, "code": code, "class": "fraud", "cascade": false}]})
        };
        let rule = |when: serde_json::Value, id: &str| {
            json!({"rules": [{"id": id, "when": when, "accounts": [{"connector_account": m.account, "weight": 1}]}]})
        };
        let many: serde_json::Map<String, serde_json::Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        let cases = [
            (overriding("stripe", "x".repeat(129)), "string_too_long", "failure_overrides[0].code"),
            (overriding("stripe", " padded".into()), "string_invalid", "failure_overrides[0].code"),
            (overriding("Stripe!", "fraudulent".into()), "adapter_name_invalid", "failure_overrides[0].adapter"),
            (rule(json!({}), "with space"), "string_invalid", "rules[0].id"),
            (rule(json!({"currencies": ["XYZ"]}), "eur"), "currency_unsupported", "rules[0].when.currencies"),
            (rule(json!({"payment_method_types": ["x".repeat(65)]}), "eur"), "string_invalid", "rules[0].when.payment_method_types"),
            (rule(json!({"metadata": many}), "eur"), "routing_config_invalid", "rules[0].when.metadata"),
            (json!({"fallback": ["acct\n"]}), "string_invalid", "fallback"),
        ];
        for (body, code, param) in cases {
            let refused = put(body.clone()).await.expect_error(400, code);
            assert_eq!(refused["param"], param, "{body}: {refused}");
        }
        // Judged as a whole only once every field is sound: one override per adapter and code.
        let twice = json!({"failure_overrides": [
            {"adapter": "stripe", "code": "fraudulent", "class": "fraud", "cascade": false},
            {"adapter": "stripe", "code": "fraudulent", "class": "issuer_declined", "cascade": true},
        ]});
        put(twice).await.expect_error(400, "routing_config_invalid");
        let unchanged = gw.admin_get(&path).await.expect(200).json();
        assert_eq!(unchanged["version"], 0, "{unchanged}");
    }
}

dual_test! {
    async fn an_operator_pauses_and_resumes_an_account_over_http_and_its_health_shows_who_and_why(&gw) {
        let m = gw.merchant("Acme").await;
        let other = gw.merchant("Other").await;
        let alice = crate::review::operator(gw, "alice").await;
        let base = format!("/admin/merchants/{}/connector_accounts/{}", m.id, m.account);
        let healthy = gw.admin_get(&format!("{base}/health")).await.expect(200).json();
        assert_eq!((healthy["takes_new_attempts"].as_bool(), healthy["breaker"]["state"].as_str()), (Some(true), Some("closed")));

        // The admin token alone cannot pause: the history must name an operator.
        gw.admin_post(&format!("{base}/pause"), &json!({"reason": "incident"})).await.expect_error(401, "operator_key_missing");
        let pause = |path: String, body: serde_json::Value| {
            let key = alice.clone();
            async move { crate::review::as_operator(gw, &key, &path, Some(&body)).await }
        };
        pause(format!("{base}/pause"), json!({"reason": " "})).await.expect_error(400, "string_invalid");
        // Another merchant's account through this merchant's path does not exist.
        let foreign = format!("/admin/merchants/{}/connector_accounts/{}/pause", m.id, other.account);
        pause(foreign, json!({"reason": "x"})).await.expect_error(404, "resource_missing");
        let paused = pause(format!("{base}/pause"), json!({"reason": "PSP incident 42"})).await.expect(200).json();
        assert_eq!(paused["takes_new_attempts"], false);
        assert_eq!(paused["skipped_because"], "paused by an operator: PSP incident 42");
        assert_eq!(paused["history"][0]["actor"], "operator:alice");

        // A payment naming the paused account is refused, saying why, and nothing is charged.
        let mut body = crate::common::payment_body("paused-0", 500);
        body["confirm"] = json!(true);
        body["connector_account"] = json!(m.account);
        let created = gw.post(&m.key, "/v1/payments", &body).await;
        let error = created.expect_error(409, "no_eligible_route");
        assert!(error["message"].as_str().unwrap().contains("PSP incident 42"), "{error}");

        let resumed = pause(format!("{base}/resume"), json!({})).await.expect(200).json();
        assert_eq!((resumed["takes_new_attempts"].as_bool(), resumed["paused"].is_null()), (Some(true), true));
        let kinds: Vec<&str> = resumed["history"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["resumed", "paused"]);
        let other_health = gw.admin_get(&format!("/admin/merchants/{}/connector_accounts/{}/health", other.id, other.account)).await.expect(200).json();
        assert_eq!(other_health["history"].as_array().map(Vec::len), Some(0), "the other merchant's account saw nothing");
    }
}
