//! `GET /v1/payments/{id}/timeline` over real HTTP (issue 16): the history
//! one bounded page at a time, and the `next` section for every open state
//! (scanner query due, webhook awaited, deadline pending, merchant action,
//! review pending) and for a payment with nothing left.

use std::time::Duration;

use crate::common::*;
use crate::review::{as_operator, operator};
use serde_json::{json, Value};
use sluice_store::{PendingKind, Provenance};

/// A confirmed payment of `m`; `extra` is merged into the create body.
async fn confirmed(gw: &Gateway, m: &TestMerchant, order_no: &str, extra: Value) -> Value {
    let mut body = payment_body(order_no, 700);
    body["connector_account"] = json!(m.account);
    body["confirm"] = json!(true);
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    gw.post(&m.key, "/v1/payments", &body)
        .await
        .expect(201)
        .json()
}

/// A payment whose sale the PSP committed while the host timed out: UNKNOWN.
async fn unknown_payment(gw: &Gateway, m: &TestMerchant, order_no: &str) -> Value {
    gw.psp.set_mode(
        PspRoute::Payments,
        Mode::TimeoutAfterCommit(Duration::from_secs(3)),
    );
    let p = confirmed(gw, m, order_no, json!({})).await;
    gw.psp.set_mode(PspRoute::Payments, Mode::Succeed);
    assert_eq!(p["attempts"][0]["state"], "UNKNOWN", "{p}");
    p
}

async fn next_of(gw: &Gateway, m: &TestMerchant, id: &str) -> Value {
    let timeline = gw
        .get(&m.key, &format!("/v1/payments/{id}/timeline"))
        .await
        .expect(200)
        .json();
    timeline["next"].clone()
}

fn step<'a>(next: &'a Value, aggregate: &str) -> &'a Value {
    next["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["aggregate"] == aggregate)
        .unwrap_or_else(|| panic!("a step for the {aggregate}: {next}"))
}

dual_test! {
    async fn an_unknown_outcome_is_next_queried_by_the_scanner_with_the_attempt_reference(&gw) {
        let m = gw.merchant("Acme").await;
        let p = unknown_payment(gw, &m, "tl-unknown").await;
        let id = p["id"].as_str().unwrap();
        let attempt = gw.store().get_attempt(p["attempts"][0]["id"].as_str().unwrap()).await.unwrap();

        let next = next_of(gw, &m, id).await;
        assert_eq!(next["mover"], "scanner", "{next}");
        let query = step(&next, "attempt");
        assert_eq!(query["action"], "query_psp", "{next}");
        assert_eq!(query["state"], "UNKNOWN");
        assert_eq!(query["reference"], attempt.reference.as_str());
        assert_eq!(query["tries"], attempt.retry_count);
        assert!(query["backoff_ms"].as_i64().unwrap() > 0, "{next}");
        let due = query["due_at"].as_i64().expect("a due time");
        let stored = attempt.next_retry_time.expect("UNKNOWN is in the pending set");
        assert!(due >= stored && due >= next["as_of"].as_i64().unwrap(), "{next}");
        assert_eq!(next["due_at"], due);
        assert!(next["review"].is_null(), "{next}");
    }
}

dual_test! {
    async fn an_attempt_the_psp_reports_as_processing_awaits_its_webhook_then_a_query(&gw) {
        let m = gw.merchant("Acme").await;
        let p = unknown_payment(gw, &m, "tl-processing").await;
        let id = p["id"].as_str().unwrap();
        let reference = p["attempts"][0]["reference"].as_str().unwrap();
        let psp_id = gw.psp.payments_for(reference)[0].id.clone();
        let event = json!({
            "id": "evt_processing",
            "type": "payment.processing",
            "data": {"id": psp_id, "reference": reference, "amount": 700, "currency": "EUR", "status": "processing"}
        });
        gw.webhook(&m.account, &event).await.expect(200);
        gw.orch.process_inbox_once().await.unwrap();

        let next = next_of(gw, &m, id).await;
        let awaited = step(&next, "attempt");
        assert_eq!(awaited["state"], "PROCESSING", "{next}");
        assert_eq!(next["mover"], "webhook", "{next}");
        assert_eq!(awaited["action"], "await_webhook");
        assert_eq!(awaited["reference"], reference);
        assert!(awaited["due_at"].as_i64().is_some(), "the fallback query has a time: {next}");
    }
}

