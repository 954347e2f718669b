use std::collections::BTreeMap;

use super::*;

fn payment(format: Format, id: &str, reference: &str, amount: i64, created: i64) -> Payment {
    Payment {
        format,
        id: id.to_owned(),
        api_key: "sk_a".to_owned(),
        reference: reference.to_owned(),
        idempotency_key: None,
        amount,
        currency: "EUR".to_owned(),
        manual_capture: false,
        payment_method: "pm_card_visa".to_owned(),
        status: PayStatus::Succeeded,
        amount_capturable: 0,
        amount_received: amount,
        amount_refunded: 0,
        amount_refund_pending: 0,
        metadata: BTreeMap::new(),
        merchant_account: (format == Format::Adyen).then(|| "MerchantA".to_owned()),
        return_url: None,
        charge_id: (format == Format::Stripe).then(|| format!("ch_{id}")),
        decline: None,
        next_action_url: None,
        committed: true,
        created,
        canceled_at: None,
        cancellation_reason: None,
    }
}

fn refund(p: &Payment, id: &str, reference: &str, amount: i64, status: RefundStatus) -> Refund {
    Refund {
        format: p.format,
        id: id.to_owned(),
        payment_id: p.id.clone(),
        charge_id: p.charge_id.clone(),
        api_key: p.api_key.clone(),
        reference: Some(reference.to_owned()),
        idempotency_key: None,
        amount,
        currency: p.currency.clone(),
        status,
        metadata: BTreeMap::new(),
        created: p.created + 60,
        failure_reason: None,
        settles_successfully: true,
    }
}

fn request(account: &str) -> ReportRequest {
    ReportRequest {
        account: account.to_owned(),
        period_start: 1_000,
        period_end: 2_000,
        discrepancies: Discrepancies::default(),
    }
}

fn rows(csv: &str) -> Vec<Vec<String>> {
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect()
}

#[test]
fn a_stripe_report_books_the_accounts_charges_and_succeeded_refunds_of_the_period() {
    let p1 = payment(Format::Stripe, "pi_1", "pay_1_a1", 2000, 1_100);
    let outside = payment(Format::Stripe, "pi_2", "pay_2_a1", 500, 2_100);
    let mut other_account = payment(Format::Stripe, "pi_3", "pay_3_a1", 700, 1_100);
    other_account.api_key = "sk_b".into();
    let done = refund(&p1, "re_1", "rfdref_1", 500, RefundStatus::Succeeded);
    let pending = refund(&p1, "re_2", "rfdref_2", 300, RefundStatus::Pending);
    let csv = stripe_report(
        &request("sk_a"),
        &[p1, outside, other_account],
        &[done, pending],
    );
    let rows = rows(&csv);
    assert_eq!(rows.len(), 2, "{csv}");
    assert_eq!(
        rows[0],
        [
            "txn_pi_1",
            "1970-01-01 00:18:20",
            "eur",
            "20.00",
            "0.40",
            "19.60",
            "charge",
            "ch_pi_1",
            "pi_1",
            "pay_1_a1",
            ""
        ]
    );
    assert_eq!(
        rows[1],
        [
            "txn_re_1",
            "1970-01-01 00:19:20",
            "eur",
            "-5.00",
            "0.00",
            "-5.00",
            "refund",
            "re_1",
            "pi_1",
            "pay_1_a1",
            "rfdref_1"
        ]
    );
}

#[test]
fn the_discrepancies_asked_for_appear_in_the_report() {
    let p1 = payment(Format::Stripe, "pi_1", "pay_1_a1", 2000, 1_100);
    let p2 = payment(Format::Stripe, "pi_2", "pay_2_a1", 900, 1_200);
    let pending = refund(&p1, "re_2", "rfdref_2", 300, RefundStatus::Pending);
    let mut req = request("sk_a");
    req.discrepancies = Discrepancies {
        unrecorded_charge: Some(UnrecordedCharge {
            reference: "ghost_a1".into(),
            amount: 1234,
            currency: "EUR".into(),
        }),
        book_pending_refunds: vec!["rfdref_2".into()],
        amount_off_by_one: vec!["pay_1_a1".into()],
        duplicate_charge: vec!["pay_2_a1".into()],
    };
    let rows = rows(&stripe_report(&req, &[p1, p2], &[pending]));
    let ids: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        ids,
        [
            "txn_unrecorded_ghost_a1",
            "txn_pi_1",
            "txn_re_2",
            "txn_pi_2",
            "txn_pi_2_dup"
        ]
    );
    assert_eq!(rows[1][3], "20.01");
    assert_eq!(rows[2][10], "rfdref_2");
    assert_eq!(rows[0][9], "ghost_a1");
}

#[test]
fn an_adyen_report_names_the_merchant_account_and_signs_by_debit_and_credit() {
    let p1 = payment(Format::Adyen, "PSP0001", "pay_1_a1", 1500, 1_100);
    let r1 = refund(&p1, "PSPR0001", "rfdref_1", 500, RefundStatus::Succeeded);
    let csv = adyen_report(&request("MerchantA"), &[p1], &[r1]);
    let rows = rows(&csv);
    assert_eq!(rows.len(), 2, "{csv}");
    let settled = &rows[0];
    assert_eq!(
        (
            settled[1].as_str(),
            settled[2].as_str(),
            settled[3].as_str(),
            settled[7].as_str()
        ),
        ("MerchantA", "PSP0001", "pay_1_a1", "Settled")
    );
    assert_eq!(
        (
            settled[11].as_str(),
            settled[15].as_str(),
            settled[16].as_str()
        ),
        ("15.00", "14.68", "0.32")
    );
    assert_eq!(settled[21], "pay_1_a1");
    let refunded = &rows[1];
    assert_eq!(
        (
            refunded[7].as_str(),
            refunded[8].as_str(),
            refunded[10].as_str(),
            refunded[21].as_str()
        ),
        ("Refunded", "PSPR0001", "5.00", "rfdref_1")
    );
}

#[test]
fn zero_decimal_currencies_are_written_without_a_decimal_point() {
    assert_eq!(decimal(1500, "JPY"), "1500");
    assert_eq!(decimal(-5, "EUR"), "-0.05");
}
