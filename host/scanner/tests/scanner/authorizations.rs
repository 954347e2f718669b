//! Issue 11 §3: an AUTHORIZED attempt keeps an exit. The scanner watches the
//! authorization's validity on a test clock (days pass without a sleep), voids
//! what the PSP still holds at expiry, and follows a void recorded as sent
//! whose sender died or got no answer.

use std::time::Duration;

use sluice_core::{AttemptState, CaptureMode, OrderState, RecoveryPolicy};
use sluice_store::{PaymentAttempt, StoreError};

use crate::common::{fast_policy, Harness, Mode, PspRoute};

const DAY: i64 = 24 * 3_600_000;

fn policy() -> RecoveryPolicy {
    fast_policy(100)
}

/// A manual-capture payment the PSP authorized.
async fn authorized(h: &Harness, order_no: &str) -> PaymentAttempt {
    let mut create = h.payment(order_no, 1200, true);
    create.capture_mode = CaptureMode::Manual;
    let view = h
        .orch
        .create_payment(&h.merchant.id, create)
        .await
        .expect("create and confirm")
        .view;
    let attempt = view.details.attempts[0].clone();
    assert_eq!(attempt.state, AttemptState::Authorized, "{attempt:?}");
    assert!(attempt.authorized_at.is_some());
    attempt
}

/// Move the test clock past the row's retry time.
fn jump_past_next_look(h: &Harness, attempt: &PaymentAttempt) {
    let due = attempt.next_retry_time.expect("in the scan set");
    h.db.clock
        .advance(due.saturating_sub(h.store().now_ms()).max(0) + 1);
}

async fn reload(h: &Harness, attempt: &PaymentAttempt) -> PaymentAttempt {
    h.store().get_attempt(&attempt.id).await.expect("attempt")
}

async fn order_state(h: &Harness, attempt: &PaymentAttempt) -> Result<OrderState, StoreError> {
    Ok(h.store()
        .get_payment(None, &attempt.payment_id)
        .await?
        .state)
}

/// The VOID_SUBMITTED history rows of an attempt: (raw status, actor).
async fn void_records(h: &Harness, attempt: &PaymentAttempt) -> Vec<(String, String)> {
    h.store()
        .timeline(&attempt.payment_id)
        .await
        .expect("timeline")
        .into_iter()
        .filter(|e| e.event_kind == "VOID_SUBMITTED" && e.decision == "applied")
        .map(|e| {
            (
                e.raw_status.unwrap_or_default(),
                e.actor.unwrap_or_default(),
            )
        })
        .collect()
}

dual_test! {
    async fn an_authorization_past_its_validity_is_voided_at_the_psp_and_the_order_ends_canceled(db) {
        let h = Harness::new(db).await;
        let attempt = authorized(&h, "o-auth-expiry").await;
        let scanner = h.scanner(policy());

        // Within its validity: looked at, and scheduled for its expiry.
        jump_past_next_look(&h, &attempt);
        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.not_yet, report.queried, report.parked), (1, 0, 0), "{report:?}");
        let watched = reload(&h, &attempt).await;
        let expires = watched.authorized_at.unwrap() + sluice_core::DEFAULT_AUTHORIZATION_VALIDITY_MS;
        assert_eq!(watched.next_retry_time, Some(expires), "the next look is the expiry");
        assert_eq!(h.psp.requests("cancel"), 0, "never voided early");

        // Seven days later.
        h.db.clock.advance(7 * DAY);
        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.authorizations_expired, report.errors), (1, 0), "{report:?}");
        let closed = reload(&h, &attempt).await;
        assert_eq!(closed.state, AttemptState::Canceled);
        assert_eq!(order_state(&h, &attempt).await.unwrap(), OrderState::Canceled);
        assert_eq!(h.psp.requests("cancel"), 1, "one void");
        assert!(h.psp.queries_for(&attempt.reference) >= 1, "queried before the void");
        assert_eq!(h.psp.payments_for(&attempt.reference)[0].status, "canceled");
        assert_eq!(
            void_records(&h, &attempt).await,
            vec![("void_after_authorization_expired".to_owned(), "system:scanner".to_owned())],
            "recorded as sent before the call, with the reason"
        );
        let amounts = h.store().payment_amounts(&attempt.payment_id).await.unwrap();
        assert_eq!(amounts.authorized_minor, 0, "the customer's funds are released");
        let again = scanner.scan_once().await.unwrap();
        assert_eq!(again.scanned, 0, "terminal: out of the scan set");
    }
}

dual_test! {
    async fn an_authorization_the_psp_already_expired_is_closed_by_the_query_without_a_void(db) {
        let h = Harness::new(db).await;
        let attempt = authorized(&h, "o-auth-psp-expired").await;
        let psp_id = attempt.psp_reference.clone().expect("PSP reference");
        let scanner = h.scanner(policy());
        // The PSP let the authorization lapse on its own.
        h.psp.set_status(&psp_id, "canceled");
        h.db.clock.advance(7 * DAY + 1);

        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.authorizations_expired, report.errors), (1, 0), "{report:?}");
        assert_eq!(reload(&h, &attempt).await.state, AttemptState::Canceled);
        assert_eq!(order_state(&h, &attempt).await.unwrap(), OrderState::Canceled);
        assert_eq!(h.psp.requests("cancel"), 0, "the query was enough");
        assert!(void_records(&h, &attempt).await.is_empty());
    }
}

