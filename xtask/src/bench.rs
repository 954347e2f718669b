//! `cargo xtask bench`: issue 17's benchmark in one go. Builds a release
//! `sluice`, runs `bench/payments.sh` on PostgreSQL and on SQLite (each with its
//! same-run pgbench baseline or the PostgreSQL figure as its reference) and the
//! adapter-call medians, then prints every figure as a ratio against its goal.
//!
//! The figures come from real tools (wrk, pgbench, pg_stat_statements, the
//! criterion bench's individually timed calls); this module only runs them and
//! does the arithmetic, so a ratio here is never a guess.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::{build_adapters, cargo, run, target_dir, workspace_root, Result};

/// One `RESULT key=value ...` line of a bench script.
type Figures = BTreeMap<String, String>;

struct Options {
    seconds: u32,
    connections: u32,
    build: bool,
    backends: Vec<&'static str>,
    adapter: bool,
}

impl Options {
    fn parse(args: &[OsString]) -> Result<Options> {
        let mut options = Options {
            seconds: 15,
            connections: 16,
            build: true,
            backends: vec!["postgres", "sqlite"],
            adapter: true,
        };
        let mut args = args.iter().map(|a| a.to_string_lossy().into_owned());
        while let Some(arg) = args.next() {
            let mut value = |name: &str| -> Result<u32> {
                let v = args.next().ok_or(format!("{name} needs a value"))?;
                v.parse()
                    .ok()
                    .filter(|n| (1..=3600).contains(n))
                    .ok_or(format!("{name}: expected 1..=3600, got {v}"))
            };
            match arg.as_str() {
                "--seconds" => options.seconds = value("--seconds")?,
                "--connections" => options.connections = value("--connections")?,
                "--no-build" => options.build = false,
                "--postgres-only" => {
                    options.backends = vec!["postgres"];
                    options.adapter = false;
                }
                "--no-adapter" => options.adapter = false,
                other => return Err(format!("bench: unknown argument `{other}`")),
            }
        }
        Ok(options)
    }
}

pub fn bench(args: &[OsString]) -> Result<()> {
    let options = Options::parse(args)?;
    let adapters = build_adapters()?;
    if options.build {
        run(cargo().args([
            "build",
            "--release",
            "-p",
            "sluice-server",
            "--bin",
            "sluice",
        ]))?;
    }
    let mut results: BTreeMap<&str, Figures> = BTreeMap::new();
    for backend in &options.backends {
        let mut cmd = Command::new("bash");
        cmd.arg(workspace_root().join("bench/payments.sh"))
            .env("BENCH_BACKEND", backend)
            .env("BENCH_SECONDS", options.seconds.to_string())
            .env("BENCH_CONNECTIONS", options.connections.to_string())
            .env("SLUICE_BIN", target_dir().join("release/sluice"))
            .env("SLUICE_BENCH_ADAPTERS", &adapters);
        results.insert(backend, result_line(&mut cmd)?);
    }
    if options.adapter {
        let mut cmd = cargo();
        // The filter matches no criterion group: only the individually timed
        // medians run, which is what the goals are stated in.
        cmd.args(["bench", "-q", "-p", "sluice-adapter-runtime", "--bench"])
            .args(["adapter_call", "--", "medians-only"]);
        results.insert("adapter", result_line(&mut cmd)?);
    }
    print_goals(&results);
    Ok(())
}

/// Runs `cmd`, echoing its output, and returns the figures of its RESULT line.
fn result_line(cmd: &mut Command) -> Result<Figures> {
    let mut child = cmd
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let mut figures = None;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            println!("{line}");
            if let Some(rest) = line.strip_prefix("RESULT ") {
                figures = Some(parse_figures(rest));
            }
        }
    }
    let status = child.wait().map_err(|e| format!("{cmd:?}: {e}"))?;
    match figures {
        Some(f) if status.success() => Ok(f),
        _ => Err(format!("{cmd:?} ended with {status} and no RESULT line")),
    }
}

