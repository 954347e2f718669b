//! Reconciliation (issue 14): our records of one connector account and period
//! against the PSP's settlement report, item by item.
//!
//! Matching totals proves nothing (one double charge and one missed charge
//! cancel out), so every PSP line is joined to one of our records by a stable
//! identity only: the attempt reference, the capture/refund reference, or a
//! PSP reference we recorded. Amount and time are compared once a pair is
//! joined, never used to join. Every difference is classified, and each says
//! whether it has exactly one safe, deterministic repair (the PSP's report
//! proves an outcome we still hold as open, with amount and currency
//! agreeing) or needs an operator's review.
//!
//! [`reconcile`] is pure and deterministic: the order of the report's lines
//! and of our records does not change its answer.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::fulfillment::FulfillmentState;
use crate::money::Money;
use crate::state::{AttemptState, CaptureState, RefundState};

/// What a settlement line records (the host-side twin of the WIT
/// `settlement-line-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineType {
    Payment,
    Capture,
    Refund,
    Chargeback,
    Fee,
    Payout,
    Other,
}

/// One normalised settlement line (the host-side twin of the WIT
/// `settlement-line`). Amounts are signed minor units from the balance's
/// point of view: a payment positive, a refund or chargeback negative.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PspLine {
    pub line_type: LineType,
    pub attempt_reference: Option<String>,
    pub action_reference: Option<String>,
    pub psp_reference: Option<String>,
    pub psp_payment_reference: Option<String>,
    /// Unique within the report.
    pub line_id: String,
    pub gross_minor: i64,
    pub net_minor: i64,
    pub currency: String,
    pub status: String,
    pub booked_at_unix_millis: Option<i64>,
}

/// One attempt of ours, as far as reconciliation needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OurAttempt {
    pub payment_id: String,
    pub reference: String,
    pub psp_reference: Option<String>,
    pub state: AttemptState,
    pub amount: Money,
    pub captured_minor: i64,
    pub refunded_minor: i64,
    /// Whether we recorded a chargeback on it.
    pub chargeback_recorded: bool,
    /// Created inside the report's period: only such records are expected to
    /// appear in the report. Records outside it are given only because a line
    /// names them.
    pub in_period: bool,
}

/// One refund or capture of ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OurAction<S> {
    pub reference: String,
    pub attempt_reference: String,
    pub psp_reference: Option<String>,
    pub state: S,
    pub amount: Money,
    pub in_period: bool,
}

/// The business fact of a payment that buys a goal: its fulfillment state and
/// the attempt that earned it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OurFulfillment {
    pub payment_id: String,
    pub state: FulfillmentState,
    pub attributed_attempt: Option<String>,
}

/// Our side: every record of one connector account for the period, plus any
/// record outside it that a line of the report names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OurRecords {
    pub attempts: Vec<OurAttempt>,
    pub refunds: Vec<OurAction<RefundState>>,
    pub captures: Vec<OurAction<CaptureState>>,
    pub fulfillments: Vec<OurFulfillment>,
}

macro_rules! classes {
    ($($(#[$meta:meta])* $variant:ident => $text:literal,)*) => {
        /// How a difference is classified (issue 14, seed 000 §12).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum DifferenceClass {
            $($(#[$meta])* $variant,)*
        }

        impl DifferenceClass {
            pub const ALL: &'static [DifferenceClass] = &[$(DifferenceClass::$variant,)*];

            /// The stored and reported name.
            pub fn as_str(&self) -> &'static str {
                match self { $(DifferenceClass::$variant => $text,)* }
            }

            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some(DifferenceClass::$variant),)* _ => None }
            }
        }
    };
}

