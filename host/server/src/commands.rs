//! What each `sluice` subcommand does.

use std::io::Write;
use std::path::{Path, PathBuf};

use rand::RngCore;

use crate::adapters::StartupReport;
use crate::api::{render_table, render_version};
use crate::cli::{
    AdapterArgs, AdapterCommand, Cli, Command, DemoArgs, PaymentsArgs, PaymentsCommand,
};
use crate::client::{AdminClient, ClientError};
use crate::config::{Config, ConfigError, Secret};
use crate::server::{self, StartError};

/// Where `cargo xtask build-adapters` puts the adapters, relative to the workspace root.
const BUILT_ADAPTERS_DIR: &str = "target/adapters";

/// Why a command failed; printed by `main` and turned into a non-zero exit code.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Usage(String),
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the server stopped: {0}")]
    Serve(#[source] std::io::Error),
    #[error(transparent)]
    Demo(#[from] crate::demo_setup::DemoError),
    #[error("cannot write to stdout: {0}")]
    Output(#[source] std::io::Error),
    #[error(transparent)]
    Conformance(#[from] crate::adapter_test::AdapterTestError),
}

pub async fn run(cli: Cli) -> Result<(), CommandError> {
    match cli.command {
        Command::Serve => serve(Config::load(cli.config.as_deref())?).await,
        Command::Demo(args) => demo(Config::load(cli.config.as_deref())?, args).await,
        Command::Migrate => migrate(Config::load(cli.config.as_deref())?).await,
        Command::Adapter(args) => adapter(args).await,
        Command::Payments(args) => payments(args).await,
        Command::Reconcile(args) => reconcile(args).await,
    }
}

/// `sluice reconcile`, through the admin API.
async fn reconcile(args: crate::cli::ReconcileArgs) -> Result<(), CommandError> {
    use crate::reconcile_cli::{period_bound, render_run, run_request};
    let bad = |flag: &str, value: &str| {
        CommandError::Usage(format!(
            "{flag} {value:?}: not Unix milliseconds nor YYYY-MM-DD"
        ))
    };
    let start = period_bound(&args.period_start)
        .ok_or_else(|| bad("--period-start", &args.period_start))?;
    let end =
        period_bound(&args.period_end).ok_or_else(|| bad("--period-end", &args.period_end))?;
    let report = read(&args.file)?;
    let client = AdminClient::new(&args.url, args.admin_token)?;
    let body = run_request(&args.account, start, end, &report);
    let run = client
        .post_json("/admin/reconciliation/runs", &body)
        .await?;
    let output = if args.json {
        pretty(&run)
    } else {
        render_run(&run)
    };
    std::io::stdout()
        .lock()
        .write_all(output.as_bytes())
        .map_err(CommandError::Output)
}

/// `sluice payments show|explain ID`, through the merchant API.
async fn payments(args: PaymentsArgs) -> Result<(), CommandError> {
    use crate::payments_cli::{fetch_payment, fetch_timeline, render_explain, render_payment};
    let client = AdminClient::new(&args.url, args.api_key)?;
    let output = match args.command {
        PaymentsCommand::Show { id } => {
            let payment = fetch_payment(&client, &id).await?;
            if args.json {
                pretty(&payment)
            } else {
                render_payment(&payment)
            }
        }
        PaymentsCommand::Explain { id } => {
            let timeline = fetch_timeline(&client, &id).await?;
            if args.json {
                pretty(&timeline)
            } else {
                render_explain(&timeline)
            }
        }
    };
    std::io::stdout()
        .lock()
        .write_all(output.as_bytes())
        .map_err(CommandError::Output)
}

async fn serve(config: Config) -> Result<(), CommandError> {
    let signal = server::ShutdownSignal::install();
    let server = server::start(&config, None).await?;
    run_until_signal(server, signal).await
}

async fn run_until_signal(
    mut server: server::RunningServer,
    mut signal: server::ShutdownSignal,
) -> Result<(), CommandError> {
    tokio::select! {
        _ = signal.recv() => {
            tracing::info!("shutting down: finishing requests in flight");
            server.shutdown().await.map_err(CommandError::Serve)
        }
        stopped = server.stopped() => stopped.map_err(CommandError::Serve),
    }
}

async fn migrate(config: Config) -> Result<(), CommandError> {
    std::fs::create_dir_all(&config.data_dir).map_err(|source| StartError::DataDir {
        path: config.data_dir.clone(),
        source,
    })?;
    // Migrations read and write no secret, so `sluice migrate` needs no master key.
    let store =
        server::open_store(&config, sluice_store::LocalSecretBox::process_ephemeral()).await?;
    store.close().await;
    let mut out = std::io::stdout().lock();
    writeln!(out, "database is up to date ({:?})", store.backend()).map_err(CommandError::Output)
}

/// `sluice demo`: the gateway with the built adapters and a fresh admin token.
async fn demo(mut config: Config, args: DemoArgs) -> Result<(), CommandError> {
    config.adapters_dir = args
        .adapters_dir
        .or(config.adapters_dir)
        .or_else(|| Some(PathBuf::from(BUILT_ADAPTERS_DIR)).filter(|dir| dir.is_dir()));
    if config.admin_token.is_none() {
        config.admin_token = Some(Secret::new(generate_token()));
    }
    config.dev_master_key = true;
    let signal = server::ShutdownSignal::install();
    let server = server::start(&config, None).await?;
    let report = server.ready().await;
    let mut banner = demo_banner(&config, &server.url(), &report);
    let services = server.services();
    let options = crate::demo_setup::DemoOptions {
        webhook_senders: usize::from(args.webhook_senders),
    };
    let demo = crate::demo_setup::set_up_with(
        services.orchestrator.store(),
        &services.merchant_api.pepper,
        &server.url(),
        options,
    )
    .await?;
    banner.push_str(&crate::demo_setup::payment_banner(&server.url(), &demo));
    let operators = crate::demo_setup::create_operators(
        services.orchestrator.store(),
        &services.merchant_api.pepper,
        &demo,
    )
    .await?;
    banner.push_str(&crate::demo_setup::console_banner(
        &server.url(),
        &demo,
        &operators,
    ));
    // Last, so whoever reads the banner (a person, the CLI test) has all of it.
    banner.push_str("\nPress ctrl-c to stop.\n");
    std::io::stdout()
        .lock()
        .write_all(banner.as_bytes())
        .map_err(CommandError::Output)?;
    run_until_signal(server, signal).await
}

fn generate_token() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    format!("sluice_admin_{}", hex::encode(bytes))
}

/// What `sluice demo` prints once the adapters are loaded.
pub fn demo_banner(config: &Config, url: &str, report: &StartupReport) -> String {
    let mut out = String::new();
    out.push_str("\nSluice demo gateway is running.\n\n");
    out.push_str(&format!("  URL          {url}\n"));
    out.push_str(&format!("  Data dir     {}\n", config.data_dir.display()));
    match &config.adapters_dir {
        Some(dir) => out.push_str(&format!("  Adapters dir {}\n", dir.display())),
        None => out.push_str("  Adapters dir (none: run `cargo xtask build-adapters`)\n"),
    }
    if let Some(token) = &config.admin_token {
        out.push_str(&format!("  Admin token  {}\n", token.expose()));
    }
    out.push_str("\nAdapters loaded:\n");
    let active: Vec<_> = report
        .adapters
        .iter()
        .filter_map(|a| a.active.as_ref())
        .collect();
    if active.is_empty() {
        out.push_str("  (none)\n");
    }
    for version in active {
        out.push_str(&format!(
            "  {:<20} {:<10} {}{}\n",
            version.name,
            version.version,
            version.digest,
            if version.from_cache {
                "  (from cache)"
            } else {
                ""
            }
        ));
    }
    let failures: Vec<_> = report
        .items
        .iter()
        .filter_map(|item| item.result.as_ref().err().map(|e| (&item.source, e)))
        .collect();
    if !failures.is_empty() {
        out.push_str("\nNot loaded:\n");
        let only_test_adapters = failures.iter().all(|(source, _)| is_test_adapter(source));
        for (source, error) in failures {
            out.push_str(&format!("  {}: {error}\n", source.display()));
        }
        if only_test_adapters {
            out.push_str(
                "  (test-* adapters exist for the test suite; test-wrong-world is refused on purpose)\n",
            );
        }
    }
    let token = config
        .admin_token
        .as_ref()
        .map(|t| t.expose())
        .unwrap_or("<admin token>");
    out.push_str("\nTry:\n");
    out.push_str(&format!(
        "  curl -s -H 'Authorization: Bearer {token}' {url}/admin/adapters\n"
    ));
    out.push_str(&format!(
        "  SLUICE_ADMIN_TOKEN={token} cargo run -q -p sluice-server --bin sluice -- adapter --url {url} list\n"
    ));
    out
}

async fn adapter(args: AdapterArgs) -> Result<(), CommandError> {
    if let AdapterCommand::Test(test) = &args.command {
        return Ok(crate::adapter_test::run(test).await?);
    }
    let client = AdminClient::new(&args.url, args.admin_token)?;
    let output = match args.command {
        AdapterCommand::Load {
            name,
            file,
            no_activate,
            shadow,
        } => {
            let wasm = read(&file)?;
            let answer = client.load(&name, wasm, !no_activate, shadow).await?;
            if args.json {
                pretty(&answer.raw)
            } else {
                render_version("loaded", &answer.value)
            }
        }
        AdapterCommand::List => {
            let answer = client.list().await?;
            if args.json {
                pretty(&answer.raw)
            } else {
                render_table(&answer.value)
            }
        }
        AdapterCommand::Activate { name, digest } => {
            let answer = client.activate(&name, &digest).await?;
            if args.json {
                pretty(&answer.raw)
            } else {
                render_version("activated", &answer.value)
            }
        }
        AdapterCommand::Rollback { name } => {
            let answer = client.rollback(&name).await?;
            if args.json {
                pretty(&answer.raw)
            } else {
                render_version("rolled back to", &answer.value)
            }
        }
        // Handled above: the kit needs no gateway.
        AdapterCommand::Test(_) => String::new(),
        release => crate::releases_cli::run(&client, release, args.json).await?,
    };
    std::io::stdout()
        .lock()
        .write_all(output.as_bytes())
        .map_err(CommandError::Output)
}

fn read(path: &Path) -> Result<Vec<u8>, CommandError> {
    std::fs::read(path).map_err(|source| CommandError::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

fn pretty(value: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.push('\n');
    text
}

fn is_test_adapter(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("test-"))
}