fn parse_figures(line: &str) -> Figures {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn num(figures: Option<&Figures>, key: &str) -> Option<f64> {
    figures?.get(key)?.parse().ok()
}

/// The p99 of the gateway's share (each answer's latency minus the time it
/// waited for the PSP) in the paced run at half the maximum rate, only when
/// wrk held the rate it was asked for (within 10 %: a run that fell behind
/// measured a queue, not the latency at that rate) and every answer was
/// paired with its request and its PSP time.
fn paced_p99(figures: Option<&Figures>) -> Option<f64> {
    let asked = num(figures, "half_rate")?;
    let achieved = num(figures, "half_rps")?;
    let paired = num(figures, "half_share_n")? > 0.0 && num(figures, "half_share_unpaired")? == 0.0;
    (achieved >= 0.9 * asked && paired).then(|| num(figures, "half_share_p99_ms"))?
}

/// Payments settled a second, only when the sandbox PSP delivered every
/// webhook about them within the bench's wait: the figure counts each payment
/// once all of its webhooks were applied, so without that it would not be one.
fn settled_per_s(figures: Option<&Figures>) -> Option<f64> {
    let idle = figures?.get("webhooks_idle").map(String::as_str) == Some("true");
    idle.then(|| num(figures, "settled_per_s"))?
}

/// One goal: a measured ratio against its bound.
struct Goal {
    name: &'static str,
    value: Option<f64>,
    at_most: bool,
    bound: f64,
}

fn print_goals(results: &BTreeMap<&str, Figures>) {
    let pg = results.get("postgres");
    let lite = results.get("sqlite");
    let adapter = results.get("adapter");
    let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b.filter(|b| *b > 0.0)?);
    let goals = [
        Goal {
            name: "PostgreSQL settled payments/s / pgbench INSERT tps",
            value: ratio(settled_per_s(pg), num(pg, "pgbench_tps")),
            at_most: false,
            bound: 0.10,
        },
        Goal {
            name: "SQLite settled payments/s / PostgreSQL's",
            value: ratio(settled_per_s(lite), settled_per_s(pg)),
            at_most: false,
            bound: 0.5,
        },
        Goal {
            name: "SQLite p99 / PostgreSQL p99 (create+confirm)",
            value: ratio(num(lite, "p99_ms"), num(pg, "p99_ms")),
            at_most: true,
            bound: 3.0,
        },
        Goal {
            name:
                "PostgreSQL p99 at half the maximum rate, the gateway's share (minus the PSP's), ms",
            value: paced_p99(pg),
            at_most: true,
            bound: 10.0,
        },
        Goal {
            name: "PostgreSQL webhook ingest/s (into the inbox) / pgbench tps",
            value: ratio(num(pg, "ingest_per_s"), num(pg, "pgbench_tps")),
            at_most: false,
            bound: 0.5,
        },
        Goal {
            name: "adapter call via the async handle / native (2 KB webhook)",
            value: ratio(num(adapter, "async_us"), num(adapter, "native_us")),
            at_most: true,
            bound: 2.0,
        },
        Goal {
            name: "fixed cost of an adapter call (describe), µs",
            value: num(adapter, "describe_us"),
            at_most: true,
            bound: 10.0,
        },
        Goal {
            name: "RSS high-water at full load, PostgreSQL, MB",
            value: num(pg, "rss_mb"),
            at_most: true,
            bound: 150.0,
        },
    ];
    println!("\n== issue 17 goals");
    for goal in goals {
        let verdict = match goal.value {
            None => "not measured".to_owned(),
            Some(v) => {
                let met = if goal.at_most {
                    v <= goal.bound
                } else {
                    v >= goal.bound
                };
                format!("{v:.3}  {}", if met { "met" } else { "NOT met" })
            }
        };
        let op = if goal.at_most { "<=" } else { ">=" };
        println!("  {:<62} goal {op} {:<6} {verdict}", goal.name, goal.bound);
    }
    print_floor(pg);
    if let Some(pg) = pg {
        println!(
            "  per payment on PostgreSQL: {} commits, {} WAL flushes, {} statements",
            pg.get("commits_per_payment").map_or("-", String::as_str),
            pg.get("wal_flushes_per_payment")
                .map_or("-", String::as_str),
            pg.get("statements_per_payment").map_or("-", String::as_str)
        );
        println!(
            "  the host's background writeback starts at {} dirty (goal 2's stalls, BENCHMARKS.md)",
            pg.get("dirty_background").map_or("-", String::as_str)
        );
        println!(
            "  per webhook ingested on PostgreSQL ({} connections): {} commits, {} statements",
            pg.get("ingest_connections").map_or("-", String::as_str),
            pg.get("ingest_commits_per_webhook")
                .map_or("-", String::as_str),
            pg.get("ingest_statements_per_webhook")
                .map_or("-", String::as_str)
        );
    }
}

/// What bounds goal 1 beneath the gateway: the payment's own rows written by
/// pgbench alone (bench/payment_floor.sql), against the same run's INSERT
/// baseline, and the share of that floor the gateway reached.
fn print_floor(pg: Option<&Figures>) {
    let (Some(floor), Some(insert), Some(settled)) = (
        num(pg, "floor_tps"),
        num(pg, "pgbench_tps"),
        settled_per_s(pg),
    ) else {
        println!("  a payment's rows without the gateway: not measured");
        return;
    };
    if floor <= 0.0 || insert <= 0.0 {
        println!("  a payment's rows without the gateway: not measured");
        return;
    }
    println!(
        "  a payment's rows without the gateway (pgbench): {floor:.1}/s = {:.3} of INSERT tps, about the most goal 1's ratio can be; the gateway settled {:.2} of that",
        floor / insert,
        settled / floor
    );
}
