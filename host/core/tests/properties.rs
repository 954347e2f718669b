//! Properties over random event sequences (with duplicates, every evidence
//! source, mismatching references and amounts) and random amount movements.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::sample::select;
use sluice_core::*;

use AttemptState as A;
use EventKind as K;
use EvidenceSource as E;

fn arb_failure() -> impl Strategy<Value = Option<Failure>> {
    prop::option::of(
        select(FailureCategory::ALL.to_vec()).prop_map(|category| Failure {
            category,
            code: format!("{category}_code"),
            message: String::new(),
        }),
    )
}

/// Any event an attempt could be sent, mostly about the right PSP payment
/// and amount, sometimes not.
fn arb_event(kinds: Vec<EventKind>) -> impl Strategy<Value = PaymentEvent> {
    (
        select(kinds),
        select(EvidenceSource::ALL.to_vec()),
        prop_oneof![4 => Just(Some("pi_1")), 2 => Just(None), 1 => Just(Some("pi_2"))],
        prop_oneof![4 => Just(None), 4 => Just(Some(PAYMENT)), 1 => Just(Some(PAYMENT - 1))],
        prop::option::of(0u8..6),
        arb_failure(),
    )
        .prop_map(|(kind, evidence, psp, amount, id, failure)| PaymentEvent {
            psp_reference: psp.map(str::to_owned),
            amount: amount.map(eur),
            provider_event_id: id.map(|n| format!("evt_{n}")),
            failure,
            ..PaymentEvent::new(kind, evidence)
        })
}

fn arb_start() -> impl Strategy<Value = (AttemptState, CaptureMode)> {
    (
        select(vec![A::Created, A::Submitted]),
        select(vec![CaptureMode::Automatic, CaptureMode::Manual]),
    )
}

fn run(start: (AttemptState, CaptureMode), events: &[PaymentEvent]) -> Sim {
    let mut sim = Sim::new(start.0, start.1);
    for event in events {
        sim.feed(event);
    }
    sim
}

