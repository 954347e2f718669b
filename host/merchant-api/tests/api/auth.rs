//! Authentication and tenancy.

use crate::common::*;
use serde_json::json;

dual_test! {
    async fn requests_without_a_valid_key_are_refused_with_401(&gw) {
        let m = gw.merchant("Acme").await;
        let no_header = gw.send(gw.http.get(gw.url("/v1/payments"))).await;
        no_header.expect_error(401, "api_key_missing");
        assert_eq!(no_header.headers.get("www-authenticate").unwrap(), "Bearer");
        gw.send(gw.http.get(gw.url("/v1/payments")).header("authorization", format!("Basic {}", m.key)))
            .await
            .expect_error(401, "api_key_missing");
        gw.get("sk_sluice_0000000000000000000000000000000000000000000000", "/v1/payments")
            .await
            .expect_error(401, "api_key_invalid");
        gw.get(&"x".repeat(5000), "/v1/payments").await.expect_error(401, "api_key_invalid");
        let refused = gw.post("wrong", "/v1/payments", &payment_body("o-1", 100)).await;
        refused.expect_error(401, "api_key_invalid");
        assert_eq!(gw.count("payment_orders").await, 0, "a refused request writes nothing");
        gw.get(&m.key, "/v1/payments").await.expect(200);
    }
}

dual_test! {
    async fn a_revoked_key_is_refused_with_401_and_other_keys_keep_working(&gw) {
        let m = gw.merchant("Acme").await;
        let second = gw
            .admin_post(&format!("/admin/merchants/{}/api_keys", m.id), &json!({}))
            .await
            .expect(201)
            .json();
        gw.get(&m.key, "/v1/payments").await.expect(200);
        let revoked = gw
            .admin_delete(&format!("/admin/merchants/{}/api_keys/{}", m.id, m.key_id))
            .await
            .expect(200)
            .json();
        assert!(revoked["revoked_at"].is_i64(), "{revoked}");
        gw.get(&m.key, "/v1/payments").await.expect_error(401, "api_key_invalid");
        gw.post(&m.key, "/v1/payments", &payment_body("o-1", 100))
            .await
            .expect_error(401, "api_key_invalid");
        gw.get(second["key"].as_str().unwrap(), "/v1/payments").await.expect(200);
    }
}

dual_test! {
    async fn another_merchants_payment_and_refund_read_exactly_like_missing_ones(&gw) {
        let acme = gw.merchant("Acme").await;
        let globex = gw.merchant("Globex").await;
        let created = gw.post(&acme.key, "/v1/payments", &payment_body("o-1", 100)).await.expect(201).json();
        let id = created["id"].as_str().unwrap();
        gw.get(&acme.key, &format!("/v1/payments/{id}")).await.expect(200);

        // The same id shape, never created.
        let missing_id = format!("pay_{}", "0".repeat(id.len() - 4));
        for (foreign, missing) in [
            (format!("/v1/payments/{id}"), format!("/v1/payments/{missing_id}")),
            (format!("/v1/payments/{id}/timeline"), format!("/v1/payments/{missing_id}/timeline")),
        ] {
            let foreign = gw.get(&globex.key, &foreign).await;
            let missing = gw.get(&globex.key, &missing).await;
            foreign.expect_error(404, "resource_missing");
            missing.expect_error(404, "resource_missing");
            assert_eq!(foreign.text().replace(id, "<id>"), missing.text().replace(&missing_id, "<id>"));
        }
        let listed = gw.get(&globex.key, "/v1/payments").await.expect(200).json();
        assert_eq!(listed["data"].as_array().unwrap().len(), 0);
        let by_number = gw.get(&globex.key, "/v1/payments?merchant_order_no=o-1").await.expect(200).json();
        assert_eq!(by_number["data"].as_array().unwrap().len(), 0);

        // The other merchant's order number is free for this merchant.
        gw.post(&globex.key, "/v1/payments", &payment_body("o-1", 999)).await.expect(201);

        // A connector account of another merchant cannot be used either.
        let mut body = payment_body("o-2", 100);
        body["connector_account"] = json!(acme.account);
        gw.post(&globex.key, "/v1/payments", &body)
            .await
            .expect_error(404, "resource_missing");
    }
}
