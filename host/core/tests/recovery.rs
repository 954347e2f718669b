//! Issue 6's recovery policy: what the scanner does with every pending state,
//! the query backoff, and the outbox redelivery schedule.

use proptest::prelude::*;
use sluice_core::*;

use AttemptState as A;
use CaptureState as C;
use PendingState as P;
use RefundState as R;

const T0: i64 = 1_700_000_000_000;
const SEC: i64 = 1_000;
const HOUR: i64 = 3_600 * SEC;
const DAY: i64 = 24 * HOUR;

fn policy() -> RecoveryPolicy {
    RecoveryPolicy::default()
}

fn item(state: PendingState) -> PendingItem {
    PendingItem::new(state, "att_1", T0)
}

fn every_state() -> Vec<PendingState> {
    let mut all: Vec<PendingState> = A::ALL.iter().map(|s| P::Attempt(*s)).collect();
    all.extend(R::ALL.iter().map(|s| P::Refund(*s)));
    all.extend(C::ALL.iter().map(|s| P::Capture(*s)));
    all
}

/// The action's kind, for tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum K {
    Query,
    QueryBackoff,
    Escalate,
    Expire,
    ExpireAuth,
    NotYet,
    Nothing,
}

fn kind(action: &RecoveryAction) -> K {
    match action {
        RecoveryAction::QueryPsp { .. } => K::Query,
        RecoveryAction::QueryWithBackoff { .. } => K::QueryBackoff,
        RecoveryAction::EscalateToManualReview { .. } => K::Escalate,
        RecoveryAction::ExpireRequiresAction { .. } => K::Expire,
        RecoveryAction::ExpireAuthorization { .. } => K::ExpireAuth,
        RecoveryAction::NotYet { .. } => K::NotYet,
        RecoveryAction::Nothing => K::Nothing,
    }
}

/// For every state of every aggregate: the action one second after creation,
/// one minute after, ten minutes after (REQUIRES_ACTION still inside its one
/// hour) and two days after (UNKNOWN past its maximum age).
#[test]
fn every_pending_state_has_its_recovery_action() {
    use K::*;
    #[rustfmt::skip]
    let table: &[(PendingState, [K; 4])] = &[
        //                            +1 s     +1 min  +10 min  +2 days
        (P::Attempt(A::Created),        [NotYet, Query,  Query,   Escalate]),
        (P::Attempt(A::Submitted),      [NotYet, Query,  Query,   Escalate]),
        (P::Attempt(A::Processing),     [NotYet, NotYet, Query,   Escalate]),
        (P::Attempt(A::RequiresAction), [NotYet, NotYet, NotYet,  Escalate]),
        // Within its 7 days; the merchant captures or voids meanwhile.
        (P::Attempt(A::Authorized),     [NotYet, NotYet, NotYet,  NotYet]),
        (P::Attempt(A::Succeeded),      [Nothing, Nothing, Nothing, Nothing]),
        (P::Attempt(A::Failed),         [Nothing, Nothing, Nothing, Nothing]),
        (P::Attempt(A::Canceled),       [Nothing, Nothing, Nothing, Nothing]),
        (P::Attempt(A::Unknown),        [NotYet, QueryBackoff, QueryBackoff, Escalate]),
        (P::Refund(R::Created),         [NotYet, Query,  Query,   Escalate]),
        (P::Refund(R::Processing),      [NotYet, NotYet, Query,   Escalate]),
        (P::Refund(R::Unknown),         [NotYet, QueryBackoff, QueryBackoff, Escalate]),
        (P::Refund(R::Succeeded),       [Nothing, Nothing, Nothing, Nothing]),
        (P::Refund(R::Failed),          [Nothing, Nothing, Nothing, Nothing]),
        (P::Refund(R::Canceled),        [Nothing, Nothing, Nothing, Nothing]),
        (P::Capture(C::Created),        [NotYet, Query,  Query,   Escalate]),
        (P::Capture(C::Processing),     [NotYet, NotYet, Query,   Escalate]),
        (P::Capture(C::Unknown),        [NotYet, QueryBackoff, QueryBackoff, Escalate]),
        (P::Capture(C::Succeeded),      [Nothing, Nothing, Nothing, Nothing]),
        (P::Capture(C::Failed),         [Nothing, Nothing, Nothing, Nothing]),
    ];
    let states = every_state();
    assert_eq!(table.len(), states.len(), "the table covers every state");
    for state in states {
        let (_, expected) = table
            .iter()
            .find(|(s, _)| *s == state)
            .unwrap_or_else(|| panic!("{state:?} missing from the table"));
        for (at, want) in [T0 + SEC, T0 + 60 * SEC, T0 + 600 * SEC, T0 + 2 * DAY]
            .into_iter()
            .zip(expected)
        {
            let action = decide_recovery(&item(state), at, 0.5, &policy());
            assert_eq!(kind(&action), *want, "{state:?} at +{} s", (at - T0) / SEC);
            if let Some(reference) = action.psp_reference_used() {
                assert_eq!(reference, "att_1", "only the original reference");
            }
            if let Some(next) = action.next_retry_at_ms() {
                assert!(next > at, "{state:?}: next retry {next} not after {at}");
            }
        }
    }
}

