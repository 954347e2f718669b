//! Exhaustive tables: for every state × event kind of every aggregate, the
//! expected decision, written out by hand from seed 001 §3 and the documented
//! choices in `matrix.rs` (not computed from the matrix).

mod common;

use common::*;
use sluice_core::*;
use std::fmt::Debug;

use AttemptState as A;
use EventKind as K;
use EvidenceSource as E;
use OrderState as O;
use X::*;

/// No other aggregate moves.
const KEEP: Cascade = Cascade {
    attempt: None,
    order: None,
};
const fn order_to(state: OrderState) -> Cascade {
    Cascade {
        attempt: None,
        order: Some(state),
    }
}
const OP: Cascade = order_to(O::Processing);
const ORA: Cascade = order_to(O::RequiresAction);
const OAU: Cascade = order_to(O::Authorized);
const OSU: Cascade = order_to(O::Succeeded);
const OCA: Cascade = order_to(O::Canceled);

/// Compare a whole grid and report every mismatching cell at once.
fn check_grid<S: Copy + Debug + PartialEq>(
    name: &str,
    states: &[S],
    grid: &[(EventKind, Vec<X<S>>)],
    decide: impl Fn(S, &PaymentEvent) -> Decision<S>,
    make_event: impl Fn(EventKind) -> PaymentEvent,
) {
    let mut kinds: Vec<EventKind> = grid.iter().map(|(k, _)| *k).collect();
    kinds.sort();
    let mut all = EventKind::ALL.to_vec();
    all.sort();
    assert_eq!(
        kinds, all,
        "{name}: the grid must list every event kind once"
    );
    let mut wrong = Vec::new();
    for (kind, expected_row) in grid {
        assert_eq!(expected_row.len(), states.len(), "{name}: row {kind}");
        for (state, expected) in states.iter().zip(expected_row) {
            let got = summarize(&decide(*state, &make_event(*kind)));
            if got != *expected {
                wrong.push(format!(
                    "{state:?} + {kind}: expected {expected:?}, got {got:?}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{name}:\n{}", wrong.join("\n"));
}

const ATTEMPT_COLUMNS: [AttemptState; 9] = [
    A::Created,
    A::Submitted,
    A::Processing,
    A::RequiresAction,
    A::Authorized,
    A::Succeeded,
    A::Failed,
    A::Canceled,
    A::Unknown,
];

fn decide_attempt_in(
    mode: CaptureMode,
) -> impl Fn(AttemptState, &PaymentEvent) -> Decision<AttemptState> {
    move |state, event| {
        decide_attempt(
            &order(order_for(state), amounts_for(state)),
            &attempt(state, mode),
            event,
        )
    }
}

fn wrong9() -> Vec<X<AttemptState>> {
    vec![Wrong; 9]
}

#[rustfmt::skip]
fn attempt_grid_verified() -> Vec<(EventKind, Vec<X<AttemptState>>)> {
    //                            CREATED            SUBMITTED            PROCESSING           REQUIRES_ACTION      AUTHORIZED          SUCCEEDED          FAILED  CANCELED  UNKNOWN
    vec![
        (K::AttemptSubmitted,       vec![To(A::Submitted, OP), Dup,                 Stale,               Stale,               Stale,              Stale,             Stale,  Stale,    Stale]),
        (K::PaymentProcessing,      vec![To(A::Processing, OP), To(A::Processing, KEEP), Dup,             To(A::Processing, OP), Stale,           Stale,             Stale,  Stale,    To(A::Processing, KEEP)]),
        (K::CustomerActionRequired, vec![To(A::RequiresAction, ORA), To(A::RequiresAction, ORA), To(A::RequiresAction, ORA), Dup, Stale,          Stale,             Stale,  Stale,    To(A::RequiresAction, ORA)]),
        (K::PaymentAuthorized,      vec![To(A::Authorized, OAU), To(A::Authorized, OAU), To(A::Authorized, OAU), To(A::Authorized, OAU), Dup,   Stale,             Rec,    Stale,    To(A::Authorized, OAU)]),
        (K::PaymentCaptured,        wrong9()),
        (K::CaptureFailed,          wrong9()),
        (K::PaymentSucceeded,       vec![To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), Dup, Rec, Rec, To(A::Succeeded, OSU)]),
        (K::PaymentFailed,          vec![To(A::Failed, OP), To(A::Failed, KEEP), To(A::Failed, KEEP), To(A::Failed, OP), Rec,               Rec,               Dup,    Stale,    To(A::Failed, KEEP)]),
        (K::ResultUnknown,          vec![To(A::Unknown, OP), To(A::Unknown, KEEP), To(A::Unknown, KEEP), Stale,           Stale,              Stale,             Stale,  Stale,    Dup]),
        (K::PaymentCanceled,        vec![To(A::Canceled, OP), To(A::Canceled, KEEP), To(A::Canceled, KEEP), To(A::Canceled, OP), To(A::Canceled, OCA), Rec,       Stale,  Dup,      To(A::Canceled, KEEP)]),
        (K::RefundProcessing,       wrong9()),
        (K::RefundSucceeded,        wrong9()),
        (K::RefundFailed,           wrong9()),
        (K::RefundUnknown,          wrong9()),
        (K::Chargeback,             vec![Rec, Rec, Rec, Rec, Rec, To(A::Succeeded, KEEP), Rec, Rec, Rec]),
        (K::VoidSubmitted,          vec![Stale, Stale, Stale, Stale, To(A::Authorized, KEEP), Stale, Stale, Stale, Stale]),
    ]
}

#[test]
fn attempt_matrix_with_webhook_evidence_matches_the_table() {
    check_grid(
        "attempt/webhook",
        &ATTEMPT_COLUMNS,
        &attempt_grid_verified(),
        decide_attempt_in(CaptureMode::Manual),
        |k| event(k, E::Webhook),
    );
}

#[test]
fn attempt_matrix_with_query_evidence_matches_the_webhook_table() {
    check_grid(
        "attempt/query",
        &ATTEMPT_COLUMNS,
        &attempt_grid_verified(),
        decide_attempt_in(CaptureMode::Manual),
        |k| event(k, E::Query),
    );
}

#[test]
#[rustfmt::skip]
fn attempt_matrix_with_sync_evidence_cannot_leave_unknown() {
    //                            CREATED            SUBMITTED            PROCESSING           REQUIRES_ACTION      AUTHORIZED          SUCCEEDED          FAILED  CANCELED  UNKNOWN
    let grid = vec![
        (K::AttemptSubmitted,       vec![To(A::Submitted, OP), Dup,                 Stale,               Stale,               Stale,              Stale,             Stale,  Stale,    Stale]),
        (K::PaymentProcessing,      vec![To(A::Processing, OP), To(A::Processing, KEEP), Dup,             To(A::Processing, OP), Stale,           Stale,             Stale,  Stale,    Evid]),
        (K::CustomerActionRequired, vec![To(A::RequiresAction, ORA), To(A::RequiresAction, ORA), To(A::RequiresAction, ORA), Dup, Stale,          Stale,             Stale,  Stale,    Evid]),
        (K::PaymentAuthorized,      vec![To(A::Authorized, OAU), To(A::Authorized, OAU), To(A::Authorized, OAU), To(A::Authorized, OAU), Dup,   Stale,             Rec,    Stale,    Evid]),
        (K::PaymentCaptured,        wrong9()),
        (K::CaptureFailed,          wrong9()),
        (K::PaymentSucceeded,       vec![To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), Dup, Rec, Rec, Evid]),
        (K::PaymentFailed,          vec![To(A::Failed, OP), To(A::Failed, KEEP), To(A::Failed, KEEP), To(A::Failed, OP), Rec,               Rec,               Dup,    Stale,    Evid]),
        (K::ResultUnknown,          vec![To(A::Unknown, OP), To(A::Unknown, KEEP), To(A::Unknown, KEEP), Stale,           Stale,              Stale,             Stale,  Stale,    Dup]),
        (K::PaymentCanceled,        vec![To(A::Canceled, OP), To(A::Canceled, KEEP), To(A::Canceled, KEEP), To(A::Canceled, OP), To(A::Canceled, OCA), Rec,       Stale,  Dup,      Evid]),
        (K::RefundProcessing,       wrong9()),
        (K::RefundSucceeded,        wrong9()),
        (K::RefundFailed,           wrong9()),
        (K::RefundUnknown,          wrong9()),
        (K::Chargeback,             vec![Rec, Rec, Rec, Rec, Rec, To(A::Succeeded, KEEP), Rec, Rec, Rec]),
        (K::VoidSubmitted,          vec![Stale, Stale, Stale, Stale, To(A::Authorized, KEEP), Stale, Stale, Stale, Stale]),
    ];
    check_grid("attempt/sync", &ATTEMPT_COLUMNS, &grid, decide_attempt_in(CaptureMode::Manual), |k| event(k, E::SyncResponse));
}

#[test]
#[rustfmt::skip]
fn attempt_matrix_lets_an_operator_close_open_states_but_never_report_progress() {
    //                            CREATED            SUBMITTED            PROCESSING           REQUIRES_ACTION      AUTHORIZED          SUCCEEDED          FAILED  CANCELED  UNKNOWN
    let grid = vec![
        (K::AttemptSubmitted,       vec![Evid,               Dup,                 Stale,               Stale,               Stale,              Stale,             Stale,  Stale,    Stale]),
        (K::PaymentProcessing,      vec![Evid,               Evid,                Dup,                 Evid,                Stale,              Stale,             Stale,  Stale,    Evid]),
        (K::CustomerActionRequired, vec![Evid,               Evid,                Evid,                Dup,                 Stale,              Stale,             Stale,  Stale,    Evid]),
        (K::PaymentAuthorized,      vec![Evid,               Evid,                Evid,                Evid,                Dup,                Stale,             Rec,    Stale,    Evid]),
        (K::PaymentCaptured,        wrong9()),
        (K::CaptureFailed,          wrong9()),
        (K::PaymentSucceeded,       vec![To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), Dup, Rec, Rec, To(A::Succeeded, OSU)]),
        (K::PaymentFailed,          vec![To(A::Failed, OP), To(A::Failed, KEEP), To(A::Failed, KEEP), To(A::Failed, OP), Rec,               Rec,               Dup,    Stale,    To(A::Failed, KEEP)]),
        (K::ResultUnknown,          vec![Evid,               Evid,                Evid,                Stale,               Stale,              Stale,             Stale,  Stale,    Dup]),
        (K::PaymentCanceled,        vec![To(A::Canceled, OP), To(A::Canceled, KEEP), To(A::Canceled, KEEP), To(A::Canceled, OP), To(A::Canceled, OCA), Rec,       Stale,  Dup,      To(A::Canceled, KEEP)]),
        (K::RefundProcessing,       wrong9()),
        (K::RefundSucceeded,        wrong9()),
        (K::RefundFailed,           wrong9()),
        (K::RefundUnknown,          wrong9()),
        (K::Chargeback,             vec![Rec, Rec, Rec, Rec, Rec, To(A::Succeeded, KEEP), Rec, Rec, Rec]),
        (K::VoidSubmitted,          vec![Stale, Stale, Stale, Stale, Evid, Stale, Stale, Stale, Stale]),
    ];
    check_grid("attempt/operator", &ATTEMPT_COLUMNS, &grid, decide_attempt_in(CaptureMode::Manual), |k| event(k, E::Operator));
}

#[test]
#[rustfmt::skip]
fn automatic_capture_treats_authorized_as_progress_and_a_capture_report_as_the_sale_result() {
    //                            CREATED            SUBMITTED            PROCESSING           REQUIRES_ACTION      AUTHORIZED          SUCCEEDED          FAILED  CANCELED  UNKNOWN
    let rows = [
        (K::PaymentAuthorized,      vec![To(A::Processing, OP), To(A::Processing, KEEP), Dup,             To(A::Processing, OP), Stale,           Stale,             Stale,  Stale,    To(A::Processing, KEEP)]),
        (K::PaymentCaptured,        vec![To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), To(A::Succeeded, OSU), Dup, Rec, Rec, To(A::Succeeded, OSU)]),
        (K::CaptureFailed,          vec![To(A::Failed, OP), To(A::Failed, KEEP), To(A::Failed, KEEP), To(A::Failed, OP), Rec,               Rec,               Dup,    Stale,    To(A::Failed, KEEP)]),
    ];
    let decide = decide_attempt_in(CaptureMode::Automatic);
    for (kind, expected) in rows {
        for (state, want) in ATTEMPT_COLUMNS.iter().zip(expected) {
            assert_eq!(summarize(&decide(*state, &event(kind, E::Webhook))), want, "{state:?} + {kind} (automatic)");
        }
    }
}

