//! Creating, reading and listing payments.

use crate::common::*;
use serde_json::{json, Value};

dual_test! {
    async fn a_created_payment_shows_its_status_amounts_and_timeline(&gw) {
        let m = gw.merchant("Acme").await;
        let mut body = payment_body("order-1", 1250);
        body["connector_account"] = json!(m.account);
        body["description"] = json!("Renewal, 1 year");
        let created = gw.post(&m.key, "/v1/payments", &body).await.expect(201);
        assert_eq!(created.headers.get("content-type").unwrap(), "application/json");
        let p = created.json();
        assert!(p["id"].as_str().unwrap().starts_with("pay_"));
        assert_eq!(p["object"], "payment");
        assert_eq!(p["status"], "created", "no attempt yet: nothing is claimed");
        assert_eq!(p["state"], "CREATED");
        assert_eq!((p["amount"].as_i64(), p["currency"].as_str()), (Some(1250), Some("EUR")));
        assert_eq!(p["amounts"], json!({
            "amount": 1250, "authorized": 0, "capture_reserved": 0, "captured": 0,
            "refund_reserved": 0, "refunded": 0, "capturable": 0, "refundable": 0
        }));
        assert_eq!(p["metadata"], json!({"cart": "42"}));
        assert_eq!(p["payment_method"], "pm_card_visa");
        assert_eq!(p["attempts"], json!([]));
        assert!(p["poll_after_ms"].is_null() && p["next_action"].is_null());

        let id = p["id"].as_str().unwrap();
        let fetched = gw.get(&m.key, &format!("/v1/payments/{id}")).await.expect(200).json();
        assert_eq!(fetched, p);
        let timeline = gw.get(&m.key, &format!("/v1/payments/{id}/timeline")).await.expect(200).json();
        let events = timeline["data"].as_array().unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["event_kind"], "COMMAND_CREATE");
        assert_eq!(events[0]["accepted"], true);
        assert_eq!(events[0]["decision"], "applied");
        assert_eq!(events[0]["source"], "command");
        assert_eq!(events[0]["actor"], format!("merchant:{}", m.id));
        assert_eq!(events[0]["to_state"], "CREATED");
    }
}

dual_test! {
    async fn the_same_order_number_with_the_same_parameters_returns_the_existing_payment(&gw) {
        let m = gw.merchant("Acme").await;
        let first = gw.post(&m.key, "/v1/payments", &payment_body("order-1", 500)).await.expect(201).json();
        // Same parameters, keys in another order and another routing choice.
        let mut again = payment_body("order-1", 500);
        again["connector_account"] = json!(m.account);
        let second = gw.post(&m.key, "/v1/payments", &again).await.expect(200).json();
        assert_eq!(second["id"], first["id"]);
        assert_eq!(gw.count("payment_orders").await, 1);
    }
}

dual_test! {
    async fn the_same_order_number_with_other_parameters_is_a_conflict(&gw) {
        let m = gw.merchant("Acme").await;
        let first = gw.post(&m.key, "/v1/payments", &payment_body("order-1", 500)).await.expect(201).json();
        let mut other = payment_body("order-1", 501);
        other["metadata"] = json!({"cart": "43"});
        let refused = gw.post(&m.key, "/v1/payments", &other).await;
        let error = refused.expect_error(409, "merchant_order_no_conflict");
        assert_eq!(error["param"], "merchant_order_no");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(first["id"].as_str().unwrap()), "{message}");
        assert!(message.contains("amount") && message.contains("metadata"), "{message}");
        assert_eq!(gw.count("payment_orders").await, 1);
        let unchanged = gw.get(&m.key, &format!("/v1/payments/{}", first["id"].as_str().unwrap())).await.json();
        assert_eq!(unchanged, first);
    }
}

dual_test! {
    async fn concurrent_creates_with_one_order_number_make_one_payment(&gw) {
        let m = gw.merchant("Acme").await;
        let body = payment_body("order-race", 700);
        let replies = futures_join(gw, &m.key, &body, 8).await;
        let created = replies.iter().filter(|r| r.status == 201).count();
        let existing = replies.iter().filter(|r| r.status == 200).count();
        assert_eq!((created, existing), (1, 7), "{:?}", replies.iter().map(|r| r.status).collect::<Vec<_>>());
        let ids: std::collections::BTreeSet<String> =
            replies.iter().map(|r| r.json()["id"].as_str().unwrap().to_owned()).collect();
        assert_eq!(ids.len(), 1);
        assert_eq!(gw.count("payment_orders").await, 1);
    }
}

async fn futures_join(gw: &Gateway, key: &str, body: &Value, n: usize) -> Vec<Reply> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let request = gw
            .http
            .post(gw.url("/v1/payments"))
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(body.to_string());
        tasks.push(tokio::spawn(async move {
            let response = request.send().await.expect("send");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let bytes = response.bytes().await.expect("body").to_vec();
            Reply {
                status,
                headers,
                bytes,
            }
        }));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("task"));
    }
    out
}