#[test]
fn a_query_uses_the_original_reference_and_names_the_next_retry() {
    let mut refund = item(P::Refund(R::Unknown));
    refund.reference = "cmp_h2r_u16_p1".into();
    let action = decide_recovery(&refund, T0 + 60 * SEC, 0.0, &policy());
    assert_eq!(
        action,
        RecoveryAction::QueryWithBackoff {
            reference: "cmp_h2r_u16_p1".into(),
            next_retry_at_ms: T0 + 60 * SEC + policy().backoff_delay(1, 0.0),
        }
    );
}

#[test]
fn processing_is_queried_again_only_after_its_timeout_since_the_last_query() {
    let mut processing = item(P::Attempt(A::Processing));
    processing.last_attempt_at_ms = Some(T0 + 10 * 60 * SEC);
    processing.retry_count = 1;
    let timeout = policy().processing_timeout_ms;
    let last = T0 + 10 * 60 * SEC;
    assert_eq!(
        decide_recovery(&processing, last + timeout - 1, 0.3, &policy()),
        RecoveryAction::NotYet {
            next_retry_at_ms: last + timeout
        }
    );
    assert!(matches!(
        decide_recovery(&processing, last + timeout, 0.3, &policy()),
        RecoveryAction::QueryPsp { .. }
    ));
}

#[test]
fn unknown_is_escalated_after_its_maximum_age_and_still_queried_under_review() {
    let mut unknown = item(P::Attempt(A::Unknown));
    unknown.retry_count = 12;
    unknown.last_attempt_at_ms = Some(T0 + DAY - HOUR);
    let at = T0 + policy().max_unknown_age_ms;

    let escalate = decide_recovery(&unknown, at, 0.1, &policy());
    assert_eq!(
        escalate,
        RecoveryAction::EscalateToManualReview {
            reference: "att_1".into(),
            age_ms: policy().max_unknown_age_ms,
            next_retry_at_ms: at + policy().backoff_delay(13, 0.1),
        }
    );
    assert!(
        kind(&decide_recovery(&unknown, at - 1, 0.1, &policy())) != K::Escalate,
        "not a millisecond early"
    );

    unknown.in_manual_review = true;
    let under_review = decide_recovery(&unknown, at, 0.1, &policy());
    assert_eq!(
        kind(&under_review),
        K::QueryBackoff,
        "escalated once, queried forever"
    );
}

#[test]
fn anything_open_past_the_maximum_age_but_an_authorization_is_escalated_once_whatever_its_state() {
    // Found by the kill -9 test: a capture recorded PROCESSING by a process
    // killed before it sent the request; every query shows the payment still
    // uncaptured, so nothing but an operator can end it. Found by the
    // simulator (seeds 34 and 75): an Adyen-format attempt whose webhook the
    // PSP gave up on; its "query" replays the original request and gets the
    // original answer (pending, or the 3-D Secure redirect) forever.
    for state in [
        P::Attempt(A::Created),
        P::Attempt(A::Submitted),
        P::Attempt(A::Processing),
        P::Attempt(A::RequiresAction),
        P::Capture(C::Created),
        P::Capture(C::Processing),
        P::Refund(R::Created),
        P::Refund(R::Processing),
    ] {
        let mut open = item(state);
        open.retry_count = 40;
        open.last_attempt_at_ms = Some(T0 + DAY - HOUR);
        let at = T0 + policy().max_unknown_age_ms;
        assert_eq!(
            decide_recovery(&open, at, 0.3, &policy()),
            RecoveryAction::EscalateToManualReview {
                reference: "att_1".into(),
                age_ms: policy().max_unknown_age_ms,
                next_retry_at_ms: at + policy().backoff_delay(41, 0.3),
            },
            "{state:?}"
        );
        assert_ne!(
            kind(&decide_recovery(&open, at - 1, 0.3, &policy())),
            K::Escalate
        );
        open.in_manual_review = true;
        assert_ne!(
            kind(&decide_recovery(&open, at, 0.3, &policy())),
            K::Escalate
        );
    }
    // An authorization is not: it waits for the merchant within its validity.
    let attempt = item(P::Attempt(A::Authorized));
    assert_ne!(
        kind(&decide_recovery(&attempt, T0 + 2 * DAY, 0.3, &policy())),
        K::Escalate
    );
}

