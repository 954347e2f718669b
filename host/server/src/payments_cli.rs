//! `sluice payments show ID` and `sluice payments explain ID`: the payment
//! resource and its timeline with the `next` section, for a terminal.
//!
//! They talk to a running gateway's merchant API with a merchant API key,
//! like any integration does: the same facts, the same merchant scoping (a
//! key sees only its merchant's payments), nothing read past the API. The
//! rendering is pure (JSON in, text out), so it is tested without a server.

use serde_json::Value;

use crate::client::{AdminClient, ClientError};

/// History rows `explain` shows at most (the timeline is read a page at a
/// time; a payment with more shows the first ones and says so).
pub const MAX_HISTORY_ROWS: usize = 1000;
const PAGE: usize = 500;

/// `GET /v1/payments/{id}`.
pub async fn fetch_payment(client: &AdminClient, id: &str) -> Result<Value, ClientError> {
    client
        .get_json(&format!("/v1/payments/{}", encode(id)))
        .await
}

/// Every page of `GET /v1/payments/{id}/timeline` up to [`MAX_HISTORY_ROWS`]
/// rows, merged: `data` holds the rows, `next` the first page's section and
/// `has_more` whether rows were left out.
pub async fn fetch_timeline(client: &AdminClient, id: &str) -> Result<Value, ClientError> {
    let base = format!("/v1/payments/{}/timeline?limit={PAGE}", encode(id));
    let mut merged = client.get_json(&base).await?;
    let mut rows: Vec<Value> = take_rows(&mut merged);
    let mut cursor = merged["next_cursor"].as_i64();
    while let Some(after) = cursor.filter(|_| rows.len() < MAX_HISTORY_ROWS) {
        let mut page = client
            .get_json(&format!("{base}&starting_after={after}"))
            .await?;
        rows.extend(take_rows(&mut page));
        cursor = page["next_cursor"].as_i64();
    }
    rows.truncate(MAX_HISTORY_ROWS);
    merged["has_more"] = Value::Bool(cursor.is_some());
    merged["data"] = Value::Array(rows);
    Ok(merged)
}

fn take_rows(page: &mut Value) -> Vec<Value> {
    match page["data"].take() {
        Value::Array(rows) => rows,
        _ => Vec::new(),
    }
}

/// Payment ids are `[A-Za-z0-9_-]`; anything else is percent-encoded so a
/// typo cannot change the path.
fn encode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn line(out: &mut String, label: &str, value: String) {
    out.push_str(&format!("{label:<16}{value}\n"));
}

/// The payment resource, for a terminal.
pub fn render_payment(p: &Value) -> String {
    let mut out = String::new();
    line(&mut out, "payment", text(&p["id"]));
    line(&mut out, "order no", text(&p["merchant_order_no"]));
    let amount = format!(
        "{} {} (minor units)",
        text(&p["amount"]),
        text(&p["currency"])
    );
    line(&mut out, "amount", amount);
    let status = format!(
        "{} (state {}, version {})",
        text(&p["status"]),
        text(&p["state"]),
        text(&p["version"])
    );
    line(&mut out, "status", status);
    if p["manual_review"] == Value::Bool(true) {
        line(&mut out, "manual review", text(&p["manual_review_reason"]));
    }
    if !p["failure"].is_null() {
        let failure = &p["failure"];
        let why = format!("{}: {}", text(&failure["code"]), text(&failure["message"]));
        line(&mut out, "failure", why);
    }
    let a = &p["amounts"];
    let amounts = format!(
        "authorized {} · captured {} (+{} reserved) · refunded {} (+{} reserved) · refundable {}",
        text(&a["authorized"]),
        text(&a["captured"]),
        text(&a["capture_reserved"]),
        text(&a["refunded"]),
        text(&a["refund_reserved"]),
        text(&a["refundable"])
    );
    line(&mut out, "amounts", amounts);
    out.push_str(&render_aggregates(p));
    out
}

