//! The operations console's admin routes over real HTTP (issue 16): search
//! across merchants, counts per open state, one payment with what happens
//! next, its timeline; the admin token and an operator key on every one, and
//! a clear 400 for every bad filter.

use crate::common::{payment_body, Gateway};
use crate::review::{as_operator, operator};
use serde_json::json;

async fn confirmed(gw: &Gateway, key: &str, account: &str, order_no: &str) -> serde_json::Value {
    let mut body = payment_body(order_no, 900);
    body["connector_account"] = json!(account);
    body["confirm"] = json!(true);
    gw.post(key, "/v1/payments", &body).await.expect(201).json()
}

dual_test! {
    async fn an_operator_finds_payments_of_any_merchant_by_order_number_attempt_or_psp_reference(&gw) {
        let acme = gw.merchant("Acme").await;
        let globex = gw.merchant("Globex").await;
        let paid = confirmed(gw, &acme.key, &acme.account, "con-1").await;
        let other = confirmed(gw, &globex.key, &globex.account, "con-2").await;
        let alice = operator(gw, "alice").await;
        let id = paid["id"].as_str().unwrap();
        let attempt_ref = paid["attempts"][0]["reference"].as_str().unwrap();
        let psp_ref = paid["attempts"][0]["psp_reference"].as_str().expect("the PSP's reference");

        for q in [id, "con-1", attempt_ref, psp_ref] {
            let found = as_operator(gw, &alice, &format!("/admin/payments?q={q}"), None).await.expect(200).json();
            let ids: Vec<&str> = found["data"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
            assert_eq!(ids, vec![id], "q={q}: {found}");
            assert_eq!(found["data"][0]["merchant_id"], acme.id.as_str());
            assert_eq!(found["data"][0]["merchant_order_no"], "con-1");
        }
        let everyone = as_operator(gw, &alice, "/admin/payments", None).await.expect(200).json();
        assert_eq!(everyone["data"].as_array().unwrap().len(), 2, "{everyone}");
        let globex_only = as_operator(gw, &alice, &format!("/admin/payments?merchant={}&state=SUCCEEDED", globex.id), None)
            .await.expect(200).json();
        assert_eq!(globex_only["data"][0]["id"], other["id"], "{globex_only}");
        assert_eq!(globex_only["data"].as_array().unwrap().len(), 1);
        let old = as_operator(gw, &alice, "/admin/payments?older_than_ms=86400000", None).await.expect(200).json();
        assert!(old["data"].as_array().unwrap().is_empty(), "nothing is a day old: {old}");
        let page = as_operator(gw, &alice, "/admin/payments?limit=1", None).await.expect(200).json();
        assert_eq!(page["has_more"], true);
        let cursor = page["next_cursor"].as_str().unwrap();
        let rest = as_operator(gw, &alice, &format!("/admin/payments?limit=1&starting_after={cursor}"), None)
            .await.expect(200).json();
        assert_eq!(rest["data"].as_array().unwrap().len(), 1);
        assert_ne!(rest["data"][0]["id"], page["data"][0]["id"]);
    }
}

dual_test! {
    async fn one_payment_shows_its_resource_its_next_step_and_its_timeline_to_an_operator(&gw) {
        let acme = gw.merchant("Acme").await;
        let paid = confirmed(gw, &acme.key, &acme.account, "con-3").await;
        let id = paid["id"].as_str().unwrap();
        let alice = operator(gw, "alice").await;
        let view = as_operator(gw, &alice, &format!("/admin/payments/{id}"), None).await.expect(200).json();
        assert_eq!(view["object"], "admin_payment");
        assert_eq!(view["merchant_id"], acme.id.as_str());
        assert_eq!(view["payment"]["id"], id);
        assert_eq!(view["next"]["mover"], "nothing", "{view}");
        assert!(view["proposals"].as_array().unwrap().is_empty());
        let timeline = as_operator(gw, &alice, &format!("/admin/payments/{id}/timeline?limit=2"), None)
            .await.expect(200).json();
        assert_eq!(timeline["data"].as_array().unwrap().len(), 2);
        assert_eq!(timeline["has_more"], true);
        assert_eq!(timeline["next"]["mover"], "nothing");
        let stats = as_operator(gw, &alice, "/admin/payments/stats", None).await.expect(200).json();
        assert_eq!(stats["object"], "payment_stats");
        assert!(stats["states"].is_array() && stats["manual_review"] == 0, "{stats}");
        as_operator(gw, &alice, "/admin/payments/pay_nope", None).await.expect_error(404, "resource_missing");
    }
}

dual_test! {
    async fn the_console_routes_need_the_admin_token_and_an_operator_key_and_refuse_bad_filters_with_400(&gw) {
        let alice = operator(gw, "alice").await;
        for path in ["/admin/payments", "/admin/payments/stats", "/admin/payments/pay_x", "/admin/payments/pay_x/timeline"] {
            gw.admin_get(path).await.expect_error(401, "operator_key_missing");
            // The admin token is the server's layer (a stand-in here, see
            // `common`): an operator key alone never passes it.
            let reply = gw.send(gw.http.get(gw.url(path)).header("Sluice-Operator-Key", &alice)).await;
            assert_eq!(reply.status, 401, "{path}: {}", reply.text());
            gw.send(gw.http.get(gw.url(path)).bearer_auth(crate::common::ADMIN_TOKEN).header("Sluice-Operator-Key", "op_wrong"))
                .await
                .expect_error(401, "operator_key_invalid");
        }
        let long = format!("q={}", "x".repeat(256));
        for (query, code, param) in [
            ("state=STUCK", "parameter_invalid", "state"),
            ("state=succeeded", "parameter_invalid", "state"),
            ("older_than_ms=-1", "parameter_invalid", "older_than_ms"),
            ("limit=0", "parameter_invalid", "limit"),
            ("limit=101", "parameter_invalid", "limit"),
            ("q=%20padded", "string_invalid", "q"),
            ("q=", "string_invalid", "q"),
            (long.as_str(), "string_too_long", "q"),
            ("merchant=a%20b", "parameter_invalid", "merchant"),
            ("starting_after=a%20b", "parameter_invalid", "starting_after"),
        ] {
            let reply = as_operator(gw, &alice, &format!("/admin/payments?{query}"), None).await;
            let error = reply.expect_error(400, code);
            assert_eq!(error["param"], param, "{query}");
        }
        let reply = as_operator(gw, &alice, "/admin/payments?colour=blue", None).await;
        assert_eq!(reply.status, 400, "{}", reply.text());
        let reply = as_operator(gw, &alice, "/admin/payments/pay_x/timeline?limit=501", None).await;
        assert_eq!(reply.status, 400, "{}", reply.text());
    }
}