#[test]
fn requires_action_expires_at_its_expiry_or_after_the_default_ttl() {
    let mut waiting = item(P::Attempt(A::RequiresAction));
    waiting.expires_at_ms = Some(T0 + 15 * 60 * SEC);
    assert_eq!(
        decide_recovery(&waiting, T0 + 14 * 60 * SEC, 0.0, &policy()),
        RecoveryAction::NotYet {
            next_retry_at_ms: T0 + 15 * 60 * SEC
        }
    );
    assert_eq!(
        kind(&decide_recovery(
            &waiting,
            T0 + 15 * 60 * SEC,
            0.0,
            &policy()
        )),
        K::Expire
    );

    waiting.expires_at_ms = None;
    let ttl = policy().requires_action_ttl_ms;
    assert_eq!(
        kind(&decide_recovery(&waiting, T0 + ttl - 1, 0.0, &policy())),
        K::NotYet
    );
    assert_eq!(
        kind(&decide_recovery(&waiting, T0 + ttl, 0.0, &policy())),
        K::Expire
    );
}

#[test]
fn the_query_backoff_is_monotone_and_capped() {
    let p = policy();
    for jitter in [0.0, 0.25, 0.5, 0.999_999] {
        let mut previous = 0;
        for retries in 0..80 {
            let delay = p.backoff_delay(retries, jitter);
            assert!(delay >= previous, "retry {retries}, jitter {jitter}");
            assert!(delay <= p.max_backoff_ms);
            assert!(delay > 0);
            previous = delay;
        }
        assert!(
            previous >= p.max_backoff_ms / 2,
            "the cap is reached: {previous}"
        );
    }
    assert_eq!(p.nominal_backoff(0), p.base_backoff_ms);
    assert_eq!(p.nominal_backoff(1), 2 * p.base_backoff_ms);
    assert_eq!(p.nominal_backoff(u32::MAX), p.max_backoff_ms);
}

#[test]
fn jitter_stays_within_half_of_the_nominal_backoff_and_bad_jitter_is_clamped() {
    let p = policy();
    for retries in [0, 3, 20] {
        let nominal = p.nominal_backoff(retries);
        let low = p.backoff_delay(retries, 0.0);
        let high = p.backoff_delay(retries, 0.999_999);
        assert_eq!(low, nominal / 2);
        assert!(high < nominal && high > low);
        for bad in [f64::NAN, -1.0, f64::NEG_INFINITY] {
            assert_eq!(p.backoff_delay(retries, bad), low, "{bad} counts as 0");
        }
        for bad in [1.0, 7.5, f64::INFINITY] {
            let clamped = p.backoff_delay(retries, bad);
            assert!(
                clamped >= high && clamped < nominal,
                "{bad} is clamped below 1"
            );
        }
    }
    assert_ne!(
        p.backoff_delay(5, 0.1),
        p.backoff_delay(5, 0.9),
        "jitter spreads items that went unknown together"
    );
}

#[test]
fn outbox_redelivery_spans_at_least_three_days_and_is_bounded() {
    let schedule = OutboxRetryPolicy::default();
    let shortest = schedule.total_span_ms(0.0);
    let longest = schedule.total_span_ms(0.999_999);
    assert!(shortest >= 3 * DAY, "{} h", shortest / HOUR);
    assert!(longest <= 4 * DAY, "{} h", longest / HOUR);

    let mut previous = 0;
    let mut deliveries = 1;
    while let Some(delay) = outbox_retry_delay(deliveries, 0.5) {
        assert!(delay >= previous, "delivery {deliveries}");
        assert!(delay > 0 && delay <= schedule.max_delay_ms + schedule.max_delay_ms / 4);
        previous = delay;
        deliveries += 1;
    }
    assert_eq!(deliveries, schedule.max_deliveries, "then dead-letter");
    assert_eq!(outbox_retry_delay(deliveries + 100, 0.5), None);
    assert_eq!(outbox_retry_delay(0, 0.0), outbox_retry_delay(1, 0.0));
    assert_eq!(outbox_retry_delay(1, 0.0), Some(30 * SEC));
}