#[test]
#[rustfmt::skip]
fn a_failure_that_is_not_a_decline_is_treated_as_unknown() {
    //                 CREATED            SUBMITTED            PROCESSING           REQUIRES_ACTION  AUTHORIZED  SUCCEEDED  FAILED  CANCELED  UNKNOWN
    let expected = vec![To(A::Unknown, OP), To(A::Unknown, KEEP), To(A::Unknown, KEEP), Stale,         Stale,      Stale,     Stale,  Stale,    Dup];
    for category in [FailureCategory::Retryable, FailureCategory::Unknown, FailureCategory::Conflict, FailureCategory::Configuration, FailureCategory::Unsupported] {
        let failed = PaymentEvent {
            failure: Some(Failure { category, code: "x".into(), message: "x".into() }),
            ..PaymentEvent::new(K::PaymentFailed, E::SyncResponse)
        };
        for (state, want) in ATTEMPT_COLUMNS.iter().zip(&expected) {
            let got = summarize(&decide_attempt_in(CaptureMode::Manual)(*state, &failed));
            assert_eq!(got, *want, "{state:?} + {category} failure");
        }
    }
}

// --- refunds -------------------------------------------------------------

use RefundState as R;

const REFUND_COLUMNS: [RefundState; 6] = [
    R::Created,
    R::Processing,
    R::Unknown,
    R::Succeeded,
    R::Failed,
    R::Canceled,
];

