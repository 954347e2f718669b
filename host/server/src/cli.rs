//! The `sluice` command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Sluice: a payment channel gateway with sandboxed WebAssembly PSP adapters.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// Configuration file [default: ./sluice.toml when it exists].
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// `sluice adapter test`: runs without a gateway and reads the adapter's log.
    pub fn is_adapter_test(&self) -> bool {
        matches!(&self.command, Command::Adapter(args) if matches!(args.command, AdapterCommand::Test(_)))
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve,
    /// Run the gateway with the built adapters loaded and a fresh admin token, and print how to
    /// try it.
    Demo(DemoArgs),
    /// Apply database migrations and exit.
    Migrate,
    /// Manage the adapters of a running gateway through its admin API.
    Adapter(AdapterArgs),
    /// Look at a payment through a running gateway's merchant API.
    Payments(PaymentsArgs),
    /// Reconcile a connector account's settlement report for a period through
    /// a running gateway's admin API: safe repairs through the door, the rest to
    /// review (`POST /admin/reconciliation/runs`).
    Reconcile(ReconcileArgs),
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Base URL of the gateway.
    #[arg(long, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,

    /// Admin token of the gateway.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// The connector account (id) whose report it is.
    #[arg(long, value_name = "ID")]
    pub account: String,

    /// Start of the report's period (inclusive): Unix milliseconds, or a UTC
    /// date `YYYY-MM-DD` (its midnight).
    #[arg(long, value_name = "WHEN")]
    pub period_start: String,

    /// End of the period (exclusive), like `--period-start`.
    #[arg(long, value_name = "WHEN")]
    pub period_end: String,

    /// The PSP's report file as downloaded (CSV).
    #[arg(long, value_name = "PATH")]
    pub file: PathBuf,

    /// Print the raw JSON response instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PaymentsArgs {
    /// Base URL of the gateway.
    #[arg(
        long,
        global = true,
        env = "SLUICE_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,

    /// The merchant's API key (a key sees only its own merchant's payments).
    #[arg(long, global = true, env = "SLUICE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Print the raw JSON responses instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: PaymentsCommand,
}

#[derive(Debug, Subcommand)]
pub enum PaymentsCommand {
    /// The payment: status, amounts, attempts, captures, refunds, fulfillment.
    Show {
        /// Payment id (`pay_...`).
        id: String,
    },
    /// What happens next to the payment (who moves it, when, with what, the
    /// money held, the review), then its history.
    Explain {
        /// Payment id (`pay_...`).
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Directory of built adapters [default: SLUICE_ADAPTERS_DIR, else target/adapters].
    #[arg(long, value_name = "DIR")]
    pub adapters_dir: Option<PathBuf>,
    /// How many of the sandbox PSP's webhook requests may be in flight at once;
    /// 1 sends them one after another, in order. More keeps pace with a
    /// gateway under load, as a PSP that delivers concurrently does (the
    /// benchmark's setting).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub webhook_senders: u16,
}

#[derive(Debug, Args)]
pub struct AdapterArgs {
    /// Base URL of the gateway.
    #[arg(
        long,
        global = true,
        env = "SLUICE_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,