/// Attempts, captures, refunds and the fulfillment, one line each.
fn render_aggregates(p: &Value) -> String {
    let mut out = String::new();
    for a in p["attempts"].as_array().into_iter().flatten() {
        let attempt = format!(
            "{} {} ref {} via {} / {} psp {}",
            text(&a["id"]),
            text(&a["state"]),
            text(&a["reference"]),
            text(&a["adapter"]),
            text(&a["connector_account"]),
            text(&a["psp_reference"])
        );
        line(&mut out, "attempt", attempt);
    }
    for (label, key) in [("capture", "captures"), ("refund", "refunds")] {
        for item in p[key].as_array().into_iter().flatten() {
            let row = format!(
                "{} {} {} ref {} psp {}",
                text(&item["id"]),
                text(&item["state"]),
                text(&item["amount"]),
                text(&item["reference"]),
                text(&item["psp_reference"])
            );
            line(&mut out, label, row);
        }
    }
    if let Some(f) = p["fulfillment"].as_object() {
        let fulfillment = format!(
            "{} {} mode {} deadline {} next check {}",
            text(&f["biz_key"]),
            text(&f["state"]),
            text(&f["mode"]),
            text(&f["deadline"]),
            text(&f["next_check_at"])
        );
        line(&mut out, "fulfillment", fulfillment);
    }
    out
}

/// The timeline's `next` section, then its history, for a terminal.
pub fn render_explain(timeline: &Value) -> String {
    let next = &timeline["next"];
    let mut out = format!(
        "next: {} — {}\n",
        text(&next["mover"]),
        text(&next["summary"])
    );
    out.push_str(&format!(
        "  as of {}, earliest due {}\n",
        text(&next["as_of"]),
        text(&next["due_at"])
    ));
    for step in next["steps"].as_array().into_iter().flatten() {
        out.push_str(&render_step(step));
    }
    out.push_str(&render_money(&next["money_held"]));
    if let Some(review) = next["review"].as_object() {
        out.push_str(&format!("review: {}\n", text(&review["awaiting"])));
        if !review["reason"].is_null() {
            out.push_str(&format!("  reason {}\n", text(&review["reason"])));
        }
    }
    out.push_str(&render_history(timeline));
    out
}

fn render_step(step: &Value) -> String {
    let mut out = format!(
        "  {} {} [{}]: {} {} due {}\n    {}\n",
        text(&step["aggregate"]),
        text(&step["id"]),
        text(&step["state"]),
        text(&step["mover"]),
        text(&step["action"]),
        text(&step["due_at"]),
        text(&step["explanation"])
    );
    if !step["reference"].is_null() || !step["tries"].is_null() {
        out.push_str(&format!(
            "    reference {} · tries {} · backoff {} ms\n",
            text(&step["reference"]),
            text(&step["tries"]),
            text(&step["backoff_ms"])
        ));
    }
    if let Some(deadline) = step["deadline"].as_object() {
        out.push_str(&format!(
            "    deadline {}: {}\n",
            text(&deadline["at"]),
            text(&deadline["then"])
        ));
    }
    out
}

fn render_money(money: &Value) -> String {
    let mut out = format!(
        "money held: authorized {} · capture reserved {} · refund reserved {}\n",
        text(&money["authorized"]),
        text(&money["capture_reserved"]),
        text(&money["refund_reserved"])
    );
    for hold in money["holds"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {} {} on {}: {}\n",
            text(&hold["kind"]),
            text(&hold["amount"]),
            text(&hold["aggregate_id"]),
            text(&hold["reason"])
        ));
    }
    out
}

