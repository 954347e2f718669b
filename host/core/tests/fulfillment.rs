//! Issue 7 at the decision level: attribution, deadlines, compensation
//! refunds that never hit a fulfilled payment, push confirmations, and the
//! seed 000 §11 story end to end.

mod common;

use common::*;
use sluice_core::*;

use FulfillmentState as F;

const A1: &str = "h2r_u16_p1";
const A2: &str = "h2r_u16_p2";
const BIZ: &str = "R:u16:round7:2024-05-01:3";
const PAID_AT: i64 = 1_700_000_000_000;
const DEADLINE: i64 = PAID_AT + 3_600_000;

fn policy() -> FulfillmentPolicy {
    FulfillmentPolicy::default()
}

fn settles() -> i64 {
    policy().settles_at(DEADLINE)
}

/// One payment's fulfillment, applied the way the store's one door does.
#[derive(Debug, Clone)]
struct Run {
    snap: FulfillmentSnapshot,
    decisions: Vec<FulfillmentDecision>,
}

impl Run {
    fn pending(mode: FulfillmentMode, siblings: &[&str]) -> Self {
        let mut snap = FulfillmentSnapshot::new(mode, BIZ, DEADLINE);
        snap.sibling_references = siblings.iter().map(|s| (*s).to_owned()).collect();
        Run {
            snap,
            decisions: Vec::new(),
        }
    }

    /// A payment of attempt `ours` that succeeded at `PAID_AT`.
    fn paid(mode: FulfillmentMode, ours: &str, siblings: &[&str]) -> Self {
        let mut run = Run::pending(mode, siblings);
        let d = run.feed(paid(ours), PAID_AT);
        assert_eq!(d.new_state(), Some(F::AwaitingFulfillment));
        run
    }

    fn feed(&mut self, input: FulfillmentInput, now: i64) -> FulfillmentDecision {
        let decision = decide_fulfillment(&self.snap, &input, now, &policy());
        self.snap = self.snap.applied(&decision);
        self.decisions.push(decision.clone());
        decision
    }

    fn compensation_refunds_started(&self) -> usize {
        self.decisions
            .iter()
            .filter(|d| d.starts_compensation().is_some())
            .count()
    }
}

fn paid(attempt: &str) -> FulfillmentInput {
    FulfillmentInput::PaymentSucceeded {
        attempt_reference: attempt.into(),
    }
}

fn fact(fact: BusinessFact, read_started_at_ms: i64) -> FulfillmentInput {
    FulfillmentInput::Fact(FactReading {
        fact,
        read_started_at_ms,
    })
}

fn fulfilled_by(attempt: &str, read_at: i64) -> FulfillmentInput {
    fact(
        BusinessFact::Fulfilled {
            attributed_to: Some(attempt.into()),
        },
        read_at,
    )
}

fn not_fulfilled(read_at: i64) -> FulfillmentInput {
    fact(BusinessFact::NotFulfilled, read_at)
}

fn push(attempt: &str) -> FulfillmentInput {
    FulfillmentInput::PushConfirmation {
        attributed_to: attempt.into(),
    }
}

fn refund_outcome(attempt: &str, outcome: CompensationRefundOutcome) -> FulfillmentInput {
    FulfillmentInput::CompensationRefund {
        refund_reference: compensation_refund_reference(attempt),
        outcome,
    }
}

fn has_effect(d: &FulfillmentDecision, pred: impl Fn(&FulfillmentEffect) -> bool) -> bool {
    d.effects().iter().any(pred)
}

fn calls_business(d: &FulfillmentDecision) -> bool {
    has_effect(d, |e| {
        matches!(e, FulfillmentEffect::CallBusinessAction { .. })
    })
}

fn reads_once_more(d: &FulfillmentDecision) -> bool {
    has_effect(d, |e| {
        matches!(e, FulfillmentEffect::ReadFactOnceMore { .. })
    })
}

fn scheduled_at(d: &FulfillmentDecision) -> Option<i64> {
    d.effects().iter().find_map(|e| match e {
        FulfillmentEffect::ScheduleCheck { at_ms, .. } => Some(*at_ms),
        _ => None,
    })
}

fn emitted(d: &FulfillmentDecision) -> Vec<&'static str> {
    d.effects()
        .iter()
        .filter_map(|e| match e {
            FulfillmentEffect::Emit(event) => Some(event.as_str()),
            _ => None,
        })
        .collect()
}

// ---- start -----------------------------------------------------------------

#[test]
fn payment_success_starts_awaiting_and_pull_calls_the_business_action_with_the_attempt_reference() {
    let mut run = Run::pending(FulfillmentMode::Pull, &[]);
    let d = run.feed(paid(A1), PAID_AT);

    assert_eq!(d.new_state(), Some(F::AwaitingFulfillment));
    assert_eq!(
        d.effects()[..3],
        [
            FulfillmentEffect::BindAttempt {
                attempt_reference: A1.into()
            },
            FulfillmentEffect::CallBusinessAction {
                attempt_reference: A1.into(),
                deadline_ms: DEADLINE
            },
            FulfillmentEffect::QueryBusinessFact {
                attempt_reference: A1.into()
            },
        ],
        "call first, then read the fact whatever the call returned"
    );
    let next = scheduled_at(&d).expect("a next check");
    assert!(next > PAID_AT && next <= DEADLINE);
    assert_eq!(run.snap.attempt_reference.as_deref(), Some(A1));
    assert_eq!(run.snap.checks, 1);
    assert!(
        run.feed(paid(A1), PAID_AT + 1) == FulfillmentDecision::Ignore(IgnoreReason::Duplicate),
        "the success told again is a duplicate"
    );
    assert!(matches!(
        run.feed(paid(A2), PAID_AT + 1),
        FulfillmentDecision::Reject(FulfillmentRefusal::AttemptMismatch { .. })
    ));
}

