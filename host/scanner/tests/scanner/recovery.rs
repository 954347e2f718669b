use std::time::Duration;

use sluice_core::{AttemptState, EventKind, EvidenceSource, PaymentEvent};
use sluice_scanner::{ItemOutcome, Scanner};
use sluice_store::{ApplyEvent, EventTarget, NewAttempt, PaymentAttempt, PendingKind, Provenance};

use crate::common::{eur, fast_policy, scanner_config, test_subject, Harness, Mode, PspRoute};
use sluice_store::Backend;

/// What a process killed mid-request leaves behind: the attempt recorded
/// SUBMITTED through the door, and nothing else. With `psp_committed` the
/// request had reached the PSP, which charged.
async fn submitted_by_a_killed_process(h: &Harness, order_no: &str) -> PaymentAttempt {
    let created = h
        .orch
        .create_payment(&h.merchant.id, h.payment(order_no, 1000, false))
        .await
        .expect("create payment");
    let payment_id = created.view.details.order.id;
    let now = h.store().now_ms();
    let provenance = Provenance::actor("system:api");
    let attempt = h
        .store()
        .create_attempt(
            &NewAttempt {
                payment_id: payment_id.clone(),
                connector_account_id: h.account.id.clone(),
                next_retry_time: Some(now),
                ..NewAttempt::default()
            },
            &provenance,
        )
        .await
        .expect("create attempt");
    h.store()
        .apply_event(&ApplyEvent {
            target: EventTarget::Attempt(attempt.reference.clone()),
            event: PaymentEvent {
                attempt_reference: Some(attempt.reference.clone()),
                raw_status: "submitted".into(),
                ..PaymentEvent::new(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse)
            },
            provenance,
            inbox_id: None,
            next_retry_time: Some(now),
        })
        .await
        .expect("record submitted");
    let attempt = h.store().get_attempt(&attempt.id).await.expect("attempt");
    assert_eq!(attempt.state, AttemptState::Submitted);
    attempt
}

/// An attempt whose sale the PSP committed while the host timed out.
async fn unknown_after_commit_then_timeout(h: &Harness, order_no: &str) -> PaymentAttempt {
    h.psp.set_mode(
        PspRoute::Payments,
        Mode::TimeoutAfterCommit(Duration::from_secs(3)),
    );
    let view = h
        .orch
        .create_payment(&h.merchant.id, h.payment(order_no, 1000, true))
        .await
        .expect("create and confirm")
        .view;
    h.psp.set_mode(PspRoute::Payments, Mode::Succeed);
    let attempt = view.details.attempts[0].clone();
    assert_eq!(attempt.state, AttemptState::Unknown);
    assert_eq!(h.psp.payments_for(&attempt.reference).len(), 1);
    attempt
}

/// Sleep until the row's stored retry time has passed.
async fn until_due(h: &Harness, attempt_id: &str) {
    let attempt = h.store().get_attempt(attempt_id).await.unwrap();
    let due = attempt
        .next_retry_time
        .expect("a pending attempt is scheduled");
    let wait = due.saturating_sub(h.store().now_ms()).max(0) + 20;
    tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap())).await;
}

dual_test! {
    async fn an_attempt_left_unknown_by_a_commit_then_timeout_converges_with_exactly_one_charge(db) {
        let h = Harness::new(db).await;
        let attempt = unknown_after_commit_then_timeout(&h, "o-unknown").await;
        let scanner = h.scanner(fast_policy(100));
        until_due(&h, &attempt.id).await;

        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.scanned, report.hits, report.queried, report.converged), (1, 1, 1, 1),
            "{report:?}");
        assert_eq!(report.errors, 0);

        let after = h.store().get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::Succeeded);
        assert_eq!(h.psp.payments_for(&attempt.reference).len(), 1, "exactly one charge");
        assert_eq!(h.psp.requests("create_payment"), 1, "the scanner never charges again");
        assert_eq!(h.psp.queries_for(&attempt.reference), 1);
        let timeline = h.store().timeline(&attempt.payment_id).await.unwrap();
        let success = timeline
            .iter()
            .find(|e| e.aggregate_type == "attempt" && e.to_state == "SUCCEEDED")
            .expect("the success is in the history");
        assert_eq!(success.actor.as_deref(), Some("system:scanner"));
        assert_eq!(success.evidence_source, "query");
    }
}

