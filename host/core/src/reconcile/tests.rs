use proptest::prelude::*;

use super::*;
use crate::money::Currency;

fn eur(amount_minor: i64) -> Money {
    Money {
        amount_minor,
        currency: Currency::parse("EUR").expect("EUR is a known currency"),
    }
}

fn attempt(n: usize, amount: i64, state: AttemptState) -> OurAttempt {
    OurAttempt {
        payment_id: format!("pay_{n}"),
        reference: format!("pay_{n}_a1"),
        psp_reference: Some(format!("pi_{n}")),
        state,
        amount: eur(amount),
        captured_minor: if state == AttemptState::Succeeded {
            amount
        } else {
            0
        },
        refunded_minor: 0,
        chargeback_recorded: false,
        in_period: true,
    }
}

fn refund(n: usize, amount: i64, state: RefundState) -> OurAction<RefundState> {
    OurAction {
        reference: format!("rfdref_{n}"),
        attempt_reference: format!("pay_{n}_a1"),
        psp_reference: Some(format!("re_{n}")),
        state,
        amount: eur(amount),
        in_period: true,
    }
}

fn line(line_type: LineType, id: &str, gross: i64) -> PspLine {
    PspLine {
        line_type,
        attempt_reference: None,
        action_reference: None,
        psp_reference: None,
        psp_payment_reference: None,
        line_id: id.to_owned(),
        gross_minor: gross,
        net_minor: gross,
        currency: "EUR".to_owned(),
        status: "available".to_owned(),
        booked_at_unix_millis: None,
    }
}

fn payment_line(a: &OurAttempt) -> PspLine {
    PspLine {
        attempt_reference: Some(a.reference.clone()),
        psp_reference: a.psp_reference.clone(),
        ..line(
            LineType::Payment,
            &format!("txn_{}", a.reference),
            a.amount.amount_minor,
        )
    }
}

fn refund_line(r: &OurAction<RefundState>) -> PspLine {
    PspLine {
        action_reference: Some(r.reference.clone()),
        psp_reference: r.psp_reference.clone(),
        ..line(
            LineType::Refund,
            &format!("txn_{}", r.reference),
            -r.amount.amount_minor,
        )
    }
}

/// A report that says exactly what our records say, plus a fee and a payout.
fn mirror(ours: &OurRecords) -> Vec<PspLine> {
    let mut lines: Vec<PspLine> = ours.attempts.iter().map(payment_line).collect();
    lines.extend(ours.refunds.iter().map(refund_line));
    lines.push(line(LineType::Fee, "txn_fee", -30));
    lines.push(line(LineType::Payout, "txn_payout", -1000));
    lines
}

/// Succeeded attempts, each with a succeeded partial refund every third one.
fn records() -> impl Strategy<Value = OurRecords> {
    prop::collection::vec(1i64..1_000_000, 1..12).prop_map(|amounts| {
        let mut ours = OurRecords::default();
        for (n, amount) in amounts.into_iter().enumerate() {
            let mut a = attempt(n, amount, AttemptState::Succeeded);
            if n % 3 == 0 {
                let r = refund(n, (amount / 2).max(1), RefundState::Succeeded);
                a.refunded_minor = r.amount.amount_minor;
                ours.refunds.push(r);
            }
            ours.attempts.push(a);
        }
        ours
    })
}

/// The discrepancies the property test injects, one at a time.
#[derive(Debug, Clone, Copy)]
enum Injected {
    ChargeNeverRecorded,
    RefundWeThinkPending,
    AmountOffByOne,
    DuplicateChargeLine,
    AttemptUnknown,
    ChargeMissingAtPsp,
    RefundMissingAtPsp,
    CurrencyDiffers,
    ChargebackUnrecorded,
    AttemptFailedButCharged,
}

const INJECTED: &[Injected] = &[
    Injected::ChargeNeverRecorded,
    Injected::RefundWeThinkPending,
    Injected::AmountOffByOne,
    Injected::DuplicateChargeLine,
    Injected::AttemptUnknown,
    Injected::ChargeMissingAtPsp,
    Injected::RefundMissingAtPsp,
    Injected::CurrencyDiffers,
    Injected::ChargebackUnrecorded,
    Injected::AttemptFailedButCharged,
];

