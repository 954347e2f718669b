//! The PSP call bulkhead (issue 13) end to end: the real adapters, the
//! sandbox PSP over HTTP made slow for one account, both databases. A new
//! attempt that finds every send slot of its account busy is shed before
//! anything is recorded as sent, while a query still gets the slot reserved
//! for queries; the shed attempt is sent by the next advance, charged once.

use std::time::Duration;

use crate::e2e_test;
use sluice_core::{AttemptState, CaptureMode, ClientStatus};
use sluice_orchestrator::{Action, Target, Trigger};
use sluice_sandbox_psp::account_faults::AccountFaults;

e2e_test! {
    async fn a_new_attempt_without_a_free_call_slot_is_shed_unsent_while_a_query_still_gets_through(e2e) {
        e2e.webhooks_off();
        // One slot for new work, one reserved for queries, no wait; calls
        // may take long enough for the account's slow answers.
        let mut config = e2e.account.config.clone();
        config["max_concurrent_calls"] = serde_json::json!("2");
        config["reserved_query_calls"] = serde_json::json!("1");
        config["call_slot_wait_ms"] = serde_json::json!("0");
        config["timeout_ms"] = serde_json::json!("20000");
        e2e.db.store.update_connector_account(&e2e.account.id, Some(&config), None, None).await.unwrap();
        let psp_name = e2e.psp_account();

        // An UNKNOWN to query later: the account answers 500 once.
        let every_call = AccountFaults { server_error_every: 1, ..AccountFaults::default() };
        e2e.sandbox.set_account_faults(&psp_name, Some(every_call));
        let unknown = e2e.create("slot-unknown", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(unknown.details.attempts[0].state, AttemptState::Unknown);
        let unknown_id = unknown.details.attempts[0].id.clone();

        // Now every call there takes 2.5 s; a first payment holds the one send slot.
        let slow = AccountFaults { latency_ms: 2_500, ..AccountFaults::default() };
        e2e.sandbox.set_account_faults(&psp_name, Some(slow));
        let orch = e2e.orch.clone();
        let merchant = e2e.merchant.id.clone();
        let holder = tokio::spawn(async move {
            crate::common::sandbox::create_payment(&orch, &merchant, "slot-holder", 1500, CaptureMode::Automatic, "pm_card_visa").await
        });
        crate::common::eventually(Duration::from_secs(20), "the first payment's call at the PSP", || async {
            (e2e.sandbox.account_faults().get(&psp_name).map(|s| s.calls) == Some(1)).then_some(())
        })
        .await;

        // The second finds no send slot: shed, nothing recorded as sent, nothing at the PSP.
        let shed = e2e.create("slot-shed", 1500, CaptureMode::Automatic, "pm_card_visa").await;
        assert_eq!(shed.status, ClientStatus::Processing);
        let shed_attempt = shed.details.attempts[0].clone();
        assert_eq!(shed_attempt.state, AttemptState::Created, "never SUBMITTED without a send");
        assert_eq!(e2e.sandbox.payment_count(&shed_attempt.reference), 0);
        // A query of the UNKNOWN still gets the slot reserved for queries
        // (with no wait, it would have been shed too).
        assert!(!holder.is_finished(), "the send slot is still held");
        let queried = e2e.orch.advance(Target::Attempt(unknown_id), Trigger::Operator).await.unwrap();
        assert!(matches!(queried.action, Action::Queried { unknown: None, .. }), "{queried:?}");

        // Once the slot is free, the next advance (the scanner's) sends it: one charge.
        let held = holder.await.unwrap();
        assert_eq!(e2e.sandbox.charge_count(&held.details.attempts[0].reference), 1);
        e2e.sandbox.set_account_faults(&psp_name, None);
        let sent = e2e.orch.advance(Target::Attempt(shed_attempt.id.clone()), Trigger::Scanner).await.unwrap();
        assert!(matches!(sent.action, Action::Sent { unknown: None, .. }), "{sent:?}");
        let after = e2e.db.store.get_attempt(&shed_attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::Succeeded);
        assert_eq!(e2e.sandbox.charge_count(&shed_attempt.reference), 1);
    }
}