fn decide_refund_in(state: RefundState, event: &PaymentEvent) -> Decision<RefundState> {
    // 300 of a captured 1000 is reserved for the refund in flight.
    let amounts = Amounts {
        authorized: PAYMENT,
        captured: PAYMENT,
        refund_reserved: 300,
        ..Amounts::default()
    };
    decide_refund(&order(O::Succeeded, amounts), &refund(state, 300), event)
}

fn refund_grid(
    rows: [(EventKind, Vec<X<RefundState>>); 4],
) -> Vec<(EventKind, Vec<X<RefundState>>)> {
    let mut grid: Vec<_> = EventKind::ALL
        .iter()
        .filter(|k| {
            !matches!(
                k,
                K::RefundProcessing | K::RefundSucceeded | K::RefundFailed | K::RefundUnknown
            )
        })
        .map(|k| (*k, vec![Wrong; 6]))
        .collect();
    grid.extend(rows);
    grid
}

const RPR: X<RefundState> = To(R::Processing, KEEP);
const RSU: X<RefundState> = To(R::Succeeded, KEEP);
const RFA: X<RefundState> = To(R::Failed, KEEP);
const RUN: X<RefundState> = To(R::Unknown, KEEP);

#[test]
#[rustfmt::skip]
fn refund_matrix_with_verified_evidence_matches_the_table() {
    for evidence in [E::Webhook, E::Query] {
        let grid = refund_grid([
            //                             CREATED  PROCESSING  UNKNOWN  SUCCEEDED  FAILED  CANCELED
            (K::RefundProcessing, vec![RPR,     Dup,        RPR,     Stale,     Stale,  Stale]),
            (K::RefundSucceeded,  vec![RSU,     RSU,        RSU,     Dup,       Rec,    Rec]),
            (K::RefundFailed,     vec![RFA,     RFA,        RFA,     Rec,       Dup,    Stale]),
            (K::RefundUnknown,    vec![RUN,     RUN,        Dup,     Stale,     Stale,  Stale]),
        ]);
        check_grid("refund/verified", &REFUND_COLUMNS, &grid, decide_refund_in, |k| event(k, evidence));
    }
}

