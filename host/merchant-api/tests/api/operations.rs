//! Confirm, capture, void and refund through HTTP, the real orchestrator,
//! the real compiled `test-well-behaved` adapter and the fake PSP.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

fn confirmed(order_no: &str, amount: i64, capture_mode: &str, account: &str) -> Value {
    let mut body = payment_body(order_no, amount);
    body["capture_mode"] = json!(capture_mode);
    body["connector_account"] = json!(account);
    body["confirm"] = json!(true);
    body
}

pub(crate) async fn paid(
    gw: &Gateway,
    m: &TestMerchant,
    order_no: &str,
    amount: i64,
    capture_mode: &str,
) -> String {
    let p = gw
        .post(
            &m.key,
            "/v1/payments",
            &confirmed(order_no, amount, capture_mode, &m.account),
        )
        .await
        .expect(201)
        .json();
    let expected = if capture_mode == "manual" {
        "authorized"
    } else {
        "succeeded"
    };
    assert_eq!(p["status"], expected, "{p}");
    p["id"].as_str().unwrap().to_owned()
}

dual_test! {
    async fn a_confirmed_payment_succeeds_with_one_charge_and_its_evidence_in_the_timeline(&gw) {
        let m = gw.merchant("Acme").await;
        let p = gw.post(&m.key, "/v1/payments", &confirmed("happy-1", 1000, "automatic", &m.account)).await.expect(201).json();
        assert_eq!(p["status"], "succeeded", "{p}");
        assert_eq!(p["state"], "SUCCEEDED");
        assert_eq!(p["amounts"]["captured"], 1000);
        assert_eq!(p["amounts"]["refundable"], 1000);
        let attempt = &p["attempts"][0];
        assert_eq!(attempt["state"], "SUCCEEDED");
        assert_eq!(attempt["adapter"], ADAPTER);
        assert_eq!(attempt["connector_account"], m.account.as_str());
        let reference = attempt["reference"].as_str().unwrap();
        assert_eq!(gw.psp.payments_for(reference).len(), 1, "exactly one charge at the PSP");
        assert_eq!(gw.psp.payments().len(), 1);

        let id = p["id"].as_str().unwrap();
        let timeline = gw.get(&m.key, &format!("/v1/payments/{id}/timeline")).await.expect(200).json();
        let from_psp: Vec<&Value> = timeline["data"].as_array().unwrap().iter()
            .filter(|e| e["source"] == "sync_response")
            .collect();
        assert!(!from_psp.is_empty(), "{timeline}");
        for event in &from_psp {
            assert_eq!(event["adapter"]["name"], ADAPTER, "{event}");
            assert!(event["adapter"]["version"].is_string(), "{event}");
            assert!(event["recorded_at"].is_i64());
            assert!(event["reason"].as_str().is_some_and(|r| !r.is_empty()), "{event}");
        }
        assert!(from_psp.iter().any(|e| e["accepted"] == true && e["event_kind"] == "PAYMENT_SUCCEEDED"), "{timeline}");

        // A repeated create returns the same payment and does not charge again.
        let again = gw.post(&m.key, "/v1/payments", &confirmed("happy-1", 1000, "automatic", &m.account)).await.expect(200).json();
        assert_eq!(again["id"], p["id"]);
        assert_eq!(gw.psp.payments().len(), 1);
    }
}

