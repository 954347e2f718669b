//! Adyen Settlement details reports (CSV) → normalised settlement lines.
//!
//! Columns are read by their documented names, so added or reordered columns do not
//! matter: `Merchant Account`, `Psp Reference`, `Merchant Reference`, `Creation Date`,
//! `TimeZone`, `Type`, `Modification Reference`, `Gross Currency`, `Gross Debit (GC)`,
//! `Gross Credit (GC)`, `Net Currency`, `Net Debit (NC)`, `Net Credit (NC)`, and when
//! present `Modification Merchant Reference` and `Batch Number`.
//!
//! Amounts are decimals in the currency's major unit; a line's amount is its credit
//! minus its debit (a settled payment is positive, a refund or a fee negative); a line
//! without a gross currency (fees, payouts, corrections) has gross = net. When the
//! gross and net currencies differ (a conversion), the line is expressed in the net
//! currency and gross is net plus the fees (`Commission`, `Markup`, `Scheme Fees`,
//! `Interchange`, all in the net currency).
//!
//! References: `Merchant Reference` is the payment's reference, i.e. our attempt
//! reference; `Modification Merchant Reference` the capture's or refund's reference
//! (ours); `Psp Reference` Adyen's payment reference; `Modification Reference` the
//! modification's own.
//!
//! | `Type` | line type |
//! |---|---|
//! | `Settled`, `SettledBulk`, `SettledInstallment`, `SettledExternallyWithInfo` | capture when a modification merchant reference differs from the payment's, payment otherwise |
//! | `Refunded`, `RefundedBulk`, `RefundedInstallment`, `RefundedExternallyWithInfo`, `RefundedReversed` | refund |
//! | `Chargeback`, `SecondChargeback`, `ChargebackReversed`, `ChargebackCorrection`, `ChargebackReversedCorrection` | chargeback |
//! | `Fee`, `MiscCosts`, `PaymentCost`, `InvoiceDeduction` | fee |
//! | `MerchantPayout`, `PaidOut` | payout |
//! | anything else (`DepositCorrection`, `Balancetransfer`, ...) | other |

use sluice_adapter_kit::amount::minor_units;
use sluice_adapter_kit::csv::{Row, Table};
use sluice_adapter_kit::time::{unix_millis, zone_offset_minutes};

use crate::types::{Failure, FailureCategory, SettlementLine, SettlementLineType};

const FEE_COLUMNS: [&str; 4] = [
    "Commission (NC)",
    "Markup (NC)",
    "Scheme Fees (NC)",
    "Interchange (NC)",
];

struct Columns {
    psp_reference: usize,
    merchant_reference: usize,
    created: usize,
    zone: Option<usize>,
    kind: usize,
    modification_reference: usize,
    gross_currency: usize,
    gross_debit: usize,
    gross_credit: usize,
    net_currency: usize,
    net_debit: usize,
    net_credit: usize,
    fees: Vec<usize>,
    modification_merchant_reference: Option<usize>,
    batch: Option<usize>,
}

/// Parse a Settlement details report: every line, or a failure for the whole report.
pub fn parse_settlement(report: &[u8]) -> Result<Vec<SettlementLine>, Failure> {
    let table = Table::parse(report).map_err(|e| malformed(&e.to_string()))?;
    if !table.has_columns(&["Psp Reference", "Type", "Net Currency"]) {
        return Err(Failure {
            category: FailureCategory::Unsupported,
            code: "unsupported_report".to_string(),
            message: "not an Adyen Settlement details report".to_string(),
        });
    }
    let col = |name: &str| table.column(name).map_err(|e| malformed(&e.to_string()));
    let columns = Columns {
        psp_reference: col("Psp Reference")?,
        merchant_reference: col("Merchant Reference")?,
        created: col("Creation Date")?,
        zone: table.optional_column("TimeZone"),
        kind: col("Type")?,
        modification_reference: col("Modification Reference")?,
        gross_currency: col("Gross Currency")?,
        gross_debit: col("Gross Debit (GC)")?,
        gross_credit: col("Gross Credit (GC)")?,
        net_currency: col("Net Currency")?,
        net_debit: col("Net Debit (NC)")?,
        net_credit: col("Net Credit (NC)")?,
        fees: FEE_COLUMNS
            .iter()
            .filter_map(|name| table.optional_column(name))
            .collect(),
        modification_merchant_reference: table.optional_column("Modification Merchant Reference"),
        batch: table.optional_column("Batch Number"),
    };
    table.rows.iter().map(|row| line(&columns, row)).collect()
}

