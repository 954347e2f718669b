//! parse-settlement: Stripe balance reports, golden lines from rows shaped by Stripe's
//! documented report columns (itemized balance change report, balance export).

mod common;

use common::*;
use sluice_adapter_stripe::settlement::parse_settlement;
use sluice_adapter_stripe::types::{FailureCategory, SettlementLine, SettlementLineType as T};

const CHARGE_TXN: &str = "txn_3QxYz1LkdIwHu7ix0c1h4r9e";

#[test]
fn an_itemized_balance_change_report_becomes_signed_lines_with_our_references() {
    let lines = parse_settlement(&fixture("settlement/balance_change_itemized.csv")).unwrap();
    assert_eq!(lines.len(), 5);
    assert_eq!(
        lines[0],
        SettlementLine {
            line_type: T::Payment,
            attempt_reference: Some(ATTEMPT.into()),
            action_reference: None,
            psp_reference: Some(PI.into()),
            psp_payment_reference: None,
            line_id: CHARGE_TXN.into(),
            gross_minor: 2000,
            net_minor: 1912,
            currency: "EUR".into(),
            status: "charge".into(),
            // 2024-12-01 10:15:30 UTC.
            booked_at_unix_millis: Some(1_733_048_130_000),
        }
    );
    let refund = &lines[1];
    assert_eq!(refund.line_type, T::Refund);
    assert_eq!(refund.psp_reference.as_deref(), Some(REFUND));
    assert_eq!(refund.psp_payment_reference.as_deref(), Some(PI));
    assert_eq!(refund.action_reference.as_deref(), Some("rf_55d1"));
    assert_eq!((refund.gross_minor, refund.net_minor), (-500, -500));

    let dispute = &lines[2];
    assert_eq!(dispute.line_type, T::Chargeback);
    assert_eq!((dispute.gross_minor, dispute.net_minor), (-2000, -3500));
    assert_eq!(dispute.psp_payment_reference.as_deref(), Some(PI));

    // A zero-decimal currency: yen are already minor units.
    let fee = &lines[3];
    assert_eq!(fee.line_type, T::Fee);
    assert_eq!((fee.currency.as_str(), fee.net_minor), ("JPY", -300));
    assert_eq!(fee.psp_reference, None);

    let payout = &lines[4];
    assert_eq!(payout.line_type, T::Payout);
    assert_eq!(payout.psp_reference.as_deref(), Some("po_1QyPaY0uTLkdIwHu"));
    assert_eq!(payout.net_minor, -1412);
}

#[test]
fn the_dashboard_balance_export_is_read_too() {
    let lines = parse_settlement(&fixture("settlement/balance_transactions_export.csv")).unwrap();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].line_type, T::Payment);
    assert_eq!(lines[0].line_id, CHARGE_TXN);
    assert_eq!((lines[0].gross_minor, lines[0].net_minor), (2000, 1912));
    assert_eq!(lines[0].status, "available");
    assert_eq!(lines[0].booked_at_unix_millis, Some(1_733_048_100_000));
    assert_eq!(lines[1].line_type, T::Payout);
    assert_eq!(lines[1].status, "pending");
}

#[test]
fn a_line_whose_net_is_not_gross_minus_fee_refuses_the_report() {
    let report = String::from_utf8(fixture("settlement/balance_change_itemized.csv"))
        .unwrap()
        .replace("0.88,19.12", "0.88,19.13");
    let failure = parse_settlement(report.as_bytes()).unwrap_err();
    assert_eq!(failure.code, "malformed_report");
    assert!(failure.message.contains("line 2"), "{}", failure.message);
}

#[test]
fn an_unknown_report_is_unsupported() {
    let failure = parse_settlement(b"x,y\n1,2\n").unwrap_err();
    assert_eq!(failure.category, FailureCategory::Unsupported);
    assert_eq!(failure.code, "unsupported_report");
}