/// Inject one discrepancy into the first attempt (and its refund, which every
/// generated set has: attempt 0 is always refunded). Returns the expected
/// class, attempt reference and whether it has a safe repair.
fn inject(
    kind: Injected,
    ours: &mut OurRecords,
    lines: &mut Vec<PspLine>,
) -> (DifferenceClass, Option<String>, bool) {
    use DifferenceClass as D;
    let first = ours.attempts[0].reference.clone();
    let first_line = lines
        .iter()
        .position(|l| {
            l.attempt_reference.as_ref() == Some(&first) && l.line_type == LineType::Payment
        })
        .expect("the mirror has the first attempt's line");
    let refund_line = lines
        .iter()
        .position(|l| l.line_type == LineType::Refund)
        .expect("attempt 0 is refunded");
    match kind {
        Injected::ChargeNeverRecorded => {
            lines.push(PspLine {
                attempt_reference: Some("pay_x_a1".into()),
                psp_reference: Some("pi_x".into()),
                ..line(LineType::Payment, "txn_x", 500)
            });
            (D::MissingOurs, Some("pay_x_a1".into()), false)
        }
        Injected::RefundWeThinkPending => {
            ours.refunds[0].state = RefundState::Processing;
            (D::PspRefundedOursPending, Some(first), true)
        }
        Injected::AmountOffByOne => {
            lines[first_line].gross_minor += 1;
            (D::AmountMismatch, Some(first), false)
        }
        Injected::DuplicateChargeLine => {
            let copy = PspLine {
                line_id: "txn_dup".into(),
                ..lines[first_line].clone()
            };
            lines.push(copy);
            (D::Duplicate, Some(first), false)
        }
        Injected::AttemptUnknown => {
            ours.attempts[0].state = AttemptState::Unknown;
            ours.attempts[0].captured_minor = 0;
            (D::PspSucceededOursPending, Some(first), true)
        }
        Injected::ChargeMissingAtPsp => {
            lines.remove(first_line);
            (D::OursSucceededPspMissing, Some(first), false)
        }
        Injected::RefundMissingAtPsp => {
            lines.remove(refund_line);
            (D::OursRefundedPspPending, Some(first), false)
        }
        Injected::CurrencyDiffers => {
            lines[first_line].currency = "USD".into();
            (D::CurrencyMismatch, Some(first), false)
        }
        Injected::ChargebackUnrecorded => {
            lines.push(PspLine {
                psp_payment_reference: ours.attempts[0].psp_reference.clone(),
                psp_reference: Some("dp_1".into()),
                ..line(LineType::Chargeback, "txn_dp", -100)
            });
            (D::UnrecordedChargeback, Some(first), false)
        }
        Injected::AttemptFailedButCharged => {
            ours.attempts[0].state = AttemptState::Failed;
            ours.attempts[0].captured_minor = 0;
            (D::PspSucceededOursFailed, Some(first), false)
        }
    }
}

proptest! {
    #[test]
    fn a_report_that_mirrors_our_records_shows_no_difference(ours in records()) {
        let lines = mirror(&ours);
        let result = reconcile(&ours, &lines);
        prop_assert_eq!(result.differences, vec![]);
        prop_assert_eq!(result.matched_lines, ours.attempts.len() + ours.refunds.len());
        prop_assert_eq!(result.ignored_lines, 2);
    }

    #[test]
    fn each_injected_discrepancy_is_found_exactly_once_and_classified(ours in records(), which in 0..INJECTED.len()) {
        let mut ours = ours;
        let mut lines = mirror(&ours);
        let (class, reference, safe) = inject(INJECTED[which], &mut ours, &mut lines);
        let result = reconcile(&ours, &lines);
        prop_assert_eq!(result.differences.len(), 1, "{:?}: {:?}", INJECTED[which], result.differences);
        let diff = &result.differences[0];
        prop_assert_eq!(diff.class, class);
        prop_assert_eq!(&diff.attempt_reference, &reference);
        prop_assert_eq!(diff.repair.is_some(), safe);
    }

    #[test]
    fn the_order_of_lines_and_records_does_not_change_the_answer(
        ours in records(),
        which in 0..INJECTED.len(),
        seed in any::<u64>(),
    ) {
        let mut ours = ours;
        let mut lines = mirror(&ours);
        inject(INJECTED[which], &mut ours, &mut lines);
        let expected = reconcile(&ours, &lines);
        let mut shuffled_lines = lines.clone();
        let mut shuffled_ours = ours.clone();
        shuffle(&mut shuffled_lines, seed);
        shuffle(&mut shuffled_ours.attempts, seed.rotate_left(7));
        shuffle(&mut shuffled_ours.refunds, seed.rotate_left(13));
        prop_assert_eq!(reconcile(&shuffled_ours, &shuffled_lines), expected);
    }
}

