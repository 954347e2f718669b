//! Every class of bad input is a 4xx in the one error shape and writes nothing.

use crate::common::*;
use serde_json::{json, Value};

/// (what, raw body, content type, status, code, param)
type Case = (
    &'static str,
    String,
    Option<&'static str>,
    u16,
    &'static str,
    Option<&'static str>,
);

fn cases() -> Vec<Case> {
    let with = |f: &dyn Fn(&mut Value)| {
        let mut body = payment_body("order-bad", 100);
        f(&mut body);
        body.to_string()
    };
    let json_ct = Some("application/json");
    vec![
        (
            "malformed JSON",
            r#"{"amount": 100,"#.into(),
            json_ct,
            400,
            "invalid_json",
            None,
        ),
        (
            "trailing garbage",
            format!("{} x", payment_body("o", 1)),
            json_ct,
            400,
            "invalid_json",
            None,
        ),
        (
            "not an object",
            "[100, \"EUR\", \"o-1\"]".into(),
            json_ct,
            400,
            "invalid_body",
            None,
        ),
        (
            "unknown field",
            with(&|b| b["amont"] = json!(1)),
            json_ct,
            400,
            "unknown_parameter",
            Some("amont"),
        ),
        (
            "unknown nested field",
            with(&|b| {
                b["fulfillment"] = json!({"biz_key": "k", "deadline": 1, "mode": "push", "x": 1})
            }),
            json_ct,
            400,
            "unknown_parameter",
            Some("fulfillment.x"),
        ),
        (
            "missing field",
            with(&|b| {
                b.as_object_mut().unwrap().remove("currency");
            }),
            json_ct,
            400,
            "parameter_missing",
            Some("currency"),
        ),
        (
            "zero amount",
            with(&|b| b["amount"] = json!(0)),
            json_ct,
            400,
            "amount_invalid",
            Some("amount"),
        ),
        (
            "negative amount",
            with(&|b| b["amount"] = json!(-100)),
            json_ct,
            400,
            "amount_invalid",
            Some("amount"),
        ),
        (
            "amount beyond i64",
            with(&|b| b["amount"] = json!(u64::MAX)),
            json_ct,
            400,
            "parameter_invalid",
            Some("amount"),
        ),
        (
            "amount beyond the maximum",
            with(&|b| b["amount"] = json!(i64::MAX)),
            json_ct,
            400,
            "amount_too_large",
            Some("amount"),
        ),
        (
            "fractional amount",
            with(&|b| b["amount"] = json!(10.5)),
            json_ct,
            400,
            "parameter_invalid",
            Some("amount"),
        ),
        (
            "amount as a string",
            with(&|b| b["amount"] = json!("100")),
            json_ct,
            400,
            "parameter_invalid",
            Some("amount"),
        ),
        (
            "unknown currency",
            with(&|b| b["currency"] = json!("XYZ")),
            json_ct,
            400,
            "currency_unsupported",
            Some("currency"),
        ),
        (
            "lower-case currency",
            with(&|b| b["currency"] = json!("eur")),
            json_ct,
            400,
            "currency_invalid",
            Some("currency"),
        ),
        (
            "unknown capture mode",
            with(&|b| b["capture_mode"] = json!("later")),
            json_ct,
            400,
            "parameter_invalid",
            Some("capture_mode"),
        ),
        (
            "over-long order number",
            with(&|b| b["merchant_order_no"] = json!("n".repeat(65))),
            json_ct,
            400,
            "string_too_long",
            Some("merchant_order_no"),
        ),
        (
            "empty order number",
            with(&|b| b["merchant_order_no"] = json!("")),
            json_ct,
            400,
            "string_invalid",
            Some("merchant_order_no"),
        ),
        (
            "control character",
            with(&|b| b["merchant_order_no"] = json!("a\u{7}b")),
            json_ct,
            400,
            "string_invalid",
            Some("merchant_order_no"),
        ),
        (
            "over-long payment method",
            with(&|b| b["payment_method"] = json!("p".repeat(256))),
            json_ct,
            400,
            "string_too_long",
            Some("payment_method"),
        ),
        (
            "over-long description",
            with(&|b| b["description"] = json!("d".repeat(1001))),
            json_ct,
            400,
            "string_too_long",
            Some("description"),
        ),
        (
            "bad return URL",
            with(&|b| b["return_url"] = json!("javascript:alert(1)")),
            json_ct,
            400,
            "url_invalid",
            Some("return_url"),
        ),
        (
            "too many metadata keys",
            with(&|b| {
                b["metadata"] =
                    Value::Object((0..51).map(|i| (format!("k{i}"), json!("v"))).collect())
            }),
            json_ct,
            400,
            "metadata_invalid",
            Some("metadata"),
        ),
        (
            "over-long metadata value",
            with(&|b| b["metadata"] = json!({"k": "v".repeat(501)})),
            json_ct,
            400,
            "string_too_long",
            Some("metadata.k"),
        ),
        (
            "non-string metadata value",
            with(&|b| b["metadata"] = json!({"k": 1})),
            json_ct,
            400,
            "parameter_invalid",
            Some("metadata.k"),
        ),
        (
            "fulfillment endpoint per payment",
            with(
                &|b| b["fulfillment"] = json!({"biz_key": "k", "deadline": i64::MAX / 2, "mode": "pull", "endpoint": "https://m.example/f"}),
            ),
            json_ct,
            400,
            "fulfillment_endpoint_per_merchant",
            Some("fulfillment.endpoint"),
        ),
        (
            "fulfillment deadline in the past",
            with(&|b| b["fulfillment"] = json!({"biz_key": "k", "deadline": 1, "mode": "push"})),
            json_ct,
            400,
            "fulfillment_deadline_invalid",
            Some("fulfillment.deadline"),
        ),
        (
            "connector account and routing",
            with(&|b| {
                b["connector_account"] = json!("ca_x");
                b["routing"] = json!({"adapter": "stripe"});
            }),
            json_ct,
            400,
            "parameter_conflict",
            Some("routing"),
        ),
        (
            "unknown connector account",
            with(&|b| b["connector_account"] = json!("ca_missing")),
            json_ct,
            404,
            "resource_missing",
            Some("connector_account"),
        ),
        (
            "no route for the adapter",
            with(&|b| b["routing"] = json!({"adapter": "stripe"})),
            json_ct,
            409,
            "no_route",
            Some("routing.adapter"),
        ),
        (
            "wrong content type",
            payment_body("o", 1).to_string(),
            Some("text/plain"),
            415,
            "unsupported_media_type",
            None,
        ),
        (
            "no content type",
            payment_body("o", 1).to_string(),
            None,
            415,
            "unsupported_media_type",
            None,
        ),
        (
            "form body",
            "amount=100&currency=EUR".into(),
            Some("application/x-www-form-urlencoded"),
            415,
            "unsupported_media_type",
            None,
        ),
        (
            "empty body",
            String::new(),
            json_ct,
            400,
            "body_missing",
            Some("body"),
        ),
        (
            "oversized body",
            with(&|b| b["description"] = json!("d".repeat(70 * 1024))),
            json_ct,
            413,
            "body_too_large",
            None,
        ),
    ]
}

