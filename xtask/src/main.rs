//! Project automation: `cargo xtask <command>` (alias in `.cargo/config.toml`).
//!
//! Deliberately std-only so that it compiles in seconds on a fresh machine.
//!
//! Commands:
//! - `build-adapters`: build every crate under `adapters/` as a `wasm32-wasip2` component and
//!   copy the results to `<target>/adapters/<dir>.wasm`, where the host loads them from.
//! - `test [args...]`: build the adapters, check PostgreSQL, run the whole workspace test suite.
//! - `demo [args...]`: build the adapters, then run `sluice demo` with the real ones loaded
//!   (copied to `<target>/demo-adapters/`; the misbehaving `adapters/test-*` stay out).
//! - `sim [args...]`: build the adapters, then run the deterministic simulator
//!   (`sluice-sim`; `--seed S` replays one seed with its trace).
//! - `bench [--seconds N] [--connections N] [--no-build] [--postgres-only] [--no-adapter]`:
//!   issue 17's benchmark (release build, wrk, pgbench) with its ratios against the goals.
//! - `new-adapter NAME [--from TEMPLATE]`: a new adapter crate copied from a working one.

mod bench;
mod new_adapter;

use std::env;
use std::ffi::OsString;
use std::fs;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

const WASM_TARGET: &str = "wasm32-wasip2";
const WASM_PROFILE: &str = "release-wasm";
const DEFAULT_TEST_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// Fallback archive of the wasm32-wasip2 standard library, relative to the workspace root.
const FALLBACK_STD_ARCHIVE: &str = "../shared/toolchain/rust-std-wasm32-wasip2-1.95.0.tgz";
/// Adapters whose directory starts with this exist only to test the sandbox
/// (an infinite loop, a memory bomb, a wrong world, ...): built for the tests,
/// never loaded by the demo.
const TEST_ADAPTER_PREFIX: &str = "test-";

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let mut args = env::args_os().skip(1);
    let command = args.next().map(|a| a.to_string_lossy().into_owned());
    let rest: Vec<OsString> = args.collect();
    let outcome = match command.as_deref() {
        Some("build-adapters") => build_adapters().map(|_| ()),
        Some("test") => test(&rest),
        Some("demo") => demo(&rest),
        Some("bench") => bench::bench(&rest),
        Some("sim") => sim(&rest),
        Some("sim-mutants") => sim_mutants(&rest),
        Some("new-adapter") => new_adapter(&rest),
        Some("help") | Some("--help") | Some("-h") | None => {
            print_help();
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{HELP}")),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: error: {message}");
            ExitCode::FAILURE
        }
    }
}

const HELP: &str = "usage: cargo xtask <command> [args...]

commands:
  demo [args...]     build the adapters, then run `sluice demo` with the real ones (not
                     adapters/test-*) from <target>/demo-adapters (extra args go to sluice)
  test [args...]     build the adapters, check PostgreSQL, run every test in the workspace
                     (extra args go to the test runner)
  sim [args...]      build the adapters, then run the deterministic simulator:
                     many seeds (--seeds N --start S --jobs J --check-determinism K),
                     or one with its whole trace (--seed S); --store postgres runs each
                     seed on a PostgreSQL database (SLUICE_TEST_DATABASE_URL's server)
  sim-mutants [N]     apply each deliberately wrong patch of host/sim/mutants/ in a scratch
                     worktree and show whether the simulator catches it within N seeds
                     (default 200), and at which seed
  bench [--seconds N] [--connections N] [--no-build] [--postgres-only] [--no-adapter]
                     release build, then wrk against `sluice demo` on PostgreSQL and SQLite
                     with the same run's pgbench baseline, and the adapter-call medians;
                     prints each figure against its goal (BENCHMARKS.md). Needs wrk, pgbench
  build-adapters     build every crate under adapters/ into <target>/adapters/<name>.wasm
  new-adapter NAME [--from TEMPLATE]
                     create adapters/NAME from a working adapter (default: stripe) under
                     the new name; it builds and passes the conformance kit as it is,
                     then you replace its wire format (docs/adapters.md)

environment:
  SLUICE_TEST_DATABASE_URL   PostgreSQL for the tests and `sim --store postgres`
                             (default postgres://postgres@127.0.0.1:5432/postgres)
  CARGO_TARGET_DIR           respected for all builds and for <target>/adapters";

fn new_adapter(args: &[OsString]) -> Result<()> {
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let new = new_adapter::NewAdapter::parse(&args)?;
    let dir = new_adapter::create(&workspace_root().join("adapters"), &new)?;
    println!(
        "created {} from adapters/{}\n\nnext:\n  cargo xtask build-adapters\n  \
         cargo run -q -p sluice-server --bin sluice -- adapter test target/adapters/{name}.wasm \
         --fixtures adapters/{name}/conformance\nthen replace the wire format module by module \
         (docs/adapters.md, \"Writing an adapter\")",
        dir.display(),
        new.template,
        name = new.name
    );
    Ok(())
}

fn print_help() {
    println!("{HELP}");
}

/// The workspace root: xtask lives in `<root>/xtask`.
fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or(manifest_dir)
}

/// Cargo's target directory, honouring `CARGO_TARGET_DIR` (relative paths are relative to the
/// directory cargo was started from, as cargo itself resolves them).
fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                env::current_dir().map(|cwd| cwd.join(&dir)).unwrap_or(dir)
            }
        }
        _ => workspace_root().join("target"),
    }
}

fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

// ---------------------------------------------------------------------------------------------
// wasm32-wasip2 target
// ---------------------------------------------------------------------------------------------

fn ensure_wasm_target() -> Result<()> {
    if wasm_target_installed() {
        return Ok(());
    }
    eprintln!("xtask: the {WASM_TARGET} target is missing; adding it with rustup");
    let added = Command::new("rustup")
        .args(["target", "add", WASM_TARGET])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if added && wasm_target_installed() {
        return Ok(());
    }
    eprintln!("xtask: `rustup target add {WASM_TARGET}` failed; trying the fallback archive");
    unpack_fallback_std()?;
    if wasm_target_installed() {
        Ok(())
    } else {
        Err(format!(
            "the {WASM_TARGET} target is still missing after rustup and the fallback archive"
        ))
    }
}

fn wasm_target_installed() -> bool {
    let listed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == WASM_TARGET)
        });
    match listed {
        Some(true) => true,
        // rustup may be absent or may not know about a std unpacked by hand: look at the sysroot.
        _ => sysroot()
            .map(|root| {
                root.join("lib/rustlib")
                    .join(WASM_TARGET)
                    .join("lib")
                    .is_dir()
            })
            .unwrap_or(false),
    }
}

fn sysroot() -> Result<PathBuf> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("cannot run rustc: {e}"))?;
    if !out.status.success() {
        return Err("`rustc --print sysroot` failed".into());
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    ))
}

fn unpack_fallback_std() -> Result<()> {
    let archive = workspace_root().join(FALLBACK_STD_ARCHIVE);
    if !archive.is_file() {
        return Err(format!(
            "cannot add the {WASM_TARGET} target: rustup failed and {} does not exist",
            archive.display()
        ));
    }
    let rustlib = sysroot()?.join("lib/rustlib");
    run(Command::new("tar")
        .arg("xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&rustlib))
}

// ---------------------------------------------------------------------------------------------
// build-adapters
// ---------------------------------------------------------------------------------------------

struct AdapterCrate {
    dir_name: String,
    package: String,
}

/// Every directory under `adapters/` with a Cargo.toml, sorted by name.
fn adapter_crates() -> Result<Vec<AdapterCrate>> {
    let adapters = workspace_root().join("adapters");
    let entries =
        fs::read_dir(&adapters).map_err(|e| format!("cannot read {}: {e}", adapters.display()))?;
    let mut crates = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", adapters.display()))?;
        let manifest = entry.path().join("Cargo.toml");
        if !manifest.is_file() {
            continue;
        }
        let dir_name = entry.file_name().to_string_lossy().into_owned();
        let text = fs::read_to_string(&manifest)
            .map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
        let package = package_name(&text)
            .ok_or_else(|| format!("{} has no [package] name", manifest.display()))?;
        crates.push(AdapterCrate { dir_name, package });
    }
    crates.sort_by(|a, b| a.dir_name.cmp(&b.dir_name));
    Ok(crates)
}

/// The `name` of the `[package]` table of a Cargo.toml (a tiny parser: xtask stays std-only).
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        if !in_package {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            if key.trim() == "name" {
                return Some(value.trim().trim_matches('"').to_string());
            }
        }
    }
    None
}