dual_test! {
    async fn an_attempt_left_submitted_by_a_killed_process_is_rediscovered_from_the_database_alone(db) {
        let h = Harness::new(db).await;
        let attempt = submitted_by_a_killed_process(&h, "o-killed").await;
        // The request reached the PSP before the process died.
        h.psp.seed_payment(&attempt.reference, 1000, "EUR", "succeeded");

        // A fresh instance: its own pool, runtime and orchestrator; it knows
        // only what the database holds.
        let restarted = h.another_instance().await;
        let scanner = Scanner::new(restarted, scanner_config(fast_policy(100))).unwrap();
        tokio::time::sleep(Duration::from_millis(120)).await;

        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.scanned, report.queried, report.converged), (1, 1, 1), "{report:?}");
        let after = h.store().get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::Succeeded);
        assert_eq!(h.psp.requests("create_payment"), 0, "recovery only queries");
        assert_eq!(h.psp.payments_for(&attempt.reference).len(), 1, "exactly one charge");
        assert_eq!(h.psp.queries_for(&attempt.reference), 1);

        // Terminal rows are out of the pending set: the next round finds nothing.
        let again = scanner.scan_once().await.unwrap();
        assert_eq!(again.scanned, 0, "{again:?}");
    }
}

dual_test! {
    async fn a_still_unknown_attempt_is_rescheduled_into_the_future_and_not_rescanned_at_once(db) {
        let h = Harness::new(db).await;
        let attempt = unknown_after_commit_then_timeout(&h, "o-backoff").await;
        // The PSP cannot answer queries for now.
        h.psp.set_mode(PspRoute::Queries, Mode::ServerError);
        let scanner = h.scanner(fast_policy(2_000));
        until_due(&h, &attempt.id).await;

        // Due by its stored time, but the policy waits half a base backoff
        // after the last call: the first rounds only move it on.
        let mut queried = None;
        for _ in 0..100 {
            let report = scanner.scan_once().await.unwrap();
            assert_eq!(report.errors, 0, "{report:?}");
            if report.queried > 0 {
                queried = Some(report);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let report = queried.expect("the scanner queried within 5 s");
        assert_eq!((report.queried, report.converged), (1, 0), "{report:?}");
        assert_eq!(h.psp.queries_for(&attempt.reference), 1);

        let after = h.store().get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::Unknown, "an unanswered query changes nothing");
        assert_eq!(after.retry_count, attempt.retry_count + 1);
        let next = after.next_retry_time.expect("still scheduled");
        let now = h.store().now_ms();
        assert!(next >= now + 1_000, "rescheduled at least half a backoff ahead: {next} vs {now}");

        let again = scanner.scan_once().await.unwrap();
        assert_eq!((again.scanned, again.queried), (0, 0), "{again:?}");
        assert_eq!(h.psp.queries_for(&attempt.reference), 1, "not rescanned at once");
        assert_eq!(h.psp.payments_for(&attempt.reference).len(), 1);
    }
}

dual_test! {
    async fn a_stale_scanner_pass_after_a_terminal_state_does_nothing(db) {
        let h = Harness::new(db).await;
        let attempt = unknown_after_commit_then_timeout(&h, "o-stale").await;
        let scanner = h.scanner(fast_policy(100));
        until_due(&h, &attempt.id).await;
        // Someone else (a webhook, the API) settles it first.
        h.orch
            .advance(sluice_orchestrator::Target::Attempt(attempt.id.clone()), sluice_orchestrator::Trigger::Operator)
            .await
            .unwrap();
        let settled = h.store().get_attempt(&attempt.id).await.unwrap();
        assert_eq!(settled.state, AttemptState::Succeeded);
        let queries = h.psp.queries_for(&attempt.reference);
        let timeline = h.store().timeline(&attempt.payment_id).await.unwrap();
        let payment = h.store().get_payment(None, &attempt.payment_id).await.unwrap();

        // A scanner that read the row before it settled still works it by id.
        let outcome = scanner.recover_one(PendingKind::Attempt, &attempt.id).await.unwrap();
        assert_eq!(outcome, ItemOutcome::Stale);
        let report = scanner.scan_once().await.unwrap();
        assert_eq!(report.scanned, 0, "{report:?}");

        assert_eq!(h.psp.queries_for(&attempt.reference), queries, "nobody was asked");
        assert_eq!(h.store().timeline(&attempt.payment_id).await.unwrap(), timeline);
        let after = h.store().get_payment(None, &attempt.payment_id).await.unwrap();
        assert_eq!(after.version, payment.version);
        assert_eq!(h.store().get_attempt(&attempt.id).await.unwrap(), settled);
    }
}

dual_test! {
    async fn the_round_budget_bounds_psp_contacts_and_leaves_the_rest_due_for_the_next_round(db) {
        let h = Harness::new(db).await;
        let mut attempts = Vec::new();
        for n in 0..5 {
            let attempt = submitted_by_a_killed_process(&h, &format!("o-budget-{n}")).await;
            h.psp.seed_payment(&attempt.reference, 1000, "EUR", "succeeded");
            attempts.push(attempt);
        }
        let mut config = scanner_config(fast_policy(100));
        config.round_budget = 2;
        let scanner = Scanner::new(h.orch.clone(), config).unwrap();
        tokio::time::sleep(Duration::from_millis(120)).await;

        // A page of three: two contact the PSP, the third stays due, and the
        // round stops reading once its budget is spent.
        let first = scanner.scan_once().await.unwrap();
        assert_eq!((first.scanned, first.queried, first.converged, first.skipped_budget),
            (3, 2, 2, 1), "{first:?}");
        // The next round restarts from the beginning and finds the rest.
        let second = scanner.scan_once().await.unwrap();
        assert_eq!((second.scanned, second.queried, second.skipped_budget), (3, 2, 1), "{second:?}");
        let third = scanner.scan_once().await.unwrap();
        assert_eq!((third.scanned, third.queried, third.skipped_budget), (1, 1, 0), "{third:?}");
        for attempt in &attempts {
            let after = h.store().get_attempt(&attempt.id).await.unwrap();
            assert_eq!(after.state, AttemptState::Succeeded);
            assert_eq!(h.psp.queries_for(&attempt.reference), 1);
        }
    }
}

dual_test! {
    async fn an_unknown_past_its_age_flags_the_payment_for_review_through_the_door_once(db) {
        let h = Harness::new(db).await;
        let attempt = unknown_after_commit_then_timeout(&h, "o-escalate").await;
        // The PSP cannot answer queries for now.
        h.psp.set_mode(PspRoute::Queries, Mode::ServerError);
        let mut policy = fast_policy(100);
        policy.max_unknown_age_ms = 0;
        let scanner = h.scanner(policy);
        until_due(&h, &attempt.id).await;
        let before = h.store().get_payment(None, &attempt.payment_id).await.unwrap();
        assert!(!before.manual_review);

        // Escalating adds the flag and never replaces the query.
        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.escalated, report.queried, report.errors), (1, 1, 0), "{report:?}");
        let flagged = h.store().get_payment(None, &attempt.payment_id).await.unwrap();
        assert!(flagged.manual_review);
        assert!(flagged.manual_review_reason.as_deref().unwrap_or("").contains("UNKNOWN"), "{flagged:?}");
        assert_eq!(flagged.state, before.state, "no payment state change");
        assert_eq!(h.store().get_attempt(&attempt.id).await.unwrap().state, AttemptState::Unknown);
        let timeline = h.store().timeline(&attempt.payment_id).await.unwrap();
        let row = timeline
            .iter()
            .find(|e| e.event_kind == sluice_store::ESCALATE_KIND)
            .expect("the escalation is in the history");
        assert_eq!(row.actor.as_deref(), Some("system:scanner"));
        assert_eq!(row.aggregate_id, attempt.id);
        let needs_review = h.store().outbox_for_payment(&attempt.payment_id).await.unwrap()
            .into_iter().filter(|m| m.event_type == "payment.needs_review").count();
        assert_eq!(needs_review, 1);

        // Flagged payments are not escalated again; queries go on.
        until_due(&h, &attempt.id).await;
        let again = scanner.scan_once().await.unwrap();
        assert_eq!((again.escalated, again.queried), (0, 1), "{again:?}");
        assert_eq!(h.psp.payments_for(&attempt.reference).len(), 1, "exactly one charge");
        let needs_review = h.store().outbox_for_payment(&attempt.payment_id).await.unwrap()
            .into_iter().filter(|m| m.event_type == "payment.needs_review").count();
        assert_eq!(needs_review, 1, "the merchant is told once");
        assert_eq!(escalations(&h, &attempt.payment_id).await, (1, 1), "recorded once");

        // The PSP answers: the attempt converges, still with one charge.
        h.psp.set_mode(PspRoute::Queries, Mode::Succeed);
        until_due(&h, &attempt.id).await;
        let last = scanner.scan_once().await.unwrap();
        assert_eq!((last.escalated, last.queried, last.converged), (0, 1, 1), "{last:?}");
        assert_eq!(h.store().get_attempt(&attempt.id).await.unwrap().state, AttemptState::Succeeded);
        assert_eq!(h.psp.payments_for(&attempt.reference).len(), 1, "exactly one charge");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_scanners_on_postgres_never_query_the_same_attempt_at_the_same_moment() {
    let h = Harness::new(test_subject(Backend::Postgres).await).await;
    let mut attempts = Vec::new();
    for n in 0..12 {
        let attempt = submitted_by_a_killed_process(&h, &format!("o-two-{n}")).await;
        h.psp
            .seed_payment(&attempt.reference, 1000, "EUR", "succeeded");
        attempts.push(attempt);
    }
    // Slow answers widen the window in which two instances could collide.
    h.psp
        .set_mode(PspRoute::Queries, Mode::Slow(Duration::from_millis(150)));
    let policy = fast_policy(100);
    let one = h.scanner(policy);
    let two = Scanner::new(h.another_instance().await, scanner_config(policy)).unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;

    let (a, b) = tokio::join!(one.scan_once(), two.scan_once());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.errors + b.errors, 0, "{a:?} {b:?}");
    assert_eq!(
        a.queried + b.queried,
        12,
        "every attempt queried once in all: {a:?} {b:?}"
    );
    assert_eq!(
        h.psp.overlapping_queries(),
        0,
        "never two queries of one attempt at once"
    );
    for attempt in &attempts {
        assert_eq!(
            h.psp.queries_for(&attempt.reference),
            1,
            "{}",
            attempt.reference
        );
        let after = h.store().get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::Succeeded);
    }
    assert_eq!(h.psp.requests("create_payment"), 0);
    // Both saw the same pending set; the one that lost a row stood back.
    assert!(a.scanned > 0 && b.scanned > 0, "{a:?} {b:?}");
}

