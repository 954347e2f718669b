//! Adapter releases on the payment path: a shadow version that disagrees is reported
//! and never changes state; a canary that answers UNKNOWN is rolled back by itself
//! while the attempts it started converge on it.

use std::time::Duration;

use crate::common::*;
use sluice_adapter_runtime::{CanaryPolicy, Rollout};
use sluice_core::{AttemptState, CaptureMode, ClientStatus};
use sluice_orchestrator::{Target, Trigger};
use sluice_test_support::adapters::well_behaved_variant_bytes;

/// Sets the account's `test_variant` (read only by the variant build) and loads the
/// variant as a second, inactive version; its digest.
async fn load_variant(h: &Harness, mode: &str) -> String {
    let config = serde_json::json!({ "base_url": h.psp.base_url(), "test_variant": mode });
    h.store()
        .update_connector_account(&h.account.id, Some(&config), None, None)
        .await
        .unwrap();
    let runtime = h.orch.runtime().clone();
    let info = tokio::task::spawn_blocking(move || {
        runtime.load(ADAPTER, &well_behaved_variant_bytes(), None, false)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(info.version, "1.0.1-variant");
    info.digest
}

fn active_digest(h: &Harness) -> String {
    h.orch
        .runtime()
        .active(ADAPTER)
        .unwrap()
        .identity()
        .digest
        .clone()
}

dual_test! {
    async fn a_shadow_version_that_disagrees_on_one_field_is_reported_with_that_diff_and_never_changes_state(db) {
        let h = Harness::new(db).await;
        let shadow = load_variant(&h, "skewed").await;
        let active = active_digest(&h);
        h.orch.runtime().stage_shadow(ADAPTER, &shadow).unwrap();

        let view = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-shadow", 1000, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        // The serving version's reading is what counts: 1000, not the shadow's 1001.
        assert_eq!(view.status, ClientStatus::Succeeded);
        assert_eq!(view.details.amounts.captured_minor, 1000);
        assert_eq!(h.psp.requests("create_payment"), 1, "the shadow's request is never sent");

        let tallies = eventually(Duration::from_secs(10), "both shadow comparisons", || {
            let tallies = h.orch.shadow_tallies(ADAPTER, &shadow);
            let done = tallies.get("parse-response").is_some_and(|t| t.differed == 1)
                && tallies.get("build-request").is_some_and(|t| t.agreed == 1);
            async move { done.then_some(tallies) }
        })
        .await;
        assert_eq!(tallies["parse-response"].agreed, 0);
        assert_eq!(tallies["build-request"].differed, 0);

        let diffs = eventually(Duration::from_secs(10), "the stored diff", || {
            let store = h.store().clone();
            let shadow = shadow.clone();
            async move {
                let diffs = store.shadow_diffs(ADAPTER, &shadow, 10).await.unwrap();
                (!diffs.is_empty()).then_some(diffs)
            }
        })
        .await;
        assert_eq!(diffs.len(), 1);
        let diff = &diffs[0].diff;
        assert_eq!(diff.operation, "parse-response");
        assert_eq!(diff.active_digest, active);
        assert_eq!(diff.account_id, h.account.id);
        assert_eq!(diff.input_digest.len(), 64);
        assert_eq!(
            diff.fields,
            serde_json::json!([{
                "path": "$.Ok[0].amount.amount_minor",
                "serving": "1000",
                "shadow": "1001",
            }])
        );

        // Nothing the shadow said reached the payment's history.
        let timeline = h.store().timeline(&view.details.order.id).await.unwrap();
        assert!(timeline.iter().all(|e| e.adapter_digest.as_deref() != Some(shadow.as_str())));
        let attempt = h.store().get_attempt(&view.details.attempts[0].id).await.unwrap();
        assert_eq!(attempt.adapter_pin.map(|p| p.digest), Some(active));
    }
}

dual_test! {
    async fn a_canary_that_answers_unknown_is_rolled_back_by_itself_while_its_attempts_converge_on_it(db) {
        let h = Harness::new(db).await;
        let canary = load_variant(&h, "unknown_on_create").await;
        let active = active_digest(&h);
        let rollout = Rollout { accounts: vec![h.account.id.clone()], percent: 0 };
        let policy = CanaryPolicy { min_sample: 5, max_excess_pct: 10 };
        h.orch.runtime().start_canary(ADAPTER, &canary, rollout, policy).unwrap();

        let mut started = Vec::new();
        for i in 0..5 {
            let view = h
                .orch
                .create_payment(&h.merchant.id, h.payment(&format!("o-canary-{i}"), 700, CaptureMode::Automatic, true))
                .await
                .unwrap()
                .view;
            // The PSP charged; the canary could not read it: processing, never failed.
            assert_eq!(view.status, ClientStatus::Processing);
            let attempt = view.details.attempts[0].clone();
            assert_eq!(attempt.state, AttemptState::Unknown);
            let pinned = h.store().get_attempt(&attempt.id).await.unwrap().adapter_pin.unwrap();
            assert_eq!((pinned.version.as_str(), pinned.digest.as_str()), ("1.0.1-variant", canary.as_str()));
            started.push(attempt);
        }

        // Five UNKNOWNs out of five against none for the active version: stopped.
        assert_eq!(h.orch.runtime().canary(ADAPTER), None);
        let history = h.store().adapter_events(ADAPTER).await.unwrap();
        assert_eq!(history.len(), 1);
        assert_eq!(history[0].kind, "canary_rolled_back");
        assert_eq!(history[0].digest, canary);
        assert_eq!(history[0].actor, "gateway");
        assert!(history[0].detail.starts_with("UNKNOWN rate 100.00% over 5 attempts"), "{}", history[0].detail);

        // New attempts go to the active version again and succeed at once.
        let next = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-after", 700, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        assert_eq!(next.status, ClientStatus::Succeeded);
        let pinned = h.store().get_attempt(&next.details.attempts[0].id).await.unwrap().adapter_pin.unwrap();
        assert_eq!(pinned.digest, active);

        // The canary's attempts are queried through the canary and converge, one
        // charge each, never charged again.
        for attempt in &started {
            let advanced = h
                .orch
                .advance(Target::Attempt(attempt.id.clone()), Trigger::Scanner)
                .await
                .unwrap();
            assert_eq!(advanced.state_after, "SUCCEEDED", "{advanced:?}");
            assert_eq!(h.psp.payments_for(&attempt.reference).len(), 1);
            let timeline = h.store().timeline(&attempt.payment_id).await.unwrap();
            let success = timeline
                .iter()
                .find(|e| e.aggregate_type == "attempt" && e.to_state == "SUCCEEDED")
                .unwrap();
            assert_eq!(success.adapter_digest.as_deref(), Some(canary.as_str()));
        }
        assert_eq!(h.psp.requests("create_payment"), 6);
    }
}

dual_test! {
    async fn a_percentage_canary_takes_the_same_attempts_on_every_run_and_only_new_ones(db) {
        let h = Harness::new(db).await;
        // An attempt already sent before the canary starts stays on the active version.
        h.psp.set_mode(PspRoute::Payments, Mode::TimeoutAfterCommit(Duration::from_secs(3)));
        let before = h
            .orch
            .create_payment(&h.merchant.id, h.payment("o-before", 300, CaptureMode::Automatic, true))
            .await
            .unwrap()
            .view;
        h.psp.set_mode(PspRoute::Payments, Mode::Succeed);
        let canary = load_variant(&h, "none").await;
        let active = active_digest(&h);
        let rollout = Rollout { accounts: vec![], percent: 50 };
        h.orch.runtime().start_canary(ADAPTER, &canary, rollout.clone(), CanaryPolicy::default()).unwrap();

        let mut on_canary = 0;
        for i in 0..12 {
            let view = h
                .orch
                .create_payment(&h.merchant.id, h.payment(&format!("o-split-{i}"), 300, CaptureMode::Automatic, true))
                .await
                .unwrap()
                .view;
            let attempt = h.store().get_attempt(&view.details.attempts[0].id).await.unwrap();
            let expected = if rollout.takes(&h.account.id, &attempt.reference) { &canary } else { &active };
            assert_eq!(&attempt.adapter_pin.unwrap().digest, expected, "{}", attempt.reference);
            on_canary += usize::from(expected == &canary);
        }
        assert!((1..12).contains(&on_canary), "a 50% split over 12 attempts took {on_canary}");

        let old = before.details.attempts[0].clone();
        h.orch.advance(Target::Attempt(old.id.clone()), Trigger::Scanner).await.unwrap();
        let old = h.store().get_attempt(&old.id).await.unwrap();
        assert_eq!(old.state, AttemptState::Succeeded);
        assert_eq!(old.adapter_pin.map(|p| p.digest), Some(active), "pinned when first sent");
    }
}

dual_test! {
    async fn a_settlement_report_the_serving_version_reads_is_read_by_the_shadow_too(db) {
        let h = Harness::new(db).await;
        let shadow = load_variant(&h, "none").await;
        h.orch.runtime().stage_shadow(ADAPTER, &shadow).unwrap();
        let now = h.orch.now_ms();
        // Neither version reads reports: both refuse it alike, so they agree, and the
        // run is refused without changing anything.
        let refused = h
            .orch
            .reconcile(sluice_orchestrator::ReconcileRequest {
                connector_account_id: h.account.id.clone(),
                period_start: now - 86_400_000,
                period_end: now,
                report: b"id,amount\n1,100\n".to_vec(),
                actor: "admin".into(),
            })
            .await;
        assert!(refused.is_err(), "{refused:?}");
        let tally = eventually(Duration::from_secs(10), "the shadow's settlement read", || {
            let tally = h.orch.shadow_tallies(ADAPTER, &shadow).get("parse-settlement").copied();
            async move { tally.filter(|t| t.agreed + t.differed + t.failed > 0) }
        })
        .await;
        assert_eq!((tally.agreed, tally.differed, tally.failed), (1, 0, 0));
    }
}