classes! {
    /// The PSP settled a payment (or capture) we still hold as open.
    PspSucceededOursPending => "psp_succeeded_ours_pending",
    /// The PSP settled a payment we hold as definitively failed or canceled.
    PspSucceededOursFailed => "psp_succeeded_ours_failed",
    /// Ours succeeded, the goal was reached, but not attributed to this attempt.
    FulfilledNotAttributed => "fulfilled_not_attributed",
    /// Two attempts of one payment charged; the goal was reached once.
    TwoAttemptsChargedGoalOnce => "two_attempts_charged_goal_once",
    /// Ours succeeded (or fulfilled); the PSP's report has no charge for it.
    OursSucceededPspMissing => "ours_succeeded_psp_missing",
    /// Ours refunded; the PSP's report has not booked the refund.
    OursRefundedPspPending => "ours_refunded_psp_pending",
    /// The PSP refunded; ours is still open.
    PspRefundedOursPending => "psp_refunded_ours_pending",
    /// The PSP refunded; ours is definitively failed or canceled.
    PspRefundedOursFailed => "psp_refunded_ours_failed",
    AmountMismatch => "amount_mismatch",
    CurrencyMismatch => "currency_mismatch",
    /// A PSP line with no record of ours.
    MissingOurs => "missing_ours",
    /// A capture of ours the report does not show.
    MissingPsp => "missing_psp",
    /// Two or more PSP lines for one reference of ours.
    Duplicate => "duplicate",
    /// The PSP booked a chargeback we have not recorded.
    UnrecordedChargeback => "unrecorded_chargeback",
}

/// The one safe, deterministic repair of a difference: an event of evidence
/// `reconciliation` through the door, proving the outcome the PSP booked.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SafeRepair {
    AttemptSucceeded { attempt_reference: String },
    RefundSucceeded { refund_reference: String },
    CaptureSucceeded { capture_reference: String },
}

/// One classified difference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Difference {
    pub class: DifferenceClass,
    pub attempt_reference: Option<String>,
    pub action_reference: Option<String>,
    pub psp_reference: Option<String>,
    /// The report lines involved, sorted.
    pub line_ids: Vec<String>,
    /// The money at stake, in minor units, never negative.
    pub amount_minor: i64,
    pub currency: String,
    /// `Some` when exactly one safe repair exists; `None` means review.
    pub repair: Option<SafeRepair>,
}

/// What [`reconcile`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciliation {
    /// Sorted, so the answer does not depend on input order.
    pub differences: Vec<Difference>,
    /// Lines joined to a record of ours that agreed with it.
    pub matched_lines: usize,
    /// Fee, payout and other lines: balance movements that are no item of ours.
    pub ignored_lines: usize,
}

/// Reconcile our records of one account and period with the PSP's lines.
pub fn reconcile(ours: &OurRecords, lines: &[PspLine]) -> Reconciliation {
    let index = Index::new(ours);
    let mut joined = Joined::default();
    let mut out = Reconciliation::default();
    let mut sorted: Vec<&PspLine> = lines.iter().collect();
    sorted.sort_by(|a, b| {
        a.line_id
            .cmp(&b.line_id)
            .then_with(|| a.cmp_key().cmp(&b.cmp_key()))
    });
    for line in sorted {
        match index.join(line) {
            Join::Attempt(i) => joined.attempts.entry(i).or_default().push(line),
            Join::Refund(i) => joined.refunds.entry(i).or_default().push(line),
            Join::Capture(i) => joined.captures.entry(i).or_default().push(line),
            Join::Chargeback(i) => joined.chargebacks.entry(i).or_default().push(line),
            Join::Nothing => out.differences.push(missing_ours(line)),
            Join::NotAnItem => out.ignored_lines += 1,
        }
    }
    let mut diffs = Vec::new();
    check_attempts(ours, &joined, &mut diffs, &mut out.matched_lines);
    check_refunds(ours, &joined, &mut diffs, &mut out.matched_lines);
    check_captures(ours, &joined, &mut diffs, &mut out.matched_lines);
    check_chargebacks(ours, &joined, &mut diffs, &mut out.matched_lines);
    check_fulfillment(ours, &joined, &mut diffs);
    out.differences.extend(diffs);
    out.differences.sort();
    out
}

impl PspLine {
    fn cmp_key(&self) -> (LineType, i64, &str) {
        (self.line_type, self.gross_minor, self.currency.as_str())
    }
}

/// Where a line joined.
enum Join {
    Attempt(usize),
    Refund(usize),
    Capture(usize),
    Chargeback(usize),
    Nothing,
    NotAnItem,
}

/// Our records by each stable identity.
struct Index {
    attempt_by_ref: BTreeMap<String, usize>,
    attempt_by_psp: BTreeMap<String, usize>,
    refund_by_ref: BTreeMap<String, usize>,
    refund_by_psp: BTreeMap<String, usize>,
    capture_by_ref: BTreeMap<String, usize>,
    capture_by_psp: BTreeMap<String, usize>,
}

fn by_ref<T>(items: &[T], key: impl Fn(&T) -> Option<&String>) -> BTreeMap<String, usize> {
    items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| key(item).map(|k| (k.clone(), i)))
        .collect()
}