/// A policy whose customer steps expire `ttl_ms` after the attempt was created.
fn expiring_policy(ttl_ms: i64) -> sluice_core::RecoveryPolicy {
    sluice_core::RecoveryPolicy {
        requires_action_ttl_ms: ttl_ms,
        ..fast_policy(100)
    }
}

/// An attempt the PSP reports as waiting for the customer (3-D Secure),
/// learned by the scanner's first query. Returns it and the PSP's payment id.
async fn waiting_for_the_customer(
    h: &Harness,
    scanner: &Scanner,
    order_no: &str,
) -> (PaymentAttempt, String) {
    let attempt = submitted_by_a_killed_process(h, order_no).await;
    let psp_id = h
        .psp
        .seed_payment(&attempt.reference, 1000, "EUR", "requires_action");
    // Past the SUBMITTED timeout, well before the step expires.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let report = scanner.scan_once().await.unwrap();
    assert_eq!((report.queried, report.errors), (1, 0), "{report:?}");
    let attempt = h.store().get_attempt(&attempt.id).await.unwrap();
    assert_eq!(attempt.state, AttemptState::RequiresAction);
    (attempt, psp_id)
}

/// Sleep until the attempt's customer step has expired and the row is due.
async fn until_expired(h: &Harness, attempt: &PaymentAttempt, ttl_ms: i64) {
    let expires_at = attempt.created_at + ttl_ms;
    let wait = expires_at.saturating_sub(h.store().now_ms()).max(0) + 20;
    tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap())).await;
    until_due(h, &attempt.id).await;
}