#[test]
fn push_mode_waits_for_the_confirmation_until_the_deadline_settles() {
    let mut run = Run::pending(FulfillmentMode::Push, &[]);
    let d = run.feed(paid(A1), PAID_AT);
    assert_eq!(d.new_state(), Some(F::AwaitingFulfillment));
    assert!(!calls_business(&d), "push mode never calls the business");
    assert_eq!(scheduled_at(&d), Some(settles()));

    let early = run.feed(FulfillmentInput::CheckDue, PAID_AT + 10);
    assert_eq!(scheduled_at(&early), Some(settles()));
    assert!(early.starts_compensation().is_none());
}

#[test]
fn nothing_happens_to_a_fulfillment_before_its_payment_succeeded() {
    let mut run = Run::pending(FulfillmentMode::Pull, &[]);
    assert_eq!(
        run.feed(FulfillmentInput::CheckDue, DEADLINE + 1_000_000),
        FulfillmentDecision::Ignore(IgnoreReason::Stale)
    );
    assert_eq!(
        run.feed(push(A1), PAID_AT),
        FulfillmentDecision::Reject(FulfillmentRefusal::PaymentNotSucceeded)
    );
    assert_eq!(run.snap.state, F::PendingPayment);
}

// ---- attribution -----------------------------------------------------------

#[test]
fn a_fact_attributed_to_this_attempt_fulfils_the_payment() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
    let d = run.feed(fulfilled_by(A1, PAID_AT + 100), PAID_AT + 200);
    assert_eq!(d.new_state(), Some(F::Fulfilled));
    assert_eq!(emitted(&d), ["fulfillment.fulfilled"]);
    assert_eq!(run.compensation_refunds_started(), 0);
}

#[test]
fn a_fact_attributed_to_this_attempt_after_the_deadline_still_fulfils_and_never_refunds() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);
    let d = run.feed(fulfilled_by(A1, settles() + 5), settles() + 10);
    assert_eq!(d.new_state(), Some(F::Fulfilled));
    assert_eq!(run.compensation_refunds_started(), 0);
}

#[test]
fn a_fact_attributed_to_a_sibling_attempt_compensates_with_fulfilled_elsewhere() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
    let d = run.feed(fulfilled_by(A2, PAID_AT + 100), PAID_AT + 200);
    assert_eq!(d.new_state(), Some(F::Compensating));
    assert_eq!(
        d.effects()[0],
        FulfillmentEffect::StartCompensationRefund {
            refund_reference: "cmp_h2r_u16_p1".into(),
            reason: CompensationReason::FulfilledElsewhere,
        }
    );
    assert_eq!(emitted(&d), ["fulfillment.compensating"]);
}

#[test]
fn a_fact_without_attribution_freezes_automation_with_an_alert() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
    let d = run.feed(
        fact(
            BusinessFact::Fulfilled {
                attributed_to: None,
            },
            PAID_AT + 1,
        ),
        PAID_AT + 2,
    );
    assert_eq!(d.new_state(), Some(F::ManualReview));
    assert!(has_effect(&d, |e| *e == FulfillmentEffect::AlertContradictoryFact));
    assert_eq!(emitted(&d), ["fulfillment.manual_review"]);
    assert_eq!(run.snap.review, Some(ReviewReason::FactWithoutAttribution));
    assert!(d.starts_compensation().is_none());

    // Frozen: neither the scanner nor a clear fact moves it any more.
    for (input, now) in [
        (FulfillmentInput::CheckDue, settles() + 1),
        (not_fulfilled(settles() + 1), settles() + 2),
        (fulfilled_by(A1, PAID_AT + 3), PAID_AT + 4),
    ] {
        assert_eq!(
            run.feed(input, now),
            FulfillmentDecision::Ignore(IgnoreReason::Stale)
        );
    }
    assert_eq!(run.snap.state, F::ManualReview);
}

#[test]
fn a_fact_attributed_to_an_unknown_reference_freezes_automation_with_an_alert() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
    let d = run.feed(fulfilled_by("h2r_stranger", PAID_AT + 1), PAID_AT + 2);
    assert_eq!(d.new_state(), Some(F::ManualReview));
    assert!(has_effect(&d, |e| *e == FulfillmentEffect::AlertContradictoryFact));
    assert_eq!(
        run.snap.review,
        Some(ReviewReason::FactAttributedToUnknown {
            reference: "h2r_stranger".into()
        })
    );
}

// ---- deadline --------------------------------------------------------------

#[test]
fn not_fulfilled_before_the_deadline_keeps_asking_with_growing_backoff_never_past_the_deadline() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);
    let mut now = PAID_AT;
    let mut previous_gap = 0;
    let mut calls = 0;
    while now < DEADLINE {
        let answer = run.feed(not_fulfilled(now), now + 1);
        assert_eq!(answer.new_state(), Some(F::AwaitingFulfillment));
        assert!(answer.starts_compensation().is_none());
        let next = scheduled_at(&answer).expect("keep asking");
        assert!(next > now + 1, "the next check is in the future");
        assert!(next <= DEADLINE, "the deadline is acted on in time");
        let gap = next - (now + 1);
        if next < DEADLINE {
            assert!(
                gap >= previous_gap,
                "backoff never shrinks: {gap} < {previous_gap}"
            );
            assert!(gap <= policy().max_check_delay_ms);
        }
        previous_gap = gap;
        now = next;
        if now < DEADLINE {
            let check = run.feed(FulfillmentInput::CheckDue, now);
            assert!(
                calls_business(&check),
                "before the deadline the business is asked again"
            );
            calls += 1;
        }
    }
    assert!(
        calls >= 5,
        "several checks happen before a one-hour deadline"
    );
    assert_eq!(run.compensation_refunds_started(), 0);
}