dual_test! {
    async fn a_decline_is_failed_and_a_new_confirm_with_other_details_may_succeed(&gw) {
        let m = gw.merchant("Acme").await;
        gw.psp.set_mode(PspRoute::Payments, Mode::Decline);
        let p = gw.post(&m.key, "/v1/payments", &confirmed("decl-1", 500, "automatic", &m.account)).await.expect(201).json();
        assert_eq!(p["status"], "failed", "{p}");
        assert_eq!(p["failure"]["category"], "declined", "{p}");
        assert_eq!(p["amounts"]["captured"], 0);
        gw.psp.set_mode(PspRoute::Payments, Mode::Succeed);
        let id = p["id"].as_str().unwrap();
        let retried = gw
            .post(&m.key, &format!("/v1/payments/{id}/confirm"), &json!({"payment_method": "pm_other_card"}))
            .await
            .expect(200)
            .json();
        assert_eq!(retried["status"], "succeeded", "{retried}");
        assert_eq!(retried["attempts"].as_array().unwrap().len(), 2);
        assert_eq!(gw.psp.payments().len(), 1, "the decline committed nothing");
    }
}

dual_test! {
    async fn a_timeout_after_commit_is_processing_never_failed_and_a_new_attempt_is_refused(&gw) {
        let m = gw.merchant("Acme").await;
        gw.psp.set_mode(PspRoute::Payments, Mode::TimeoutAfterCommit(Duration::from_secs(3)));
        let p = gw.post(&m.key, "/v1/payments", &confirmed("slow-1", 800, "automatic", &m.account)).await.expect(201).json();
        assert_eq!(p["status"], "processing", "a timeout is not a failure: {p}");
        assert!(p["poll_after_ms"].as_i64().is_some_and(|ms| ms >= 1000), "{p}");
        assert_eq!(p["attempts"][0]["state"], "UNKNOWN", "{p}");
        gw.psp.set_mode(PspRoute::Payments, Mode::Succeed);
        let id = p["id"].as_str().unwrap();
        let refused = gw.post(&m.key, &format!("/v1/payments/{id}/confirm"), &json!({})).await;
        refused.expect_error(409, "attempt_in_flight");
        let after = gw.get(&m.key, &format!("/v1/payments/{id}")).await.json();
        assert_eq!(after["attempts"].as_array().unwrap().len(), 1, "no second attempt while UNKNOWN");
        assert_eq!(gw.psp.payments().len(), 1, "exactly one charge at the PSP");
    }
}

dual_test! {
    async fn two_concurrent_refunds_of_70_on_100_captured_one_accepted_one_refused(&gw) {
        let m = gw.merchant("Acme").await;
        let id = paid(gw, &m, "r-1", 100, "automatic").await;
        let path = format!("/v1/payments/{id}/refunds");
        let (first, second) = (json!({"amount": 70, "reason": "first"}), json!({"amount": 70, "reason": "second"}));
        let (a, b) = tokio::join!(gw.post(&m.key, &path, &first), gw.post(&m.key, &path, &second));
        let mut statuses = [a.status, b.status];
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 409], "{} / {}", a.text(), b.text());
        let (ok, refused) = if a.status == 200 { (a, b) } else { (b, a) };
        let error = refused.expect_error(409, "amount_exceeds_refundable");
        assert_eq!(error["param"], "amount");
        let refund = ok.json();
        assert_eq!(refund["status"], "succeeded", "{refund}");
        assert_eq!(refund["amount"], 70);
        let payment = gw.get(&m.key, &format!("/v1/payments/{id}")).await.json();
        assert_eq!(payment["amounts"]["refunded"], 70);
        assert_eq!(payment["amounts"]["refund_reserved"], 0);
        assert_eq!(payment["refunds"].as_array().unwrap().len(), 1, "the refused request left no row");
        assert_eq!(payment["status"], "partially_refunded");
        assert_eq!(gw.psp.refunds().len(), 1);
        let fetched = gw.get(&m.key, &format!("/v1/refunds/{}", refund["id"].as_str().unwrap())).await.expect(200).json();
        assert_eq!(fetched, refund);
    }
}