/// Builds every adapter and returns the directory holding `<dir>.wasm` for each.
fn build_adapters() -> Result<PathBuf> {
    ensure_wasm_target()?;
    let crates = adapter_crates()?;
    let out_dir = target_dir().join("adapters");
    fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    if crates.is_empty() {
        eprintln!("xtask: no adapter crates under adapters/");
        return Ok(out_dir);
    }

    let mut cmd = cargo();
    cmd.args(["build", "--target", WASM_TARGET, "--profile", WASM_PROFILE]);
    for c in &crates {
        cmd.args(["-p", &c.package]);
    }
    eprintln!(
        "xtask: building {} adapters for {WASM_TARGET}",
        crates.len()
    );
    run(&mut cmd)?;

    let built = target_dir().join(WASM_TARGET).join(WASM_PROFILE);
    for c in &crates {
        let artifact = built.join(format!("{}.wasm", c.package.replace('-', "_")));
        let dest = out_dir.join(format!("{}.wasm", c.dir_name));
        fs::copy(&artifact, &dest).map_err(|e| {
            format!(
                "cannot copy {} to {}: {e}",
                artifact.display(),
                dest.display()
            )
        })?;
    }
    build_variants(&out_dir)?;
    eprintln!("xtask: {} adapters in {}", crates.len(), out_dir.display());
    Ok(out_dir)
}

/// Test adapters built a second time with a feature, as a second version of the same
/// adapter for the host's release tests (shadow, canary): (adapter directory, feature).
const VARIANTS: &[(&str, &str)] = &[("test-well-behaved", "variant")];

/// Builds each variant into `<out>/variants/<dir>-<feature>.wasm`. Each gets a target
/// directory of its own: a cdylib's file name carries no feature hash, so building both
/// in one directory would rebuild one or the other every time.
fn build_variants(out_dir: &Path) -> Result<()> {
    let variants = out_dir.join("variants");
    fs::create_dir_all(&variants)
        .map_err(|e| format!("cannot create {}: {e}", variants.display()))?;
    for (dir, feature) in VARIANTS {
        let manifest = workspace_root()
            .join("adapters")
            .join(dir)
            .join("Cargo.toml");
        let target = target_dir().join("variants").join(feature);
        let mut cmd = cargo();
        cmd.args(["build", "--target", WASM_TARGET, "--profile", WASM_PROFILE])
            .arg("--manifest-path")
            .arg(&manifest)
            .args(["--features", feature])
            .arg("--target-dir")
            .arg(&target);
        run(&mut cmd)?;
        let package = format!("sluice_adapter_{}", dir.replace('-', "_"));
        let artifact = target
            .join(WASM_TARGET)
            .join(WASM_PROFILE)
            .join(format!("{package}.wasm"));
        let dest = variants.join(format!("{dir}-{feature}.wasm"));
        fs::copy(&artifact, &dest).map_err(|e| {
            format!(
                "cannot copy {} to {}: {e}",
                artifact.display(),
                dest.display()
            )
        })?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// test
// ---------------------------------------------------------------------------------------------

fn test(extra: &[OsString]) -> Result<()> {
    let adapters_dir = build_adapters()?;
    let database_url = test_database_url();
    check_postgres(&database_url)?;

    let with_env = |cmd: &mut Command| {
        cmd.env("SLUICE_TEST_ADAPTERS_DIR", &adapters_dir)
            .env("SLUICE_TEST_DATABASE_URL", &database_url);
    };
    if nextest_installed() {
        let mut cmd = cargo();
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"])
            .args(extra);
        with_env(&mut cmd);
        run(&mut cmd)?;
        // nextest does not run doc tests.
        let mut doc = cargo();
        doc.args(["test", "--doc", "--workspace"]);
        with_env(&mut doc);
        run(&mut doc)
    } else {
        let mut cmd = cargo();
        cmd.args(["test", "--workspace", "--no-fail-fast"])
            .args(extra);
        with_env(&mut cmd);
        run(&mut cmd)
    }
}

fn nextest_installed() -> bool {
    cargo()
        .args(["nextest", "--version"])
        .output()
        .map(|out| out.status.success())
        .unwrap_or(false)
}

/// The PostgreSQL server of the tests and of `sim --store postgres`.
fn test_database_url() -> String {
    env::var("SLUICE_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_TEST_DATABASE_URL.into())
}

/// Fails clearly when nothing listens where the tests expect PostgreSQL.
fn check_postgres(url: &str) -> Result<()> {
    let (host, port) = postgres_host_port(url)
        .ok_or_else(|| format!("cannot read host and port from SLUICE_TEST_DATABASE_URL={url}"))?;
    let addrs: Vec<_> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve PostgreSQL host {host}: {e}"))?
        .collect();
    let reachable = addrs
        .iter()
        .any(|addr| TcpStream::connect_timeout(addr, Duration::from_secs(3)).is_ok());
    if reachable {
        Ok(())
    } else {
        Err(format!(
            "PostgreSQL is not reachable at {host}:{port} (SLUICE_TEST_DATABASE_URL={}). \
             The tests need a running PostgreSQL; start it (e.g. \
             `pg_ctlcluster --skip-systemctl-redirect <version> main start`) or point \
             SLUICE_TEST_DATABASE_URL at one.",
            redact_password(url)
        ))
    }
}

/// Host and port of a `postgres://[user[:password]@]host[:port][/db][?query]` URL.
fn postgres_host_port(url: &str) -> Option<(String, u16)> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = match host_port.strip_prefix('[') {
        // [ipv6]:port
        Some(v6) => {
            let (host, after) = v6.split_once(']')?;
            (host, after.strip_prefix(':'))
        }
        None => match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        },
    };
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => 5432,
    };
    Some((host.to_string(), port))
}

fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// demo
// ---------------------------------------------------------------------------------------------

/// `<target>/demo-adapters/`: the built adapters without the test ones, so a
/// first run loads only what a merchant can use and logs no refusal.
fn demo_adapters(built: &Path) -> Result<PathBuf> {
    let dir = target_dir().join("demo-adapters");
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
    }
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let real = adapter_crates()?
        .into_iter()
        .filter(|c| !c.dir_name.starts_with(TEST_ADAPTER_PREFIX));
    for c in real {
        let file = format!("{}.wasm", c.dir_name);
        fs::copy(built.join(&file), dir.join(&file))
            .map_err(|e| format!("cannot copy {file} to {}: {e}", dir.display()))?;
    }
    Ok(dir)
}

fn demo(extra: &[OsString]) -> Result<()> {
    let adapters_dir = demo_adapters(&build_adapters()?)?;
    let mut cmd = cargo();
    cmd.args([
        "run",
        "-p",
        "sluice-server",
        "--bin",
        "sluice",
        "--",
        "demo",
    ])
    .arg("--adapters-dir")
    .arg(&adapters_dir)
    .args(extra);
    run(&mut cmd)
}

/// The simulator runs from the `sim` profile (optimised, the workspace's
/// assertions kept; see Cargo.toml).
const SIM_RUN: [&str; 9] = [
    "run",
    "-q",
    "--profile",
    "sim",
    "-p",
    "sluice-sim",
    "--bin",
    "sluice-sim",
    "--",
];

fn sim(extra: &[OsString]) -> Result<()> {
    if on_postgres(extra) {
        check_postgres(&test_database_url())?;
    }
    let adapters_dir = build_adapters()?;
    let mut cmd = cargo();
    cmd.args(SIM_RUN)
        .arg("--adapters")
        .arg(&adapters_dir)
        .args(extra);
    run(&mut cmd)
}

/// Whether the simulator's arguments ask for `--store postgres`.
fn on_postgres(args: &[OsString]) -> bool {
    let args: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
    args.iter().any(|a| a == "--store=postgres")
        || args
            .windows(2)
            .any(|pair| pair[0] == "--store" && pair[1] == "postgres")
}

/// Each wrong patch in `host/sim/mutants/`, applied to a scratch worktree of
/// HEAD, must make the simulator fail; prints the table for docs/simulation.md.
fn sim_mutants(extra: &[OsString]) -> Result<()> {
    let seeds = extra
        .first()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "200".into());
    let adapters_dir = build_adapters()?;
    let root = workspace_root();
    let scratch = target_dir().join("mutants");
    seed_mutant_target(&scratch.join("target"))?;
    let mut patches: Vec<PathBuf> = fs::read_dir(root.join("host/sim/mutants"))
        .map_err(|e| format!("host/sim/mutants: {e}"))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "patch"))
        .collect();
    patches.sort();
    let tree = mutant_tree(&root, &scratch)?;
    let mut rows = Vec::new();
    for patch in &patches {
        let name = patch
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        reset_mutant_tree(&root, &tree)?;
        run(Command::new("git")
            .current_dir(&tree)
            .arg("apply")
            .arg(patch))?;
        let output = cargo()
            .current_dir(&tree)
            .env("CARGO_TARGET_DIR", scratch.join("target"))
            .args(SIM_RUN)
            .arg("--adapters")
            .arg(&adapters_dir)
            .args(["--seeds", &seeds, "--jobs", "2"])
            .output()
            .map_err(|e| format!("cannot run the simulator on {name}: {e}"))?;
        let verdict = mutant_verdict(
            &String::from_utf8_lossy(&output.stdout),
            &seeds,
            output.status.success(),
        );
        println!("{name}: {verdict}");
        rows.push((name, verdict));
    }
    reset_mutant_tree(&root, &tree)?;
    println!("\n| wrong patch | what the simulator did |\n| --- | --- |");
    for (name, verdict) in &rows {
        println!("| `{name}` | {verdict} |");
    }
    Ok(())
}