/// A deterministic Fisher-Yates shuffle from a seed (no RNG in the core).
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed | 1;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = (state % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

#[test]
fn a_line_is_joined_by_the_psp_reference_when_the_report_does_not_echo_ours() {
    let ours = OurRecords {
        attempts: vec![attempt(1, 700, AttemptState::Succeeded)],
        ..OurRecords::default()
    };
    let lines = vec![PspLine {
        psp_reference: Some("pi_1".into()),
        ..line(LineType::Payment, "txn_1", 700)
    }];
    let result = reconcile(&ours, &lines);
    assert_eq!(result.differences, vec![]);
    assert_eq!(result.matched_lines, 1);
}

#[test]
fn an_amount_alone_never_joins_a_line_to_a_record() {
    let ours = OurRecords {
        attempts: vec![attempt(1, 700, AttemptState::Unknown)],
        ..OurRecords::default()
    };
    let lines = vec![PspLine {
        psp_reference: Some("pi_other".into()),
        ..line(LineType::Payment, "txn_1", 700)
    }];
    let result = reconcile(&ours, &lines);
    assert_eq!(result.differences.len(), 1);
    assert_eq!(result.differences[0].class, DifferenceClass::MissingOurs);
    assert_eq!(result.differences[0].repair, None);
}

#[test]
fn a_charge_of_an_attempt_still_created_needs_review_not_a_repair() {
    let ours = OurRecords {
        attempts: vec![attempt(1, 700, AttemptState::Created)],
        ..OurRecords::default()
    };
    let lines = mirror(&ours);
    let diff = &reconcile(&ours, &lines).differences[0];
    assert_eq!(diff.class, DifferenceClass::PspSucceededOursPending);
    assert_eq!(diff.repair, None);
}

#[test]
fn a_second_charged_attempt_of_a_fulfilled_payment_is_two_attempts_charged_goal_once() {
    let first = attempt(1, 700, AttemptState::Succeeded);
    let mut second = attempt(1, 700, AttemptState::Succeeded);
    second.reference = "pay_1_a2".into();
    second.psp_reference = Some("pi_1b".into());
    let ours = OurRecords {
        attempts: vec![first, second],
        fulfillments: vec![OurFulfillment {
            payment_id: "pay_1".into(),
            state: FulfillmentState::Fulfilled,
            attributed_attempt: Some("pay_1_a1".into()),
        }],
        ..OurRecords::default()
    };
    let diffs = reconcile(&ours, &mirror(&ours)).differences;
    assert_eq!(diffs.len(), 1);
    assert_eq!(diffs[0].class, DifferenceClass::TwoAttemptsChargedGoalOnce);
    assert_eq!(diffs[0].attempt_reference.as_deref(), Some("pay_1_a2"));
}

#[test]
fn a_charged_attempt_of_a_payment_fulfilled_without_attribution_is_fulfilled_not_attributed() {
    let ours = OurRecords {
        attempts: vec![attempt(1, 700, AttemptState::Succeeded)],
        fulfillments: vec![OurFulfillment {
            payment_id: "pay_1".into(),
            state: FulfillmentState::Fulfilled,
            attributed_attempt: None,
        }],
        ..OurRecords::default()
    };
    let diffs = reconcile(&ours, &mirror(&ours)).differences;
    assert_eq!(diffs.len(), 1);
    assert_eq!(diffs[0].class, DifferenceClass::FulfilledNotAttributed);
}

#[test]
fn a_capture_the_psp_settled_while_ours_is_unknown_has_a_safe_repair() {
    let mut a = attempt(1, 700, AttemptState::Authorized);
    a.captured_minor = 0;
    let capture = OurAction {
        reference: "capref_1".into(),
        attempt_reference: a.reference.clone(),
        psp_reference: None,
        state: CaptureState::Unknown,
        amount: eur(500),
        in_period: true,
    };
    let ours = OurRecords {
        attempts: vec![a],
        captures: vec![capture],
        ..OurRecords::default()
    };
    let lines = vec![PspLine {
        action_reference: Some("capref_1".into()),
        ..line(LineType::Capture, "txn_c", 500)
    }];
    let diffs = reconcile(&ours, &lines).differences;
    assert_eq!(diffs.len(), 1);
    assert_eq!(
        diffs[0].repair,
        Some(SafeRepair::CaptureSucceeded {
            capture_reference: "capref_1".into()
        })
    );
}

#[test]
fn every_class_name_round_trips() {
    for class in DifferenceClass::ALL {
        assert_eq!(DifferenceClass::parse(class.as_str()), Some(*class));
        let json = serde_json::to_string(class).expect("a class serialises");
        assert_eq!(json, format!("\"{}\"", class.as_str()));
    }
}