dual_test! {
    async fn a_partial_capture_then_refunds_count_against_the_captured_amount_only(&gw) {
        let m = gw.merchant("Acme").await;
        let id = paid(gw, &m, "cap-1", 100, "manual").await;
        let captured = gw.post(&m.key, &format!("/v1/payments/{id}/capture"), &json!({"amount": 60})).await.expect(200).json();
        assert_eq!(captured["status"], "succeeded", "{captured}");
        assert_eq!((captured["amounts"]["authorized"].as_i64(), captured["amounts"]["captured"].as_i64()), (Some(100), Some(60)));
        assert_eq!(captured["captures"][0]["state"], "SUCCEEDED");
        assert_eq!(gw.psp.captures().len(), 1);

        let refunds = format!("/v1/payments/{id}/refunds");
        let too_much = gw.post(&m.key, &refunds, &json!({"amount": 70})).await;
        let error = too_much.expect_error(409, "amount_exceeds_refundable");
        assert!(error["message"].as_str().unwrap().contains("60"), "{error}");
        let unchanged = gw.get(&m.key, &format!("/v1/payments/{id}")).await.json();
        assert_eq!(unchanged["refunds"], json!([]));
        assert_eq!(unchanged["amounts"]["refund_reserved"], 0);

        let first = gw.post(&m.key, &refunds, &json!({"amount": 40})).await.expect(200).json();
        assert_eq!(first["status"], "succeeded");
        let rest = gw.post(&m.key, &refunds, &json!({})).await.expect(200).json();
        assert_eq!(rest["amount"], 20, "the rest of the captured amount, not of the authorization");
        let done = gw.get(&m.key, &format!("/v1/payments/{id}")).await.json();
        assert_eq!(done["amounts"]["refunded"], 60);
        assert_eq!(done["status"], "refunded");
        gw.post(&m.key, &refunds, &json!({"amount": 1})).await.expect_error(409, "amount_exceeds_refundable");
        assert_eq!(gw.psp.refunds().len(), 2);
    }
}

dual_test! {
    async fn bad_capture_and_refund_input_is_a_4xx_and_changes_nothing(&gw) {
        let m = gw.merchant("Acme").await;
        let other = gw.merchant("Globex").await;
        let id = paid(gw, &m, "bad-1", 100, "manual").await;
        let capture = format!("/v1/payments/{id}/capture");
        let refunds = format!("/v1/payments/{id}/refunds");
        let cases: Vec<(&str, Value, u16, &str)> = vec![
            (&capture, json!({"amount": 50, "currency": "USD"}), 409, "currency_mismatch"),
            (&capture, json!({"amount": 0}), 400, "amount_invalid"),
            (&capture, json!({"amount": -5}), 400, "amount_invalid"),
            (&capture, json!({"amount": 1e30}), 400, "parameter_invalid"),
            (&capture, json!({"amount": 101}), 409, "amount_exceeds_capturable"),
            (&capture, json!({"amount": 10, "note": "x"}), 400, "unknown_parameter"),
            (&capture, json!({"amount": 10, "currency": "usd"}), 400, "currency_invalid"),
            (&refunds, json!({"amount": 10, "currency": "GBP"}), 409, "currency_mismatch"),
            (&refunds, json!({"amount": 10, "reason": "r".repeat(501)}), 400, "string_too_long"),
            (&refunds, json!({"amount": 10}), 409, "payment_state_invalid"),
        ];
        for (path, body, status, code) in cases {
            gw.post(&m.key, path, &body).await.expect_error(status, code);
        }
        gw.post(&other.key, &capture, &json!({"amount": 10})).await.expect_error(404, "resource_missing");
        gw.post(&other.key, &refunds, &json!({})).await.expect_error(404, "resource_missing");
        gw.post(&other.key, &format!("/v1/payments/{id}/void"), &json!({})).await.expect_error(404, "resource_missing");
        gw.post(&other.key, &format!("/v1/payments/{id}/confirm"), &json!({})).await.expect_error(404, "resource_missing");
        let text_body = gw
            .send(gw.http.post(gw.url(&capture)).header("authorization", format!("Bearer {}", m.key)).header("content-type", "text/plain").body("amount=10"))
            .await;
        text_body.expect_error(415, "unsupported_media_type");
        let p = gw.get(&m.key, &format!("/v1/payments/{id}")).await.json();
        assert_eq!(p["status"], "authorized");
        assert_eq!(p["captures"], json!([]));
        assert_eq!(p["refunds"], json!([]));
        assert_eq!(p["amounts"]["capture_reserved"], 0);
        assert!(gw.psp.captures().is_empty());
    }
}

