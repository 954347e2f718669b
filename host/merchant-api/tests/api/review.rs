//! Operator review over real HTTP (seed 001 §10): a second, different
//! operator approves; approval goes through the one door; history names both.

use std::time::Duration;

use crate::common::{payment_body, Gateway, Mode, PspRoute, Reply, TestMerchant, ADMIN_TOKEN};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::{json, Value};

const OPERATOR_HEADER: &str = "Sluice-Operator-Key";

pub(crate) async fn operator(gw: &Gateway, name: &str) -> String {
    let issued = gw
        .admin_post("/admin/operators", &json!({"name": name}))
        .await
        .expect(201)
        .json();
    assert_eq!(issued["name"], name);
    issued["key"].as_str().expect("key shown once").to_owned()
}

pub(crate) async fn as_operator(
    gw: &Gateway,
    key: &str,
    path: &str,
    body: Option<&Value>,
) -> Reply {
    let request = match body {
        Some(body) => gw
            .http
            .post(gw.url(path))
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string()),
        None => gw.http.get(gw.url(path)),
    };
    gw.send(
        request
            .header(AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"))
            .header(OPERATOR_HEADER, key),
    )
    .await
}

/// A payment whose sale the PSP committed while the host timed out: UNKNOWN.
async fn unknown_payment(gw: &Gateway, m: &TestMerchant, order_no: &str) -> (String, String) {
    gw.psp.set_mode(
        PspRoute::Payments,
        Mode::TimeoutAfterCommit(Duration::from_secs(3)),
    );
    let mut body = payment_body(order_no, 700);
    body["connector_account"] = json!(m.account);
    body["confirm"] = json!(true);
    let p = gw
        .post(&m.key, "/v1/payments", &body)
        .await
        .expect(201)
        .json();
    gw.psp.set_mode(PspRoute::Payments, Mode::Succeed);
    assert_eq!(p["attempts"][0]["state"], "UNKNOWN", "{p}");
    (
        p["id"].as_str().unwrap().to_owned(),
        p["attempts"][0]["id"].as_str().unwrap().to_owned(),
    )
}

fn proposal_body(outcome: &str, target: &str) -> Value {
    json!({
        "outcome": outcome,
        "target_id": target,
        "reason_code": "psp_settlement_report",
        "evidence_note": "the PSP's settlement report lists the charge"
    })
}