dual_test! {
    async fn an_expired_customer_step_is_canceled_at_the_psp_and_the_order_expires(db) {
        let h = Harness::new(db).await;
        let scanner = h.scanner(expiring_policy(300));
        let (attempt, psp_id) = waiting_for_the_customer(&h, &scanner, "o-3ds-expired").await;

        until_expired(&h, &attempt, 300).await;
        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.expired, report.expire_blocked, report.errors), (1, 0, 0),
            "{report:?}");

        let after = h.store().get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::Canceled);
        let order = h.store().get_payment(None, &attempt.payment_id).await.unwrap();
        assert_eq!(order.state, sluice_core::OrderState::Expired);
        assert_eq!(h.psp.requests("cancel"), 1, "the customer step is closed at the PSP");
        let at_psp = h.psp.payments_for(&attempt.reference);
        assert_eq!(at_psp.len(), 1);
        assert_eq!((at_psp[0].id.as_str(), at_psp[0].status.as_str()), (psp_id.as_str(), "canceled"));
        assert_eq!(h.psp.requests("create_payment"), 0, "recovery never charges");

        // The closed attempt and the expired order are out of the pending set.
        let again = scanner.scan_once().await.unwrap();
        assert_eq!((again.scanned, again.queried), (0, 0), "{again:?}");
        assert_eq!(h.psp.requests("cancel"), 1);
    }
}