dual_test! {
    async fn a_void_cancels_an_authorization(&gw) {
        let m = gw.merchant("Acme").await;
        let id = paid(gw, &m, "void-1", 300, "manual").await;
        let voided = gw.post(&m.key, &format!("/v1/payments/{id}/void"), &json!({})).await.expect(200).json();
        assert_eq!(voided["status"], "canceled", "{voided}");
        gw.post(&m.key, &format!("/v1/payments/{id}/capture"), &json!({})).await.expect_error(409, "payment_state_invalid");
    }
}

dual_test! {
    async fn a_refund_retried_with_its_key_is_replayed_and_refunds_once(&gw) {
        let m = gw.merchant("Acme").await;
        let id = paid(gw, &m, "idem-r", 100, "automatic").await;
        let path = format!("/v1/payments/{id}/refunds");
        let first = gw.post_idem(&m.key, "refund-1", &path, &json!({"amount": 30})).await.expect(200);
        let again = gw.post_idem(&m.key, "refund-1", &path, &json!({"amount": 30})).await.expect(200);
        assert_eq!(again.bytes, first.bytes);
        assert_eq!(again.headers.get("idempotent-replayed").unwrap(), "true");
        assert_eq!(gw.psp.refunds().len(), 1);
        // The same key on another payment's refunds is another request.
        let other = paid(gw, &m, "idem-r2", 100, "automatic").await;
        gw.post_idem(&m.key, "refund-1", &format!("/v1/payments/{other}/refunds"), &json!({"amount": 30}))
            .await
            .expect_error(400, "idempotency_key_reused");
    }
}

dual_test! {
    async fn the_same_key_while_a_slow_confirm_runs_is_409_in_use(&gw) {
        let m = gw.merchant("Acme").await;
        let created = gw.post(&m.key, "/v1/payments", &payment_body("busy-1", 100)).await.expect(201).json();
        let path = format!("/v1/payments/{}/confirm", created["id"].as_str().unwrap());
        gw.psp.set_mode(PspRoute::Payments, Mode::Slow(Duration::from_millis(600)));
        let empty = json!({});
        let first = gw.post_idem(&m.key, "confirm-1", &path, &empty);
        let second = async {
            tokio::time::sleep(Duration::from_millis(250)).await;
            gw.post_idem(&m.key, "confirm-1", &path, &empty).await
        };
        let (first, second) = tokio::join!(first, second);
        second.expect_error(409, "idempotency_key_in_use");
        assert_eq!(first.status, 200, "{}", first.text());
        assert_eq!(first.json()["status"], "succeeded");
        let replay = gw.post_idem(&m.key, "confirm-1", &path, &json!({})).await;
        assert_eq!(replay.bytes, first.bytes);
        assert_eq!(gw.psp.payments().len(), 1);
    }
}

async fn status_ids(gw: &Gateway, key: &str, status: &str) -> Vec<String> {
    let list = gw
        .get(key, &format!("/v1/payments?status={status}"))
        .await
        .expect(200)
        .json();
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect()
}

