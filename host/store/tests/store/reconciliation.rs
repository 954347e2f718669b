//! Reconciliation runs: one per account, period and report digest; their
//! differences with both sides' evidence; outcomes recorded once.

use crate::common::*;
use sluice_core::{EventKind, EvidenceSource};
use sluice_store::{
    DifferenceFilter, NewDifference, NewReconciliationRun, Resolution, RunStatus, StoreError,
};

fn difference(class: &str, reference: &str, amount: i64) -> NewDifference {
    NewDifference {
        class: class.to_owned(),
        attempt_reference: Some(reference.to_owned()),
        action_reference: None,
        psp_reference: Some(format!("pi_{reference}")),
        payment_id: None,
        amount_minor: amount,
        currency: "EUR".to_owned(),
        ours: serde_json::json!({ "state": "UNKNOWN" }),
        psp: serde_json::json!([{ "line_id": format!("txn_{reference}") }]),
        repair: None,
    }
}

fn new_run(account: &str, digest: &str, differences: Vec<NewDifference>) -> NewReconciliationRun {
    NewReconciliationRun {
        connector_account_id: account.to_owned(),
        adapter: "fixture".to_owned(),
        period_start: 1_000,
        period_end: 2_000,
        report_digest: digest.to_owned(),
        line_count: 7,
        matched_lines: 4,
        ignored_lines: 1,
        differences,
    }
}

dual_test! {
    async fn the_same_report_for_the_same_account_and_period_finds_the_recorded_run_and_writes_nothing(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let diffs = vec![difference("amount_mismatch", "a1", 100), difference("missing_ours", "a2", 250), difference("amount_mismatch", "a3", 5)];
        let (first, created) = store.record_reconciliation_run(&new_run(&fx.account.id, "sha256:aa", diffs.clone())).await.unwrap();
        assert!(created);
        assert_eq!(first.status, RunStatus::Repairing);
        assert_eq!(first.difference_count, 3);
        assert_eq!(first.class_totals["amount_mismatch"], serde_json::json!({ "count": 2, "amount_minor": 105 }));
        assert_eq!(first.class_totals["missing_ours"], serde_json::json!({ "count": 1, "amount_minor": 250 }));

        let (again, created) = store.record_reconciliation_run(&new_run(&fx.account.id, "sha256:aa", vec![])).await.unwrap();
        assert!(!created);
        assert_eq!(again, first);
        assert_eq!(count(store, "SELECT COUNT(*) FROM reconciliation_differences WHERE run_id = $1", &first.id).await, 3);

        let (other, created) = store.record_reconciliation_run(&new_run(&fx.account.id, "sha256:bb", diffs)).await.unwrap();
        assert!(created, "another report is another run");
        assert_ne!(other.id, first.id);
    }
}

