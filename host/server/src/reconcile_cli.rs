//! `sluice reconcile`: the request body of `POST /admin/reconciliation/runs`
//! and a text rendering of the run it answers. Pure, so it is tested without
//! a gateway.

use std::fmt::Write as _;

use base64::Engine as _;
use serde_json::{json, Value};

/// A period bound: Unix milliseconds, or a UTC date `YYYY-MM-DD` (midnight).
pub fn period_bound(text: &str) -> Option<i64> {
    if let Ok(ms) = text.parse::<i64>() {
        return (ms >= 0).then_some(ms);
    }
    let mut parts = text.splitn(3, '-');
    let year: i64 = parts.next()?.parse().ok()?;
    let month: i64 = parts.next()?.parse().ok()?;
    let day: i64 = parts.next()?.parse().ok()?;
    let valid =
        (1970..=9999).contains(&year) && (1..=12).contains(&month) && (1..=31).contains(&day);
    valid.then(|| days_from_civil(year, month, day) * 86_400_000)
}

/// Howard Hinnant's civil-to-days (proleptic Gregorian), days since 1970-01-01.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The upload's JSON body: the report base64-encoded.
pub fn run_request(account: &str, start: i64, end: i64, report: &[u8]) -> Value {
    json!({
        "connector_account": account,
        "period_start": start,
        "period_end": end,
        "report_base64": base64::engine::general_purpose::STANDARD.encode(report),
    })
}

/// The run as text: its inputs, what it found and did, per class.
pub fn render_run(run: &Value) -> String {
    let text = |key: &str| run[key].as_str().unwrap_or("-").to_owned();
    let number = |key: &str| run[key].as_i64().unwrap_or(0);
    let mut out = String::new();
    let _ = writeln!(out, "run          {} ({})", text("id"), text("status"));
    let _ = writeln!(
        out,
        "account      {} ({})",
        text("connector_account"),
        text("adapter")
    );
    let _ = writeln!(
        out,
        "period       {} .. {} (ms)",
        number("period_start"),
        number("period_end")
    );
    let _ = writeln!(out, "report       {}", text("report_digest"));
    let _ = writeln!(
        out,
        "lines        {} ({} matched, {} fees/payouts)",
        number("line_count"),
        number("matched_lines"),
        number("ignored_lines")
    );
    let _ = writeln!(
        out,
        "differences  {} ({} repaired through the door, {} to review)",
        number("difference_count"),
        number("repaired_count"),
        number("review_count")
    );
    if let Some(classes) = run["classes"].as_object() {
        for (class, total) in classes {
            let count = total["count"].as_i64().unwrap_or(0);
            let amount = total["amount_minor"].as_i64().unwrap_or(0);
            let _ = writeln!(out, "  {class:<32} {count:>6}  {amount:>12} minor units");
        }
    }
    let _ = writeln!(
        out,
        "\nDetails: GET /admin/reconciliation/runs/{}/differences",
        text("id")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_bound_is_milliseconds_or_a_utc_date() {
        assert_eq!(period_bound("1764806400000"), Some(1_764_806_400_000));
        assert_eq!(period_bound("1970-01-02"), Some(86_400_000));
        assert_eq!(period_bound("2026-12-01"), Some(1_796_083_200_000));
        assert_eq!(period_bound("2026-13-01"), None);
        assert_eq!(period_bound("-5"), None);
        assert_eq!(period_bound("yesterday"), None);
    }

    #[test]
    fn the_upload_carries_the_report_in_base64_and_the_run_renders_per_class() {
        let body = run_request("ca_1", 0, 10, b"a,b\n");
        assert_eq!(body["report_base64"], "YSxiCg==");
        let run = json!({
            "id": "rec_1", "status": "completed", "connector_account": "ca_1", "adapter": "stripe",
            "period_start": 0, "period_end": 10, "report_digest": "sha256:ab", "line_count": 4,
            "matched_lines": 2, "ignored_lines": 0, "difference_count": 2, "repaired_count": 1,
            "review_count": 1,
            "classes": { "duplicate": { "count": 1, "amount_minor": 300 } },
        });
        let text = render_run(&run);
        assert!(text.contains("run          rec_1 (completed)"), "{text}");
        assert!(
            text.contains("2 (1 repaired through the door, 1 to review)"),
            "{text}"
        );
        assert!(
            text.contains("duplicate") && text.contains("300 minor units"),
            "{text}"
        );
    }
}