fn line(c: &Columns, row: &Row) -> Result<SettlementLine, Failure> {
    let at =
        |what: &str, detail: String| malformed(&format!("line {} ({what}): {detail}", row.line));
    let amount = |index: usize, currency: &str, what: &str| {
        minor_units(row.get(index), currency).map_err(|e| at(what, e.to_string()))
    };
    let net_currency = row.get(c.net_currency).to_ascii_uppercase();
    let net = amount(c.net_credit, &net_currency, "Net Credit")?
        - amount(c.net_debit, &net_currency, "Net Debit")?;
    let gross_currency = row.get(c.gross_currency).to_ascii_uppercase();
    let gross = if gross_currency.is_empty() {
        // Fees, payouts and corrections have no gross side: what moved is the net.
        net
    } else if gross_currency == net_currency {
        amount(c.gross_credit, &net_currency, "Gross Credit")?
            - amount(c.gross_debit, &net_currency, "Gross Debit")?
    } else {
        let mut fees = 0i64;
        for index in &c.fees {
            fees += amount(*index, &net_currency, "fees")?;
        }
        net + fees
    };
    let kind = row.get(c.kind);
    let merchant_reference = row.non_empty(Some(c.merchant_reference));
    let modification_merchant_reference = row.non_empty(c.modification_merchant_reference);
    let line_type = line_type(kind, &merchant_reference, &modification_merchant_reference);
    let psp_reference = row.non_empty(Some(c.psp_reference));
    let modification_reference = row.non_empty(Some(c.modification_reference));
    let (own_psp, payment_psp, action_reference) = match line_type {
        SettlementLineType::Payment => (psp_reference, None, None),
        SettlementLineType::Capture | SettlementLineType::Refund => (
            modification_reference.or(psp_reference.clone()),
            psp_reference,
            modification_merchant_reference,
        ),
        SettlementLineType::Chargeback => (modification_reference, psp_reference, None),
        _ => (modification_reference.or(psp_reference), None, None),
    };
    let offset = c
        .zone
        .map(|z| zone_offset_minutes(row.get(z)))
        .unwrap_or(Some(0));
    let booked = offset.and_then(|o| unix_millis(row.get(c.created), o));
    let line_id = match row.non_empty(c.batch) {
        Some(batch) => format!("batch {batch} line {}", row.line),
        None => format!("line {}", row.line),
    };
    Ok(SettlementLine {
        line_type,
        attempt_reference: match line_type {
            SettlementLineType::Fee | SettlementLineType::Payout | SettlementLineType::Other => {
                None
            }
            _ => merchant_reference,
        },
        action_reference,
        psp_reference: own_psp,
        psp_payment_reference: payment_psp,
        line_id,
        gross_minor: gross,
        net_minor: net,
        currency: net_currency,
        status: kind.to_string(),
        booked_at_unix_millis: booked,
    })
}

fn line_type(
    kind: &str,
    merchant_reference: &Option<String>,
    modification_merchant_reference: &Option<String>,
) -> SettlementLineType {
    match kind {
        "Settled" | "SettledBulk" | "SettledInstallment" | "SettledExternallyWithInfo" => {
            let separate_capture = modification_merchant_reference
                .as_ref()
                .is_some_and(|m| Some(m) != merchant_reference.as_ref());
            if separate_capture {
                SettlementLineType::Capture
            } else {
                SettlementLineType::Payment
            }
        }
        "Refunded"
        | "RefundedBulk"
        | "RefundedInstallment"
        | "RefundedExternallyWithInfo"
        | "RefundedReversed" => SettlementLineType::Refund,
        "Chargeback"
        | "SecondChargeback"
        | "ChargebackReversed"
        | "ChargebackCorrection"
        | "ChargebackReversedCorrection" => SettlementLineType::Chargeback,
        "Fee" | "MiscCosts" | "PaymentCost" | "InvoiceDeduction" => SettlementLineType::Fee,
        "MerchantPayout" | "PaidOut" => SettlementLineType::Payout,
        _ => SettlementLineType::Other,
    }
}

fn malformed(message: &str) -> Failure {
    Failure {
        category: FailureCategory::Unsupported,
        code: "malformed_report".to_string(),
        message: message.chars().take(500).collect(),
    }
}