dual_test! {
    async fn a_customer_who_completed_the_step_before_the_expiry_scan_keeps_the_payment(db) {
        let h = Harness::new(db).await;
        let scanner = h.scanner(expiring_policy(300));
        let (attempt, psp_id) = waiting_for_the_customer(&h, &scanner, "o-3ds-completed").await;
        // The customer authenticates at the last moment; the PSP charges.
        h.psp.set_status(&psp_id, "succeeded");

        until_expired(&h, &attempt, 300).await;
        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.expired, report.errors), (0, 0), "{report:?}");

        let after = h.store().get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::Succeeded);
        let order = h.store().get_payment(None, &attempt.payment_id).await.unwrap();
        assert_eq!(order.state, sluice_core::OrderState::Succeeded);
        assert_eq!(h.psp.requests("cancel"), 0, "a completed step is never canceled");
    }
}

dual_test! {
    async fn an_expired_step_whose_cancel_has_no_answer_stays_open_and_is_canceled_on_the_next_scan(db) {
        let h = Harness::new(db).await;
        let scanner = h.scanner(expiring_policy(300));
        let (attempt, _psp_id) = waiting_for_the_customer(&h, &scanner, "o-3ds-5xx").await;

        h.psp.set_mode(PspRoute::Cancels, Mode::ServerError);
        until_expired(&h, &attempt, 300).await;
        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.expired, report.expire_blocked, report.errors), (0, 1, 0),
            "{report:?}");
        let after = h.store().get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::RequiresAction, "no answer closes nothing");
        let order = h.store().get_payment(None, &attempt.payment_id).await.unwrap();
        assert_ne!(order.state, sluice_core::OrderState::Expired);

        h.psp.set_mode(PspRoute::Cancels, Mode::Succeed);
        until_due(&h, &attempt.id).await;
        let report = scanner.scan_once().await.unwrap();
        assert_eq!((report.expired, report.errors), (1, 0), "{report:?}");
        let after = h.store().get_attempt(&attempt.id).await.unwrap();
        assert_eq!(after.state, AttemptState::Canceled);
    }
}

/// Sleep until a refund's stored retry time has passed.
async fn until_refund_due(h: &Harness, refund_id: &str) {
    let refund = h.store().get_refund(refund_id).await.unwrap();
    let due = refund
        .next_retry_time
        .expect("a pending refund is scheduled");
    let wait = due.saturating_sub(h.store().now_ms()).max(0) + 20;
    tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap())).await;
}

/// A succeeded payment of 1000 (one charge at the fake PSP).
async fn succeeded(h: &Harness, order_no: &str) -> (String, String) {
    let view = h
        .orch
        .create_payment(&h.merchant.id, h.payment(order_no, 1000, true))
        .await
        .expect("create and confirm")
        .view;
    let attempt = &view.details.attempts[0];
    assert_eq!(attempt.state, AttemptState::Succeeded);
    let psp_payment = attempt.psp_reference.clone().expect("the PSP's payment id");
    (view.details.order.id, psp_payment)
}

