//! Real deliveries verified by the Standard Webhooks reference library for
//! Python (`standardwebhooks` from PyPI, pinned below), the way a merchant
//! verifies them: with the endpoint secret as Sluice showed it, and nothing
//! written by us on the verifying side.
//!
//! The library lives in a venv under the target directory, made on first use
//! (like `.ci/schemathesis`'s). PyPI or `python3 -m venv` being unavailable
//! is a failure that says so, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use serde_json::json;

use crate::common::*;
use sluice_delivery::signature::sign_standard;
use sluice_store::SystemClock;

const STANDARDWEBHOOKS_VERSION: &str = "1.1.0";

/// Verifies every delivery of `deliveries.json` with the library, and that a
/// tampered body does not verify. Prints `verified N`.
const VERIFY_PY: &str = r#"
import base64, json, sys
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

cases = json.load(open(sys.argv[1]))
for case in cases:
    body = base64.b64decode(case["body"])
    Webhook(case["secret"]).verify(body, case["headers"])
    try:
        Webhook(case["secret"]).verify(body + b" ", case["headers"])
    except WebhookVerificationError:
        pass
    else:
        sys.exit("a tampered body verified")
print(f"verified {len(cases)}")
"#;

/// `<target>` from this test binary's path (`<target>/debug/deps/delivery-...`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .expect("the test binary lives in <target>/<profile>/deps")
}

fn run_checked(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The venv's python with the pinned library, made once. Two tests making
/// it at once each build a venv of their own and rename it into place; the
/// loser throws its copy away.
fn standardwebhooks_python() -> PathBuf {
    let venv = std::env::var_os("SLUICE_STANDARDWEBHOOKS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            target_dir().join(format!("standardwebhooks-venv-{STANDARDWEBHOOKS_VERSION}"))
        });
    let python = venv.join("bin/python");
    if python.exists() {
        return python;
    }
    let scratch = venv.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    run_checked(
        Command::new("python3").arg("-m").arg("venv").arg(&scratch),
        "python3 -m venv",
    );
    run_checked(
        Command::new(scratch.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("standardwebhooks=={STANDARDWEBHOOKS_VERSION}")),
        "pip install standardwebhooks from PyPI (needed by this test; is PyPI reachable?)",
    );
    if std::fs::rename(&scratch, &venv).is_err() {
        // Someone else's venv is in place already; ours is not needed.
        let _ = std::fs::remove_dir_all(&scratch);
    }
    python
}

dual_test! {
    async fn real_deliveries_verify_with_the_standard_webhooks_python_library_and_the_endpoint_secret(&db) {
        // The library checks the timestamp against the wall clock.
        db.clock.set(SystemClock.now_ms());
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let merchant = TestMerchant::start().await;
        let endpoint = fx.endpoint(store, &merchant.url, &["*"]).await;
        fx.succeeded(store, "SW-1", 1_250).await;
        fx.refunded(store, "SW-2").await;
        let publisher = publisher(store, test_config());
        while publisher.publish_once().await.unwrap().did_work() {}
        let received = merchant.received();
        assert!(received.len() >= 2, "{} deliveries", received.len());

        let mut cases: Vec<serde_json::Value> = received.iter().map(|request| {
            assert_eq!(request.header("webhook-id"), request.event_id(), "webhook-id is the event id");
            assert!(request.header("webhook-signature").starts_with("v1,"));
            assert!(request.header("Sluice-Signature").starts_with("t="), "the old signature stays");
            json!({
                "secret": endpoint.secret,
                "body": base64::engine::general_purpose::STANDARD.encode(&request.body),
                "headers": {
                    "webhook-id": request.header("webhook-id"),
                    "webhook-timestamp": request.header("webhook-timestamp"),
                    "webhook-signature": request.header("webhook-signature"),
                },
            })
        }).collect();
        // An endpoint created before Standard Webhooks has a `whsec_<hex>`
        // secret: the library reads the same key from it that we sign with.
        let legacy = format!("whsec_{}", "5e".repeat(32));
        let now = SystemClock.now_ms() / 1000;
        let body = br#"{"id":"evt_legacy"}"#;
        cases.push(json!({
            "secret": legacy,
            "body": base64::engine::general_purpose::STANDARD.encode(body),
            "headers": {
                "webhook-id": "evt_legacy",
                "webhook-timestamp": now.to_string(),
                "webhook-signature": sign_standard(&legacy, "evt_legacy", now, body).unwrap(),
            },
        }));

        let count = cases.len();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("deliveries.json");
        std::fs::write(&file, serde_json::to_vec(&cases).unwrap()).unwrap();
        let script = dir.path().join("verify.py");
        std::fs::write(&script, VERIFY_PY).unwrap();
        let out = tokio::task::spawn_blocking(move || {
            let python = standardwebhooks_python();
            run_checked(Command::new(python).arg(&script).arg(&file), "the standardwebhooks verification")
        })
        .await
        .unwrap();
        assert_eq!(out.trim(), format!("verified {count}"));
    }
}
