//! Settlement reports from the ledger (issue 14), in the two layouts the
//! adapters' `parse-settlement` reads (docs/psp-wire-subsets.md "Settlement
//! reports"): the Stripe-format itemized balance change report and the
//! Adyen-format Settlement details report, for one account and period, with
//! controllable discrepancies so reconciliation can be tested end to end.
//!
//! The account is named as for `account_declines`: the Stripe-format API key,
//! the Adyen-format merchant account. A line is booked when its object was
//! created (the sandbox settles at once); the period is `[start, end)` in Unix
//! seconds. Money moved is what the ledger holds: a payment's received
//! amount, a refund's amount once it succeeded. Fees are a fixed, made-up
//! schedule (`fee_of`), so gross and net differ as in a real report.

use serde::{Deserialize, Serialize};

use crate::config::Format;
use crate::model::{PayStatus, Payment, Refund, RefundStatus};
use crate::util::iso8601_utc;

/// Which report, for which account and period, with which discrepancies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportRequest {
    pub account: String,
    pub period_start: i64,
    pub period_end: i64,
    #[serde(default)]
    pub discrepancies: Discrepancies,
}

/// What the report gets wrong on purpose.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Discrepancies {
    /// A charge line for a payment the gateway never recorded, with this
    /// attempt reference (and a PSP reference made from it).
    pub unrecorded_charge: Option<UnrecordedCharge>,
    /// Refund references whose refunds the report books as succeeded although
    /// the sandbox holds them pending (a refund the gateway thinks is pending).
    pub book_pending_refunds: Vec<String>,
    /// Attempt references whose charge line is one minor unit higher.
    pub amount_off_by_one: Vec<String>,
    /// Attempt references whose charge line appears twice.
    pub duplicate_charge: Vec<String>,
}

/// A charge at the PSP the gateway has no record of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnrecordedCharge {
    pub reference: String,
    pub amount: i64,
    pub currency: String,
}

/// One booked movement, before it is written in a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Booked {
    kind: Kind,
    /// Unique within the report.
    line_id: String,
    /// The payment's PSP id.
    payment_id: String,
    charge_id: Option<String>,
    /// The refund's PSP id, for refunds.
    refund_id: Option<String>,
    attempt_reference: String,
    refund_reference: Option<String>,
    /// Signed, from the balance's point of view.
    gross: i64,
    fee: i64,
    currency: String,
    booked_at: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Charge,
    Refund,
}

/// The account a payment belongs to, as reports name it.
fn account_of(payment: &Payment) -> &str {
    match payment.format {
        Format::Stripe => &payment.api_key,
        Format::Adyen => payment
            .merchant_account
            .as_deref()
            .unwrap_or(&payment.api_key),
    }
}

/// A made-up but deterministic fee: 1.5 % plus 10 minor units of a charge.
fn fee_of(gross: i64) -> i64 {
    if gross <= 0 {
        return 0;
    }
    gross.saturating_mul(15) / 1000 + 10
}

/// The booked lines of one account, format and period, discrepancies applied.
fn booked(
    format: Format,
    request: &ReportRequest,
    payments: &[Payment],
    refunds: &[Refund],
) -> Vec<Booked> {
    let within = |at: i64| at >= request.period_start && at < request.period_end;
    let ours = |p: &Payment| p.format == format && account_of(p) == request.account;
    let mut lines = Vec::new();
    for p in payments.iter().filter(|p| ours(p) && within(p.created)) {
        let charged =
            p.amount_received > 0 && matches!(p.status, PayStatus::Succeeded | PayStatus::Canceled);
        if !charged {
            continue;
        }
        let off = i64::from(
            request
                .discrepancies
                .amount_off_by_one
                .contains(&p.reference),
        );
        let line = charge_line(p, p.amount_received.saturating_add(off));
        if request
            .discrepancies
            .duplicate_charge
            .contains(&p.reference)
        {
            lines.push(Booked {
                line_id: format!("{}_dup", line.line_id),
                ..line.clone()
            });
        }
        lines.push(line);
    }
    for r in refunds.iter().filter(|r| within(r.created)) {
        let Some(p) = payments.iter().find(|p| p.id == r.payment_id && ours(p)) else {
            continue;
        };
        let forced = r
            .reference
            .as_ref()
            .is_some_and(|x| request.discrepancies.book_pending_refunds.contains(x));
        if r.status == RefundStatus::Succeeded || (forced && r.status == RefundStatus::Pending) {
            lines.push(refund_line(p, r));
        }
    }
    if let Some(extra) = &request.discrepancies.unrecorded_charge {
        lines.push(unrecorded_line(extra, request.period_start));
    }
    lines.sort_by(|a, b| (a.booked_at, &a.line_id).cmp(&(b.booked_at, &b.line_id)));
    lines
}

fn charge_line(p: &Payment, gross: i64) -> Booked {
    Booked {
        kind: Kind::Charge,
        line_id: format!("txn_{}", p.id),
        payment_id: p.id.clone(),
        charge_id: p.charge_id.clone(),
        refund_id: None,
        attempt_reference: p.reference.clone(),
        refund_reference: None,
        gross,
        fee: fee_of(gross),
        currency: p.currency.clone(),
        booked_at: p.created,
    }
}

fn refund_line(p: &Payment, r: &Refund) -> Booked {
    Booked {
        kind: Kind::Refund,
        line_id: format!("txn_{}", r.id),
        payment_id: p.id.clone(),
        charge_id: p.charge_id.clone(),
        refund_id: Some(r.id.clone()),
        attempt_reference: p.reference.clone(),
        refund_reference: r.reference.clone(),
        gross: r.amount.saturating_neg(),
        fee: 0,
        currency: r.currency.clone(),
        booked_at: r.created,
    }
}