/// How often the payment was escalated: history rows and merchant events.
async fn escalations(h: &Harness, payment_id: &str) -> (usize, usize) {
    let rows = h
        .store()
        .timeline(payment_id)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_kind == sluice_store::ESCALATE_KIND)
        .count();
    let events = h
        .store()
        .outbox_for_payment(payment_id)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.event_type == "payment.needs_review")
        .count();
    (rows, events)
}

/// Scan rounds until one queries the refund (the policy may first move it
/// on to its due time): that round's report, and the escalations counted on
/// the way.
async fn scan_until_queried(
    h: &Harness,
    scanner: &Scanner,
    refund_id: &str,
) -> (sluice_scanner::ScanReport, u64) {
    let mut escalated = 0;
    for _ in 0..100 {
        until_refund_due(h, refund_id).await;
        let report = scanner.scan_once().await.unwrap();
        assert_eq!(report.errors, 0, "{report:?}");
        escalated += report.escalated;
        if report.queried > 0 {
            return (report, escalated);
        }
    }
    panic!("the scanner never queried refund {refund_id}");
}

/// Scanner rounds over a refund past its age whose PSP cannot say yet:
/// it is queried on its backoff every time, and flagged only once.
async fn rounds_flag_once_and_query_each_time(
    h: &Harness,
    scanner: &Scanner,
    refund_id: &str,
    payment_id: &str,
) {
    let reference = h.store().get_refund(refund_id).await.unwrap().reference;
    let before = h.psp.queries_for(&reference);
    let mut escalated = 0;
    for round in 0..3u64 {
        let (report, flagged) = scan_until_queried(h, scanner, refund_id).await;
        escalated += flagged;
        assert_eq!(
            (report.queried, report.converged),
            (1, 0),
            "round {round}: {report:?}"
        );
        assert_eq!(
            h.psp.queries_for(&reference),
            before + round + 1,
            "round {round}"
        );
        assert_eq!(
            escalations(h, payment_id).await,
            (1, 1),
            "flagged once, recorded once"
        );
    }
    assert_eq!(escalated, 1, "escalated in one round only");
    let flagged = h.store().get_payment(None, payment_id).await.unwrap();
    assert!(flagged.manual_review, "{flagged:?}");
}

dual_test! {
    /// Issue 11 §3: escalation adds a flag; it never stops queries, and it
    /// records once.
    async fn a_refund_unknown_past_its_age_is_flagged_once_and_queried_every_round_until_it_converges(db) {
        let h = Harness::new(db).await;
        let (payment_id, _) = succeeded(&h, "o-refund-unknown").await;
        h.psp.set_mode(PspRoute::Refunds, Mode::TimeoutAfterCommit(Duration::from_secs(3)));
        let refund = h.orch.refund(&h.merchant.id, &payment_id, Some(eur(300)), None).await.unwrap().refund;
        assert_eq!(refund.state.as_str(), "UNKNOWN");
        h.psp.set_mode(PspRoute::Queries, Mode::ServerError);
        let mut policy = fast_policy(100);
        policy.max_unknown_age_ms = 0;
        let scanner = h.scanner(policy);

        rounds_flag_once_and_query_each_time(&h, &scanner, &refund.id, &payment_id).await;

        h.psp.set_mode(PspRoute::Queries, Mode::Succeed);
        let (report, escalated) = scan_until_queried(&h, &scanner, &refund.id).await;
        assert_eq!((escalated, report.queried, report.converged), (0, 1, 1), "{report:?}");
        assert_eq!(h.store().get_refund(&refund.id).await.unwrap().state.as_str(), "SUCCEEDED");
        assert_eq!(h.psp.refunds().len(), 1, "exactly one refund");
        assert_eq!(escalations(&h, &payment_id).await, (1, 1));
    }
}