impl Index {
    fn new(ours: &OurRecords) -> Self {
        Index {
            attempt_by_ref: by_ref(&ours.attempts, |a| Some(&a.reference)),
            attempt_by_psp: by_ref(&ours.attempts, |a| a.psp_reference.as_ref()),
            refund_by_ref: by_ref(&ours.refunds, |r| Some(&r.reference)),
            refund_by_psp: by_ref(&ours.refunds, |r| r.psp_reference.as_ref()),
            capture_by_ref: by_ref(&ours.captures, |c| Some(&c.reference)),
            capture_by_psp: by_ref(&ours.captures, |c| c.psp_reference.as_ref()),
        }
    }

    /// The attempt a line names: our reference first, then the PSP's.
    fn attempt(&self, line: &PspLine, psp: Option<&String>) -> Option<usize> {
        let by_ref = line
            .attempt_reference
            .as_ref()
            .and_then(|r| self.attempt_by_ref.get(r));
        by_ref
            .or_else(|| psp.and_then(|p| self.attempt_by_psp.get(p)))
            .copied()
    }

    fn join(&self, line: &PspLine) -> Join {
        let found = match line.line_type {
            LineType::Payment => self
                .attempt(line, line.psp_reference.as_ref())
                .map(Join::Attempt),
            LineType::Refund => {
                lookup(line, &self.refund_by_ref, &self.refund_by_psp).map(Join::Refund)
            }
            LineType::Capture => {
                lookup(line, &self.capture_by_ref, &self.capture_by_psp).map(Join::Capture)
            }
            LineType::Chargeback => self
                .attempt(line, line.psp_payment_reference.as_ref())
                .map(Join::Chargeback),
            LineType::Fee | LineType::Payout | LineType::Other => return Join::NotAnItem,
        };
        found.unwrap_or(Join::Nothing)
    }
}

fn lookup(
    line: &PspLine,
    by_ref: &BTreeMap<String, usize>,
    by_psp: &BTreeMap<String, usize>,
) -> Option<usize> {
    let ours = line.action_reference.as_ref().and_then(|r| by_ref.get(r));
    ours.or_else(|| line.psp_reference.as_ref().and_then(|p| by_psp.get(p)))
        .copied()
}

/// The lines joined to each record of ours, by the record's index.
#[derive(Default)]
struct Joined<'a> {
    attempts: BTreeMap<usize, Vec<&'a PspLine>>,
    refunds: BTreeMap<usize, Vec<&'a PspLine>>,
    captures: BTreeMap<usize, Vec<&'a PspLine>>,
    chargebacks: BTreeMap<usize, Vec<&'a PspLine>>,
}

impl Joined<'_> {
    /// Whether the PSP shows money taken for the attempt: a payment line, or a
    /// capture line for one of its captures (a manual capture settles as one).
    fn charged(&self, ours: &OurRecords, attempt: usize) -> bool {
        let reference = &ours.attempts[attempt].reference;
        self.attempts.contains_key(&attempt)
            || self
                .captures
                .keys()
                .any(|c| &ours.captures[*c].attempt_reference == reference)
    }
}

fn missing_ours(line: &PspLine) -> Difference {
    Difference {
        class: DifferenceClass::MissingOurs,
        attempt_reference: line.attempt_reference.clone(),
        action_reference: line.action_reference.clone(),
        psp_reference: line.psp_reference.clone(),
        line_ids: vec![line.line_id.clone()],
        amount_minor: line.gross_minor.saturating_abs(),
        currency: line.currency.clone(),
        repair: None,
    }
}

/// A difference about one record, with the lines that joined it.
struct Subject<'a> {
    attempt_reference: &'a str,
    action_reference: Option<&'a str>,
    psp_reference: Option<&'a String>,
    amount: Money,
}

impl Subject<'_> {
    fn diff(
        &self,
        class: DifferenceClass,
        lines: &[&PspLine],
        repair: Option<SafeRepair>,
    ) -> Difference {
        let mut line_ids: Vec<String> = lines.iter().map(|l| l.line_id.clone()).collect();
        line_ids.sort();
        Difference {
            class,
            attempt_reference: Some(self.attempt_reference.to_owned()),
            action_reference: self.action_reference.map(str::to_owned),
            psp_reference: self.psp_reference.cloned(),
            line_ids,
            amount_minor: self.amount.amount_minor,
            currency: self.amount.currency.as_str().to_owned(),
            repair,
        }
    }
}