dual_test! {
    async fn payments_are_filtered_by_their_client_status(&gw) {
        let m = gw.merchant("Acme").await;
        let succeeded = paid(gw, &m, "f-ok", 100, "automatic").await;
        let refunded = paid(gw, &m, "f-part", 100, "automatic").await;
        gw.post(&m.key, &format!("/v1/payments/{refunded}/refunds"), &json!({"amount": 10})).await.expect(200);
        let authorized = paid(gw, &m, "f-auth", 100, "manual").await;
        gw.psp.set_mode(PspRoute::Payments, Mode::Decline);
        let failed = gw.post(&m.key, "/v1/payments", &confirmed("f-failed", 100, "automatic", &m.account)).await.expect(201).json();
        gw.psp.set_mode(PspRoute::Payments, Mode::Succeed);
        let created = gw.post(&m.key, "/v1/payments", &payment_body("f-new", 100)).await.expect(201).json();

        let key = m.key.as_str();
        assert_eq!(status_ids(gw, key, "succeeded").await, [succeeded]);
        assert_eq!(status_ids(gw, key, "partially_refunded").await, [refunded]);
        assert_eq!(status_ids(gw, key, "authorized").await, [authorized]);
        assert_eq!(status_ids(gw, key, "failed").await, [failed["id"].as_str().unwrap()]);
        assert_eq!(status_ids(gw, key, "created").await, [created["id"].as_str().unwrap()]);
        assert!(status_ids(gw, key, "processing").await.is_empty());
        assert!(status_ids(gw, key, "refunded").await.is_empty());
        let page = gw.get(&m.key, "/v1/payments?status=succeeded&limit=1").await.json();
        assert_eq!(page["has_more"], false, "the only succeeded payment fills the page: {page}");
    }
}

/// The `psp` duration of a `Server-Timing` header, in milliseconds.
fn psp_millis(reply: &Reply) -> f64 {
    timing_millis(reply, "psp")
}

/// The duration of the `Server-Timing` metric `name`, in milliseconds.
fn timing_millis(reply: &Reply, name: &str) -> f64 {
    let header = reply.headers["server-timing"].to_str().unwrap();
    let dur = header
        .split(", ")
        .find_map(|metric| metric.strip_prefix(&format!("{name};dur=")))
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no {name} duration in {header:?}"));
    dur.parse().unwrap()
}

dual_test! {
    async fn every_answer_says_in_server_timing_how_long_it_waited_for_the_psp(&gw) {
        let m = gw.merchant("Acme").await;
        gw.psp.set_mode(PspRoute::Payments, Mode::Slow(Duration::from_millis(80)));
        let started = std::time::Instant::now();
        let created = gw.post(&m.key, "/v1/payments", &confirmed("timing-1", 1000, "automatic", &m.account)).await.expect(201);
        let total_ms = started.elapsed().as_secs_f64() * 1000.0;
        let psp = psp_millis(&created);
        assert!(psp >= 80.0, "the PSP held its answer 80 ms; Server-Timing says {psp} ms");
        assert!(psp <= total_ms, "the PSP's share ({psp} ms) is part of the request's {total_ms} ms");
        let app = timing_millis(&created, "app");
        assert!(psp <= app && app <= total_ms, "the PSP's {psp} ms are inside the routes' {app} ms, inside the request's {total_ms} ms");
        assert_eq!(created.json()["status"], "succeeded");

        // A read and a replay call no PSP.
        let id = created.json()["id"].as_str().unwrap().to_owned();
        let read = gw.get(&m.key, &format!("/v1/payments/{id}")).await.expect(200);
        assert_eq!(psp_millis(&read), 0.0);
        let body = confirmed("timing-2", 1000, "automatic", &m.account);
        let first = gw.post_idem(&m.key, "timing-key", "/v1/payments", &body).await.expect(201);
        assert!(psp_millis(&first) >= 80.0);
        let replay = gw.post_idem(&m.key, "timing-key", "/v1/payments", &body).await.expect(201);
        assert_eq!(replay.headers["idempotent-replayed"], "true");
        assert_eq!(psp_millis(&replay), 0.0);
        // A refused request too.
        let refused = gw.post(&m.key, "/v1/payments", &json!({"amount": -1})).await;
        assert_eq!(refused.status, 400);
        assert_eq!(psp_millis(&refused), 0.0);
    }
}