/// What the simulator's output says about one wrong patch.
fn mutant_verdict(stdout: &str, seeds: &str, success: bool) -> String {
    let first = stdout.lines().find_map(|line| {
        line.strip_suffix(": FAILED")?
            .strip_prefix("seed ")
            .map(str::to_owned)
    });
    let failed = stdout
        .lines()
        .filter(|line| line.ends_with(": FAILED"))
        .count();
    // The first violation the simulator printed (of the first failing seed).
    let saw = stdout
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("VIOLATION "))
        .unwrap_or("-");
    match (&first, success) {
        (Some(seed), _) => {
            format!("caught: {failed} of {seeds} seeds fail, first at seed {seed}: {saw}")
        }
        (None, false) => "the simulator did not run (see its output)".to_owned(),
        (None, true) => format!("NOT caught in {seeds} seeds"),
    }
}

/// The one scratch worktree every wrong patch is applied in, in turn. It is
/// kept between patches and runs: a file keeps its modification time unless
/// a patch touched it, so cargo rebuilds only the crates the previous and
/// the current patch change (a fresh worktree per patch rebuilt every
/// workspace crate each time).
fn mutant_tree(root: &Path, scratch: &Path) -> Result<PathBuf> {
    let tree = scratch.join("tree");
    if tree.join(".git").exists() {
        return Ok(tree);
    }
    let _ = fs::remove_dir_all(&tree);
    let _ = Command::new("git")
        .current_dir(root)
        .args(["worktree", "prune"])
        .status();
    run(Command::new("git")
        .current_dir(root)
        .args(["worktree", "add", "--detach"])
        .arg(&tree)
        .arg("HEAD"))?;
    Ok(tree)
}

/// The scratch worktree at the workspace's HEAD, without any patch.
fn reset_mutant_tree(root: &Path, tree: &Path) -> Result<()> {
    let head = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "HEAD"])
        .output()
        .map_err(|e| format!("git rev-parse HEAD: {e}"))?;
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    run(Command::new("git")
        .current_dir(tree)
        .args(["reset", "--hard", "-q"])
        .arg(&head))?;
    run(Command::new("git")
        .current_dir(tree)
        .args(["clean", "-fdq"]))
}

/// The mutants build in their own target directory, so that a mutant's
/// binary never stands where `cargo xtask sim` runs the real one. Starting it
/// as a copy of the real build's `sim` profile spares a full optimised build
/// of every dependency (the workspace's crates live at another path there, so
/// cargo rebuilds just those).
fn seed_mutant_target(mutant_target: &Path) -> Result<()> {
    let built = target_dir().join("sim");
    if mutant_target.join("sim").exists() || !built.exists() {
        return Ok(());
    }
    fs::create_dir_all(mutant_target).map_err(|e| format!("{}: {e}", mutant_target.display()))?;
    run(Command::new("cp").arg("-a").arg(&built).arg(mutant_target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_name_is_read_from_the_package_table_only() {
        let manifest = "[workspace]\nname = \"nope\"\n\n[package]\nname = \"sluice-adapter-stripe\"\nversion = \"0.1.0\"\n\n[dependencies]\nname = \"other\"\n";
        assert_eq!(
            package_name(manifest).as_deref(),
            Some("sluice-adapter-stripe")
        );
    }

    #[test]
    fn postgres_urls_yield_host_and_port() {
        assert_eq!(
            postgres_host_port("postgres://postgres@127.0.0.1:5432/postgres"),
            Some(("127.0.0.1".into(), 5432))
        );
        assert_eq!(
            postgres_host_port("postgresql://u:p@db.internal/app?sslmode=disable"),
            Some(("db.internal".into(), 5432))
        );
        assert_eq!(
            postgres_host_port("postgres://u@[::1]:6543/x"),
            Some(("::1".into(), 6543))
        );
        assert_eq!(postgres_host_port("mysql://localhost"), None);
        assert_eq!(postgres_host_port("postgres://h:notaport/x"), None);
    }

    #[test]
    fn passwords_are_redacted_from_error_messages() {
        assert_eq!(
            redact_password("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_password("postgres://u@h/db"), "postgres://u@h/db");
    }
}
