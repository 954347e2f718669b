//! Stripe settlement reports → normalised settlement lines.
//!
//! Two CSV layouts are read, told apart by their header:
//!
//! - the itemized balance change / reconciliation reports of the Reporting API
//!   (`balance_change_from_activity.itemized.*`, `payout_reconciliation.itemized.*`):
//!   lower-case columns `balance_transaction_id`, `created_utc`, `currency`, `gross`,
//!   `fee`, `net`, `reporting_category`, `source_id`, and optionally `payment_intent_id`,
//!   `charge_id` and the metadata columns `payment_metadata[sluice_attempt_reference]`
//!   and `refund_metadata[sluice_refund_reference]` (the references this adapter sends);
//! - the Dashboard's balance transactions export: `id`, `Type`, `Source`, `Amount`,
//!   `Fee`, `Net`, `Currency`, `Created (UTC)`, and optionally `Status`.
//!
//! Amounts are decimals in the currency's major unit (`"10.00"`) and become integer
//! minor units by the ISO 4217 exponent. Stripe's signs are the balance's: a charge is
//! positive, a refund, a dispute, a fee and a payout negative; gross − fee = net.
//!
//! | `reporting_category` / `Type` | line type |
//! |---|---|
//! | `charge`, `payment` | payment |
//! | `partial_capture_reversal` | capture |
//! | `refund`, `refund_failure`, `payment_refund`, `payment_failure_refund` | refund |
//! | `dispute`, `dispute_reversal` | chargeback |
//! | `fee`, `stripe_fee`, `application_fee`, `tax_fee`, `network_cost` | fee |
//! | `payout`, `payout_reversal` | payout |
//! | anything else | other |

use sluice_adapter_kit::amount::minor_units;
use sluice_adapter_kit::csv::{Row, Table};
use sluice_adapter_kit::time::unix_millis;

use crate::model::{META_ATTEMPT, META_REFUND};
use crate::types::{Failure, FailureCategory, SettlementLine, SettlementLineType};

/// Column positions of one of the two layouts.
struct Columns {
    id: usize,
    created: usize,
    currency: usize,
    gross: usize,
    fee: usize,
    net: usize,
    category: usize,
    source: Option<usize>,
    status: Option<usize>,
    payment_intent: Option<usize>,
    attempt: Option<usize>,
    refund_reference: Option<usize>,
}

/// Parse a Stripe settlement report: every line, or a failure for the whole report.
pub fn parse_settlement(report: &[u8]) -> Result<Vec<SettlementLine>, Failure> {
    let table = Table::parse(report).map_err(|e| malformed(&e.to_string()))?;
    let columns = columns(&table)?;
    table.rows.iter().map(|row| line(&columns, row)).collect()
}

fn columns(table: &Table) -> Result<Columns, Failure> {
    let col = |name: &str| table.column(name).map_err(|e| malformed(&e.to_string()));
    if table.has_columns(&["balance_transaction_id", "reporting_category"]) {
        return Ok(Columns {
            id: col("balance_transaction_id")?,
            created: col("created_utc")?,
            currency: col("currency")?,
            gross: col("gross")?,
            fee: col("fee")?,
            net: col("net")?,
            category: col("reporting_category")?,
            source: table.optional_column("source_id"),
            status: None,
            payment_intent: table.optional_column("payment_intent_id"),
            attempt: table.optional_column(&format!("payment_metadata[{META_ATTEMPT}]")),
            refund_reference: table.optional_column(&format!("refund_metadata[{META_REFUND}]")),
        });
    }
    if table.has_columns(&["id", "Type", "Net"]) {
        return Ok(Columns {
            id: col("id")?,
            created: col("Created (UTC)")?,
            currency: col("Currency")?,
            gross: col("Amount")?,
            fee: col("Fee")?,
            net: col("Net")?,
            category: col("Type")?,
            source: table.optional_column("Source"),
            status: table.optional_column("Status"),
            payment_intent: None,
            attempt: None,
            refund_reference: None,
        });
    }
    Err(Failure {
        category: FailureCategory::Unsupported,
        code: "unsupported_report".to_string(),
        message: "not a Stripe itemized balance report or balance transactions export".to_string(),
    })
}

fn line(c: &Columns, row: &Row) -> Result<SettlementLine, Failure> {
    let at =
        |what: &str, detail: String| malformed(&format!("line {} ({what}): {detail}", row.line));
    let currency = row.get(c.currency).to_ascii_uppercase();
    let amount = |index: usize, what: &str| {
        minor_units(row.get(index), &currency).map_err(|e| at(what, e.to_string()))
    };
    let (gross, fee, net) = (
        amount(c.gross, "gross")?,
        amount(c.fee, "fee")?,
        amount(c.net, "net")?,
    );
    if gross.checked_sub(fee) != Some(net) {
        return Err(at(
            "net",
            format!("gross {gross} - fee {fee} is not net {net}"),
        ));
    }
    let id = row.get(c.id);
    if id.is_empty() {
        return Err(at("id", "no balance transaction id".to_string()));
    }
    let category = row.get(c.category);
    let line_type = line_type(category);
    let source = row.non_empty(c.source);
    let payment_intent = row.non_empty(c.payment_intent);
    let (psp_reference, psp_payment_reference) = match line_type {
        SettlementLineType::Payment | SettlementLineType::Capture => {
            (payment_intent.clone().or(source), None)
        }
        SettlementLineType::Refund | SettlementLineType::Chargeback => (source, payment_intent),
        _ => (source, None),
    };
    let action_reference = match line_type {
        SettlementLineType::Refund => row.non_empty(c.refund_reference),
        _ => None,
    };
    Ok(SettlementLine {
        line_type,
        attempt_reference: row.non_empty(c.attempt),
        action_reference,
        psp_reference,
        psp_payment_reference,
        line_id: id.to_string(),
        gross_minor: gross,
        net_minor: net,
        currency,
        status: row
            .non_empty(c.status)
            .unwrap_or_else(|| category.to_string()),
        booked_at_unix_millis: unix_millis(row.get(c.created), 0),
    })
}

fn line_type(category: &str) -> SettlementLineType {
    match category {
        "charge" | "payment" => SettlementLineType::Payment,
        "partial_capture_reversal" => SettlementLineType::Capture,
        "refund" | "refund_failure" | "payment_refund" | "payment_failure_refund" => {
            SettlementLineType::Refund
        }
        "dispute" | "dispute_reversal" => SettlementLineType::Chargeback,
        "fee" | "stripe_fee" | "application_fee" | "tax_fee" | "network_cost" => {
            SettlementLineType::Fee
        }
        "payout" | "payout_reversal" => SettlementLineType::Payout,
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