dual_test! {
    async fn a_push_fulfillment_is_moved_next_by_its_deadline_which_would_refund(&gw) {
        let m = gw.merchant("Acme").await;
        let deadline = SystemClock.now_ms() + 3_600_000;
        let p = confirmed(gw, &m, "tl-deadline", json!({
            "fulfillment": {"biz_key": "course-42", "deadline": deadline, "mode": "push"}
        })).await;
        assert_eq!(p["status"], "succeeded", "{p}");
        let id = p["id"].as_str().unwrap();
        let reference = p["attempts"][0]["reference"].as_str().unwrap();

        let next = next_of(gw, &m, id).await;
        assert_eq!(next["mover"], "deadline", "{next}");
        let fulfillment = step(&next, "fulfillment");
        assert_eq!(fulfillment["state"], "awaiting_fulfillment");
        assert_eq!(fulfillment["id"], "course-42");
        assert_eq!(fulfillment["reference"], reference);
        assert_eq!(fulfillment["deadline"]["at"], deadline);
        let then = fulfillment["deadline"]["then"].as_str().unwrap();
        assert!(then.contains(&format!("cmp_{reference}")), "{then}");
        assert_eq!(next["steps"].as_array().unwrap().len(), 1, "the sale itself is settled: {next}");
    }
}

dual_test! {
    async fn an_authorization_waits_for_the_merchant_and_holds_its_money_until_it_expires(&gw) {
        let m = gw.merchant("Acme").await;
        let p = confirmed(gw, &m, "tl-auth", json!({"capture_mode": "manual"})).await;
        assert_eq!(p["status"], "authorized", "{p}");
        let id = p["id"].as_str().unwrap();

        let next = next_of(gw, &m, id).await;
        assert_eq!(next["mover"], "merchant", "{next}");
        let attempt = step(&next, "attempt");
        assert_eq!(attempt["action"], "capture_or_void");
        let expires = attempt["deadline"]["at"].as_i64().expect("the authorization's expiry");
        assert_eq!(attempt["due_at"], expires);
        assert_eq!(next["money_held"]["authorized"], 700, "{next}");
        let hold = &next["money_held"]["holds"][0];
        assert_eq!(hold["kind"], "authorization");
        assert_eq!(hold["amount"], 700);
        assert_eq!(hold["aggregate_id"], p["attempts"][0]["id"]);
    }
}

dual_test! {
    async fn a_flagged_payment_with_a_proposal_waits_for_a_second_operator(&gw) {
        let m = gw.merchant("Acme").await;
        let p = unknown_payment(gw, &m, "tl-review").await;
        let id = p["id"].as_str().unwrap();
        let attempt_id = p["attempts"][0]["id"].as_str().unwrap();
        gw.store()
            .flag_manual_review(PendingKind::Attempt, attempt_id, "UNKNOWN for too long",
                &Provenance::actor("system:test"))
            .await
            .unwrap();

        let flagged = next_of(gw, &m, id).await;
        assert_eq!(flagged["mover"], "operator", "{flagged}");
        assert_eq!(flagged["review"]["reason"], "UNKNOWN for too long");
        assert!(flagged["review"]["pending_proposals"].as_array().unwrap().is_empty());
        assert!(flagged["review"]["awaiting"].as_str().unwrap().contains("proposes"), "{flagged}");
        assert_eq!(step(&flagged, "attempt")["mover"], "scanner", "queries go on: {flagged}");

        let alice = operator(gw, "alice").await;
        let proposal = as_operator(gw, &alice, &format!("/admin/review/payments/{id}/proposals"), Some(&json!({
            "outcome": "attempt_succeeded",
            "target_id": attempt_id,
            "reason_code": "psp_settlement_report",
            "evidence_note": "the PSP's settlement report lists the charge",
            "psp_reference": gw.psp.payments()[0].id,
        }))).await.expect(201).json();

        let next = next_of(gw, &m, id).await;
        assert_eq!(next["mover"], "operator", "{next}");
        let pending = &next["review"]["pending_proposals"][0];
        assert_eq!(pending["id"], proposal["id"]);
        assert_eq!(pending["outcome"], "attempt_succeeded");
        assert_eq!(pending["target_id"], attempt_id);
        assert_eq!(pending["evidence_note"], "the PSP's settlement report lists the charge");
        let awaiting = next["review"]["awaiting"].as_str().unwrap();
        assert!(awaiting.contains(proposal["id"].as_str().unwrap()), "{awaiting}");
        assert!(next["summary"].as_str().unwrap().starts_with("in manual review"), "{next}");
    }
}