dual_test! {
    async fn every_bad_create_input_is_a_4xx_in_the_error_shape_and_writes_nothing(&gw) {
        let m = gw.merchant("Acme").await;
        let history_before = gw.count("state_history").await;
        for (i, (what, body, content_type, status, code, param)) in cases().into_iter().enumerate() {
            let mut request = gw
                .http
                .post(gw.url("/v1/payments"))
                .header("authorization", format!("Bearer {}", m.key))
                .header("idempotency-key", format!("bad-{i}"))
                .body(body);
            if let Some(ct) = content_type {
                request = request.header("content-type", ct);
            }
            let reply = gw.send(request).await;
            assert_eq!(reply.status, status, "{what}: {}", reply.text());
            let error = reply.expect_error(status, code);
            assert_eq!(error["param"].as_str(), param, "{what}: {error}");
        }
        assert_eq!(gw.count("payment_orders").await, 0, "no payment written");
        assert_eq!(gw.count("state_history").await, history_before, "no history written");
        assert_eq!(gw.count("idempotency_keys").await, 0, "validation failures keep no idempotency record");
    }
}

dual_test! {
    async fn unknown_routes_and_methods_are_not_served_as_success(&gw) {
        let m = gw.merchant("Acme").await;
        let p = gw.post(&m.key, "/v1/payments", &payment_body("o-1", 100)).await.expect(201).json();
        let id = p["id"].as_str().unwrap();
        let delete = gw
            .send(gw.http.delete(gw.url(&format!("/v1/payments/{id}"))).header("authorization", format!("Bearer {}", m.key)))
            .await;
        assert_eq!(delete.status, 405);
        assert_eq!(gw.count("payment_orders").await, 1);
    }
}

