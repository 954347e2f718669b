//! The conformance kit on real components: the two real adapters pass it with
//! their fixtures; each misbehaving test adapter fails it for its own reason.

use std::path::PathBuf;

use sluice_adapter_runtime::SandboxLimits;
use sluice_conformance::{run, KitOptions, Outcome, Report};
use sluice_test_support::adapters::adapter_path;

fn fixtures(adapter: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../adapters")
        .join(adapter)
        .join("conformance")
}

async fn kit(adapter: &str, fixtures_of: Option<&str>) -> Report {
    let options = KitOptions {
        wasm: adapter_path(adapter),
        fixtures: fixtures_of.map(fixtures),
        limits: None,
    };
    run(&options).await.expect("the kit runs")
}

fn assert_fails_because(report: &Report, reason: &str) {
    assert!(!report.passed(), "{}", report.table());
    assert!(
        report.failures().any(|(_, why)| why.contains(reason)),
        "no failure mentions {reason:?}:\n{}",
        report.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripe_format_adapter_passes_the_standard_suite_and_its_fixtures() {
    let report = kit("stripe", Some("stripe")).await;
    assert!(report.passed(), "{}", report.table());
    let fixtures = report
        .cases
        .iter()
        .filter(|c| c.suite == "fixtures")
        .count();
    assert_eq!(fixtures, 8, "every fixture file ran:\n{}", report.table());
    assert!(
        report
            .cases
            .iter()
            .any(|c| c.name.starts_with("webhooks:") && c.outcome == Outcome::Passed),
        "the webhook forgeries were checked:\n{}",
        report.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adyen_format_adapter_passes_the_standard_suite_and_its_fixtures() {
    let report = kit("adyen", Some("adyen")).await;
    assert!(report.passed(), "{}", report.table());
    let fixtures = report
        .cases
        .iter()
        .filter(|c| c.suite == "fixtures")
        .count();
    assert_eq!(fixtures, 7, "every fixture file ran:\n{}", report.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixture_that_expects_another_outcome_fails_with_the_difference() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bodies = fixtures("stripe").join("../tests/");
    for entry in std::fs::read_dir(fixtures("stripe")).expect("fixtures") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        // Body files are named relative to the fixture: make them absolute.
        let text = text.replace("\"../tests/", &format!("\"{}", bodies.display()));
        let text = match path.file_name().is_some_and(|n| n == "sale_declined.json") {
            true => text.replace("\"Declined\"", "\"Retryable\""),
            false => text,
        };
        std::fs::write(dir.path().join(path.file_name().expect("name")), text).expect("write");
    }
    let options = KitOptions {
        wasm: adapter_path("stripe"),
        fixtures: Some(dir.path().to_path_buf()),
        limits: None,
    };
    let report = run(&options).await.expect("the kit runs");
    assert_fails_because(
        &report,
        "category: expected \"Retryable\", got \"Declined\"",
    );
    assert_eq!(report.failures().count(), 1, "{}", report.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_that_loops_fails_at_its_cpu_deadline() {
    let report = kit("test-infinite-loop", None).await;
    assert_fails_because(&report, "exceeded its CPU deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_that_allocates_without_bound_fails_at_its_memory_cap() {
    let report = kit("test-memory-bomb", Some("stripe")).await;
    assert_fails_because(&report, "memory limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_that_panics_fails_as_a_trap() {
    let report = kit("test-panic", None).await;
    assert_fails_because(&report, "trapped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_that_returns_too_much_fails_at_its_output_cap() {
    // A generous deadline: copying megabytes out of the guest takes a while in
    // a debug build, and this is about the output cap, not the deadline.
    let options = KitOptions {
        wasm: adapter_path("test-huge-output"),
        fixtures: None,
        limits: Some(SandboxLimits {
            cpu_deadline: std::time::Duration::from_secs(5),
            ..SandboxLimits::default()
        }),
    };
    let report = run(&options).await.expect("the kit runs");
    assert_fails_because(&report, "exceeds the cap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_of_another_world_does_not_load() {
    let report = kit("test-wrong-world", None).await;
    assert_fails_because(&report, "psp-adapter world");
    assert_eq!(
        report.cases.len(),
        1,
        "nothing else can run:\n{}",
        report.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_that_tries_to_exfiltrate_secrets_fails_for_what_it_tried() {
    let report = kit("test-exfiltrate", Some("stripe")).await;
    assert_fails_because(&report, "credential placeholder in the URL");
    assert_fails_because(
        &report,
        "accepted a webhook signed with another account's secret",
    );
    assert_fails_because(&report, "is not an upper-case ISO 4217 code");
}
