//! Issue 7's property: two payments (attempts) serve one business goal; a
//! random schedule interleaves payment successes, business commits, fact
//! reads delivered late and out of order, deadline ticks, push
//! confirmations, compensation refund outcomes and duplicate deliveries.
//! After every step:
//!
//! - a `fulfilled` payment has zero compensation refunds, and the business
//!   really credited it;
//! - a `compensated` payment has exactly one succeeded compensation refund,
//!   and it is not the payment that reached the goal;
//! - no payment ever starts a second compensation refund;
//! - `fulfilled` and `compensated` are never left.

use proptest::prelude::*;
use sluice_core::*;

const REFS: [&str; 2] = ["h2r_u16_p1", "h2r_u16_p2"];
const DEADLINES: [i64; 2] = [1_000, 1_600];

fn policy() -> FulfillmentPolicy {
    FulfillmentPolicy {
        first_check_delay_ms: 10,
        max_check_delay_ms: 120,
        action_timeout_ms: 50,
        unanswered_review_after_ms: 700,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Advance(i64),
    PaymentSucceeds(usize),
    /// The business performs the action for payment `i` (only before its
    /// deadline, only once the payment succeeded, only if the goal is open).
    BusinessCommits(usize),
    /// A read of the business fact starts now; `kind` picks an honest
    /// answer, no answer, or a contradictory one.
    StartRead(usize, u8),
    /// Deliver a read that is still in flight (any of them: out of order).
    Deliver(usize),
    Tick(usize),
    /// The merchant confirms, truthfully, whoever reached the goal.
    Push(usize),
    /// The PSP answers the compensation refund of payment `i`.
    RefundAnswer(usize, CompensationRefundOutcome),
    /// Deliver again something that was already delivered.
    Redeliver(usize),
}

fn arb_op() -> impl Strategy<Value = Op> {
    let who = 0usize..2;
    prop_oneof![
        4 => (1i64..400).prop_map(Op::Advance),
        2 => who.clone().prop_map(Op::PaymentSucceeds),
        2 => who.clone().prop_map(Op::BusinessCommits),
        4 => (who.clone(), 0u8..10).prop_map(|(i, k)| Op::StartRead(i, k)),
        4 => (0usize..16).prop_map(Op::Deliver),
        3 => who.clone().prop_map(Op::Tick),
        1 => who.clone().prop_map(Op::Push),
        2 => (who.clone(), prop_oneof![
                3 => Just(CompensationRefundOutcome::Succeeded),
                1 => Just(CompensationRefundOutcome::Failed),
                2 => Just(CompensationRefundOutcome::Unknown),
            ]).prop_map(|(i, o)| Op::RefundAnswer(i, o)),
        3 => (0usize..32).prop_map(Op::Redeliver),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PspRefund {
    Pending,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone)]
struct Payment {
    snap: FulfillmentSnapshot,
    refunds_started: usize,
    psp_refund: Option<PspRefund>,
    delivered: Vec<FulfillmentInput>,
}

#[derive(Debug, Clone)]
struct World {
    now: i64,
    goal_by: Option<usize>,
    payments: [Payment; 2],
    in_flight: Vec<(usize, FactReading)>,
}

impl World {
    fn new(modes: [FulfillmentMode; 2]) -> Self {
        let payment = |i: usize| {
            let mut snap = FulfillmentSnapshot::new(modes[i], "R:u16:round7", DEADLINES[i]);
            snap.sibling_references = vec![REFS[1 - i].to_owned()];
            Payment {
                snap,
                refunds_started: 0,
                psp_refund: None,
                delivered: Vec::new(),
            }
        };
        World {
            now: 0,
            goal_by: None,
            payments: [payment(0), payment(1)],
            in_flight: Vec::new(),
        }
    }

    fn feed(&mut self, i: usize, input: FulfillmentInput) {
        let payment = &mut self.payments[i];
        let decision = decide_fulfillment(&payment.snap, &input, self.now, &policy());
        if decision.starts_compensation().is_some() {
            payment.refunds_started += 1;
            payment.psp_refund = Some(PspRefund::Pending);
        }
        payment.snap = payment.snap.applied(&decision);
        payment.delivered.push(input);
    }

    fn honest_fact(&self) -> BusinessFact {
        match self.goal_by {
            Some(j) => BusinessFact::Fulfilled {
                attributed_to: Some(REFS[j].to_owned()),
            },
            None => BusinessFact::NotFulfilled,
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Advance(dt) => self.now += dt,
            Op::PaymentSucceeds(i) => self.feed(
                i,
                FulfillmentInput::PaymentSucceeded {
                    attempt_reference: REFS[i].to_owned(),
                },
            ),
            Op::BusinessCommits(i) => {
                let paid = self.payments[i].snap.attempt_reference.is_some();
                if !paid || self.goal_by.is_some() || self.now >= DEADLINES[i] {
                    return;
                }
                match self.payments[i].snap.mode {
                    FulfillmentMode::Pull => self.goal_by = Some(i),
                    // Push: the confirmation is the fact. The merchant's safe
                    // protocol confirms first and grants only if accepted.
                    FulfillmentMode::Push => {
                        self.feed(
                            i,
                            FulfillmentInput::PushConfirmation {
                                attributed_to: REFS[i].to_owned(),
                            },
                        );
                        if self.payments[i].snap.state == FulfillmentState::Fulfilled {
                            self.goal_by = Some(i);
                        }
                    }
                }
            }
            Op::StartRead(i, kind) => {
                let fact = match kind {
                    0 | 1 => BusinessFact::NoAnswer(NoAnswer::Timeout),
                    2 => BusinessFact::NoAnswer(NoAnswer::Error),
                    3 if self.goal_by.is_some() => BusinessFact::Fulfilled {
                        attributed_to: None,
                    },
                    _ => self.honest_fact(),
                };
                self.in_flight.push((
                    i,
                    FactReading {
                        fact,
                        read_started_at_ms: self.now,
                    },
                ));
            }
            Op::Deliver(k) => {
                if !self.in_flight.is_empty() {
                    let (i, reading) = self.in_flight.remove(k % self.in_flight.len());
                    self.feed(i, FulfillmentInput::Fact(reading));
                }
            }
            Op::Tick(i) => self.feed(i, FulfillmentInput::CheckDue),
            Op::Push(i) => {
                if let Some(j) = self.goal_by {
                    self.feed(
                        i,
                        FulfillmentInput::PushConfirmation {
                            attributed_to: REFS[j].to_owned(),
                        },
                    );
                }
            }
            Op::RefundAnswer(i, outcome) => {
                if self.payments[i].psp_refund == Some(PspRefund::Pending) {
                    self.payments[i].psp_refund = match outcome {
                        CompensationRefundOutcome::Succeeded => Some(PspRefund::Succeeded),
                        CompensationRefundOutcome::Failed => Some(PspRefund::Failed),
                        CompensationRefundOutcome::Unknown => Some(PspRefund::Pending),
                    };
                    self.feed(
                        i,
                        FulfillmentInput::CompensationRefund {
                            refund_reference: compensation_refund_reference(REFS[i]),
                            outcome,
                        },
                    );
                }
            }
            Op::Redeliver(k) => {
                let i = k % 2;
                let delivered = &self.payments[i].delivered;
                if !delivered.is_empty() {
                    let input = delivered[(k / 2) % delivered.len()].clone();
                    self.feed(i, input);
                }
            }
        }
    }
}

fn check(world: &World, before: &[FulfillmentState; 2], op: &Op) -> Result<(), TestCaseError> {
    for (i, payment) in world.payments.iter().enumerate() {
        let state = payment.snap.state;
        let succeeded_refunds = usize::from(payment.psp_refund == Some(PspRefund::Succeeded));
        prop_assert!(
            payment.refunds_started <= 1,
            "payment {i} started {} compensation refunds",
            payment.refunds_started
        );
        if state == FulfillmentState::Fulfilled {
            prop_assert_eq!(
                payment.refunds_started,
                0,
                "fulfilled payment {} refunded",
                i
            );
            prop_assert_eq!(world.goal_by, Some(i), "payment {} claims a success", i);
        }
        if state == FulfillmentState::Compensated {
            prop_assert_eq!(succeeded_refunds, 1);
            prop_assert_eq!(payment.refunds_started, 1);
            prop_assert_ne!(world.goal_by, Some(i), "payment {} reached the goal", i);
        }
        if before[i].is_terminal() {
            prop_assert_eq!(
                state,
                before[i],
                "payment {} left {} on {:?}",
                i,
                before[i],
                op
            );
        }
    }
    Ok(())
}

fn arb_mode() -> impl Strategy<Value = FulfillmentMode> {
    prop_oneof![Just(FulfillmentMode::Pull), Just(FulfillmentMode::Push)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn fulfilled_is_never_refunded_and_compensated_never_reached_the_goal(
        modes in [arb_mode(), arb_mode()],
        ops in prop::collection::vec(arb_op(), 1..80),
    ) {
        let mut world = World::new(modes);
        for op in &ops {
            let before = [world.payments[0].snap.state, world.payments[1].snap.state];
            world.step(op);
            check(&world, &before, op)?;
        }
    }
}

/// The schedule above must actually reach the interesting states, or the
/// property proves nothing: drive a fixed set of seeds and count outcomes.
#[test]
fn the_random_schedules_reach_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};

    let mut runner = TestRunner::new(Config::default());
    let strategy = (
        [arb_mode(), arb_mode()],
        prop::collection::vec(arb_op(), 1..80),
    );
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..2_000 {
        let (modes, ops) = strategy.new_tree(&mut runner).unwrap().current();
        let mut world = World::new(modes);
        for op in &ops {
            world.step(op);
        }
        for payment in &world.payments {
            *seen.entry(payment.snap.state.as_str()).or_insert(0) += 1;
            if let Some(compensation) = &payment.snap.compensation {
                *seen.entry(compensation.reason.as_str()).or_insert(0) += 1;
            }
        }
    }
    eprintln!("final states and reasons over 2000 random schedules: {seen:?}");
    for outcome in [
        "fulfilled",
        "compensating",
        "compensated",
        "manual_review",
        "fulfilled_elsewhere",
        "fulfillment_deadline_passed",
    ] {
        assert!(
            seen.get(outcome).copied().unwrap_or(0) >= 20,
            "{outcome} reached too rarely: {seen:?}"
        );
    }
}