dual_test! {
    async fn an_integer_written_with_a_zero_fraction_is_that_integer(&gw) {
        // JSON Schema's `integer`, which the OpenAPI document promises, includes 100.0.
        let m = gw.merchant("Acme").await;
        let mut body = payment_body("order-float", 100);
        body["amount"] = json!(100.0);
        assert_eq!(body.to_string().matches("100.0").count(), 1);
        let p = gw.post(&m.key, "/v1/payments", &body).await.expect(201).json();
        assert_eq!(p["amount"], 100);
        let refund = gw
            .post(&m.key, &format!("/v1/payments/{}/refunds", p["id"].as_str().unwrap()), &json!({"amount": 5.0}))
            .await;
        refund.expect_error(409, "payment_state_invalid");
    }
}

dual_test! {
    async fn a_fulfillment_endpoint_secret_is_measured_in_characters_like_every_text(&gw) {
        let m = gw.merchant("Acme").await;
        let path = format!("/admin/merchants/{}/fulfillment_endpoint", m.id);
        let put = |secret: String| {
            gw.send(
                gw.http
                    .put(gw.url(&path))
                    .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
                    .header("content-type", "application/json")
                    .body(json!({"url": "https://shop.example/fulfil", "secret": secret}).to_string()),
            )
        };
        // 300 characters of two bytes each: 600 bytes, inside the document's 16 to 500 characters.
        let set = put("é".repeat(300)).await.expect(200).json();
        assert_eq!(set["secret_set"], true);
        for refused in ["é".repeat(501), "é".repeat(15)] {
            let error = put(refused).await.expect_error(400, "secret_invalid");
            assert_eq!(error["param"], "secret");
        }
    }
}

dual_test! {
    async fn a_well_formed_request_the_current_state_refuses_is_a_409_and_changes_nothing(&gw) {
        let m = gw.merchant("Acme").await;
        gw.admin_post(
            &format!("/admin/merchants/{}/connector_accounts", m.id),
            &json!({"adapter": "test-well-behaved", "label": "second", "config": {"base_url": gw.psp.base_url()}}),
        )
        .await
        .expect(201);
        let p = gw.post(&m.key, "/v1/payments", &payment_body("order-two", 100)).await.expect(201).json();
        let id = p["id"].as_str().unwrap();
        let error = gw
            .post(&m.key, &format!("/v1/payments/{id}/confirm"), &json!({}))
            .await
            .expect_error(409, "route_ambiguous");
        assert_eq!(error["param"], "connector_account");
        let operator = gw.admin_post("/admin/operators", &json!({"name": "alice"})).await.expect(201).json();
        let dismiss = gw
            .send(
                gw.http
                    .post(gw.url(&format!("/admin/review/payments/{id}/proposals")))
                    .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
                    .header("sluice-operator-key", operator["key"].as_str().unwrap())
                    .header("content-type", "application/json")
                    .body(json!({"outcome": "dismiss", "reason_code": "noise", "evidence_note": "nothing to see"}).to_string()),
            )
            .await;
        dismiss.expect_error(409, "proposal_not_applicable");
        let after = gw.get(&m.key, &format!("/v1/payments/{id}")).await.expect(200).json();
        assert_eq!(after["status"], "created");
        assert_eq!(after["attempts"], json!([]));
        assert_eq!(gw.count("review_proposals").await, 0);
    }
}