fn render_history(timeline: &Value) -> String {
    let mut out = String::from("history (oldest first):\n");
    for e in timeline["data"].as_array().into_iter().flatten() {
        let adapter = e["adapter"]
            .as_object()
            .map(|a| format!(" {}@{}", text(&a["name"]), text(&a["version"])))
            .unwrap_or_default();
        out.push_str(&format!(
            "  #{} {} {} {} {}→{} {} ({}{}{}): {}\n",
            text(&e["id"]),
            text(&e["recorded_at"]),
            text(&e["aggregate_type"]),
            text(&e["aggregate_id"]),
            text(&e["from_state"]),
            text(&e["to_state"]),
            text(&e["event_kind"]),
            text(&e["source"]),
            adapter,
            e["actor"]
                .as_str()
                .map(|a| format!(" by {a}"))
                .unwrap_or_default(),
            text(&e["decision"]),
        ));
    }
    if timeline["has_more"] == Value::Bool(true) {
        out.push_str(&format!(
            "  ... more rows: the first {MAX_HISTORY_ROWS} are shown; page on with GET .../timeline?starting_after=\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_explanation_shows_the_mover_the_step_the_money_and_the_history() {
        let timeline = json!({
            "data": [{"id": 1, "recorded_at": 5, "aggregate_type": "attempt", "aggregate_id": "att_1",
                      "from_state": "SUBMITTED", "to_state": "UNKNOWN", "event_kind": "RESULT_UNKNOWN",
                      "source": "sync_response", "adapter": {"name": "stripe", "version": "1.0.0"},
                      "actor": "system:api", "decision": "applied"}],
            "has_more": false,
            "next": {"mover": "scanner", "summary": "the scanner queries", "as_of": 10, "due_at": 20,
                     "steps": [{"aggregate": "attempt", "id": "att_1", "state": "UNKNOWN", "mover": "scanner",
                                "action": "query_psp", "due_at": 20, "reference": "pay_1_a1", "tries": 2,
                                "backoff_ms": 60000, "deadline": null, "explanation": "query it"}],
                     "money_held": {"authorized": 0, "capture_reserved": 0, "refund_reserved": 300,
                                    "holds": [{"kind": "refund_reservation", "amount": 300,
                                               "aggregate_id": "re_1", "reason": "reserved"}]},
                     "review": null}
        });
        let out = render_explain(&timeline);
        assert!(
            out.starts_with("next: scanner — the scanner queries\n"),
            "{out}"
        );
        assert!(
            out.contains("attempt att_1 [UNKNOWN]: scanner query_psp due 20"),
            "{out}"
        );
        assert!(
            out.contains("reference pay_1_a1 · tries 2 · backoff 60000 ms"),
            "{out}"
        );
        assert!(
            out.contains("refund_reservation 300 on re_1: reserved"),
            "{out}"
        );
        assert!(out.contains("#1 5 attempt att_1 SUBMITTED→UNKNOWN RESULT_UNKNOWN (sync_response stripe@1.0.0 by system:api): applied"), "{out}");
        assert!(!out.contains("review:"), "{out}");
    }

    #[test]
    fn a_payment_shows_its_status_amounts_and_every_aggregate() {
        let payment = json!({
            "id": "pay_1", "merchant_order_no": "o-1", "amount": 700, "currency": "EUR",
            "status": "processing", "state": "PROCESSING", "version": 4, "manual_review": true,
            "manual_review_reason": "UNKNOWN too long", "failure": null,
            "amounts": {"authorized": 0, "captured": 0, "capture_reserved": 0, "refunded": 0,
                        "refund_reserved": 0, "refundable": 0},
            "attempts": [{"id": "att_1", "state": "UNKNOWN", "reference": "pay_1_a1", "adapter": "stripe",
                          "connector_account": "ca_1", "psp_reference": null}],
            "captures": [], "refunds": [], "fulfillment": null
        });
        let out = render_payment(&payment);
        assert!(
            out.contains("status          processing (state PROCESSING, version 4)"),
            "{out}"
        );
        assert!(out.contains("manual review   UNKNOWN too long"), "{out}");
        assert!(
            out.contains("attempt         att_1 UNKNOWN ref pay_1_a1 via stripe / ca_1 psp -"),
            "{out}"
        );
    }

    #[test]
    fn an_id_with_path_characters_is_percent_encoded() {
        assert_eq!(encode("pay_01-x"), "pay_01-x");
        assert_eq!(encode("../admin"), "%2E%2E%2Fadmin");
    }
}