#[test]
fn a_deadline_tick_stops_business_calls_and_reads_the_fact_once_more_before_any_refund() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);

    let settling = run.feed(FulfillmentInput::CheckDue, DEADLINE);
    assert!(
        !calls_business(&settling),
        "no business action at the deadline"
    );
    assert!(settling.starts_compensation().is_none());
    assert_eq!(scheduled_at(&settling), Some(settles()));

    let tick = run.feed(FulfillmentInput::CheckDue, settles());
    assert!(!calls_business(&tick));
    assert!(reads_once_more(&tick), "{tick:?}");
    assert!(
        tick.starts_compensation().is_none(),
        "no refund before the last read"
    );
    assert_eq!(run.snap.state, F::AwaitingFulfillment);

    for later in [settles() + 1, settles() + 86_400_000] {
        let d = run.feed(FulfillmentInput::CheckDue, later);
        assert!(
            !calls_business(&d),
            "never a business call after the deadline"
        );
    }
}

#[test]
fn deadline_passed_and_still_not_fulfilled_starts_exactly_one_compensation_refund() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);
    run.feed(FulfillmentInput::CheckDue, settles());
    run.feed(FulfillmentInput::CheckDue, settles() + 1); // duplicate tick

    let last_read = run.feed(not_fulfilled(settles() + 2), settles() + 3);
    assert_eq!(last_read.new_state(), Some(F::Compensating));
    assert_eq!(
        last_read.effects()[0],
        FulfillmentEffect::StartCompensationRefund {
            refund_reference: compensation_refund_reference(A1),
            reason: CompensationReason::FulfillmentDeadlinePassed,
        }
    );

    // Every duplicate trigger afterwards: no second refund.
    run.feed(not_fulfilled(settles() + 2), settles() + 4);
    run.feed(not_fulfilled(settles() + 5), settles() + 6);
    run.feed(FulfillmentInput::CheckDue, settles() + 7);
    run.feed(
        fact(BusinessFact::NoAnswer(NoAnswer::Timeout), settles() + 8),
        settles() + 9,
    );
    run.feed(
        refund_outcome(A1, CompensationRefundOutcome::Unknown),
        settles() + 10,
    );
    assert_eq!(run.compensation_refunds_started(), 1);
    assert_eq!(run.snap.state, F::Compensating);
}

#[test]
fn a_stale_not_fulfilled_read_from_before_the_deadline_only_triggers_one_more_read() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);
    // Read one second before the deadline, delivered long after it settled.
    let d = run.feed(not_fulfilled(DEADLINE - 1_000), settles() + 60_000);
    assert_eq!(d.new_state(), Some(F::AwaitingFulfillment));
    assert!(reads_once_more(&d));
    assert!(d.starts_compensation().is_none());

    // A read started while calls may still be in flight proves nothing either.
    let d = run.feed(not_fulfilled(DEADLINE + 1), settles() + 60_001);
    assert!(reads_once_more(&d));
    assert!(d.starts_compensation().is_none());
}

#[test]
fn a_timeout_or_an_error_is_never_read_as_not_fulfilled() {
    for no_answer in [NoAnswer::Timeout, NoAnswer::Error] {
        let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);
        for now in [
            PAID_AT + 1,
            DEADLINE - 1,
            DEADLINE,
            settles(),
            settles() + 3_600_000,
        ] {
            let d = run.feed(fact(BusinessFact::NoAnswer(no_answer), now), now);
            assert_eq!(d.new_state(), Some(F::AwaitingFulfillment), "at {now}");
            assert!(d.starts_compensation().is_none(), "at {now}");
            assert!(scheduled_at(&d).is_some_and(|at| at > now));
        }
        assert_eq!(run.compensation_refunds_started(), 0);
    }
}

#[test]
fn a_business_that_never_answers_goes_to_manual_review_never_to_a_blind_refund() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);
    let give_up = settles() + policy().unanswered_review_after_ms;
    let d = run.feed(
        fact(BusinessFact::NoAnswer(NoAnswer::Error), give_up),
        give_up,
    );
    assert_eq!(d.new_state(), Some(F::ManualReview));
    assert_eq!(run.snap.review, Some(ReviewReason::FactUnavailable));
    assert!(d.starts_compensation().is_none());
    assert_eq!(emitted(&d), ["fulfillment.manual_review"]);
}

#[test]
fn push_mode_without_a_confirmation_compensates_once_the_deadline_settles() {
    let mut run = Run::paid(FulfillmentMode::Push, A1, &[]);
    assert!(run
        .feed(FulfillmentInput::CheckDue, DEADLINE)
        .starts_compensation()
        .is_none());
    let d = run.feed(FulfillmentInput::CheckDue, settles());
    assert_eq!(d.new_state(), Some(F::Compensating));
    assert_eq!(
        d.starts_compensation(),
        Some(compensation_refund_reference(A1).as_str())
    );
    run.feed(FulfillmentInput::CheckDue, settles() + 1);
    assert_eq!(run.compensation_refunds_started(), 1);
}