dual_test! {
    async fn a_second_operator_approves_over_http_the_event_goes_through_the_door_and_history_names_both(&gw) {
        let m = gw.merchant("Acme").await;
        let (payment_id, attempt_id) = unknown_payment(gw, &m, "rev-1").await;
        let alice = operator(gw, "alice").await;
        let bob = operator(gw, "bob").await;
        assert!(alice.starts_with("op_sluice_"));

        // The admin token alone is not an operator.
        gw.admin_get("/admin/review/payments").await.expect_error(401, "operator_key_missing");
        as_operator(gw, "op_sluice_forged", "/admin/review/payments", None)
            .await
            .expect_error(401, "operator_key_invalid");

        let queue = as_operator(gw, &alice, "/admin/review/payments?unknown_older_than_ms=0", None)
            .await
            .expect(200)
            .json();
        let item = queue["data"].as_array().unwrap().iter()
            .find(|i| i["payment"]["id"] == payment_id.as_str())
            .expect("the UNKNOWN payment is listed");
        assert_eq!(item["payment"]["attempts"][0]["state"], "UNKNOWN");
        assert!(item["timeline"].as_array().unwrap().iter().any(|e| e["to_state"] == "UNKNOWN"), "{item}");

        let mut success = proposal_body("attempt_succeeded", &attempt_id);
        success["psp_reference"] = json!(gw.psp.payments()[0].id);
        let proposal = as_operator(gw, &alice, &format!("/admin/review/payments/{payment_id}/proposals"),
            Some(&success))
            .await
            .expect(201)
            .json();
        assert_eq!(proposal["status"], "proposed");
        let approve = format!("/admin/review/proposals/{}/approve", proposal["id"].as_str().unwrap());

        // The proposer cannot approve, whatever name they type.
        as_operator(gw, &alice, &approve, Some(&json!({"note": "I am bob"})))
            .await
            .expect_error(403, "same_operator");
        let still = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.expect(200).json();
        assert_eq!(still["attempts"][0]["state"], "UNKNOWN", "nothing applied");

        let applied = as_operator(gw, &bob, &approve, Some(&json!({"note": "checked the report"})))
            .await
            .expect(200)
            .json();
        assert_eq!(applied["status"], "applied", "{applied}");
        assert_eq!(applied["result"]["decision"], "applied", "{applied}");
        let after = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.expect(200).json();
        assert_eq!(after["status"], "succeeded", "{after}");
        assert_eq!(after["attempts"][0]["state"], "SUCCEEDED");
        assert_eq!(gw.psp.payments().len(), 1, "no new charge: the operator records, never charges");

        let timeline = gw.get(&m.key, &format!("/v1/payments/{payment_id}/timeline")).await.expect(200).json();
        let entry = timeline["data"].as_array().unwrap().iter()
            .find(|e| e["aggregate_type"] == "attempt" && e["to_state"] == "SUCCEEDED")
            .expect("the operator event is in the timeline");
        assert_eq!(entry["source"], "operator");
        assert_eq!(entry["actor"], "operator:alice+operator:bob");

        // Approving again is idempotent for the approver.
        let again = as_operator(gw, &bob, &approve, Some(&json!({}))).await.expect(200).json();
        assert_eq!(again, applied);
        let item = as_operator(gw, &bob, &format!("/admin/review/payments/{payment_id}"), None)
            .await
            .expect(200)
            .json();
        assert_eq!(item["proposals"][0]["status"], "applied");
    }
}