#[test]
fn outbox_jitter_only_lengthens_a_delay_by_at_most_a_quarter() {
    for attempt in 1..OutboxRetryPolicy::default().max_deliveries {
        let base = outbox_retry_delay(attempt, 0.0).unwrap();
        for jitter in [0.1, 0.5, 0.999_999, 3.0, f64::NAN] {
            let delay = outbox_retry_delay(attempt, jitter).unwrap();
            assert!(
                delay >= base && delay < base + base / 4 + 1,
                "{attempt} {jitter}"
            );
        }
    }
}

fn arb_state() -> impl Strategy<Value = PendingState> {
    proptest::sample::select(every_state())
}

fn arb_item() -> impl Strategy<Value = PendingItem> {
    // Timestamps over ~36 years around T0; clocks may disagree.
    let t = (T0 - 10 * DAY)..(T0 + 13_000 * DAY);
    (
        arb_state(),
        t.clone(),
        proptest::option::of(t.clone()),
        0u32..200,
        proptest::option::of(t.clone()),
        any::<bool>(),
        (
            proptest::option::of(t.clone()),
            proptest::option::of(0i64..40 * DAY),
            proptest::option::of(t),
        ),
    )
        .prop_map(
            |(state, created, last, retry_count, expires, in_manual_review, authorization)| {
                let (authorized_at, validity, void_requested_at) = authorization;
                PendingItem {
                    last_attempt_at_ms: last,
                    retry_count,
                    expires_at_ms: expires,
                    in_manual_review,
                    authorized_at_ms: authorized_at,
                    authorization_validity_ms: validity,
                    void_requested_at_ms: void_requested_at,
                    ..PendingItem::new(state, "ref_orig", created)
                }
            },
        )
}

fn arb_jitter() -> impl Strategy<Value = f64> {
    prop_oneof![8 => 0.0f64..1.0, 1 => any::<f64>()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5_000))]

    #[test]
    fn the_next_retry_is_always_in_the_future_and_bounded_after_contact(
        item in arb_item(),
        now in (T0 - 10 * DAY)..(T0 + 13_000 * DAY),
        jitter in arb_jitter(),
    ) {
        let p = policy();
        let action = decide_recovery(&item, now, jitter, &p);
        if let Some(next) = action.next_retry_at_ms() {
            prop_assert!(next > now, "{action:?} at {now}");
        }
        if action.psp_reference_used().is_some()
            || matches!(action, RecoveryAction::EscalateToManualReview { .. })
        {
            let bound = p.max_backoff_ms.max(p.processing_timeout_ms).max(p.submitted_timeout_ms);
            prop_assert!(action.next_retry_at_ms().unwrap() - now <= bound);
        }
        // Every non-terminal state keeps an exit (seed 000 §4), AUTHORIZED too.
        prop_assert_eq!(action == RecoveryAction::Nothing, item.state.is_terminal());
    }

    #[test]
    fn unknown_is_only_ever_queried_with_its_original_reference(
        item in arb_item(),
        now in (T0 - 10 * DAY)..(T0 + 13_000 * DAY),
        jitter in arb_jitter(),
    ) {
        let mut item = item;
        item.state = match item.state {
            P::Attempt(_) => P::Attempt(A::Unknown),
            P::Refund(_) => P::Refund(R::Unknown),
            P::Capture(_) => P::Capture(C::Unknown),
        };
        let action = decide_recovery(&item, now, jitter, &policy());
        match &action {
            RecoveryAction::QueryWithBackoff { reference, .. }
            | RecoveryAction::EscalateToManualReview { reference, .. } => {
                prop_assert_eq!(reference.as_str(), "ref_orig");
            }
            RecoveryAction::NotYet { .. } => {}
            other => prop_assert!(false, "UNKNOWN led to {:?}", other),
        }
    }

    #[test]
    fn a_second_scan_right_after_a_query_does_not_query_again(
        item in arb_item(),
        now in (T0 - 10 * DAY)..(T0 + 13_000 * DAY),
        jitter in arb_jitter(),
        again in 0i64..1_000,
    ) {
        let p = policy();
        let first = decide_recovery(&item, now, jitter, &p);
        if matches!(first, RecoveryAction::QueryPsp { .. } | RecoveryAction::QueryWithBackoff { .. }) {
            let queried = PendingItem {
                last_attempt_at_ms: Some(now),
                retry_count: item.retry_count + 1,
                ..item.clone()
            };
            let second = decide_recovery(&queried, now + again, jitter, &p);
            prop_assert!(
                matches!(second, RecoveryAction::NotYet { .. }),
                "{first:?} then {second:?}"
            );
        }
    }
}