#[test]
fn a_payment_that_succeeds_after_the_deadline_never_calls_the_business_action() {
    let late = settles() + 1;
    let mut pull = Run::pending(FulfillmentMode::Pull, &[]);
    let d = pull.feed(paid(A1), late);
    assert!(!calls_business(&d));
    assert!(
        reads_once_more(&d),
        "the fact is read once before any refund"
    );
    assert!(d.starts_compensation().is_none());

    let mut push_mode = Run::pending(FulfillmentMode::Push, &[]);
    let d = push_mode.feed(paid(A1), late);
    assert_eq!(d.new_state(), Some(F::Compensating));
    assert_eq!(push_mode.snap.attempt_reference.as_deref(), Some(A1));
    assert_eq!(
        push_mode.snap.compensation,
        Some(Compensation {
            refund_reference: "cmp_h2r_u16_p1".into(),
            reason: CompensationReason::FulfillmentDeadlinePassed,
        })
    );
}

#[test]
fn a_read_that_claims_to_start_in_the_future_is_rejected() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);
    assert!(matches!(
        run.feed(not_fulfilled(settles() + 10), settles()),
        FulfillmentDecision::Reject(FulfillmentRefusal::ReadInTheFuture { .. })
    ));
    assert_eq!(run.snap.state, F::AwaitingFulfillment);
}

// ---- refund safety ---------------------------------------------------------

#[test]
fn once_fulfilled_no_automatic_input_leads_to_a_refund() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
    run.feed(fulfilled_by(A1, PAID_AT + 1), PAID_AT + 2);
    assert_eq!(run.snap.state, F::Fulfilled);

    let after = settles() + 86_400_000;
    let automatic = [
        (FulfillmentInput::CheckDue, DEADLINE - 1),
        (FulfillmentInput::CheckDue, settles()),
        (FulfillmentInput::CheckDue, after),
        (not_fulfilled(after), after),
        (not_fulfilled(PAID_AT), after),
        (
            fact(BusinessFact::NoAnswer(NoAnswer::Timeout), after),
            after,
        ),
        (fulfilled_by(A1, after), after),
        (paid(A1), after),
        (push(A1), after),
    ];
    for (input, now) in automatic {
        let d = run.feed(input.clone(), now);
        assert!(
            matches!(d, FulfillmentDecision::Ignore(_)),
            "{input:?} → {d:?}"
        );
    }
    // A contradicting attribution is flagged, never acted on.
    for reported in [Some(A2), Some("h2r_stranger"), None] {
        let d = run.feed(
            fact(
                BusinessFact::Fulfilled {
                    attributed_to: reported.map(str::to_owned),
                },
                after,
            ),
            after,
        );
        assert_eq!(
            d,
            FulfillmentDecision::NeedsReview(ReviewReason::AttributionChanged {
                recorded: A1.into(),
                reported: reported.map(str::to_owned),
            })
        );
    }
    assert!(matches!(
        run.feed(
            refund_outcome(A1, CompensationRefundOutcome::Succeeded),
            after
        ),
        FulfillmentDecision::Reject(FulfillmentRefusal::NoCompensationRefund)
    ));
    assert_eq!(run.snap.state, F::Fulfilled);
    assert_eq!(run.compensation_refunds_started(), 0);
}

#[test]
fn a_stale_scanner_task_after_fulfilled_does_nothing() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);
    let snapshot_seen_by_the_scanner = run.snap.clone();
    run.feed(fulfilled_by(A1, PAID_AT + 1), PAID_AT + 2);

    // The scanner's task carried the old snapshot; the one door re-reads.
    assert_eq!(snapshot_seen_by_the_scanner.state, F::AwaitingFulfillment);
    let d = run.feed(FulfillmentInput::CheckDue, settles() + 1);
    assert_eq!(d, FulfillmentDecision::Ignore(IgnoreReason::Stale));
    assert!(d.effects().is_empty());
    assert_eq!(run.snap.state, F::Fulfilled);
}

#[test]
fn the_compensation_refund_reference_is_derived_from_the_attempt_reference() {
    assert_eq!(compensation_refund_reference(A1), "cmp_h2r_u16_p1");
    assert_eq!(
        compensation_refund_reference(A1),
        compensation_refund_reference(A1),
        "every retry names the same refund"
    );
    assert_ne!(
        compensation_refund_reference(A1),
        compensation_refund_reference(A2)
    );
}

#[test]
fn compensation_refund_success_compensates_failure_goes_to_manual_review_unknown_stays() {
    let compensating = || {
        let mut run = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
        run.feed(fulfilled_by(A2, PAID_AT + 1), PAID_AT + 2);
        assert_eq!(run.snap.state, F::Compensating);
        run
    };

    let mut unknown = compensating();
    let d = unknown.feed(
        refund_outcome(A1, CompensationRefundOutcome::Unknown),
        PAID_AT + 3,
    );
    assert_eq!(d, FulfillmentDecision::Ignore(IgnoreReason::Duplicate));
    assert_eq!(unknown.snap.state, F::Compensating);

    let mut succeeded = compensating();
    let d = succeeded.feed(
        refund_outcome(A1, CompensationRefundOutcome::Succeeded),
        PAID_AT + 3,
    );
    assert_eq!(d.new_state(), Some(F::Compensated));
    assert_eq!(emitted(&d), ["fulfillment.compensated"]);
    assert_eq!(
        succeeded.feed(
            refund_outcome(A1, CompensationRefundOutcome::Succeeded),
            PAID_AT + 4
        ),
        FulfillmentDecision::Ignore(IgnoreReason::Duplicate)
    );

    let mut failed = compensating();
    let d = failed.feed(
        refund_outcome(A1, CompensationRefundOutcome::Failed),
        PAID_AT + 3,
    );
    assert_eq!(d.new_state(), Some(F::ManualReview));
    assert_eq!(
        failed.snap.review,
        Some(ReviewReason::CompensationRefundFailed {
            refund_reference: compensation_refund_reference(A1)
        })
    );
}