dual_test! {
    async fn differences_are_listed_in_order_by_class_and_resolution_one_bounded_page_at_a_time(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let diffs = (0..5).map(|n| difference(if n % 2 == 0 { "duplicate" } else { "missing_psp" }, &format!("a{n}"), n)).collect();
        let (run, _) = store.record_reconciliation_run(&new_run(&fx.account.id, "sha256:cc", diffs)).await.unwrap();
        let all = store.reconciliation_differences(&run.id, &DifferenceFilter { limit: 100, ..Default::default() }).await.unwrap();
        assert_eq!(all.iter().map(|d| d.seq).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert_eq!(all[0].psp, serde_json::json!([{ "line_id": "txn_a0" }]));
        let page = store.reconciliation_differences(&run.id, &DifferenceFilter { class: Some("duplicate".into()), after_seq: Some(0), limit: 1, ..Default::default() }).await.unwrap();
        assert_eq!(page.iter().map(|d| d.seq).collect::<Vec<_>>(), vec![2]);

        assert!(store.resolve_reconciliation_difference(&all[1].id, Resolution::Repaired, "applied", Some(42)).await.unwrap());
        assert!(!store.resolve_reconciliation_difference(&all[1].id, Resolution::InReview, "again", None).await.unwrap(), "an outcome is recorded once");
        let repaired = store.reconciliation_differences(&run.id, &DifferenceFilter { resolved: Some(true), limit: 100, ..Default::default() }).await.unwrap();
        assert_eq!(repaired.len(), 1);
        assert_eq!((repaired[0].resolution, repaired[0].history_id), (Resolution::Repaired, Some(42)));
        let open = store.reconciliation_differences(&run.id, &DifferenceFilter { resolved: Some(false), limit: 100, ..Default::default() }).await.unwrap();
        assert_eq!(open.len(), 4);

        store.resolve_reconciliation_difference(&all[0].id, Resolution::InReview, "flagged", None).await.unwrap();
        let done = store.complete_reconciliation_run(&run.id).await.unwrap().unwrap();
        assert_eq!((done.status, done.repaired_count, done.review_count), (RunStatus::Completed, 1, 1));

        let (classes, oldest) = store.unresolved_differences().await.unwrap();
        let counts: Vec<(String, i64, i64)> = classes.into_iter().map(|c| (c.class, c.count, c.amount_minor)).collect();
        assert_eq!(counts, vec![("duplicate".to_owned(), 3, 6), ("missing_psp".to_owned(), 1, 3)]);
        assert!(oldest.is_some());
    }
}

dual_test! {
    async fn a_run_with_an_empty_period_is_refused(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let mut bad = new_run(&fx.account.id, "sha256:dd", vec![]);
        bad.period_end = bad.period_start;
        let refused = store.record_reconciliation_run(&bad).await;
        assert!(matches!(refused, Err(StoreError::InvalidRequest(_))), "{refused:?}");
    }
}

dual_test! {
    async fn our_side_of_a_period_is_the_accounts_payments_with_an_attempt_created_in_it(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let other = Fixture::new(store, "Other").await;
        let start = store.now_ms();
        let (mine, attempt) = fx.succeeded(store, "o1", 1000).await;
        other.succeeded(store, "o2", 1000).await;
        let ids = store.reconciliation_payment_ids(&fx.account.id, start, start + 1, 10).await.unwrap();
        assert_eq!(ids, vec![mine.id.clone()]);
        assert!(store.reconciliation_payment_ids(&fx.account.id, start + 1, start + 2, 10).await.unwrap().is_empty());

        assert!(store.chargebacked_attempts(&mine.id).await.unwrap().is_empty());
        store.apply_event(&on_attempt(&attempt, event(EventKind::Chargeback, EvidenceSource::Webhook))).await.unwrap();
        assert_eq!(store.chargebacked_attempts(&mine.id).await.unwrap(), vec![attempt.id.clone()]);
    }
}

dual_test! {
    async fn a_reconciliation_review_flags_the_payment_even_when_the_attempt_is_terminal_once(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let (payment, attempt) = fx.succeeded(store, "o1", 1000).await;
        let first = store.flag_reconciliation_review(sluice_store::PendingKind::Attempt, &attempt.id, "reconciliation: amount_mismatch", &sys()).await.unwrap();
        assert_eq!(first.decision, sluice_store::DecisionKind::NeedsReconciliation);
        assert_eq!(first.history_ids.len(), 1);
        let details = store.payment_details(None, &payment.id).await.unwrap();
        assert!(details.order.manual_review);
        assert_eq!(details.attempts[0].state, sluice_core::AttemptState::Succeeded, "no state moves");
        let again = store.flag_reconciliation_review(sluice_store::PendingKind::Attempt, &attempt.id, "again", &sys()).await.unwrap();
        assert_eq!(again.decision, sluice_store::DecisionKind::IgnoredDuplicate);
        assert!(again.history_ids.is_empty());
        assert_eq!(count(store, "SELECT COUNT(*) FROM state_history WHERE payment_id = $1 AND event_kind = 'COMMAND_RECONCILIATION_REVIEW'", &payment.id).await, 1);
    }
}
