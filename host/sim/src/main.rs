//! `sluice-sim`: run many seeds, or replay one with its trace.
//! Normally started through `cargo xtask sim` (which builds the adapters).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Parser;

/// A seed allocates and frees tens of thousands of small objects (rows,
/// events, wasm call state); glibc's allocator was a sixth of the profile.
/// The allocator cannot change what a seed does, only how fast.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use sluice_sim::{KeepDb, SeedReport, SimOptions, Simulator, StoreKind};

/// The store every seed's gateway runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Store {
    Sqlite,
    Postgres,
}

#[derive(Debug, Parser)]
#[command(about = "Deterministic simulation of the Sluice gateway")]
struct Args {
    /// Replay exactly this seed and print its whole trace.
    #[arg(long)]
    seed: Option<u64>,
    /// How many seeds to run.
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    start: u64,
    /// Worker threads (each with its own world).
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Workload steps per seed before convergence.
    #[arg(long, default_value_t = SimOptions::default().steps)]
    steps: u32,
    /// Run this many of the seeds a second time and compare trace hashes.
    #[arg(long, default_value_t = 0)]
    check_determinism: u64,
    /// With --store postgres: run every seed on SQLite too, and fail a seed
    /// whose trace differs (the stores must behave alike, to the line).
    #[arg(long)]
    same_as_sqlite: bool,
    /// The store: SQLite (a file per seed) or PostgreSQL (a database per
    /// seed on the server at SLUICE_TEST_DATABASE_URL, default
    /// postgres://postgres@127.0.0.1:5432/postgres).
    #[arg(long, value_enum, default_value_t = Store::Sqlite)]
    store: Store,
    /// Keep a seed's database to inspect. SQLite: a copy at PATH (replaying
    /// one seed). PostgreSQL, without PATH: a failing seed's database (a
    /// replayed seed's whatever its outcome) stays on the server under the
    /// name printed.
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    keep_db: Option<Option<PathBuf>>,
    /// Where `stripe.wasm` and `adyen.wasm` are (default: the test adapters).
    #[arg(long, env = "SLUICE_TEST_ADAPTERS_DIR")]
    adapters: Option<PathBuf>,
}

