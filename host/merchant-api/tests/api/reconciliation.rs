//! `/admin/reconciliation/runs`: bad input is a 4xx in the one error shape
//! and changes nothing; a recorded run and its differences read back, paged
//! and filtered. (The run itself, end to end through the real adapters, is
//! the orchestrator's `reconciliation` test.)

use base64::Engine as _;
use serde_json::json;

use crate::common::*;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

dual_test! {
    async fn a_bad_upload_is_refused_in_the_one_error_shape_and_changes_nothing(&gw) {
        let merchant = gw.merchant("Acme").await;
        let runs = "/admin/reconciliation/runs";
        let body = |account: &str, start: i64, end: i64, report: &str| json!({
            "connector_account": account, "period_start": start, "period_end": end, "report_base64": report,
        });
        let before = gw.count("reconciliation_runs").await;
        gw.admin_post(runs, &body(&merchant.account, 0, 1000, "%%%")).await.expect_error(400, "parameter_invalid");
        gw.admin_post(runs, &body(&merchant.account, 1000, 1000, &b64(b"id,net\n"))).await.expect_error(400, "invalid_request");
        gw.admin_post(runs, &body("ca_nobody", 0, 1000, &b64(b"id,net\n"))).await.expect_error(404, "resource_missing");
        // The account's adapter reads no settlement reports: refused whole.
        let refused = gw.admin_post(runs, &body(&merchant.account, 0, 1000, &b64(b"id,net\n1,2\n"))).await;
        let error = refused.expect_error(400, "invalid_request");
        assert!(error["message"].as_str().unwrap().contains("could not read the report"), "{error:?}");
        gw.admin_post(runs, &json!({ "connector_account": merchant.account })).await.expect_error(400, "parameter_missing");
        assert_eq!(gw.count("reconciliation_runs").await, before);
        assert_eq!(gw.count("reconciliation_differences").await, 0);
        // Without the admin token nothing is answered.
        let anonymous = gw.send(gw.http.post(gw.url(runs)).json(&body(&merchant.account, 0, 1000, "AAAA"))).await;
        assert_eq!(anonymous.status, 401);
    }
}

dual_test! {
    async fn a_run_and_its_differences_read_back_paged_and_filtered(&gw) {
        let merchant = gw.merchant("Acme").await;
        let difference = |class: &str, n: i64| sluice_store::NewDifference {
            class: class.into(),
            attempt_reference: Some(format!("pay_{n}_a1")),
            action_reference: None,
            psp_reference: None,
            payment_id: None,
            amount_minor: 100 * n,
            currency: "EUR".into(),
            ours: serde_json::Value::Null,
            psp: json!([{ "line_id": format!("txn_{n}") }]),
            repair: None,
        };
        let new = sluice_store::NewReconciliationRun {
            connector_account_id: merchant.account.clone(),
            adapter: ADAPTER.into(),
            period_start: 0,
            period_end: 1000,
            report_digest: "sha256:00".into(),
            line_count: 3,
            matched_lines: 0,
            ignored_lines: 0,
            differences: vec![difference("missing_ours", 1), difference("duplicate", 2), difference("missing_ours", 3)],
        };
        let (run, _) = gw.store().record_reconciliation_run(&new).await.unwrap();
        let view = gw.admin_get(&format!("/admin/reconciliation/runs/{}", run.id)).await.expect(200).json();
        assert_eq!(view["object"], "reconciliation_run");
        assert_eq!(view["classes"]["missing_ours"], json!({ "count": 2, "amount_minor": 400 }));
        assert_eq!(view["status"], "repairing");

        let base = format!("/admin/reconciliation/runs/{}/differences", run.id);
        let page = gw.admin_get(&format!("{base}?class=missing_ours&limit=1")).await.expect(200).json();
        assert_eq!(page["data"].as_array().unwrap().len(), 1);
        assert_eq!(page["has_more"], true);
        let cursor = page["next_cursor"].as_i64().unwrap();
        let rest = gw.admin_get(&format!("{base}?class=missing_ours&limit=1&starting_after={cursor}")).await.expect(200).json();
        assert_eq!(rest["data"][0]["attempt_reference"], "pay_3_a1");
        assert_eq!(rest["has_more"], false);
        let repaired = gw.admin_get(&format!("{base}?resolved=true")).await.expect(200).json();
        assert_eq!(repaired["data"], json!([]));

        gw.admin_get(&format!("{base}?class=no_such_class")).await.expect_error(400, "parameter_invalid");
        gw.admin_get(&format!("{base}?limit=0")).await.expect_error(400, "parameter_invalid");
        gw.admin_get(&format!("{base}?bogus=1")).await.expect_error(400, "invalid_query");
        gw.admin_get("/admin/reconciliation/runs/rec_nope").await.expect_error(404, "resource_missing");
    }
}