/// The checks every joined pair goes through before states are compared:
/// one line only, same currency, same amount. `None`: they agree.
fn compare_line(subject: &Subject, lines: &[&PspLine], expected_minor: i64) -> Option<Difference> {
    let [line] = lines else {
        return Some(subject.diff(DifferenceClass::Duplicate, lines, None));
    };
    if line.currency != subject.amount.currency.as_str() {
        return Some(subject.diff(DifferenceClass::CurrencyMismatch, lines, None));
    }
    if line.gross_minor.saturating_abs() != expected_minor {
        return Some(subject.diff(DifferenceClass::AmountMismatch, lines, None));
    }
    None
}

/// States in which the PSP's proof of an outcome may close an item by
/// reconciliation: the request may have left and nothing definitive is known.
const ATTEMPT_REPAIRABLE: &[AttemptState] = &[
    AttemptState::Submitted,
    AttemptState::Processing,
    AttemptState::Unknown,
];
const REFUND_REPAIRABLE: &[RefundState] = &[RefundState::Processing, RefundState::Unknown];
const CAPTURE_REPAIRABLE: &[CaptureState] = &[CaptureState::Processing, CaptureState::Unknown];

fn check_attempts(
    ours: &OurRecords,
    joined: &Joined,
    out: &mut Vec<Difference>,
    matched: &mut usize,
) {
    for (i, attempt) in ours.attempts.iter().enumerate() {
        let subject = Subject {
            attempt_reference: &attempt.reference,
            action_reference: None,
            psp_reference: attempt.psp_reference.as_ref(),
            amount: attempt.amount,
        };
        let Some(lines) = joined.attempts.get(&i) else {
            let took_money = attempt.state == AttemptState::Succeeded || attempt.captured_minor > 0;
            if attempt.in_period && took_money && !joined.charged(ours, i) {
                out.push(subject.diff(DifferenceClass::OursSucceededPspMissing, &[], None));
            }
            continue;
        };
        // A manual capture settles what was captured; a sale its amount.
        let expected = if attempt.captured_minor > 0 {
            attempt.captured_minor
        } else {
            attempt.amount.amount_minor
        };
        if let Some(diff) = compare_line(&subject, lines, expected) {
            out.push(diff);
            continue;
        }
        match attempt.state {
            AttemptState::Succeeded => *matched += 1,
            state if ATTEMPT_REPAIRABLE.contains(&state) => {
                let repair = SafeRepair::AttemptSucceeded {
                    attempt_reference: attempt.reference.clone(),
                };
                out.push(subject.diff(
                    DifferenceClass::PspSucceededOursPending,
                    lines,
                    Some(repair),
                ));
            }
            AttemptState::Failed | AttemptState::Canceled => {
                out.push(subject.diff(DifferenceClass::PspSucceededOursFailed, lines, None));
            }
            // CREATED, REQUIRES_ACTION, AUTHORIZED: the PSP booked money we
            // did not expect yet; which event is right needs a person.
            _ => out.push(subject.diff(DifferenceClass::PspSucceededOursPending, lines, None)),
        }
    }
}

fn check_refunds(
    ours: &OurRecords,
    joined: &Joined,
    out: &mut Vec<Difference>,
    matched: &mut usize,
) {
    for (i, refund) in ours.refunds.iter().enumerate() {
        let subject = Subject {
            attempt_reference: &refund.attempt_reference,
            action_reference: Some(&refund.reference),
            psp_reference: refund.psp_reference.as_ref(),
            amount: refund.amount,
        };
        let Some(lines) = joined.refunds.get(&i) else {
            if refund.in_period && refund.state == RefundState::Succeeded {
                out.push(subject.diff(DifferenceClass::OursRefundedPspPending, &[], None));
            }
            continue;
        };
        if let Some(diff) = compare_line(&subject, lines, refund.amount.amount_minor) {
            out.push(diff);
            continue;
        }
        match refund.state {
            RefundState::Succeeded => *matched += 1,
            state if REFUND_REPAIRABLE.contains(&state) => {
                let repair = SafeRepair::RefundSucceeded {
                    refund_reference: refund.reference.clone(),
                };
                out.push(subject.diff(
                    DifferenceClass::PspRefundedOursPending,
                    lines,
                    Some(repair),
                ));
            }
            RefundState::Created => {
                out.push(subject.diff(DifferenceClass::PspRefundedOursPending, lines, None))
            }
            _ => out.push(subject.diff(DifferenceClass::PspRefundedOursFailed, lines, None)),
        }
    }
}