fn unrecorded_line(extra: &UnrecordedCharge, at: i64) -> Booked {
    Booked {
        kind: Kind::Charge,
        line_id: format!("txn_unrecorded_{}", extra.reference),
        payment_id: format!("psp_{}", extra.reference),
        charge_id: None,
        refund_id: None,
        attempt_reference: extra.reference.clone(),
        refund_reference: None,
        gross: extra.amount,
        fee: fee_of(extra.amount),
        currency: extra.currency.to_ascii_uppercase(),
        booked_at: at,
    }
}

/// The Stripe-format itemized balance change report (CSV).
pub fn stripe_report(request: &ReportRequest, payments: &[Payment], refunds: &[Refund]) -> String {
    let mut out = String::from(
        "balance_transaction_id,created_utc,currency,gross,fee,net,reporting_category,source_id,\
         payment_intent_id,payment_metadata[sluice_attempt_reference],refund_metadata[sluice_refund_reference]\n",
    );
    for b in booked(Format::Stripe, request, payments, refunds) {
        let (category, source) = match b.kind {
            Kind::Charge => (
                "charge",
                b.charge_id.clone().unwrap_or_else(|| b.payment_id.clone()),
            ),
            Kind::Refund => ("refund", b.refund_id.clone().unwrap_or_default()),
        };
        let fields = [
            b.line_id.clone(),
            report_time(b.booked_at),
            b.currency.to_ascii_lowercase(),
            decimal(b.gross, &b.currency),
            decimal(b.fee, &b.currency),
            decimal(b.gross.saturating_sub(b.fee), &b.currency),
            category.to_owned(),
            source,
            b.payment_id.clone(),
            b.attempt_reference.clone(),
            b.refund_reference.clone().unwrap_or_default(),
        ];
        push_row(&mut out, &fields);
    }
    out
}

/// The Adyen-format Settlement details report (CSV). A charge is `Settled`
/// (its modification merchant reference is the payment's own, so it reads as
/// a payment), a refund `Refunded`; credit and debit columns carry the sign.
pub fn adyen_report(request: &ReportRequest, payments: &[Payment], refunds: &[Refund]) -> String {
    let mut out = String::from(
        "Company Account,Merchant Account,Psp Reference,Merchant Reference,Payment Method,Creation Date,\
         TimeZone,Type,Modification Reference,Gross Currency,Gross Debit (GC),Gross Credit (GC),\
         Exchange Rate,Net Currency,Net Debit (NC),Net Credit (NC),Commission (NC),Markup (NC),\
         Scheme Fees (NC),Interchange (NC),Payment Method Variant,Modification Merchant Reference,Batch Number\n",
    );
    for b in booked(Format::Adyen, request, payments, refunds) {
        let money = |minor: i64| decimal(minor.saturating_abs(), &b.currency);
        let net = b.gross.saturating_sub(b.fee);
        let (kind, modification, modification_reference) = match b.kind {
            Kind::Charge => ("Settled", b.payment_id.clone(), b.attempt_reference.clone()),
            Kind::Refund => (
                "Refunded",
                b.refund_id.clone().unwrap_or_default(),
                b.refund_reference.clone().unwrap_or_default(),
            ),
        };
        let (gross_debit, gross_credit) = if b.gross < 0 {
            (money(b.gross), String::new())
        } else {
            (String::new(), money(b.gross))
        };
        let (net_debit, net_credit) = if net < 0 {
            (money(net), String::new())
        } else {
            (String::new(), money(net))
        };
        let fields = [
            "SluiceSandbox".to_owned(),
            request.account.clone(),
            b.payment_id.clone(),
            b.attempt_reference.clone(),
            "visa".to_owned(),
            report_time(b.booked_at),
            "UTC".to_owned(),
            kind.to_owned(),
            modification,
            b.currency.clone(),
            gross_debit,
            gross_credit,
            "1".to_owned(),
            b.currency.clone(),
            net_debit,
            net_credit,
            if b.fee > 0 {
                money(b.fee)
            } else {
                String::new()
            },
            String::new(),
            String::new(),
            String::new(),
            "visaclassic".to_owned(),
            modification_reference,
            "1".to_owned(),
        ];
        push_row(&mut out, &fields);
    }
    out
}

/// `YYYY-MM-DD HH:MM:SS` in UTC, as both reports write their times.
fn report_time(unix_secs: i64) -> String {
    let iso = iso8601_utc(unix_secs);
    iso.trim_end_matches("+00:00").replacen('T', " ", 1)
}

/// Minor units as a decimal in the major unit, by the currency's exponent.
fn decimal(minor: i64, currency: &str) -> String {
    let zero_decimal = matches!(currency.to_ascii_uppercase().as_str(), "JPY" | "KRW");
    if zero_decimal {
        return minor.to_string();
    }
    let sign = if minor < 0 { "-" } else { "" };
    let abs = minor.unsigned_abs();
    format!("{sign}{}.{:02}", abs / 100, abs % 100)
}

/// One RFC 4180 row: a field with a comma, quote or line break is quoted.
fn push_row(out: &mut String, fields: &[String]) {
    let quoted: Vec<String> = fields
        .iter()
        .map(|f| {
            if f.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.clone()
            }
        })
        .collect();
    out.push_str(&quoted.join(","));
    out.push('\n');
}

#[cfg(test)]
mod tests;