// --- AUTHORIZED: the validity watch and the void recorded as sent ----------

fn authorized() -> PendingItem {
    PendingItem {
        authorized_at_ms: Some(T0 + HOUR),
        ..item(P::Attempt(A::Authorized))
    }
}

#[test]
fn an_authorization_waits_for_its_validity_to_end_and_is_then_expired_with_its_original_reference()
{
    let auth = authorized();
    let expires = T0 + HOUR + DEFAULT_AUTHORIZATION_VALIDITY_MS;
    assert_eq!(policy().authorization_validity_ms, 7 * DAY);
    assert_eq!(authorization_expires_at(&auth, &policy()), expires);
    assert_eq!(
        decide_recovery(&auth, expires - 1, 0.4, &policy()),
        RecoveryAction::NotYet {
            next_retry_at_ms: expires
        },
        "looked at again exactly when it expires"
    );
    assert_eq!(
        decide_recovery(&auth, expires, 0.4, &policy()),
        RecoveryAction::ExpireAuthorization {
            reference: "att_1".into(),
            expired_at_ms: expires,
            next_retry_at_ms: expires + policy().backoff_delay(1, 0.4),
        }
    );
}

#[test]
fn the_connector_account_or_adapter_validity_wins_over_the_default() {
    let auth = PendingItem {
        authorization_validity_ms: Some(2 * DAY),
        ..authorized()
    };
    let expires = T0 + HOUR + 2 * DAY;
    assert_eq!(authorization_expires_at(&auth, &policy()), expires);
    assert_eq!(
        kind(&decide_recovery(&auth, expires - 1, 0.0, &policy())),
        K::NotYet
    );
    assert_eq!(
        kind(&decide_recovery(&auth, expires, 0.0, &policy())),
        K::ExpireAuth
    );
    // An authorization recorded before the door kept its time: from creation.
    let legacy = PendingItem {
        authorized_at_ms: None,
        ..auth
    };
    assert_eq!(authorization_expires_at(&legacy, &policy()), T0 + 2 * DAY);
}

#[test]
fn a_void_recorded_as_sent_is_queried_after_the_send_timeout_and_escalated_once_past_the_maximum_age(
) {
    let sent_at = T0 + 2 * HOUR;
    let voiding = PendingItem {
        void_requested_at_ms: Some(sent_at),
        last_attempt_at_ms: Some(sent_at),
        ..authorized()
    };
    let timeout = policy().submitted_timeout_ms;
    assert_eq!(
        decide_recovery(&voiding, sent_at + timeout - 1, 0.0, &policy()),
        RecoveryAction::NotYet {
            next_retry_at_ms: sent_at + timeout
        }
    );
    assert_eq!(
        decide_recovery(&voiding, sent_at + timeout, 0.0, &policy()),
        RecoveryAction::QueryPsp {
            reference: "att_1".into(),
            next_retry_at_ms: sent_at + timeout + policy().backoff_delay(1, 0.0).max(timeout),
        }
    );
    let old = sent_at + policy().max_unknown_age_ms;
    assert_eq!(
        kind(&decide_recovery(&voiding, old, 0.0, &policy())),
        K::Escalate
    );
    let flagged = PendingItem {
        in_manual_review: true,
        ..voiding
    };
    assert_eq!(
        kind(&decide_recovery(&flagged, old, 0.0, &policy())),
        K::Query,
        "escalated once, queried on"
    );
}

fn resend_check() -> ResendCheck {
    ResendCheck {
        state: P::Attempt(A::Unknown),
        query_proved_absent: true,
        created_at_ms: T0,
        now_ms: T0 + HOUR,
        resend_window_ms: Some(23 * HOUR),
    }
}