#[test]
fn a_refund_outcome_for_another_reference_is_rejected() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
    run.feed(fulfilled_by(A2, PAID_AT + 1), PAID_AT + 2);
    let d = run.feed(
        refund_outcome(A2, CompensationRefundOutcome::Succeeded),
        PAID_AT + 3,
    );
    assert!(matches!(
        d,
        FulfillmentDecision::Reject(FulfillmentRefusal::NotTheCompensationRefund { .. })
    ));
    assert_eq!(run.snap.state, F::Compensating);
}

#[test]
fn a_fact_crediting_this_payment_during_compensation_is_flagged_and_the_refund_goes_on() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[]);
    run.feed(not_fulfilled(settles()), settles());
    assert_eq!(run.snap.state, F::Compensating);
    assert_eq!(
        run.feed(fulfilled_by(A1, settles() + 1), settles() + 1),
        FulfillmentDecision::NeedsReview(ReviewReason::FulfilledWhileCompensating)
    );
    assert_eq!(run.snap.state, F::Compensating);
    run.feed(
        refund_outcome(A1, CompensationRefundOutcome::Succeeded),
        settles() + 2,
    );
    assert_eq!(
        run.feed(fulfilled_by(A1, settles() + 3), settles() + 3),
        FulfillmentDecision::NeedsReview(ReviewReason::FulfilledAfterCompensation)
    );
    assert_eq!(run.snap.state, F::Compensated);
}

// ---- push confirmation -----------------------------------------------------

#[test]
fn a_push_confirmation_fulfils_and_a_repeated_one_is_an_idempotent_duplicate() {
    let mut run = Run::paid(FulfillmentMode::Push, A1, &[]);
    let d = run.feed(push(A1), PAID_AT + 5);
    assert_eq!(d.new_state(), Some(F::Fulfilled));
    assert_eq!(
        run.feed(push(A1), PAID_AT + 6),
        FulfillmentDecision::Ignore(IgnoreReason::Duplicate)
    );
    assert_eq!(
        run.feed(push(A2), PAID_AT + 7),
        FulfillmentDecision::Reject(FulfillmentRefusal::AlreadyFulfilled {
            attributed_to: A1.into()
        })
    );
}

#[test]
fn a_push_confirmation_naming_a_sibling_compensates_this_payment() {
    let mut run = Run::paid(FulfillmentMode::Push, A1, &[A2]);
    let d = run.feed(push(A2), PAID_AT + 5);
    assert_eq!(d.new_state(), Some(F::Compensating));
    assert_eq!(
        run.snap.compensation.as_ref().map(|c| c.reason),
        Some(CompensationReason::FulfilledElsewhere)
    );
}

#[test]
fn a_push_with_an_unknown_reference_is_refused_without_freezing_automation() {
    let mut run = Run::paid(FulfillmentMode::Push, A1, &[A2]);
    let d = run.feed(push("typo"), PAID_AT + 5);
    assert_eq!(
        d,
        FulfillmentDecision::Reject(FulfillmentRefusal::UnknownAttempt {
            reference: "typo".into()
        })
    );
    assert_eq!(run.snap.state, F::AwaitingFulfillment);
}

#[test]
fn a_push_after_compensation_started_is_refused_and_says_what_happened_to_the_money() {
    let mut run = Run::paid(FulfillmentMode::Push, A1, &[]);
    run.feed(FulfillmentInput::CheckDue, settles());
    assert_eq!(run.snap.state, F::Compensating);

    let d = run.feed(push(A1), settles() + 1);
    assert_eq!(
        d,
        FulfillmentDecision::Reject(FulfillmentRefusal::RefundInProgress {
            refund_reference: "cmp_h2r_u16_p1".into(),
            reason: CompensationReason::FulfillmentDeadlinePassed,
        })
    );
    let message = d.explain();
    assert!(
        message.contains("being returned") && message.contains("cmp_h2r_u16_p1"),
        "{message}"
    );

    run.feed(
        refund_outcome(A1, CompensationRefundOutcome::Succeeded),
        settles() + 2,
    );
    let d = run.feed(push(A1), settles() + 3);
    assert!(matches!(
        d,
        FulfillmentDecision::Reject(FulfillmentRefusal::Refunded { .. })
    ));
    assert!(d.explain().contains("back with the customer"), "{d:?}");
    assert!(d.explain().contains("fulfillment_deadline_passed"));
}