dual_test! {
    /// A refund recorded as sent by a process that died before sending stays
    /// PROCESSING: past its age it is flagged once and still queried every
    /// round (it used to be re-escalated each round and never queried again).
    async fn a_refund_processing_past_its_age_is_flagged_once_and_still_queried_every_round(db) {
        let h = Harness::new(db).await;
        let (payment_id, psp_payment) = succeeded(&h, "o-refund-processing").await;
        let provenance = Provenance::actor("system:api");
        let reserved = h.store()
            .reserve_refund(&sluice_store::RefundRequest {
                payment_id: payment_id.clone(), merchant_id: None, amount: eur(300), reason: None, idempotency_key: None,
            }, &provenance)
            .await
            .unwrap()
            .record;
        let now = h.store().now_ms();
        h.store()
            .apply_event(&ApplyEvent {
                target: EventTarget::Refund(reserved.reference.clone()),
                event: PaymentEvent {
                    action_reference: Some(reserved.reference.clone()),
                    raw_status: "sent".into(),
                    ..PaymentEvent::new(EventKind::RefundProcessing, EvidenceSource::SyncResponse)
                },
                provenance,
                inbox_id: None,
                next_retry_time: Some(now),
            })
            .await
            .unwrap();
        assert_eq!(h.store().get_refund(&reserved.id).await.unwrap().state.as_str(), "PROCESSING");
        let mut policy = fast_policy(100);
        policy.max_unknown_age_ms = 0;
        let scanner = h.scanner(policy);

        // The PSP has nothing under the reference yet: queries prove nothing.
        rounds_flag_once_and_query_each_time(&h, &scanner, &reserved.id, &payment_id).await;

        // The request had reached the PSP after all.
        h.psp.seed_refund(&psp_payment, &reserved.reference, 300, "EUR");
        let (report, escalated) = scan_until_queried(&h, &scanner, &reserved.id).await;
        assert_eq!((escalated, report.queried, report.converged), (0, 1, 1), "{report:?}");
        assert_eq!(h.store().get_refund(&reserved.id).await.unwrap().state.as_str(), "SUCCEEDED");
        assert_eq!(escalations(&h, &payment_id).await, (1, 1));
    }
}

dual_test! {
    async fn after_an_outage_the_retry_budget_paces_recovery_and_pushes_the_rest_out_with_jitter_never_dropping_a_row(db) {
        let h = Harness::new(db).await;
        let mut attempts = Vec::new();
        for n in 0..6 {
            let attempt = submitted_by_a_killed_process(&h, &format!("o-retry-{n}")).await;
            h.psp.seed_payment(&attempt.reference, 1000, "EUR", "succeeded");
            attempts.push(attempt);
        }
        let mut config = scanner_config(fast_policy(100));
        config.retry_budget = sluice_core::RetryBudgetPolicy { burst: 2, per_second: 1, max_defer_ms: 60_000 };
        let scanner = Scanner::new(h.orch.clone(), config).unwrap();
        h.db.clock.advance(120);

        // Six rows due at once after the outage: the budget lets two reach the PSP.
        let before = h.store().now_ms();
        let first = scanner.scan_once().await.unwrap();
        assert_eq!((first.scanned, first.queried, first.deferred_budget), (6, 2, 4), "{first:?}");
        // The other four stay pending, each pushed out by its place in the
        // queue at the budget's rate (1 s, 2 s, ...) plus jitter: no two together.
        let mut pushed = Vec::new();
        for attempt in &attempts {
            let after = h.store().get_attempt(&attempt.id).await.unwrap();
            if after.state == AttemptState::Succeeded {
                continue;
            }
            assert_eq!(after.state, AttemptState::Submitted);
            assert_eq!(after.retry_count, attempt.retry_count, "a deferral is not a query");
            let look = after.next_retry_time.expect("still in the pending set");
            pushed.push(look - before);
        }
        pushed.sort_unstable();
        assert_eq!(pushed.len(), 4, "{pushed:?}");
        assert!(pushed[0] >= 1_000 && pushed[3] < 8_000 + 1_000, "{pushed:?}");
        pushed.dedup();
        assert_eq!(pushed.len(), 4, "spread, not one moment: {pushed:?}");
        // Right after, no second flood: nothing is due.
        let again = scanner.scan_once().await.unwrap();
        assert_eq!((again.scanned, again.queried), (0, 0), "{again:?}");

        // As time passes the budget refills and every row converges, each
        // queried exactly once.
        for _ in 0..5 {
            h.db.clock.advance(8_000);
            scanner.scan_once().await.unwrap();
        }
        for attempt in &attempts {
            let after = h.store().get_attempt(&attempt.id).await.unwrap();
            assert_eq!(after.state, AttemptState::Succeeded, "{}", attempt.id);
            assert_eq!(h.psp.queries_for(&attempt.reference), 1);
        }
    }
}