    /// Admin token of the gateway.
    #[arg(
        long,
        global = true,
        env = "SLUICE_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    /// Print the raw JSON response instead of a table.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: AdapterCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdapterCommand {
    /// Upload a component; it is validated, then activated unless --no-activate.
    Load {
        /// Adapter name (its webhook route); must equal the name the component describes.
        name: String,
        /// The component file (`.wasm`).
        file: PathBuf,
        /// Stage the version without activating it.
        #[arg(long)]
        no_activate: bool,
        /// Stage it as the shadow of the active version: it repeats the active
        /// version's calls and is compared with it, never affecting state.
        #[arg(long, conflicts_with = "no_activate")]
        shadow: bool,
    },
    /// The shadow version's agreement with the active one, per operation, and its
    /// newest diffs.
    ShadowReport {
        name: String,
        /// How many of the newest diffs to show (1-200).
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// End the shadow.
    ShadowStop { name: String },
    /// Let a loaded version take a share of the new attempts; it is stopped
    /// automatically when its UNKNOWN, error or decline rate exceeds the active
    /// version's by more than --max-excess-pct points over --min-sample first sends.
    Canary {
        name: String,
        /// SHA-256 digest (hex) of the version.
        digest: String,
        /// Percentage (0-100) of new attempts, by a hash of the attempt reference.
        #[arg(long, default_value_t = 0)]
        percent: u8,
        /// Connector accounts whose every new attempt the canary takes.
        #[arg(long = "account", value_name = "ID")]
        accounts: Vec<String>,
        #[arg(long)]
        min_sample: Option<u32>,
        #[arg(long)]
        max_excess_pct: Option<u8>,
    },
    /// The canary, its first sends against the active version's, and the adapter's
    /// release history.
    CanaryReport { name: String },
    /// Stop the canary: it takes no new attempts; its attempts keep converging on it.
    CanaryStop { name: String },
    /// List adapters with their versions, digests and status.
    List,
    /// Activate a loaded version by its digest.
    Activate {
        name: String,
        /// SHA-256 digest (hex) of the version, as shown by `sluice adapter list`.
        digest: String,
    },
    /// Re-activate the version that was active before the current one.
    Rollback { name: String },
    /// Check a component against the adapter contract, locally: no gateway, no PSP
    /// (the conformance kit, `docs/adapters.md`). Exits non-zero when a check fails.
    Test(AdapterTestArgs),
}

#[derive(Debug, Args)]
pub struct AdapterTestArgs {
    /// The component file (`.wasm`).
    pub file: PathBuf,
    /// Golden fixtures: `account.json` and recorded exchanges, webhooks and reports.
    #[arg(long, value_name = "DIR")]
    pub fixtures: Option<PathBuf>,
    /// Also write the result as JUnit XML.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// The CPU deadline per call the adapter will be loaded with [default: the gateway's].
    #[arg(long, value_name = "MS")]
    pub cpu_deadline_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn payments_show_and_explain_take_an_id_and_the_merchant_key() {
        let cli = Cli::try_parse_from([
            "sluice",
            "payments",
            "--api-key",
            "sk_x",
            "explain",
            "pay_1",
        ])
        .expect("parses");
        match cli.command {
            Command::Payments(args) => {
                assert_eq!(args.api_key.as_deref(), Some("sk_x"));
                assert!(matches!(args.command, PaymentsCommand::Explain { id } if id == "pay_1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["sluice", "payments", "show"]).is_err());
    }

    #[test]
    fn reconcile_takes_the_account_the_period_and_the_file() {
        let cli = Cli::try_parse_from([
            "sluice",
            "reconcile",
            "--account",
            "ca_1",
            "--period-start",
            "2026-12-01",
            "--period-end",
            "1764806400000",
            "--file",
            "report.csv",
        ])
        .unwrap();
        let Command::Reconcile(args) = cli.command else {
            panic!("not reconcile");
        };
        assert_eq!(
            (args.account.as_str(), args.period_start.as_str()),
            ("ca_1", "2026-12-01")
        );
        assert_eq!(args.file, PathBuf::from("report.csv"));
        assert!(Cli::try_parse_from(["sluice", "reconcile", "--account", "ca_1"]).is_err());
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn adapter_test_needs_no_gateway_and_parses_its_flags() {
        let cli = Cli::try_parse_from([
            "sluice",
            "adapter",
            "test",
            "stripe.wasm",
            "--fixtures",
            "adapters/stripe/conformance",
            "--junit",
            "kit.xml",
        ])
        .unwrap();
        let Command::Adapter(args) = cli.command else {
            panic!("expected adapter command");
        };
        let AdapterCommand::Test(test) = args.command else {
            panic!("expected adapter test");
        };
        assert_eq!(test.file, PathBuf::from("stripe.wasm"));
        assert_eq!(
            test.fixtures,
            Some(PathBuf::from("adapters/stripe/conformance"))
        );
        assert_eq!(test.junit, Some(PathBuf::from("kit.xml")));
        assert_eq!(test.cpu_deadline_ms, None);
    }

    #[test]
    fn adapter_load_parses_its_flags() {
        let cli = Cli::try_parse_from([
            "sluice",
            "adapter",
            "--url",
            "http://127.0.0.1:9999",
            "load",
            "stripe",
            "stripe.wasm",
            "--no-activate",
        ])
        .unwrap();
        let Command::Adapter(args) = cli.command else {
            panic!("expected adapter command");
        };
        assert_eq!(args.url, "http://127.0.0.1:9999");
        match args.command {
            AdapterCommand::Load {
                name,
                file,
                no_activate,
                shadow,
            } => {
                assert_eq!(name, "stripe");
                assert_eq!(file, PathBuf::from("stripe.wasm"));
                assert!(no_activate);
                assert!(!shadow);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