#[test]
fn the_original_request_is_re_sent_only_when_the_psp_has_no_such_payment_refund_or_capture_within_its_key_retention(
) {
    assert_eq!(decide_resend(&resend_check()), Resend::Resend);
    for state in [
        P::Attempt(A::Submitted),
        P::Refund(R::Processing),
        P::Refund(R::Unknown),
        P::Capture(C::Processing),
        P::Capture(C::Unknown),
    ] {
        let check = ResendCheck {
            state,
            ..resend_check()
        };
        assert_eq!(decide_resend(&check), Resend::Resend, "{state:?}");
    }
    for refused in [
        ResendCheck {
            query_proved_absent: false,
            ..resend_check()
        },
        ResendCheck {
            resend_window_ms: None,
            ..resend_check()
        },
        ResendCheck {
            resend_window_ms: Some(0),
            ..resend_check()
        },
        ResendCheck {
            now_ms: T0 + 23 * HOUR,
            ..resend_check()
        },
        ResendCheck {
            now_ms: T0 - 1,
            ..resend_check()
        },
    ] {
        assert!(
            matches!(decide_resend(&refused), Resend::Keep { .. }),
            "{refused:?}"
        );
    }
    for state in every_state() {
        let open = matches!(
            state,
            P::Attempt(A::Submitted | A::Unknown)
                | P::Refund(R::Processing | R::Unknown)
                | P::Capture(C::Processing | C::Unknown)
        );
        if !open {
            let check = ResendCheck {
                state,
                ..resend_check()
            };
            assert!(
                matches!(decide_resend(&check), Resend::Keep { .. }),
                "{state:?}: known to the PSP, or nothing can prove it absent"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5_000))]

    #[test]
    fn an_authorized_attempt_always_keeps_an_exit_and_is_never_expired_early(
        item in arb_item(),
        now in (T0 - 10 * DAY)..(T0 + 13_000 * DAY),
        jitter in arb_jitter(),
    ) {
        let mut item = item;
        item.state = P::Attempt(A::Authorized);
        let p = policy();
        let action = decide_recovery(&item, now, jitter, &p);
        prop_assert!(action.next_retry_at_ms().is_some_and(|next| next > now), "{action:?}");
        match &action {
            RecoveryAction::ExpireAuthorization { reference, expired_at_ms, .. } => {
                prop_assert!(item.void_requested_at_ms.is_none());
                prop_assert_eq!(*expired_at_ms, authorization_expires_at(&item, &p));
                prop_assert!(now >= *expired_at_ms, "expired early");
                prop_assert_eq!(reference.as_str(), "ref_orig");
            }
            RecoveryAction::NotYet { next_retry_at_ms } if item.void_requested_at_ms.is_none() => {
                prop_assert_eq!(*next_retry_at_ms, authorization_expires_at(&item, &p));
            }
            RecoveryAction::QueryPsp { reference, .. }
            | RecoveryAction::EscalateToManualReview { reference, .. } => {
                prop_assert!(item.void_requested_at_ms.is_some(), "{action:?}");
                prop_assert_eq!(reference.as_str(), "ref_orig");
            }
            RecoveryAction::NotYet { .. } => {}
            other => prop_assert!(false, "AUTHORIZED led to {:?}", other),
        }
    }

    #[test]
    fn a_re_send_never_happens_outside_the_retention_or_without_proof_of_absence(
        state in arb_state(),
        absent in any::<bool>(),
        created in (T0 - 10 * DAY)..(T0 + 10 * DAY),
        now in (T0 - 10 * DAY)..(T0 + 20 * DAY),
        window in proptest::option::of(-DAY..3 * DAY),
    ) {
        let check = ResendCheck {
            state,
            query_proved_absent: absent,
            created_at_ms: created,
            now_ms: now,
            resend_window_ms: window,
        };
        if decide_resend(&check) == Resend::Resend {
            prop_assert!(absent);
            prop_assert!(matches!(
                state,
                P::Attempt(A::Submitted | A::Unknown)
                    | P::Refund(R::Processing | R::Unknown)
                    | P::Capture(C::Processing | C::Unknown)
            ));
            let window = window.unwrap_or(0);
            prop_assert!(now >= created && now - created < window);
        }
    }
}
