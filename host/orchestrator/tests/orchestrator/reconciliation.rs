//! Reconciliation end to end (issue 14's "done when"): payments and refunds
//! through the real adapters and the sandbox PSP, a settlement report from
//! the sandbox's ledger with injected discrepancies, a run that finds exactly
//! those, repairs the safe ones through the door with evidence
//! `reconciliation`, sends the rest to review, and changes nothing when run
//! again on the same report.

use std::collections::BTreeMap;

use crate::e2e_test;
use sluice_core::{AttemptState, CaptureMode, ClientStatus, RefundState};
use sluice_orchestrator::{OrchestratorError, ReconcileRequest};
use sluice_sandbox_psp::reports::{Discrepancies, ReportRequest, UnrecordedCharge};
use sluice_sandbox_psp::{Format, RefundBehaviour};
use sluice_store::{DifferenceFilter, Resolution, RunStatus};

/// Rows of history and outbox: what "changes nothing" is measured by.
async fn written(e2e: &crate::common::sandbox::E2e) -> (i64, i64) {
    use sqlx::Row;
    let pool = e2e.db.store.pool();
    let count = |sql: &'static str| async move {
        let row = sqlx::query(sql).fetch_one(pool).await.unwrap();
        row.try_get::<i64, _>(0).unwrap()
    };
    (
        count("SELECT COUNT(*) FROM state_history").await,
        count("SELECT COUNT(*) FROM outbox").await,
    )
}