#[test]
fn a_push_confirmation_racing_the_compensation_decision_lets_exactly_one_win() {
    // Both sides decide on the same snapshot (version v); the store's CAS on
    // the version lets the first applied win, the loser re-reads and decides
    // again.
    fn race(push_first: bool) -> (Run, FulfillmentDecision) {
        let mut run = Run::paid(FulfillmentMode::Push, A1, &[]);
        let seen = run.snap.clone();
        let now = settles();
        let by_push = decide_fulfillment(&seen, &push(A1), now, &policy());
        let by_scanner = decide_fulfillment(&seen, &FulfillmentInput::CheckDue, now, &policy());
        assert_eq!(by_push.new_state(), Some(F::Fulfilled));
        assert_eq!(by_scanner.new_state(), Some(F::Compensating));

        let (winner, loser_input) = if push_first {
            (by_push, FulfillmentInput::CheckDue)
        } else {
            (by_scanner, push(A1))
        };
        run.snap = run.snap.applied(&winner);
        run.decisions.push(winner);
        assert_ne!(run.snap.version, seen.version, "the loser's CAS misses");
        let retried = run.feed(loser_input, now);
        (run, retried)
    }

    let (run, scanner_retry) = race(true);
    assert_eq!(run.snap.state, F::Fulfilled);
    assert_eq!(
        scanner_retry,
        FulfillmentDecision::Ignore(IgnoreReason::Stale)
    );
    assert_eq!(run.compensation_refunds_started(), 0);

    let (run, push_retry) = race(false);
    assert_eq!(run.snap.state, F::Compensating);
    assert!(matches!(
        push_retry,
        FulfillmentDecision::Reject(FulfillmentRefusal::RefundInProgress { .. })
    ));
    assert_eq!(run.compensation_refunds_started(), 1);
}

// ---- manual review ---------------------------------------------------------

#[test]
fn manual_review_is_left_only_by_an_operator_resolution() {
    let frozen = || {
        let mut run = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
        run.feed(
            fact(
                BusinessFact::Fulfilled {
                    attributed_to: None,
                },
                PAID_AT,
            ),
            PAID_AT,
        );
        assert_eq!(run.snap.state, F::ManualReview);
        run
    };

    let mut run = frozen();
    assert_eq!(
        run.feed(push(A1), PAID_AT + 1),
        FulfillmentDecision::Reject(FulfillmentRefusal::UnderReview(Some(
            ReviewReason::FactWithoutAttribution
        )))
    );
    assert_eq!(
        run.feed(
            refund_outcome(A1, CompensationRefundOutcome::Succeeded),
            PAID_AT + 1
        ),
        FulfillmentDecision::Ignore(IgnoreReason::Stale)
    );

    let op = FulfillmentInput::Operator;
    let mut run = frozen();
    let d = run.feed(op(OperatorResolution::Fulfilled), PAID_AT + 2);
    assert_eq!(d.new_state(), Some(F::Fulfilled));

    let mut run = frozen();
    let d = run.feed(
        op(OperatorResolution::Compensate {
            reason: CompensationReason::FulfilledElsewhere,
        }),
        PAID_AT + 2,
    );
    assert_eq!(d.new_state(), Some(F::Compensating));
    assert_eq!(d.starts_compensation(), Some("cmp_h2r_u16_p1"));

    let mut run = frozen();
    let d = run.feed(op(OperatorResolution::ResumeAutomation), PAID_AT + 2);
    assert_eq!(d.new_state(), Some(F::AwaitingFulfillment));
    assert!(scheduled_at(&d).is_some_and(|at| at > PAID_AT + 2));
}

#[test]
fn an_operator_cannot_restart_a_compensation_refund_that_failed() {
    let mut run = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
    run.feed(fulfilled_by(A2, PAID_AT), PAID_AT);
    run.feed(
        refund_outcome(A1, CompensationRefundOutcome::Failed),
        PAID_AT + 1,
    );
    assert_eq!(run.snap.state, F::ManualReview);

    for resolution in [
        OperatorResolution::Compensate {
            reason: CompensationReason::FulfilledElsewhere,
        },
        OperatorResolution::ResumeAutomation,
    ] {
        assert_eq!(
            run.feed(FulfillmentInput::Operator(resolution), PAID_AT + 2),
            FulfillmentDecision::Reject(FulfillmentRefusal::CompensationAlreadyStarted {
                refund_reference: "cmp_h2r_u16_p1".into()
            })
        );
    }
    let d = run.feed(
        FulfillmentInput::Operator(OperatorResolution::RefundedManually {
            refund_reference: "man_r_1".into(),
        }),
        PAID_AT + 3,
    );
    assert_eq!(d.new_state(), Some(F::Compensated));
}

#[test]
fn operator_resolutions_outside_manual_review_are_refused() {
    let mut fulfilled = Run::paid(FulfillmentMode::Push, A1, &[]);
    fulfilled.feed(push(A1), PAID_AT + 1);
    let mut compensated = Run::paid(FulfillmentMode::Push, A1, &[]);
    compensated.feed(FulfillmentInput::CheckDue, settles());
    compensated.feed(
        refund_outcome(A1, CompensationRefundOutcome::Succeeded),
        settles() + 1,
    );
    for mut run in [
        fulfilled,
        compensated,
        Run::paid(FulfillmentMode::Pull, A1, &[]),
    ] {
        let state = run.snap.state;
        let d = run.feed(
            FulfillmentInput::Operator(OperatorResolution::Compensate {
                reason: CompensationReason::FulfillmentDeadlinePassed,
            }),
            settles() + 2,
        );
        assert_eq!(
            d,
            FulfillmentDecision::Reject(FulfillmentRefusal::NotUnderReview(state))
        );
    }
}

// ---- the stories -----------------------------------------------------------