dual_test! {
    async fn a_connector_account_with_a_shorter_validity_is_expired_on_its_own_schedule(db) {
        let h = Harness::new(db).await;
        h.store()
            .update_connector_account(
                &h.account.id,
                Some(&serde_json::json!({
                    "base_url": h.psp.base_url(),
                    "authorization_validity_ms": (2 * DAY).to_string(),
                })),
                None,
                None,
            )
            .await
            .expect("account config");
        let attempt = authorized(&h, "o-auth-short").await;
        let scanner = h.scanner(policy());
        jump_past_next_look(&h, &attempt);
        scanner.scan_once().await.unwrap();
        let watched = reload(&h, &attempt).await;
        assert_eq!(watched.next_retry_time, Some(watched.authorized_at.unwrap() + 2 * DAY));

        h.db.clock.advance(2 * DAY);
        let report = scanner.scan_once().await.unwrap();
        assert_eq!(report.authorizations_expired, 1, "{report:?}");
        assert_eq!(reload(&h, &attempt).await.state, AttemptState::Canceled);
    }
}

dual_test! {
    async fn a_merchant_void_whose_answer_is_lost_converges_by_query_instead_of_staying_authorized(db) {
        let h = Harness::new(db).await;
        let attempt = authorized(&h, "o-void-lost").await;
        // The PSP cancels, then the answer never comes back in time.
        h.psp.set_mode(PspRoute::Cancels, Mode::TimeoutAfterCommit(Duration::from_secs(2)));
        let view = h.orch.void(&h.merchant.id, &attempt.payment_id).await.expect("void");
        assert_eq!(view.details.order.state, OrderState::Authorized, "outcome unknown");
        h.psp.set_mode(PspRoute::Cancels, Mode::Succeed);
        let voiding = reload(&h, &attempt).await;
        assert_eq!(voiding.state, AttemptState::Authorized);
        assert!(voiding.void_requested_at.is_some(), "recorded as sent before the call");
        assert_eq!(
            void_records(&h, &attempt).await,
            vec![("void_requested_by_merchant".to_owned(), "system:api".to_owned())]
        );

        let scanner = h.scanner(policy());
        jump_past_next_look(&h, &voiding);
        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.queried, report.converged, report.errors), (1, 1, 0), "{report:?}");
        assert_eq!(reload(&h, &attempt).await.state, AttemptState::Canceled);
        assert_eq!(order_state(&h, &attempt).await.unwrap(), OrderState::Canceled);
        assert_eq!(h.psp.requests("cancel"), 1, "the query proved it: no second void");
    }
}

dual_test! {
    async fn a_void_recorded_by_a_process_killed_before_sending_it_is_sent_by_the_scanner(db) {
        let h = Harness::new(db).await;
        let attempt = authorized(&h, "o-void-killed").await;
        // The process dies right after recording the void: nothing reaches the PSP.
        h.psp.set_mode(PspRoute::Cancels, Mode::ServerError);
        h.orch.void(&h.merchant.id, &attempt.payment_id).await.expect("void");
        h.psp.set_mode(PspRoute::Cancels, Mode::Succeed);
        let voiding = reload(&h, &attempt).await;
        assert!(voiding.void_requested_at.is_some());
        assert_eq!(h.psp.payments_for(&attempt.reference)[0].status, "authorized");

        let scanner = h.scanner(policy());
        jump_past_next_look(&h, &voiding);
        let report = scanner.scan_once().await.unwrap();
        assert_eq!(report.errors, 0, "{report:?}");
        assert_eq!(reload(&h, &attempt).await.state, AttemptState::Canceled);
        assert_eq!(order_state(&h, &attempt).await.unwrap(), OrderState::Canceled);
        assert_eq!(h.psp.requests("cancel"), 2, "the same void, sent again by recovery");
        assert_eq!(void_records(&h, &attempt).await.len(), 1, "recorded once");
    }
}

dual_test! {
    async fn a_void_the_psp_never_confirms_reaches_an_operator_once_and_is_still_retried(db) {
        let h = Harness::new(db).await;
        let attempt = authorized(&h, "o-void-review").await;
        h.psp.set_mode(PspRoute::Cancels, Mode::ServerError);
        h.orch.void(&h.merchant.id, &attempt.payment_id).await.expect("void");
        let mut policy = policy();
        policy.max_unknown_age_ms = DAY;
        let scanner = h.scanner(policy);

        h.db.clock.advance(DAY + 1);
        let report = scanner.scan_once().await.unwrap();
        assert_eq!(report.escalated, 1, "{report:?}");
        let flagged = h.store().get_payment(None, &attempt.payment_id).await.unwrap();
        assert!(flagged.manual_review);
        assert!(
            flagged.manual_review_reason.as_deref().unwrap_or("").contains("void"),
            "{flagged:?}"
        );
        jump_past_next_look(&h, &reload(&h, &attempt).await);
        let again = scanner.scan_once().await.unwrap();
        assert_eq!((again.escalated, again.queried), (0, 1), "flagged once, retried on: {again:?}");
        assert_eq!(reload(&h, &attempt).await.state, AttemptState::Authorized);
    }
}
