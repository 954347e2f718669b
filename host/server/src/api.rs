//! JSON bodies of the admin API, shared by the server and the `sluice adapter` client.

use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use sluice_adapter_runtime::{AdapterStatus, AdapterVersionInfo, Capability, SandboxLimits};
use utoipa::ToSchema;

/// `GET /admin/adapters`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AdapterList {
    pub adapters: Vec<AdapterView>,
}

/// One adapter: which version serves, and every version loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AdapterView {
    pub name: String,
    /// `active` when a version serves calls, `inactive` when versions are only staged.
    pub status: AdapterState,
    pub active_version: Option<String>,
    pub active_digest: Option<String>,
    /// Digest of the version `rollback` would re-activate.
    pub rollback_to: Option<String>,
    /// Digest of the shadow version, if one is staged (`/admin/adapters/{name}/shadow`).
    pub shadow_digest: Option<String>,
    /// Digest of the canary version, if one runs (`/admin/adapters/{name}/canary`).
    pub canary_digest: Option<String>,
    pub versions: Vec<AdapterVersionView>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AdapterState {
    Active,
    Inactive,
}

/// One loaded version of an adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AdapterVersionView {
    pub name: String,
    /// The version the component reports in `describe()`.
    pub version: String,
    /// sha256 of the component bytes (hex): what identifies a version.
    pub digest: String,
    /// Whether this version serves new calls.
    pub active: bool,
    /// Whether the compiled artifact came from the compile cache (no compilation).
    pub from_cache: bool,
    /// Time spent compiling (or reading the cache), in milliseconds.
    pub compile_ms: u64,
    /// When this version was loaded, in Unix epoch milliseconds.
    pub loaded_at_ms: i64,
    pub limits: LimitsView,
    pub capabilities: Vec<String>,
    pub currencies: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LimitsView {
    pub memory_bytes: u64,
    pub cpu_deadline_ms: u64,
    pub max_output_bytes: u64,
    pub max_log_bytes: u64,
}

/// `POST /admin/adapters/{name}/activate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivateRequest {
    /// The version to serve: the sha256 (64 lower-case hex characters) of an uploaded component.
    #[schema(pattern = "^[0-9a-f]{64}$", min_length = 64, max_length = 64)]
    pub digest: String,
}

impl AdapterView {
    pub fn from_status(status: &AdapterStatus) -> Self {
        let active_digest = status.active.as_ref().map(|a| a.digest.clone());
        AdapterView {
            name: status.name.clone(),
            status: if status.active.is_some() {
                AdapterState::Active
            } else {
                AdapterState::Inactive
            },
            active_version: status.active.as_ref().map(|a| a.version.clone()),
            rollback_to: status.rollback_to.clone(),
            shadow_digest: status.shadow.as_ref().map(|s| s.digest.clone()),
            canary_digest: status.canary.as_ref().map(|c| c.digest.clone()),
            versions: status
                .versions
                .iter()
                .map(|v| {
                    AdapterVersionView::from_info(v, active_digest.as_deref() == Some(&v.digest))
                })
                .collect(),
            active_digest,
        }
    }
}

impl AdapterVersionView {
    pub fn from_info(info: &AdapterVersionInfo, active: bool) -> Self {
        AdapterVersionView {
            name: info.name.clone(),
            version: info.version.clone(),
            digest: info.digest.clone(),
            active,
            from_cache: info.from_cache,
            compile_ms: saturating_u64(info.compile_time.as_millis()),
            loaded_at_ms: info
                .loaded_at
                .duration_since(UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .unwrap_or(0),
            limits: LimitsView::from(&info.limits),
            capabilities: info
                .describe
                .capabilities
                .iter()
                .map(|c| capability_name(*c).to_string())
                .collect(),
            currencies: info.describe.currencies.clone(),
        }
    }
}

impl From<&SandboxLimits> for LimitsView {
    fn from(limits: &SandboxLimits) -> Self {
        LimitsView {
            memory_bytes: limits.memory_bytes as u64,
            cpu_deadline_ms: saturating_u64(limits.cpu_deadline.as_millis()),
            max_output_bytes: limits.max_output_bytes as u64,
            max_log_bytes: limits.max_log_bytes as u64,
        }
    }
}

fn saturating_u64(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// The WIT spelling of a capability, as platform teams read it in `wit/psp-adapter.wit`.
pub fn capability_name(capability: Capability) -> &'static str {
    match capability {
        Capability::Authorize => "authorize",
        Capability::Sale => "sale",
        Capability::Capture => "capture",
        Capability::PartialCapture => "partial-capture",
        Capability::MultipleCapture => "multiple-capture",
        Capability::Void => "void",
        Capability::Refund => "refund",
        Capability::PartialRefund => "partial-refund",
        Capability::QueryPayment => "query-payment",
        Capability::QueryRefund => "query-refund",
        Capability::Webhooks => "webhooks",
        Capability::SettlementReports => "settlement-reports",
    }
}

/// Renders the list as a fixed-width table for `sluice adapter list`.
pub fn render_table(list: &AdapterList) -> String {
    if list.adapters.is_empty() {
        return "no adapters loaded\n".to_string();
    }
    let mut rows = vec![[
        "NAME".to_string(),
        "VERSION".to_string(),
        "DIGEST".to_string(),
        "STATUS".to_string(),
        "CACHE".to_string(),
    ]];
    for adapter in &list.adapters {
        for version in &adapter.versions {
            let is = |digest: &Option<String>| digest.as_deref() == Some(&version.digest);
            let status = if version.active {
                "active"
            } else if is(&adapter.canary_digest) {
                "canary"
            } else if is(&adapter.shadow_digest) {
                "shadow"
            } else if is(&adapter.rollback_to) {
                "previous"
            } else {
                "staged"
            };
            rows.push([
                adapter.name.clone(),
                version.version.clone(),
                version.digest.clone(),
                status.to_string(),
                if version.from_cache { "hit" } else { "miss" }.to_string(),
            ]);
        }
    }
    let widths: Vec<usize> = (0..5)
        .map(|col| rows.iter().map(|r| r[col].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// One line describing a version, for `load`, `activate` and `rollback`.
pub fn render_version(verb: &str, version: &AdapterVersionView) -> String {
    format!(
        "{verb} {} {} ({}){}\n",
        version.name,
        version.version,
        version.digest,
        if version.active {
            ", active"
        } else {
            ", staged"
        }
    )
}