#[test]
#[rustfmt::skip]
fn refund_matrix_with_sync_evidence_cannot_leave_unknown() {
    let grid = refund_grid([
        //                             CREATED  PROCESSING  UNKNOWN  SUCCEEDED  FAILED  CANCELED
        (K::RefundProcessing, vec![RPR,     Dup,        Evid,    Stale,     Stale,  Stale]),
        (K::RefundSucceeded,  vec![RSU,     RSU,        Evid,    Dup,       Rec,    Rec]),
        (K::RefundFailed,     vec![RFA,     RFA,        Evid,    Rec,       Dup,    Stale]),
        (K::RefundUnknown,    vec![RUN,     RUN,        Dup,     Stale,     Stale,  Stale]),
    ]);
    check_grid("refund/sync", &REFUND_COLUMNS, &grid, decide_refund_in, |k| event(k, E::SyncResponse));
}

#[test]
#[rustfmt::skip]
fn refund_matrix_lets_an_operator_close_but_not_report_progress() {
    let grid = refund_grid([
        //                             CREATED  PROCESSING  UNKNOWN  SUCCEEDED  FAILED  CANCELED
        (K::RefundProcessing, vec![Evid,    Dup,        Evid,    Stale,     Stale,  Stale]),
        (K::RefundSucceeded,  vec![RSU,     RSU,        RSU,     Dup,       Rec,    Rec]),
        (K::RefundFailed,     vec![RFA,     RFA,        RFA,     Rec,       Dup,    Stale]),
        (K::RefundUnknown,    vec![Evid,    Evid,       Dup,     Stale,     Stale,  Stale]),
    ]);
    check_grid("refund/operator", &REFUND_COLUMNS, &grid, decide_refund_in, |k| event(k, E::Operator));
}