/// Seed 000 §11: the wallet's response is lost, a delayed message and the
/// scanner race on the query, the renewal's RPC response is lost too, the
/// business fact attributes the renewal to this payment, a stale scanner task
/// arrives last. One charge, no refund, fulfilled.
#[test]
fn seed_000_section_11_story_ends_fulfilled_with_one_charge_and_no_refund() {
    use AttemptState as A;
    use EventKind as K;
    use EvidenceSource as E;

    let mut payment = Sim::new(A::Submitted, CaptureMode::Automatic);
    payment.attempt.reference = A1.into();
    let mut fulfillment = Run::pending(FulfillmentMode::Pull, &[]);

    // The wallet charged, but its answer was lost: UNKNOWN, never a new attempt.
    let timeout = PaymentEvent {
        failure: Some(Failure {
            category: FailureCategory::Unknown,
            code: "timeout".into(),
            message: "no answer within 1s".into(),
        }),
        ..PaymentEvent::new(K::ResultUnknown, E::SyncResponse)
    };
    payment.feed(&timeout);
    assert_eq!(payment.attempt.state, A::Unknown);
    assert_eq!(
        decide_order(
            &payment.order,
            Some(payment.attempt.state),
            OrderCommand::StartAttempt
        ),
        Decision::Reject(RejectReason::AttemptInFlight(A::Unknown))
    );

    // A delayed message and the scanner both query with the same reference.
    let query_success = PaymentEvent {
        attempt_reference: Some(A1.into()),
        psp_reference: Some("wallet_901".into()),
        amount: Some(eur(PAYMENT)),
        raw_status: "SUCCESS".into(),
        ..PaymentEvent::new(K::PaymentSucceeded, E::Query)
    };
    assert!(payment.feed(&query_success).is_apply());
    assert_eq!(
        payment.feed(&query_success),
        Decision::Ignore(IgnoreReason::Duplicate),
        "the second query's success changes nothing"
    );
    assert_eq!(
        payment.outbox,
        [OutboxEvent::PaymentSucceeded],
        "one charge, announced once"
    );

    // PAYED: the fulfillment starts, the renewal is called.
    let start = fulfillment.feed(paid(&payment.attempt.reference), PAID_AT);
    assert!(calls_business(&start));
    let started_again = fulfillment.feed(paid(A1), PAID_AT + 1);
    assert_eq!(
        started_again,
        FulfillmentDecision::Ignore(IgnoreReason::Duplicate)
    );

    // The renewal committed with resume_order_no = A1, but its RPC answer was lost.
    let lost = fulfillment.feed(
        fact(BusinessFact::NoAnswer(NoAnswer::Timeout), PAID_AT + 10),
        PAID_AT + 1_010,
    );
    assert_eq!(lost.new_state(), Some(F::AwaitingFulfillment));
    assert!(lost.starts_compensation().is_none());

    // Reading the business's own record: done, and attributed to this payment.
    let read = fulfillment.feed(fulfilled_by(A1, PAID_AT + 1_020), PAID_AT + 1_030);
    assert_eq!(read.new_state(), Some(F::Fulfilled));

    // The stale scanner task (it still believed PAYED) arrives last.
    assert_eq!(
        fulfillment.feed(FulfillmentInput::CheckDue, PAID_AT + 60_000),
        FulfillmentDecision::Ignore(IgnoreReason::Stale)
    );
    assert_eq!(fulfillment.snap.state, F::Fulfilled);
    assert_eq!(fulfillment.compensation_refunds_started(), 0);
    assert!(
        request_refund(&payment.order, eur(PAYMENT)).is_ok(),
        "only an explicit after-sales refund could still be asked for"
    );
}

/// Seed 000 §11, the failure branch: the renewal never happens before the
/// deadline; after it, one last read, then one compensation refund whose
/// response is lost and which converges through a query of the same reference.
#[test]
fn seed_000_section_11_failure_branch_refunds_once_through_a_lost_refund_response() {
    use EventKind as K;
    use EvidenceSource as E;
    use RefundState as R;

    let payment = Sim::new(AttemptState::Succeeded, CaptureMode::Automatic);
    let mut fulfillment = Run::paid(FulfillmentMode::Pull, A1, &[]);
    fulfillment.feed(not_fulfilled(PAID_AT + 5), PAID_AT + 6);

    let tick = fulfillment.feed(FulfillmentInput::CheckDue, settles());
    assert!(reads_once_more(&tick) && !calls_business(&tick));
    let last_read = fulfillment.feed(not_fulfilled(settles() + 1), settles() + 2);
    let refund_reference = last_read
        .starts_compensation()
        .expect("the refund starts after the last read")
        .to_owned();
    assert_eq!(refund_reference, "cmp_h2r_u16_p1");

    // The store reserves the whole payment for the compensation refund.
    let reserve = request_refund(&payment.order, eur(PAYMENT)).expect("a succeeded payment");
    let mut order = payment.order.clone();
    order.amounts = order.amounts.apply_all(&[reserve]).unwrap();
    let mut cmp = refund(R::Created, PAYMENT);
    cmp.reference = refund_reference.clone();

    // The refund's response is lost: UNKNOWN, the fulfillment stays compensating.
    let lost = PaymentEvent {
        action_reference: Some(refund_reference.clone()),
        ..PaymentEvent::new(K::RefundUnknown, E::SyncResponse)
    };
    let d = decide_refund(&order, &cmp, &lost);
    assert!(d.effects().contains(&Effect::ScheduleQuery));
    cmp.state = R::Unknown;
    fulfillment.feed(
        FulfillmentInput::CompensationRefund {
            refund_reference: refund_reference.clone(),
            outcome: CompensationRefundOutcome::Unknown,
        },
        settles() + 3,
    );
    assert_eq!(fulfillment.snap.state, F::Compensating);
    // A duplicate deadline tick meanwhile starts nothing.
    fulfillment.feed(FulfillmentInput::CheckDue, settles() + 4);

    // The query with the same reference finds the refund succeeded.
    let found = PaymentEvent {
        action_reference: Some(refund_reference.clone()),
        amount: Some(eur(PAYMENT)),
        ..PaymentEvent::new(K::RefundSucceeded, E::Query)
    };
    assert!(decide_refund(&order, &cmp, &found).is_apply());
    let done = fulfillment.feed(
        FulfillmentInput::CompensationRefund {
            refund_reference,
            outcome: CompensationRefundOutcome::Succeeded,
        },
        settles() + 5,
    );
    assert_eq!(done.new_state(), Some(F::Compensated));
    assert_eq!(fulfillment.compensation_refunds_started(), 1);
}