e2e_test! {
    async fn a_report_with_injected_discrepancies_is_reconciled_exactly_once(e2e) {
        let start_ms = e2e.orch.now_ms() - 60_000;
        // Three sales the PSP and we agree on, two of which the report will garble.
        let agreed = e2e.create("rec-agreed", 1000, CaptureMode::Automatic, "pm_card_visa").await;
        let off_by_one = e2e.create("rec-off", 2000, CaptureMode::Automatic, "pm_card_visa").await;
        let doubled = e2e.create("rec-dup", 3000, CaptureMode::Automatic, "pm_card_visa").await;
        e2e.settle_webhooks().await;
        // From here the PSP's news reaches us only through the report.
        e2e.webhooks_off();
        let unknown = e2e.create("rec-unknown", 4000, CaptureMode::Automatic, "pm_sluice_commit_then_timeout").await;
        let unknown_attempt = unknown.details.attempts[0].clone();
        assert_eq!(unknown_attempt.state, AttemptState::Unknown);
        e2e.sandbox.set_refund_behaviour(RefundBehaviour::PendingThenSucceed);
        let agreed_id = agreed.details.order.id.clone();
        let refund = e2e.orch.refund(&e2e.merchant.id, &agreed_id, Some(crate::common::eur(400)), None).await.unwrap();
        assert_eq!(refund.refund.state, RefundState::Processing, "{:?}", refund.refund);

        let reference = |view: &sluice_orchestrator::PaymentView| view.details.attempts[0].reference.clone();
        let now_secs = e2e.orch.now_ms() / 1000;
        let report_request = ReportRequest {
            account: e2e.psp_account(),
            period_start: start_ms / 1000,
            period_end: now_secs + 60,
            discrepancies: Discrepancies {
                unrecorded_charge: Some(UnrecordedCharge { reference: "ghost_a1".into(), amount: 777, currency: "EUR".into() }),
                book_pending_refunds: vec![refund.refund.reference.clone()],
                amount_off_by_one: vec![reference(&off_by_one)],
                duplicate_charge: vec![reference(&doubled)],
            },
        };
        let format = match e2e.psp { crate::common::sandbox::Psp::Stripe => Format::Stripe, crate::common::sandbox::Psp::Adyen => Format::Adyen };
        let report = e2e.sandbox.settlement_report(format, &report_request);
        let request = ReconcileRequest {
            connector_account_id: e2e.account.id.clone(),
            period_start: start_ms,
            period_end: (now_secs + 60) * 1000,
            report: report.clone().into_bytes(),
            actor: "admin:test".into(),
        };
        let done = e2e.orch.reconcile(request.clone()).await.unwrap();
        assert!(done.created);
        let run = done.run;
        assert_eq!(run.status, RunStatus::Completed);

        let diffs = e2e.db.store.reconciliation_differences(&run.id, &DifferenceFilter { limit: 100, ..Default::default() }).await.unwrap();
        let found: BTreeMap<String, (String, Resolution)> = diffs
            .iter()
            .map(|d| (d.action_reference.clone().or(d.attempt_reference.clone()).unwrap_or_default(), (d.class.clone(), d.resolution)))
            .collect();
        let expected: BTreeMap<String, (String, Resolution)> = [
            (reference(&off_by_one), ("amount_mismatch", Resolution::InReview)),
            (reference(&doubled), ("duplicate", Resolution::InReview)),
            (unknown_attempt.reference.clone(), ("psp_succeeded_ours_pending", Resolution::Repaired)),
            (refund.refund.reference.clone(), ("psp_refunded_ours_pending", Resolution::Repaired)),
            ("ghost_a1".to_owned(), ("missing_ours", Resolution::InReview)),
        ]
        .into_iter()
        .map(|(k, (class, resolution))| (k, (class.to_owned(), resolution)))
        .collect();
        assert_eq!(found, expected, "report:\n{report}");
        assert_eq!((run.difference_count, run.repaired_count, run.review_count), (5, 2, 3));

        // The safe repairs went through the door, with the report line as evidence.
        let store = &e2e.db.store;
        assert_eq!(store.get_attempt(&unknown_attempt.id).await.unwrap().state, AttemptState::Succeeded);
        let timeline = store.timeline(&unknown.details.order.id).await.unwrap();
        let repaired = timeline.iter().find(|h| h.aggregate_id == unknown_attempt.id && h.to_state == "SUCCEEDED").unwrap();
        assert_eq!((repaired.evidence_source.as_str(), repaired.decision.as_str()), ("reconciliation", "applied"));
        assert!(repaired.provider_event_id.as_deref().is_some_and(|id| id.starts_with(&format!("settlement:{}:", run.report_digest))));
        let refund_row = store.get_refund(&refund.refund.id).await.unwrap();
        assert_eq!(refund_row.state, RefundState::Succeeded);
        let agreed_view = e2e.view(&agreed_id).await;
        assert_eq!(agreed_view.status, ClientStatus::PartiallyRefunded);
        assert_eq!(agreed_view.details.amounts.refunded_minor, 400);
        assert!(!agreed_view.details.order.manual_review);

        // The rest went to the two-person review, with their evidence.
        for view in [&off_by_one, &doubled] {
            let order = store.get_payment(None, &view.details.order.id).await.unwrap();
            assert!(order.manual_review, "{order:?}");
            let details = e2e.view(&order.id).await.details;
            let facts = (details.attempts[0].state, details.amounts.captured_minor);
            assert_eq!(facts, (AttemptState::Succeeded, order.amount.amount_minor), "a recorded fact is never overwritten");
        }
        let mismatch = diffs.iter().find(|d| d.class == "amount_mismatch").unwrap();
        assert_eq!(mismatch.ours["amount_minor"], 2000);
        assert_eq!(mismatch.psp[0]["gross_minor"], 2001);
        assert!(mismatch.history_id.is_some());
        assert!(!mismatch.ours.to_string().contains("pm_card"), "no card data in the evidence");

        // The same report again: the recorded run, and nothing written.
        let before = written(&e2e).await;
        let again = e2e.orch.reconcile(request.clone()).await.unwrap();
        assert!(!again.created);
        assert_eq!(again.run.id, run.id);
        assert_eq!(written(&e2e).await, before);

        // A garbled report is refused whole and changes nothing.
        let bad = ReconcileRequest { report: b"not,a,report\n1,2,3\n".to_vec(), ..request };
        let refused = e2e.orch.reconcile(bad).await;
        assert!(matches!(refused, Err(OrchestratorError::InvalidRequest(_))), "{refused:?}");
        assert_eq!(written(&e2e).await, before);
    }
}