// --- captures ------------------------------------------------------------

use CaptureState as C;

const CAPTURE_COLUMNS: [CaptureState; 5] = [
    C::Created,
    C::Processing,
    C::Unknown,
    C::Succeeded,
    C::Failed,
];

/// A first capture succeeding on an authorized attempt makes the payment succeeded.
const CAPTURED: Cascade = Cascade {
    attempt: Some(A::Succeeded),
    order: Some(O::Succeeded),
};

fn decide_capture_in(state: CaptureState, event: &PaymentEvent) -> Decision<CaptureState> {
    // 400 of an authorized 1000 is reserved for the capture in flight.
    let amounts = Amounts {
        authorized: PAYMENT,
        capture_reserved: 400,
        ..Amounts::default()
    };
    decide_capture(
        &order(O::Authorized, amounts),
        &attempt(A::Authorized, CaptureMode::Manual),
        &capture(state, 400),
        event,
    )
}

fn capture_grid(
    rows: [(EventKind, Vec<X<CaptureState>>); 5],
) -> Vec<(EventKind, Vec<X<CaptureState>>)> {
    let mut grid: Vec<_> = EventKind::ALL
        .iter()
        .filter(|k| {
            !matches!(
                k,
                K::AttemptSubmitted
                    | K::PaymentProcessing
                    | K::PaymentCaptured
                    | K::CaptureFailed
                    | K::ResultUnknown
            )
        })
        .map(|k| (*k, vec![Wrong; 5]))
        .collect();
    grid.extend(rows);
    grid
}

const CPR: X<CaptureState> = To(C::Processing, KEEP);
const CSU: X<CaptureState> = To(C::Succeeded, CAPTURED);
const CFA: X<CaptureState> = To(C::Failed, KEEP);
const CUN: X<CaptureState> = To(C::Unknown, KEEP);

#[test]
#[rustfmt::skip]
fn capture_matrix_with_verified_evidence_matches_the_table() {
    for evidence in [E::Webhook, E::Query] {
        let grid = capture_grid([
            //                               CREATED  PROCESSING  UNKNOWN  SUCCEEDED  FAILED
            (K::AttemptSubmitted,  vec![CPR,     Dup,        Stale,   Stale,     Stale]),
            (K::PaymentProcessing, vec![CPR,     Dup,        CPR,     Stale,     Stale]),
            (K::PaymentCaptured,   vec![CSU,     CSU,        CSU,     Dup,       Rec]),
            (K::CaptureFailed,     vec![CFA,     CFA,        CFA,     Rec,       Dup]),
            (K::ResultUnknown,     vec![CUN,     CUN,        Dup,     Stale,     Stale]),
        ]);
        check_grid("capture/verified", &CAPTURE_COLUMNS, &grid, decide_capture_in, |k| event(k, evidence));
    }
}