dual_test! {
    async fn a_settled_payment_has_nothing_left_and_holds_no_money(&gw) {
        let m = gw.merchant("Acme").await;
        let p = confirmed(gw, &m, "tl-done", json!({})).await;
        assert_eq!(p["status"], "succeeded", "{p}");
        let next = next_of(gw, &m, p["id"].as_str().unwrap()).await;
        assert_eq!(next["mover"], "nothing", "{next}");
        assert!(next["steps"].as_array().unwrap().is_empty(), "{next}");
        assert!(next["due_at"].is_null());
        assert!(next["review"].is_null());
        assert_eq!(next["money_held"], json!({
            "authorized": 0, "capture_reserved": 0, "refund_reserved": 0, "holds": []
        }));
        assert!(next["summary"].as_str().unwrap().starts_with("nothing left"), "{next}");
    }
}

dual_test! {
    async fn the_history_is_paged_with_a_cursor_and_every_row_comes_exactly_once(&gw) {
        let m = gw.merchant("Acme").await;
        let p = confirmed(gw, &m, "tl-pages", json!({})).await;
        let id = p["id"].as_str().unwrap();
        let all = gw.get(&m.key, &format!("/v1/payments/{id}/timeline")).await.expect(200).json();
        let all_ids: Vec<i64> = all["data"].as_array().unwrap().iter().map(|e| e["id"].as_i64().unwrap()).collect();
        assert!(all_ids.len() >= 3, "{all}");
        assert_eq!(all["has_more"], false);
        assert!(all["next_cursor"].is_null());

        let mut seen = Vec::new();
        let mut path = format!("/v1/payments/{id}/timeline?limit=2");
        loop {
            let page = gw.get(&m.key, &path).await.expect(200).json();
            let rows = page["data"].as_array().unwrap();
            assert!(rows.len() <= 2, "{page}");
            seen.extend(rows.iter().map(|e| e["id"].as_i64().unwrap()));
            assert_eq!(page["next"]["mover"], "nothing", "every page explains the present: {page}");
            match page["next_cursor"].as_i64() {
                Some(cursor) => {
                    assert_eq!(page["has_more"], true);
                    path = format!("/v1/payments/{id}/timeline?limit=2&starting_after={cursor}");
                }
                None => break,
            }
        }
        assert_eq!(seen, all_ids);
    }
}

dual_test! {
    async fn a_bad_page_request_is_a_400_in_the_json_error_shape(&gw) {
        let m = gw.merchant("Acme").await;
        let p = confirmed(gw, &m, "tl-bad", json!({})).await;
        let id = p["id"].as_str().unwrap();
        for (query, code, param) in [
            ("limit=0", "parameter_invalid", "limit"),
            ("limit=501", "parameter_invalid", "limit"),
            ("starting_after=-1", "parameter_invalid", "starting_after"),
            ("starting_after=abc", "invalid_query", ""),
            ("page=2", "invalid_query", "page"),
        ] {
            let reply = gw.get(&m.key, &format!("/v1/payments/{id}/timeline?{query}")).await;
            let error = reply.expect_error(400, code);
            if !param.is_empty() {
                assert_eq!(error["param"], param, "{query}: {error}");
            }
        }
    }
}