dual_test! {
    async fn a_stale_proposal_and_bad_input_are_refused_with_json_errors_and_change_nothing(&gw) {
        let m = gw.merchant("Acme").await;
        let (payment_id, attempt_id) = unknown_payment(gw, &m, "rev-2").await;
        // Another merchant's open attempt: a proposal on this payment may not resolve it.
        let other = gw.merchant("Other").await;
        let (_, other_attempt) = unknown_payment(gw, &other, "rev-2-other").await;
        let alice = operator(gw, "alice").await;
        let bob = operator(gw, "bob").await;
        let proposals = format!("/admin/review/payments/{payment_id}/proposals");

        for (body, status, code) in [
            (proposal_body("teleport", &attempt_id), 400, "parameter_invalid"),
            (json!({"outcome": "attempt_failed", "reason_code": "x", "evidence_note": "y"}), 400, "parameter_invalid"),
            (json!({"outcome": "attempt_failed", "target_id": attempt_id, "reason_code": "", "evidence_note": "y"}), 400, "string_invalid"),
            (json!({"outcome": "attempt_failed", "target_id": attempt_id, "reason_code": "x", "evidence_note": "y", "force": true}), 400, "unknown_parameter"),
            (proposal_body("refund_failed", &attempt_id), 404, "resource_missing"),
            (proposal_body("attempt_failed", &other_attempt), 404, "resource_missing"),
        ] {
            let reply = as_operator(gw, &alice, &proposals, Some(&body)).await;
            let error = reply.expect_error(status, code);
            assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
        as_operator(gw, &alice, "/admin/review/payments/pay_missing/proposals", Some(&proposal_body("attempt_failed", &attempt_id)))
            .await
            .expect_error(404, "resource_missing");
        as_operator(gw, &bob, "/admin/review/proposals/rvp_missing/approve", Some(&json!({})))
            .await
            .expect_error(404, "resource_missing");
        gw.admin_post("/admin/operators", &json!({"name": "alice"})).await.expect_error(409, "conflict");
        assert_eq!(gw.count("review_proposals").await, 0, "bad input changes nothing");

        let proposal = as_operator(gw, &alice, &proposals, Some(&proposal_body("attempt_failed", &attempt_id)))
            .await
            .expect(201)
            .json();
        // Meanwhile a query finds the charge the PSP committed.
        gw.orch
            .advance(sluice_orchestrator::Target::Attempt(attempt_id.clone()), sluice_orchestrator::Trigger::Operator)
            .await
            .unwrap();
        let before = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.expect(200).json();
        assert_eq!(before["attempts"][0]["state"], "SUCCEEDED");
        let timeline = gw.get(&m.key, &format!("/v1/payments/{payment_id}/timeline")).await.json();

        let stale = as_operator(gw, &bob, &format!("/admin/review/proposals/{}/approve", proposal["id"].as_str().unwrap()), Some(&json!({})))
            .await;
        let error = stale.expect_error(409, "proposal_stale");
        assert!(error["message"].as_str().unwrap().contains("moved since the proposal"), "{error}");
        let after = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.json();
        assert_eq!(after, before, "a stale approval changes nothing");
        // The history is untouched; `next` differs only because the proposal
        // is no longer waiting for anyone.
        let timeline_after = gw.get(&m.key, &format!("/v1/payments/{payment_id}/timeline")).await.json();
        assert_eq!(timeline_after["data"], timeline["data"]);
        assert!(timeline_after["next"]["review"].is_null(), "{timeline_after}");
        let item = as_operator(gw, &bob, &format!("/admin/review/payments/{payment_id}"), None).await.json();
        assert_eq!(item["proposals"][0]["status"], "stale");
    }
}

dual_test! {
    async fn a_manual_refund_needs_a_second_operator_and_goes_through_the_normal_reservation(&gw) {
        let m = gw.merchant("Acme").await;
        let mut body = payment_body("rev-3", 1000);
        body["connector_account"] = json!(m.account);
        body["confirm"] = json!(true);
        let p = gw.post(&m.key, "/v1/payments", &body).await.expect(201).json();
        assert_eq!(p["status"], "succeeded", "{p}");
        let payment_id = p["id"].as_str().unwrap().to_owned();
        let alice = operator(gw, "alice").await;
        let bob = operator(gw, "bob").await;
        let carol = operator(gw, "carol").await;
        let proposals = format!("/admin/review/payments/{payment_id}/proposals");
        let refund = |amount: i64| json!({
            "outcome": "manual_refund", "amount": amount,
            "reason_code": "goodwill", "evidence_note": "ticket 4711, approved by support lead"
        });
        as_operator(gw, &alice, &proposals, Some(&json!({"outcome": "manual_refund", "reason_code": "x", "evidence_note": "y"})))
            .await
            .expect_error(400, "proposal_invalid");

        // Rejected by a second operator: nothing happens.
        let turned_down = as_operator(gw, &alice, &proposals, Some(&refund(400))).await.expect(201).json();
        let reject = format!("/admin/review/proposals/{}/reject", turned_down["id"].as_str().unwrap());
        as_operator(gw, &alice, &reject, Some(&json!({"note": "mine"}))).await.expect_error(403, "same_operator");
        let rejected = as_operator(gw, &carol, &reject, Some(&json!({"note": "no ticket found"}))).await.expect(200).json();
        assert_eq!(rejected["status"], "rejected");
        as_operator(gw, &bob, &format!("/admin/review/proposals/{}/approve", turned_down["id"].as_str().unwrap()), Some(&json!({})))
            .await
            .expect_error(409, "proposal_already_decided");
        assert!(gw.psp.refunds().is_empty(), "a rejected proposal refunds nothing");

        // More than was captured: refused by the reservation, nothing changes.
        let too_much = as_operator(gw, &alice, &proposals, Some(&refund(5000))).await.expect(201).json();
        as_operator(gw, &bob, &format!("/admin/review/proposals/{}/approve", too_much["id"].as_str().unwrap()), Some(&json!({})))
            .await
            .expect_error(409, "resolution_refused");
        assert_eq!(gw.count("refunds").await, 0);

        let proposal = as_operator(gw, &alice, &proposals, Some(&refund(300))).await.expect(201).json();
        assert_eq!(proposal["amount"], 300);
        let approve = format!("/admin/review/proposals/{}/approve", proposal["id"].as_str().unwrap());
        as_operator(gw, &alice, &approve, Some(&json!({}))).await.expect_error(403, "same_operator");
        assert_eq!(gw.count("refunds").await, 0, "one person cannot refund");
        let applied = as_operator(gw, &bob, &approve, Some(&json!({}))).await.expect(200).json();
        assert_eq!(applied["status"], "applied", "{applied}");
        let refund_id = applied["result"]["refund_id"].as_str().expect("the refund it reserved").to_owned();
        let refunded = gw.get(&m.key, &format!("/v1/refunds/{refund_id}")).await.expect(200).json();
        assert_eq!(refunded["status"], "succeeded", "{refunded}");
        assert_eq!(refunded["amount"], 300);
        assert_eq!(gw.psp.refunds().len(), 1);
        // Idempotent: approving again sends nothing more.
        as_operator(gw, &bob, &approve, Some(&json!({}))).await.expect(200);
        assert_eq!(gw.psp.refunds().len(), 1, "exactly one refund at the PSP");
        let timeline = gw.get(&m.key, &format!("/v1/payments/{payment_id}/timeline")).await.json();
        let created = timeline["data"].as_array().unwrap().iter()
            .find(|e| e["aggregate_type"] == "refund" && e["event_kind"] == "COMMAND_REFUND")
            .expect("the reservation is in the timeline");
        assert_eq!(created["actor"], "operator:alice+operator:bob");
    }
}

dual_test! {
    async fn the_review_queue_lists_flagged_payments_and_old_unknowns_but_not_settled_ones(&gw) {
        let m = gw.merchant("Acme").await;
        let (flagged_id, attempt_id) = unknown_payment(gw, &m, "rev-q1").await;
        let (young_id, _) = unknown_payment(gw, &m, "rev-q2").await;
        let mut body = payment_body("rev-q3", 500);
        body["connector_account"] = json!(m.account);
        body["confirm"] = json!(true);
        let settled = gw.post(&m.key, "/v1/payments", &body).await.expect(201).json();
        assert_eq!(settled["status"], "succeeded");
        gw.store()
            .flag_manual_review(
                sluice_store::PendingKind::Attempt,
                &attempt_id,
                "UNKNOWN past its age",
                &sluice_store::Provenance::actor("system:scanner"),
            )
            .await
            .unwrap();
        let alice = operator(gw, "alice").await;
        let ids = |queue: &Value| -> Vec<String> {
            queue["data"].as_array().unwrap().iter()
                .map(|i| i["payment"]["id"].as_str().unwrap().to_owned()).collect()
        };
        // Default age (15 min): only the flagged payment.
        let queue = as_operator(gw, &alice, "/admin/review/payments", None).await.expect(200).json();
        assert_eq!(ids(&queue), vec![flagged_id.clone()]);
        let item = &queue["data"][0];
        assert_eq!(item["payment"]["manual_review"], true, "{item}");
        assert!(item["timeline"].as_array().unwrap().iter()
            .any(|e| e["event_kind"] == "COMMAND_ESCALATE_MANUAL_REVIEW" && e["actor"] == "system:scanner"), "{item}");
        // Any UNKNOWN older than 0 ms: both, never the settled one.
        let all = as_operator(gw, &alice, "/admin/review/payments?unknown_older_than_ms=0", None).await.expect(200).json();
        let mut listed = ids(&all);
        listed.sort();
        let mut expected = vec![flagged_id, young_id];
        expected.sort();
        assert_eq!(listed, expected);
        as_operator(gw, &alice, "/admin/review/payments?limit=0", None).await.expect_error(400, "parameter_invalid");
        as_operator(gw, &alice, "/admin/review/payments?unknown_older_than_ms=-1", None).await.expect_error(400, "parameter_invalid");
        as_operator(gw, &alice, "/admin/review/payments?colour=red", None).await.expect_error(400, "invalid_query");
    }
}

dual_test! {
    async fn a_disabled_operator_can_neither_propose_nor_approve_and_is_listed_as_disabled(&gw) {
        let m = gw.merchant("Acme").await;
        let (payment_id, attempt_id) = unknown_payment(gw, &m, "rev-disabled").await;
        let alice = operator(gw, "alice").await;
        let bob = operator(gw, "bob").await;
        let proposal = as_operator(gw, &alice, &format!("/admin/review/payments/{payment_id}/proposals"),
            Some(&json!({"outcome": "attempt_succeeded", "target_id": attempt_id,
                "reason_code": "psp_statement", "evidence_note": "the PSP statement lists it",
                "psp_reference": gw.psp.payments()[0].id})))
            .await
            .expect(201)
            .json();

        let listed = gw.admin_get("/admin/operators").await.expect(200).json();
        let bob_id = listed["data"].as_array().unwrap().iter()
            .find(|o| o["name"] == "bob")
            .expect("bob is listed")["id"].as_str().unwrap().to_owned();
        let text = listed.to_string();
        assert!(!text.contains(&alice) && !text.contains(&bob), "never a whole key: {listed}");
        let disabled = gw.admin_post(&format!("/admin/operators/{bob_id}/disable"), &json!({}))
            .await
            .expect(200)
            .json();
        assert!(disabled["disabled_at"].is_i64(), "{disabled}");
        let again = gw.admin_post(&format!("/admin/operators/{bob_id}/disable"), &json!({}))
            .await
            .expect(200)
            .json();
        assert_eq!(again["disabled_at"], disabled["disabled_at"], "disabling twice keeps the first time");
        gw.admin_post("/admin/operators/opr_nobody/disable", &json!({}))
            .await
            .expect_error(404, "resource_missing");

        let approve = format!("/admin/review/proposals/{}/approve", proposal["id"].as_str().unwrap());
        as_operator(gw, &bob, &approve, Some(&json!({"note": "still me"})))
            .await
            .expect_error(401, "operator_key_invalid");
        let attempt = gw.store().get_attempt(&attempt_id).await.unwrap();
        assert_eq!(attempt.state, sluice_core::AttemptState::Unknown, "nothing moved");
    }
}

dual_test! {
    /// Issue 11 §3: an operator's success carries the PSP reference as
    /// evidence, so the payment can be refunded afterwards.
    async fn an_operator_success_needs_the_psp_reference_stores_it_and_a_later_refund_is_sent_against_it(&gw) {
        let m = gw.merchant("Acme").await;
        let (payment_id, attempt_id) = unknown_payment(gw, &m, "rev-psp").await;
        let alice = operator(gw, "alice").await;
        let bob = operator(gw, "bob").await;
        let path = format!("/admin/review/payments/{payment_id}/proposals");
        let mut success = proposal_body("attempt_succeeded", &attempt_id);
        let missing = as_operator(gw, &alice, &path, Some(&success)).await;
        let error = missing.expect_error(400, "parameter_missing");
        assert_eq!(error["param"], "psp_reference", "{error}");
        let mut failed = proposal_body("attempt_failed", &attempt_id);
        failed["psp_reference"] = json!("pi_whatever");
        as_operator(gw, &alice, &path, Some(&failed)).await.expect_error(400, "parameter_invalid");
        assert!(gw.store().proposals_for_payment(&payment_id).await.unwrap().is_empty(), "nothing recorded");

        let psp_payment = gw.psp.payments()[0].id.clone();
        success["psp_reference"] = json!(psp_payment);
        let proposal = as_operator(gw, &alice, &path, Some(&success)).await.expect(201).json();
        assert_eq!(proposal["psp_reference"], psp_payment.as_str());
        let approve = format!("/admin/review/proposals/{}/approve", proposal["id"].as_str().unwrap());
        as_operator(gw, &bob, &approve, Some(&json!({}))).await.expect(200);
        let paid = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.expect(200).json();
        assert_eq!(paid["attempts"][0]["state"], "SUCCEEDED", "{paid}");
        assert_eq!(paid["attempts"][0]["psp_reference"], psp_payment.as_str(), "{paid}");

        let refund = gw.post(&m.key, &format!("/v1/payments/{payment_id}/refunds"), &json!({"amount": 300}))
            .await
            .expect(200)
            .json();
        assert_eq!(refund["state"], "SUCCEEDED", "{refund}");
        let at_psp = gw.psp.refunds();
        assert_eq!(at_psp.len(), 1);
        assert_eq!((at_psp[0].payment.as_str(), at_psp[0].amount), (psp_payment.as_str(), 300));
    }
}

dual_test! {
    /// A success resolved before the evidence was required carries no PSP
    /// reference: a refund of it waits in manual review with the reason,
    /// reserved, instead of being cancelled without a word.
    async fn a_refund_of_a_success_without_a_psp_reference_waits_in_manual_review_instead_of_a_silent_cancel(&gw) {
        use sluice_core::{EventKind, EvidenceSource, PaymentEvent};
        let m = gw.merchant("Acme").await;
        let (payment_id, attempt_id) = unknown_payment(gw, &m, "rev-noref").await;
        let attempt = gw.store().get_attempt(&attempt_id).await.unwrap();
        let operator_success = sluice_store::ApplyEvent {
            target: sluice_store::EventTarget::Attempt(attempt.reference.clone()),
            event: PaymentEvent {
                attempt_reference: Some(attempt.reference.clone()),
                provider_event_id: Some("review:legacy".into()),
                ..PaymentEvent::new(EventKind::PaymentSucceeded, EvidenceSource::Operator)
            },
            provenance: sluice_store::Provenance::actor("operator:alice+operator:bob"),
            inbox_id: None,
            next_retry_time: None,
        };
        gw.store().apply_event(&operator_success).await.unwrap();
        let attempt = gw.store().get_attempt(&attempt_id).await.unwrap();
        assert_eq!((attempt.state, attempt.psp_reference), (sluice_core::AttemptState::Succeeded, None));

        let refund = gw.post(&m.key, &format!("/v1/payments/{payment_id}/refunds"), &json!({"amount": 300}))
            .await
            .expect(200)
            .json();
        assert_eq!((refund["state"].as_str(), refund["status"].as_str()), (Some("CREATED"), Some("pending")), "{refund}");
        let refund_id = refund["id"].as_str().unwrap().to_owned();
        // The scanner comes back to it: still waiting, flagged once.
        for _ in 0..2 {
            gw.orch.advance(sluice_orchestrator::Target::Refund(refund_id.clone()), sluice_orchestrator::Trigger::Scanner)
                .await
                .unwrap();
        }
        let payment = gw.get(&m.key, &format!("/v1/payments/{payment_id}")).await.expect(200).json();
        assert_eq!(payment["manual_review"], true, "{payment}");
        let reason = payment["manual_review_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("no PSP payment reference") && reason.contains(&refund_id), "{reason}");
        assert_eq!(payment["refunds"][0]["state"], "CREATED", "never cancelled: {payment}");
        assert_eq!(payment["amounts"]["refund_reserved"], 300, "{payment}");
        assert!(gw.psp.refunds().is_empty(), "nothing sent");
        let escalations = gw.store().timeline(&payment_id).await.unwrap().into_iter()
            .filter(|e| e.event_kind == sluice_store::ESCALATE_KIND)
            .count();
        assert_eq!(escalations, 1, "recorded once");
    }
}