dual_test! {
    async fn payments_are_listed_newest_first_with_filters_and_a_cursor(&gw) {
        let m = gw.merchant("Acme").await;
        let mut ids = Vec::new();
        for n in 0..5 {
            gw.db.clock.advance(1000);
            let p = gw.post(&m.key, "/v1/payments", &payment_body(&format!("order-{n}"), 100 + n)).await.expect(201).json();
            ids.push((p["id"].as_str().unwrap().to_owned(), p["created_at"].as_i64().unwrap()));
        }
        let page1 = gw.get(&m.key, "/v1/payments?limit=2").await.expect(200).json();
        let got: Vec<&str> = page1["data"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
        assert_eq!(got, [ids[4].0.as_str(), ids[3].0.as_str()]);
        assert_eq!(page1["has_more"], true);
        let cursor = page1["next_cursor"].as_str().unwrap();
        let page2 = gw.get(&m.key, &format!("/v1/payments?limit=2&starting_after={cursor}")).await.expect(200).json();
        let got: Vec<&str> = page2["data"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
        assert_eq!(got, [ids[2].0.as_str(), ids[1].0.as_str()]);
        let cursor = page2["next_cursor"].as_str().unwrap();
        let page3 = gw.get(&m.key, &format!("/v1/payments?limit=2&starting_after={cursor}")).await.expect(200).json();
        assert_eq!(page3["data"].as_array().unwrap().len(), 1);
        assert_eq!(page3["has_more"], false);
        assert!(page3["next_cursor"].is_null());

        let by_number = gw.get(&m.key, "/v1/payments?merchant_order_no=order-3").await.expect(200).json();
        assert_eq!(by_number["data"][0]["id"], ids[3].0.as_str());
        assert_eq!(by_number["data"].as_array().unwrap().len(), 1);

        let range = format!("/v1/payments?created_gte={}&created_lte={}", ids[1].1, ids[3].1);
        let ranged = gw.get(&m.key, &range).await.expect(200).json();
        assert_eq!(ranged["data"].as_array().unwrap().len(), 3);

        let created = gw.get(&m.key, "/v1/payments?status=created").await.expect(200).json();
        assert_eq!(created["data"].as_array().unwrap().len(), 5);
        let succeeded = gw.get(&m.key, "/v1/payments?status=succeeded").await.expect(200).json();
        assert_eq!(succeeded["data"].as_array().unwrap().len(), 0);

        gw.get(&m.key, "/v1/payments?status=paid").await.expect_error(400, "parameter_invalid");
        gw.get(&m.key, "/v1/payments?limit=0").await.expect_error(400, "parameter_invalid");
        gw.get(&m.key, "/v1/payments?limit=101").await.expect_error(400, "parameter_invalid");
        gw.get(&m.key, "/v1/payments?limit=abc").await.expect_error(400, "invalid_query");
        let unknown = gw.get(&m.key, "/v1/payments?colour=red").await;
        assert_eq!(unknown.expect_error(400, "invalid_query")["param"], "colour");
        gw.get(&m.key, &format!("/v1/payments?created_gte={}&created_lte={}", ids[3].1, ids[1].1))
            .await
            .expect_error(400, "parameter_invalid");
    }
}

dual_test! {
    async fn an_unknown_refund_or_payment_is_404_in_the_json_shape(&gw) {
        let m = gw.merchant("Acme").await;
        gw.get(&m.key, "/v1/refunds/rfd_missing").await.expect_error(404, "resource_missing");
        gw.get(&m.key, "/v1/payments/pay_missing").await.expect_error(404, "resource_missing");
        gw.get(&m.key, &format!("/v1/payments/{}", "x".repeat(300))).await.expect_error(404, "resource_missing");
    }
}

dual_test! {
    async fn a_push_fulfillment_block_is_stored_and_shown(&gw) {
        let m = gw.merchant("Acme").await;
        let deadline = gw.db.clock.now_ms() + 3_600_000;
        let mut body = payment_body("renewal-1", 9900);
        body["fulfillment"] = json!({"biz_key": "renew:user-7:2027", "deadline": deadline, "mode": "push"});
        let p = gw.post(&m.key, "/v1/payments", &body).await.expect(201).json();
        assert_eq!(p["fulfillment"], json!({
            "biz_key": "renew:user-7:2027", "deadline": deadline, "mode": "push",
            "state": "pending_payment", "attempt_reference": null, "next_check_at": null,
            "compensation_refund_reference": null, "compensation_reason": null, "review_reason": null
        }));
        let mut changed = body.clone();
        changed["fulfillment"]["deadline"] = json!(deadline + 1);
        gw.post(&m.key, "/v1/payments", &changed).await.expect_error(409, "merchant_order_no_conflict");
    }
}
