//! `sluice adapter shadow-report|shadow-stop|canary|canary-report|canary-stop`: the
//! release routes of the admin API (`releases.rs`), rendered for a terminal.

use reqwest::Method;
use serde_json::{json, Value};

use crate::cli::AdapterCommand;
use crate::client::{AdminClient, ClientError};
use crate::releases::{CanaryReport, ShadowReport};

/// Runs one release command; its output (raw JSON with `json`).
pub async fn run(
    client: &AdminClient,
    command: AdapterCommand,
    json: bool,
) -> Result<String, ClientError> {
    let (method, path, body) = request(&command);
    let answer = client.call(method, &path, body.as_ref()).await?;
    if json {
        let mut text = serde_json::to_string_pretty(&answer.raw).unwrap_or_default();
        text.push('\n');
        return Ok(text);
    }
    Ok(match command {
        AdapterCommand::ShadowReport { .. } | AdapterCommand::ShadowStop { .. } => {
            parse::<ShadowReport>(answer.value).map_or_else(|e| e, |r| render_shadow(&r))
        }
        _ => parse::<CanaryReport>(answer.value).map_or_else(|e| e, |r| render_canary(&r)),
    })
}

fn request(command: &AdapterCommand) -> (Method, String, Option<Value>) {
    let base = |name: &str, what: &str| format!("/admin/adapters/{name}/{what}");
    match command {
        AdapterCommand::ShadowReport { name, limit } => (
            Method::GET,
            format!("{}?limit={limit}", base(name, "shadow")),
            None,
        ),
        AdapterCommand::ShadowStop { name } => (Method::DELETE, base(name, "shadow"), None),
        AdapterCommand::Canary {
            name,
            digest,
            percent,
            accounts,
            min_sample,
            max_excess_pct,
        } => {
            let body = json!({
                "digest": digest, "percent": percent, "accounts": accounts,
                "min_sample": min_sample, "max_excess_pct": max_excess_pct,
            });
            (Method::POST, base(name, "canary"), Some(body))
        }
        AdapterCommand::CanaryStop { name } => (Method::DELETE, base(name, "canary"), None),
        AdapterCommand::CanaryReport { name }
        | AdapterCommand::Load { name, .. }
        | AdapterCommand::Activate { name, .. }
        | AdapterCommand::Rollback { name } => (Method::GET, base(name, "canary"), None),
        AdapterCommand::List | AdapterCommand::Test(_) => {
            (Method::GET, "/admin/adapters".into(), None)
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| format!("unexpected answer from the gateway: {e}\n"))
}

/// The shadow report as text: agreement per operation, then the newest diffs.
pub fn render_shadow(report: &ShadowReport) -> String {
    let Some(shadow) = &report.shadow else {
        return format!("{}: no shadow version staged\n", report.adapter);
    };
    let mut out = format!(
        "{} shadow {} ({}) against active {}\n\n",
        report.adapter,
        shadow.version,
        short(&shadow.digest),
        report.active_digest.as_deref().map_or("-", short)
    );
    out.push_str("OPERATION         AGREED  DIFFERED  FAILED  SHED  AGREEMENT\n");
    for op in &report.operations {
        let rate = op
            .agreement_rate
            .map_or("-".to_string(), |r| format!("{:.1}%", r * 100.0));
        out.push_str(&format!(
            "{:<16}  {:>6}  {:>8}  {:>6}  {:>4}  {rate:>9}\n",
            op.operation, op.agreed, op.differed, op.failed, op.shed
        ));
    }
    if report.diffs.is_empty() {
        out.push_str("\nno diffs\n");
    }
    for diff in &report.diffs {
        out.push_str(&format!(
            "\n{} on {} (input {})\n",
            diff.operation,
            diff.connector_account,
            short(&diff.input_digest)
        ));
        for field in diff.fields.as_array().into_iter().flatten() {
            let side = |k: &str| {
                field
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("(absent)")
                    .to_string()
            };
            let path = field.get("path").and_then(Value::as_str).unwrap_or("?");
            out.push_str(&format!(
                "  {path}: serving {} / shadow {}\n",
                side("serving"),
                side("shadow")
            ));
        }
    }
    out
}

/// The canary report as text: the canary and its tallies, then the release history.
pub fn render_canary(report: &CanaryReport) -> String {
    let mut out = match &report.canary {
        None => format!("{}: no canary running\n", report.adapter),
        Some(c) => format!(
            "{} canary {} ({}): {}% of new attempts, accounts [{}]\n\
             first sends  canary: {} ({} unknown, {} error, {} declined)  \
             active: {} ({} unknown, {} error, {} declined)\n\
             stopped when a rate exceeds the active one's by {} points over {} sends\n",
            report.adapter,
            c.version,
            short(&c.digest),
            c.percent,
            c.accounts.join(", "),
            c.canary_sends.total,
            c.canary_sends.unknown,
            c.canary_sends.error,
            c.canary_sends.declined,
            c.active_sends.total,
            c.active_sends.unknown,
            c.active_sends.error,
            c.active_sends.declined,
            c.max_excess_pct,
            c.min_sample,
        ),
    };
    if !report.history.is_empty() {
        out.push_str("\nhistory (newest first)\n");
    }
    for event in &report.history {
        out.push_str(&format!(
            "  {}  {:<18}  {}  by {}: {}\n",
            event.at_ms,
            event.kind,
            short(&event.digest),
            event.actor,
            event.detail
        ));
    }
    out
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::releases::{ShadowDiffView, ShadowOperationView};

    #[test]
    fn a_shadow_report_shows_agreement_per_operation_and_each_differing_field() {
        let report = ShadowReport {
            adapter: "stripe".into(),
            active_digest: Some("a".repeat(64)),
            shadow: None,
            operations: vec![ShadowOperationView {
                operation: "parse-response".into(),
                agreed: 3,
                differed: 1,
                failed: 0,
                shed: 0,
                agreement_rate: Some(0.75),
            }],
            diffs_by_field: Default::default(),
            diffs: vec![ShadowDiffView {
                operation: "parse-response".into(),
                connector_account: "ca_1".into(),
                serving_digest: "a".repeat(64),
                input_digest: "b".repeat(64),
                fields: json!([{"path": "$.Ok[0].amount.amount_minor", "serving": "1000", "shadow": "1001"}]),
                at_ms: 0,
            }],
        };
        assert_eq!(render_shadow(&report), "stripe: no shadow version staged\n");
        let staged = ShadowReport {
            shadow: Some(crate::api::AdapterVersionView {
                name: "stripe".into(),
                version: "2.0.0".into(),
                digest: "c".repeat(64),
                active: false,
                from_cache: false,
                compile_ms: 0,
                loaded_at_ms: 0,
                limits: crate::api::LimitsView::from(
                    &sluice_adapter_runtime::SandboxLimits::default(),
                ),
                capabilities: vec![],
                currencies: vec![],
            }),
            ..report
        };
        let text = render_shadow(&staged);
        assert!(
            text.contains("parse-response         3         1       0     0      75.0%"),
            "{text}"
        );
        assert!(
            text.contains("$.Ok[0].amount.amount_minor: serving 1000 / shadow 1001"),
            "{text}"
        );
    }
}