#[test]
fn a_late_fulfilled_for_attempt_1_after_attempt_2_fulfilled_compensates_attempt_1_and_keeps_attempt_2(
) {
    // Attempt 1's payment succeeded but its renewal stalled; the user paid
    // again (attempt 2), whose renewal went through.
    let mut first = Run::paid(FulfillmentMode::Pull, A1, &[A2]);
    let mut second = Run::paid(FulfillmentMode::Pull, A2, &[A1]);
    first.feed(
        fact(BusinessFact::NoAnswer(NoAnswer::Timeout), PAID_AT + 1),
        PAID_AT + 2,
    );

    let now = PAID_AT + 30_000;
    assert_eq!(
        second.feed(fulfilled_by(A2, now), now).new_state(),
        Some(F::Fulfilled)
    );
    // Attempt 1's delayed message now reads the same business record.
    let late = first.feed(fulfilled_by(A2, now + 1), now + 2);
    assert_eq!(late.new_state(), Some(F::Compensating));
    assert_eq!(
        first.snap.compensation.as_ref().map(|c| c.reason),
        Some(CompensationReason::FulfilledElsewhere)
    );
    first.feed(
        refund_outcome(A1, CompensationRefundOutcome::Succeeded),
        now + 3,
    );
    assert_eq!(first.snap.state, F::Compensated);

    // Everything attempt 1's compensation does leaves attempt 2 alone.
    assert_eq!(
        second.feed(fulfilled_by(A2, now + 4), now + 4),
        FulfillmentDecision::Ignore(IgnoreReason::Duplicate)
    );
    assert_eq!(second.snap.state, F::Fulfilled);
    assert_eq!(second.compensation_refunds_started(), 0);
}

#[test]
fn state_mode_and_reason_names_round_trip() {
    for state in FulfillmentState::ALL {
        assert_eq!(FulfillmentState::parse(state.as_str()), Some(*state));
    }
    assert!(F::Fulfilled.is_terminal() && F::Compensated.is_terminal());
    assert!(!F::ManualReview.is_terminal() && !F::Compensating.is_terminal());
    for mode in FulfillmentMode::ALL {
        assert_eq!(FulfillmentMode::parse(mode.as_str()), Some(*mode));
    }
    for reason in CompensationReason::ALL {
        assert_eq!(CompensationReason::parse(reason.as_str()), Some(*reason));
    }
    assert_eq!(
        CompensationReason::FulfillmentDeadlinePassed.as_str(),
        "fulfillment_deadline_passed"
    );
    assert_eq!(
        CompensationReason::FulfilledElsewhere.as_str(),
        "fulfilled_elsewhere"
    );
}

mod compensation_guard {
    use sluice_core::{
        guard_compensation, CompensationReason, FulfillmentDecision, FulfillmentEffect,
        FulfillmentEvent, FulfillmentState, IgnoreReason, ReviewReason,
    };

    fn compensate() -> FulfillmentDecision {
        FulfillmentDecision::Apply {
            new_state: FulfillmentState::Compensating,
            effects: vec![
                FulfillmentEffect::StartCompensationRefund {
                    refund_reference: "cmp_att_1".into(),
                    reason: CompensationReason::FulfillmentDeadlinePassed,
                },
                FulfillmentEffect::Emit(FulfillmentEvent::Compensating),
            ],
            rule: "deadline passed",
        }
    }

    #[test]
    fn a_compensation_with_nothing_left_to_refund_becomes_a_manual_review_without_alert() {
        let guarded = guard_compensation(compensate(), 0, 0, 1_000);
        assert_eq!(guarded.new_state(), Some(FulfillmentState::ManualReview));
        assert_eq!(guarded.starts_compensation(), None);
        assert!(guarded
            .effects()
            .contains(&FulfillmentEffect::RecordReview {
                reason: ReviewReason::NothingLeftToRefund {
                    refunded_minor: 1_000
                }
            }));
        assert!(!guarded
            .effects()
            .contains(&FulfillmentEffect::AlertContradictoryFact));
    }

    #[test]
    fn a_compensation_with_money_left_or_a_refund_in_flight_stands() {
        assert_eq!(guard_compensation(compensate(), 600, 0, 400), compensate());
        assert_eq!(guard_compensation(compensate(), 0, 1_000, 0), compensate());
    }

    #[test]
    fn decisions_that_start_no_compensation_are_left_alone() {
        let ignore = FulfillmentDecision::Ignore(IgnoreReason::Duplicate);
        assert_eq!(guard_compensation(ignore.clone(), 0, 0, 1_000), ignore);
    }
}