fn check_captures(
    ours: &OurRecords,
    joined: &Joined,
    out: &mut Vec<Difference>,
    matched: &mut usize,
) {
    for (i, capture) in ours.captures.iter().enumerate() {
        let subject = Subject {
            attempt_reference: &capture.attempt_reference,
            action_reference: Some(&capture.reference),
            psp_reference: capture.psp_reference.as_ref(),
            amount: capture.amount,
        };
        let Some(lines) = joined.captures.get(&i) else {
            // A sale-style report books the capture as the payment's line.
            let attempt_line = ours
                .attempts
                .iter()
                .position(|a| a.reference == capture.attempt_reference)
                .is_some_and(|a| joined.attempts.contains_key(&a));
            if capture.in_period && capture.state == CaptureState::Succeeded && !attempt_line {
                out.push(subject.diff(DifferenceClass::MissingPsp, &[], None));
            }
            continue;
        };
        if let Some(diff) = compare_line(&subject, lines, capture.amount.amount_minor) {
            out.push(diff);
            continue;
        }
        match capture.state {
            CaptureState::Succeeded => *matched += 1,
            state if CAPTURE_REPAIRABLE.contains(&state) => {
                let repair = SafeRepair::CaptureSucceeded {
                    capture_reference: capture.reference.clone(),
                };
                out.push(subject.diff(
                    DifferenceClass::PspSucceededOursPending,
                    lines,
                    Some(repair),
                ));
            }
            CaptureState::Created => {
                out.push(subject.diff(DifferenceClass::PspSucceededOursPending, lines, None))
            }
            _ => out.push(subject.diff(DifferenceClass::PspSucceededOursFailed, lines, None)),
        }
    }
}

fn check_chargebacks(
    ours: &OurRecords,
    joined: &Joined,
    out: &mut Vec<Difference>,
    matched: &mut usize,
) {
    for (i, lines) in &joined.chargebacks {
        let attempt = &ours.attempts[*i];
        if attempt.chargeback_recorded {
            *matched += lines.len();
            continue;
        }
        let subject = Subject {
            attempt_reference: &attempt.reference,
            action_reference: None,
            psp_reference: attempt.psp_reference.as_ref(),
            amount: attempt.amount,
        };
        let mut diff = subject.diff(DifferenceClass::UnrecordedChargeback, lines, None);
        diff.amount_minor = lines
            .iter()
            .map(|l| l.gross_minor.saturating_abs())
            .fold(0, i64::saturating_add);
        out.push(diff);
    }
}

/// The business facts: a payment whose goal was reached once must have money
/// taken once, by the attempt that earned it.
fn check_fulfillment(ours: &OurRecords, joined: &Joined, out: &mut Vec<Difference>) {
    let fulfilled: BTreeMap<&str, Option<&String>> = ours
        .fulfillments
        .iter()
        .filter(|f| f.state == FulfillmentState::Fulfilled)
        .map(|f| (f.payment_id.as_str(), f.attributed_attempt.as_ref()))
        .collect();
    let charged: BTreeSet<&str> = ours
        .attempts
        .iter()
        .enumerate()
        .filter(|(i, a)| a.state == AttemptState::Succeeded || joined.charged(ours, *i))
        .map(|(_, a)| a.reference.as_str())
        .collect();
    for attempt in &ours.attempts {
        let Some(earner) = fulfilled.get(attempt.payment_id.as_str()) else {
            continue;
        };
        let kept = attempt.refunded_minor >= attempt.amount.amount_minor;
        if earner.is_some_and(|e| *e == attempt.reference)
            || !charged.contains(attempt.reference.as_str())
            || kept
        {
            continue;
        }
        let class = match earner {
            Some(e) if charged.contains(e.as_str()) => DifferenceClass::TwoAttemptsChargedGoalOnce,
            _ => DifferenceClass::FulfilledNotAttributed,
        };
        let subject = Subject {
            attempt_reference: &attempt.reference,
            action_reference: None,
            psp_reference: attempt.psp_reference.as_ref(),
            amount: attempt.amount,
        };
        out.push(subject.diff(class, &[], None));
    }
}

#[cfg(test)]
mod tests;