dual_test! {
    async fn an_operator_closes_a_difference_in_review_once_and_it_stops_counting_as_unresolved(&gw) {
        let merchant = gw.merchant("Acme").await;
        let new = sluice_store::NewReconciliationRun {
            connector_account_id: merchant.account.clone(),
            adapter: ADAPTER.into(),
            period_start: 0,
            period_end: 1000,
            report_digest: "sha256:01".into(),
            line_count: 1,
            matched_lines: 0,
            ignored_lines: 0,
            differences: vec![sluice_store::NewDifference {
                class: "missing_ours".into(),
                attempt_reference: Some("pay_9_a1".into()),
                action_reference: None,
                psp_reference: None,
                payment_id: None,
                amount_minor: 900,
                currency: "EUR".into(),
                ours: serde_json::Value::Null,
                psp: json!([{ "line_id": "txn_9" }]),
                repair: None,
            }],
        };
        let (run, _) = gw.store().record_reconciliation_run(&new).await.unwrap();
        let base = format!("/admin/reconciliation/runs/{}/differences", run.id);
        let id = gw.admin_get(&base).await.expect(200).json()["data"][0]["id"].as_str().unwrap().to_owned();
        let close = format!("/admin/reconciliation/differences/{id}/close");
        let key = crate::review::operator(gw, "olga").await;
        let note = json!({ "note": "a test charge of the PSP's own; refunded at the PSP" });

        // Only a difference handed to review is closed.
        crate::review::as_operator(gw, &key, &close, Some(&note)).await.expect_error(409, "conflict");
        gw.store()
            .resolve_reconciliation_difference(&id, sluice_store::reconciliation::Resolution::InReview, "no payment of ours", None)
            .await
            .unwrap();
        assert_eq!(gw.store().unresolved_differences().await.unwrap().0.len(), 1);

        // Bad input and a missing operator key change nothing.
        crate::review::as_operator(gw, &key, &close, Some(&json!({ "note": "" }))).await.expect_error(400, "parameter_invalid");
        crate::review::as_operator(gw, &key, &close, Some(&json!({ "note": "x".repeat(1001) }))).await.expect_error(400, "parameter_invalid");
        gw.admin_post(&close, &note).await.expect_error(401, "operator_key_missing");
        crate::review::as_operator(gw, &key, "/admin/reconciliation/differences/rdf_nope/close", Some(&note)).await.expect_error(404, "resource_missing");

        let closed = crate::review::as_operator(gw, &key, &close, Some(&note)).await.expect(200).json();
        assert_eq!(closed["resolution"], "closed");
        assert_eq!(closed["resolution_detail"], "closed by operator:olga: a test charge of the PSP's own; refunded at the PSP");
        assert_eq!(gw.store().unresolved_differences().await.unwrap().0, vec![]);
        let resolved = gw.admin_get(&format!("{base}?resolved=true")).await.expect(200).json();
        assert_eq!(resolved["data"][0]["id"], id.as_str());
        crate::review::as_operator(gw, &key, &close, Some(&note)).await.expect_error(409, "conflict");
    }
}