#[test]
#[rustfmt::skip]
fn capture_matrix_with_sync_evidence_cannot_leave_unknown() {
    let grid = capture_grid([
        //                               CREATED  PROCESSING  UNKNOWN  SUCCEEDED  FAILED
        (K::AttemptSubmitted,  vec![CPR,     Dup,        Stale,   Stale,     Stale]),
        (K::PaymentProcessing, vec![CPR,     Dup,        Evid,    Stale,     Stale]),
        (K::PaymentCaptured,   vec![CSU,     CSU,        Evid,    Dup,       Rec]),
        (K::CaptureFailed,     vec![CFA,     CFA,        Evid,    Rec,       Dup]),
        (K::ResultUnknown,     vec![CUN,     CUN,        Dup,     Stale,     Stale]),
    ]);
    check_grid("capture/sync", &CAPTURE_COLUMNS, &grid, decide_capture_in, |k| event(k, E::SyncResponse));
}

#[test]
#[rustfmt::skip]
fn capture_matrix_lets_an_operator_close_but_not_report_progress() {
    let grid = capture_grid([
        //                               CREATED  PROCESSING  UNKNOWN  SUCCEEDED  FAILED
        (K::AttemptSubmitted,  vec![Evid,    Dup,        Stale,   Stale,     Stale]),
        (K::PaymentProcessing, vec![Evid,    Dup,        Evid,    Stale,     Stale]),
        (K::PaymentCaptured,   vec![CSU,     CSU,        CSU,     Dup,       Rec]),
        (K::CaptureFailed,     vec![CFA,     CFA,        CFA,     Rec,       Dup]),
        (K::ResultUnknown,     vec![Evid,    Evid,       Dup,     Stale,     Stale]),
    ]);
    check_grid("capture/operator", &CAPTURE_COLUMNS, &grid, decide_capture_in, |k| event(k, E::Operator));
}

/// Where a settlement report's evidence decides differently from an
/// operator's: it closes an UNKNOWN only as a success, so the failure and
/// cancellation of an UNKNOWN item are not its to decide.
fn reconciliation_may_not(state_is_unknown: bool, kind: EventKind) -> bool {
    state_is_unknown
        && matches!(
            kind,
            K::PaymentFailed | K::PaymentCanceled | K::RefundFailed | K::CaptureFailed
        )
}

/// Compare reconciliation evidence with an operator's, cell by cell.
fn check_reconciliation_against_operator<S: Copy + Debug + PartialEq>(
    name: &str,
    states: &[S],
    unknown: S,
    decide: impl Fn(S, &PaymentEvent) -> Decision<S>,
) {
    let mut wrong = Vec::new();
    for state in states {
        for kind in EventKind::ALL {
            let got = summarize(&decide(*state, &event(*kind, E::Reconciliation)));
            let operator = summarize(&decide(*state, &event(*kind, E::Operator)));
            let expected = if reconciliation_may_not(*state == unknown, *kind) && operator != Wrong
            {
                Evid
            } else {
                operator
            };
            if got != expected {
                wrong.push(format!(
                    "{state:?} + {kind}: expected {expected:?}, got {got:?}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{name}:\n{}", wrong.join("\n"));
}

#[test]
fn a_settlement_report_closes_open_items_only_as_the_success_it_booked_and_never_leaves_a_terminal_state(
) {
    check_reconciliation_against_operator(
        "attempt",
        &ATTEMPT_COLUMNS,
        A::Unknown,
        decide_attempt_in(CaptureMode::Manual),
    );
    check_reconciliation_against_operator("refund", &REFUND_COLUMNS, R::Unknown, decide_refund_in);
    check_reconciliation_against_operator(
        "capture",
        &CAPTURE_COLUMNS,
        C::Unknown,
        decide_capture_in,
    );
    // The cells that matter most, spelled out.
    let decide = decide_attempt_in(CaptureMode::Manual);
    let success = event(K::PaymentSucceeded, E::Reconciliation);
    assert_eq!(
        summarize(&decide(A::Unknown, &success)),
        To(A::Succeeded, OSU)
    );
    assert_eq!(summarize(&decide(A::Failed, &success)), Rec);
    assert_eq!(summarize(&decide(A::Succeeded, &success)), Dup);
    let refund = event(K::RefundSucceeded, E::Reconciliation);
    assert!(matches!(
        summarize(&decide_refund_in(R::Unknown, &refund)),
        To(R::Succeeded, _)
    ));
    assert_eq!(summarize(&decide_refund_in(R::Failed, &refund)), Rec);
}
