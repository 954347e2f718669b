//! parse-settlement: Settlement details reports, golden lines from Adyen's published
//! sample rows and from rows shaped by the documented columns.

mod common;

use common::*;
use sluice_adapter_adyen::settlement::parse_settlement;
use sluice_adapter_adyen::types::{FailureCategory, SettlementLine, SettlementLineType as T};

fn line(
    line_type: T,
    line_id: &str,
    gross: i64,
    net: i64,
    currency: &str,
    status: &str,
) -> SettlementLine {
    SettlementLine {
        line_type,
        attempt_reference: None,
        action_reference: None,
        psp_reference: None,
        psp_payment_reference: None,
        line_id: line_id.into(),
        gross_minor: gross,
        net_minor: net,
        currency: currency.into(),
        status: status.into(),
        booked_at_unix_millis: None,
    }
}

#[test]
fn the_published_sample_rows_become_a_settled_payment_and_a_chargeback() {
    let lines = parse_settlement(&fixture("settlement/published_sample.csv")).unwrap();
    let mut settled = line(T::Payment, "line 2", 500, 488, "GBP", "Settled");
    settled.attempt_reference = Some("3vpzf7".into());
    settled.psp_reference = Some("1813702551707653".into());
    // 2013-06-03 11:26:49 CET.
    settled.booked_at_unix_millis = Some(1_370_255_209_000);
    let mut chargeback = line(
        T::Chargeback,
        "line 3",
        -34_999,
        -35_749,
        "EUR",
        "Chargeback",
    );
    chargeback.attempt_reference = Some("324959451".into());
    chargeback.psp_reference = Some("2313642467170922".into());
    chargeback.psp_payment_reference = Some("1313642467023511".into());
    // 2013-03-26 22:37:26 CET.
    chargeback.booked_at_unix_millis = Some(1_364_333_846_000);
    assert_eq!(lines, vec![settled, chargeback]);
}

#[test]
fn captures_refunds_conversions_fees_and_payouts_carry_our_references_and_signed_amounts() {
    let lines = parse_settlement(&fixture("settlement/capture_refund_fee_payout.csv")).unwrap();
    assert_eq!(lines.len(), 5);

    let capture = &lines[0];
    assert_eq!(capture.line_type, T::Capture);
    assert_eq!(capture.attempt_reference.as_deref(), Some(ATTEMPT));
    assert_eq!(capture.action_reference.as_deref(), Some("cap_91b0"));
    assert_eq!(capture.psp_reference.as_deref(), Some("C1A2P3T4U5R6E7D8"));
    assert_eq!(capture.psp_payment_reference.as_deref(), Some(PSP));
    assert_eq!((capture.gross_minor, capture.net_minor), (1500, 1464));
    assert_eq!(capture.line_id, "batch 4 line 2");

    let refund = &lines[1];
    assert_eq!(refund.line_type, T::Refund);
    assert_eq!(refund.action_reference.as_deref(), Some("rf_55d1"));
    assert_eq!(refund.psp_reference.as_deref(), Some("R1E2F3U4N5D6S7X8"));
    assert_eq!(refund.psp_payment_reference.as_deref(), Some(PSP));
    assert_eq!((refund.gross_minor, refund.net_minor), (-500, -500));

    // Charged in USD, settled in EUR: the line is in EUR, gross = net + fees.
    let converted = &lines[2];
    assert_eq!(converted.line_type, T::Payment);
    assert_eq!(converted.currency, "EUR");
    assert_eq!((converted.gross_minor, converted.net_minor), (1840, 1810));

    let fee = &lines[3];
    assert_eq!(fee.line_type, T::Fee);
    assert_eq!((fee.gross_minor, fee.net_minor), (-35, -35));
    assert_eq!(fee.attempt_reference, None);
    assert_eq!(
        fee.psp_reference.as_deref(),
        Some("Transaction Fees December 2024, batch 4")
    );

    let payout = &lines[4];
    assert_eq!(payout.line_type, T::Payout);
    assert_eq!(payout.net_minor, -2739);
    assert_eq!(payout.status, "MerchantPayout");
}

#[test]
fn a_report_that_is_not_a_settlement_details_report_is_unsupported() {
    let failure = parse_settlement(b"a,b\n1,2\n").unwrap_err();
    assert_eq!(failure.category, FailureCategory::Unsupported);
    assert_eq!(failure.code, "unsupported_report");
}

#[test]
fn a_report_with_an_unreadable_amount_is_refused_whole() {
    let report = String::from_utf8(fixture("settlement/published_sample.csv"))
        .unwrap()
        .replace("4.88", "4.8.8");
    let failure = parse_settlement(report.as_bytes()).unwrap_err();
    assert_eq!(failure.code, "malformed_report");
    assert!(failure.message.contains("line 2"), "{}", failure.message);
}