fn main() -> ExitCode {
    // Before anything opens a database (see `process`).
    sluice_sim::process::sqlite_on_mimalloc();
    let args = Args::parse();
    // Diagnosis only (e.g. `SLUICE_SIM_LOG=sqlx::query=debug` to see every
    // statement a seed runs); logs never enter the trace or its hash.
    if let Ok(filter) = std::env::var("SLUICE_SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let adapters = args
        .adapters
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/adapters"));
    let (store, keep_db) = match store_and_keep(&args) {
        Ok(chosen) => chosen,
        Err(message) => {
            eprintln!("sluice-sim: {message}");
            return ExitCode::FAILURE;
        }
    };
    let options = SimOptions {
        steps: args.steps,
        echo: args.seed.is_some(),
        store,
        keep_db,
        ..SimOptions::default()
    };
    match args.seed {
        Some(seed) => replay(&adapters, options, seed),
        None => sweep(&args, &adapters, options),
    }
}

/// The store and what to keep of it, from `--store` and `--keep-db`.
fn store_and_keep(args: &Args) -> Result<(StoreKind, KeepDb), String> {
    let path = args.keep_db.as_ref().and_then(Option::as_ref);
    match args.store {
        Store::Sqlite => {
            let keep = match (&args.keep_db, path) {
                (None, _) => KeepDb::No,
                (Some(_), Some(path)) => KeepDb::CopyTo(path.clone()),
                (Some(_), None) => return Err("on SQLite, --keep-db needs a PATH".into()),
            };
            Ok((StoreKind::Sqlite, keep))
        }
        Store::Postgres => {
            if path.is_some() {
                return Err("on PostgreSQL, --keep-db takes no PATH: the database stays on the server under the name printed".into());
            }
            let keep = match args.keep_db {
                Some(_) => KeepDb::OnServer {
                    always: args.seed.is_some(),
                },
                None => KeepDb::No,
            };
            let server_url = sluice_test_support::db::server_url();
            Ok((StoreKind::Postgres { server_url }, keep))
        }
    }
}

fn replay(adapters: &std::path::Path, options: SimOptions, seed: u64) -> ExitCode {
    let outcome = Simulator::new(adapters, options).and_then(|sim| sim.run(seed));
    match outcome {
        Ok(report) => {
            println!(
                "seed {seed}: {} payments, {} crashes ({} at store await points), {} trace lines, trace hash {}",
                report.payments,
                report.crashes,
                report.store_kills,
                report.trace_lines,
                report.trace_hash
            );
            if let Some(kept) = &report.kept_db {
                println!("seed {seed}: database kept: {kept}");
            }
            if report.passed() {
                println!("seed {seed}: all invariants hold");
                ExitCode::SUCCESS
            } else {
                for violation in &report.violations {
                    println!("seed {seed}: VIOLATION {violation}");
                }
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("seed {seed}: could not run: {error}");
            ExitCode::FAILURE
        }
    }
}

fn sweep(args: &Args, adapters: &std::path::Path, options: SimOptions) -> ExitCode {
    let started = Instant::now();
    let store = options.store.label();
    let seeds: Vec<u64> = (args.start..args.start.saturating_add(args.seeds)).collect();
    let first = run_all(adapters, options.clone(), &seeds, args.jobs);
    let again: Vec<u64> = seeds
        .iter()
        .copied()
        .take(usize::try_from(args.check_determinism).unwrap_or(usize::MAX))
        .collect();
    let on_sqlite = SimOptions {
        store: StoreKind::Sqlite,
        keep_db: KeepDb::No,
        ..options.clone()
    };
    let second = run_all(adapters, options, &again, args.jobs);
    let failed = print_failures(&first, &replay_flags(args));
    let nondeterministic = trace_differences(&first, &second, "NOT DETERMINISTIC");
    let mut summary = format!(
        "{} replayed with {nondeterministic} trace differences",
        again.len()
    );
    let mut across = 0;
    if args.same_as_sqlite && args.store != Store::Sqlite {
        let sqlite = run_all(adapters, on_sqlite, &seeds, args.jobs);
        across = trace_differences(&first, &sqlite, "DIFFERS FROM SQLITE");
        summary.push_str(&format!(", {across} traces differ from SQLite's"));
    }
    let passed = first.iter().flatten().filter(|r| r.passed()).count();
    let payments: usize = first.iter().flatten().map(|r| r.payments).sum();
    let crashes: u32 = first.iter().flatten().map(|r| r.crashes).sum();
    let store_kills: u32 = first.iter().flatten().map(|r| r.store_kills).sum();
    println!(
        "sim ({store}): {passed}/{} seeds passed ({payments} payments, {crashes} crashes, {store_kills} of them at store await points), {summary}, in {:.1} s",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    if failed || nondeterministic > 0 || across > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Prints each failing seed; whether there was one.
fn print_failures(outcomes: &[Outcome], flags: &str) -> bool {
    let mut failed = false;
    for outcome in outcomes {
        match outcome {
            Ok(report) if report.passed() => {}
            Ok(report) => {
                failed = true;
                print_failure(report, flags);
            }
            Err((seed, error)) => {
                failed = true;
                println!("seed {seed}: could not run: {error}");
            }
        }
    }
    failed
}

/// The seeds of `other` whose trace hash differs from the same seed's in
/// `first`, each printed with `what`.
fn trace_differences(first: &[Outcome], other: &[Outcome], what: &str) -> usize {
    let mut differ = 0;
    for report in other.iter().flatten() {
        let earlier = first.iter().flatten().find(|r| r.seed == report.seed);
        if earlier.is_some_and(|e| e.trace_hash != report.trace_hash) {
            differ += 1;
            println!("seed {}: {what} (trace hashes differ)", report.seed);
        }
    }
    differ
}

type Outcome = Result<SeedReport, (u64, String)>;

/// Runs `seeds` on `jobs` threads, each with its own simulator.
fn run_all(
    adapters: &std::path::Path,
    options: SimOptions,
    seeds: &[u64],
    jobs: usize,
) -> Vec<Outcome> {
    if seeds.is_empty() {
        return Vec::new();
    }
    let next = AtomicU64::new(0);
    let results = Mutex::new(Vec::new());
    // Each job keeps to one core, and so do the threads it starts (sqlx's
    // SQLite worker, tokio's blocking pool): a statement is a hand-off to the
    // connection's worker thread and back, and a hand-off on the same core
    // costs a fraction of waking a thread on another (100 seeds on one job:
    // 7.9 s pinned, 15.9 s not). Where affinity is unavailable, jobs float.
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    std::thread::scope(|scope| {
        for job in 0..jobs.max(1) {
            let core = cores.get(job % cores.len().max(1)).copied();
            let (next, results, options) = (&next, &results, options.clone());
            scope.spawn(move || {
                if let Some(core) = core {
                    core_affinity::set_for_current(core);
                }
                sluice_sim::process::batch_scheduling();
                let sim = match Simulator::new(adapters, options) {
                    Ok(sim) => sim,
                    Err(error) => {
                        let mut results = results.lock().unwrap_or_else(|p| p.into_inner());
                        results.push(Err((0, error.to_string())));
                        return;
                    }
                };
                loop {
                    let index = next.fetch_add(1, Ordering::SeqCst) as usize;
                    let Some(&seed) = seeds.get(index) else {
                        return;
                    };
                    let outcome = sim.run(seed).map_err(|e| (seed, e.to_string()));
                    results
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(outcome);
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|r| match r {
        Ok(report) => report.seed,
        Err((seed, _)) => *seed,
    });
    results
}

/// The flags a replay of a seed of this run needs besides `--seed`.
fn replay_flags(args: &Args) -> String {
    let mut flags = String::new();
    if args.store == Store::Postgres {
        flags.push_str(" --store postgres");
    }
    if args.steps != SimOptions::default().steps {
        flags.push_str(&format!(" --steps {}", args.steps));
    }
    flags
}

fn print_failure(report: &SeedReport, flags: &str) {
    println!("seed {}: FAILED", report.seed);
    for violation in &report.violations {
        println!("  VIOLATION {violation}");
    }
    println!("  last trace lines:");
    for line in report.tail.iter().rev().take(40).rev() {
        println!("    {line}");
    }
    if let Some(kept) = &report.kept_db {
        println!("  database kept: {kept}");
    }
    println!("  replay: cargo xtask sim --seed {}{flags}", report.seed);
}