fn succeeded_count(sim: &Sim) -> usize {
    sim.outbox
        .iter()
        .filter(|o| **o == OutboxEvent::PaymentSucceeded)
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn no_terminal_state_is_ever_left_and_success_is_never_followed_by_failure(
        start in arb_start(),
        events in prop::collection::vec(arb_event(EventKind::ALL.to_vec()), 0..24),
    ) {
        let mut sim = Sim::new(start.0, start.1);
        for event in &events {
            let before = sim.clone();
            // `feed` also proves every decided effect applies to the amounts.
            sim.feed(event);
            if before.attempt.state.is_terminal() {
                prop_assert_eq!(sim.attempt.state, before.attempt.state);
            }
            if before.order.state.is_terminal() {
                prop_assert_eq!(sim.order.state, before.order.state);
            }
            if before.attempt.state == A::Succeeded {
                prop_assert_ne!(sim.attempt.state, A::Failed);
            }
            prop_assert!(sim.order.amounts.holds());
        }
        prop_assert!(succeeded_count(&sim) <= 1);
    }

    #[test]
    fn redelivering_events_in_place_changes_nothing(
        start in arb_start(),
        events in prop::collection::vec((arb_event(EventKind::ALL.to_vec()), 1usize..4), 0..20),
    ) {
        let once: Vec<PaymentEvent> = events.iter().map(|(e, _)| e.clone()).collect();
        let repeated: Vec<PaymentEvent> = events
            .iter()
            .flat_map(|(e, times)| std::iter::repeat_n(e.clone(), *times))
            .collect();
        let a = run(start, &once);
        let b = run(start, &repeated);
        prop_assert_eq!(a.attempt.state, b.attempt.state);
        prop_assert_eq!(a.order.state, b.order.state);
        prop_assert_eq!(a.order.amounts, b.order.amounts);
        prop_assert_eq!(a.outbox, b.outbox);
    }

    #[test]
    fn once_terminal_any_replay_of_earlier_events_changes_no_money_and_no_state(
        start in arb_start(),
        events in prop::collection::vec(arb_event(EventKind::ALL.to_vec()), 1..20),
        replay in prop::collection::vec(any::<prop::sample::Index>(), 1..20),
    ) {
        let mut sim = run(start, &events);
        prop_assume!(sim.attempt.state.is_terminal());
        let (state, order, amounts) = (sim.attempt.state, sim.order.state, sim.order.amounts);
        let successes = succeeded_count(&sim);
        for index in replay {
            sim.feed(index.get(&events));
        }
        prop_assert_eq!(sim.attempt.state, state);
        prop_assert_eq!(sim.order.state, order);
        prop_assert_eq!(sim.order.amounts, amounts);
        prop_assert_eq!(succeeded_count(&sim), successes);
    }

    #[test]
    fn a_verified_success_wins_whatever_order_the_progress_reports_arrive_in(
        start in arb_start(),
        mut events in prop::collection::vec(
            arb_event(vec![K::AttemptSubmitted, K::PaymentProcessing, K::CustomerActionRequired, K::ResultUnknown]),
            0..12,
        ),
        evidence in select(vec![E::Webhook, E::Query]),
        at in any::<prop::sample::Index>(),
    ) {
        for e in events.iter_mut() {
            e.psp_reference = Some("pi_1".into());
            e.amount = None;
        }
        let success = PaymentEvent {
            psp_reference: Some("pi_1".into()),
            ..PaymentEvent::new(K::PaymentSucceeded, evidence)
        };
        let position = at.index(events.len() + 1);
        events.insert(position, success);
        let sim = run(start, &events);
        prop_assert_eq!(sim.attempt.state, A::Succeeded);
        prop_assert_eq!(sim.order.state, OrderState::Succeeded);
        prop_assert_eq!(succeeded_count(&sim), 1);
        prop_assert_eq!(sim.order.amounts.captured, PAYMENT);
    }

    #[test]
    fn a_verified_decline_ends_the_attempt_but_not_the_order_in_any_order(
        start in arb_start(),
        mut events in prop::collection::vec(
            arb_event(vec![K::AttemptSubmitted, K::PaymentProcessing, K::CustomerActionRequired, K::ResultUnknown]),
            0..12,
        ),
        evidence in select(vec![E::Webhook, E::Query]),
        at in any::<prop::sample::Index>(),
    ) {
        for e in events.iter_mut() {
            e.psp_reference = Some("pi_1".into());
        }
        let decline = PaymentEvent {
            psp_reference: Some("pi_1".into()),
            ..event(K::PaymentFailed, evidence)
        };
        let position = at.index(events.len() + 1);
        events.insert(position, decline);
        let sim = run(start, &events);
        prop_assert_eq!(sim.attempt.state, A::Failed);
        prop_assert_eq!(sim.order.state, OrderState::Processing);
        prop_assert_eq!(client_status(&sim.view()), ClientStatus::Failed);
        prop_assert_eq!(sim.order.amounts, Amounts::default());
    }

    #[test]
    fn a_refund_never_leaves_a_terminal_state_and_settles_at_most_once(
        events in prop::collection::vec(arb_event(EventKind::ALL.to_vec()), 0..24),
    ) {
        let payment_amounts = Amounts { authorized: PAYMENT, captured: PAYMENT, refund_reserved: 300, ..Amounts::default() };
        let mut payment = order(OrderState::Succeeded, payment_amounts);
        let mut refund_row = refund(RefundState::Created, 300);
        let mut settled = 0;
        for e in &events {
            // Refund events speak of the refund's amount when they state one.
            let e = PaymentEvent { amount: e.amount.map(|_| eur(300)), ..e.clone() };
            let before = refund_row.state;
            if let Decision::Apply { new_state, cascade, effects, .. } = decide_refund(&payment, &refund_row, &e) {
                prop_assert_eq!(cascade, Cascade::default());
                payment.amounts = payment.amounts.apply_all(&effects).expect("decided effects apply");
                settled += effects.iter().filter(|x| matches!(x, Effect::SettleRefund { .. })).count();
                refund_row.state = new_state;
                refund_row.last_event = Some(EventIdentity::of(&e));
            }
            if before.is_terminal() {
                prop_assert_eq!(refund_row.state, before);
            }
            prop_assert!(payment.amounts.holds());
        }
        prop_assert!(settled <= 1);
        prop_assert_eq!(payment.state, OrderState::Succeeded, "a refund never fails the payment");
    }

    #[test]
    fn amount_invariants_hold_over_any_sequence_of_movements(
        ops in prop::collection::vec((0u8..10, -5i64..400), 0..40),
    ) {
        let mut amounts = Amounts::default();
        for (op, amount) in ops {
            let result = match op {
                0 => amounts.record_authorization(amount.max(1) * 3),
                1 => amounts.record_sale(amount),
                2 => amounts.reserve_capture(amount),
                3 => amounts.settle_capture(amount),
                4 => amounts.release_capture(amount),
                5 => amounts.void_authorization(),
                6 => amounts.reserve_refund(amount),
                7 => amounts.settle_refund_success(amount),
                8 => amounts.release_refund(amount),
                _ => amounts.reserve_refund(amounts.refundable()),
            };
            if let Ok(next) = result {
                prop_assert!(next.holds(), "{:?} -> {:?}", amounts, next);
                prop_assert!(next.captured >= amounts.captured, "captured money never shrinks");
                prop_assert!(next.refunded >= amounts.refunded, "refunded money never shrinks");
                amounts = next;
            }
            prop_assert!(0 <= amounts.captured && amounts.captured + amounts.capture_reserved <= amounts.authorized);
            prop_assert!(0 <= amounts.refunded && amounts.refunded + amounts.refund_reserved <= amounts.captured);
        }
    }
}
