//! The built `sluice` binary against a running gateway.

use std::path::Path;
use std::process::Output;

use sqlx::{Connection, Row};
use tokio::process::Command;

use crate::common::*;

/// Runs the built `sluice` binary with a clean environment for its own variables.
async fn sluice(args: &[&str], env: &[(&str, &str)], cwd: &Path) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.args(args).current_dir(cwd);
    for var in [
        "SLUICE_ADMIN_TOKEN",
        "SLUICE_URL",
        "SLUICE_DATABASE_URL",
        "SLUICE_DATA_DIR",
        "SLUICE_LISTEN",
        "SLUICE_ADAPTERS_DIR",
        "SLUICE_MASTER_KEY",
        "SLUICE_PREVIOUS_MASTER_KEYS",
        "SLUICE_API_KEY",
    ] {
        command.env_remove(var);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().await.expect("run the sluice binary")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_adapter_list_prints_the_adapters_of_a_running_gateway() {
    let data = tempfile::tempdir().unwrap();
    let dir = adapters_subset(&[WELL_BEHAVED]);
    let server = start(&config(data.path(), Some(dir.path().to_path_buf()))).await;
    let url = server.url();
    let wasm_digest = digest(&adapter_bytes(WELL_BEHAVED));

    let table = sluice(
        &[
            "adapter",
            "--url",
            &url,
            "--admin-token",
            ADMIN_TOKEN,
            "list",
        ],
        &[],
        data.path(),
    )
    .await;
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    assert!(text.starts_with("NAME"), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with(WELL_BEHAVED))
        .unwrap_or_else(|| panic!("no row for {WELL_BEHAVED}: {text}"));
    assert!(row.contains(&wasm_digest), "{row}");
    assert!(row.contains("active"), "{row}");

    // The token may also come from the environment; --json prints the API's answer.
    let json = sluice(
        &["adapter", "--url", &url, "list", "--json"],
        &[("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)],
        data.path(),
    )
    .await;
    assert!(json.status.success(), "{}", stderr(&json));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON output");
    assert_eq!(adapter(&value, WELL_BEHAVED)["active_digest"], wasm_digest);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_adapter_load_activate_and_rollback_drive_the_admin_api() {
    let data = tempfile::tempdir().unwrap();
    let dir = adapters_subset(&[WELL_BEHAVED]);
    let server = start(&config(data.path(), Some(dir.path().to_path_buf()))).await;
    let url = server.url();
    let v1 = adapter_bytes(WELL_BEHAVED);
    let v2 = with_custom_section(&v1, "sluice-test-cli");
    let file = data.path().join("v2.wasm");
    std::fs::write(&file, &v2).unwrap();
    let file = file.to_str().unwrap();
    let base = [
        "adapter",
        "--url",
        url.as_str(),
        "--admin-token",
        ADMIN_TOKEN,
    ];
    let run = |extra: Vec<&'static str>, owned: Vec<String>| {
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        args.extend(extra.into_iter().map(str::to_string));
        args.extend(owned);
        let cwd = data.path().to_path_buf();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            sluice(&args, &[], &cwd).await
        }
    };

    let load = run(
        vec!["load", WELL_BEHAVED],
        vec![file.to_string(), "--no-activate".into()],
    )
    .await;
    assert!(load.status.success(), "{}", stderr(&load));
    assert!(stdout(&load).contains(&digest(&v2)), "{}", stdout(&load));
    assert!(stdout(&load).contains("staged"), "{}", stdout(&load));
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v1));

    let activate = run(vec!["activate", WELL_BEHAVED], vec![digest(&v2)]).await;
    assert!(activate.status.success(), "{}", stderr(&activate));
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v2));

    let rollback = run(vec!["rollback", WELL_BEHAVED], vec![]).await;
    assert!(rollback.status.success(), "{}", stderr(&rollback));
    assert!(
        stdout(&rollback).contains(&digest(&v1)),
        "{}",
        stdout(&rollback)
    );
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v1));

    let garbage = data.path().join("garbage.wasm");
    std::fs::write(&garbage, b"garbage").unwrap();
    let refused = run(
        vec!["load", WELL_BEHAVED],
        vec![garbage.to_str().unwrap().to_string()],
    )
    .await;
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("invalid_component"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v1));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_adapter_commands_fail_clearly_with_a_wrong_token_or_no_gateway() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let url = server.url();

    let wrong = sluice(
        &[
            "adapter",
            "--url",
            &url,
            "--admin-token",
            "wrong-token-0123456789",
            "list",
        ],
        &[],
        data.path(),
    )
    .await;
    assert!(!wrong.status.success());
    assert!(
        stderr(&wrong).contains("admin_token_invalid"),
        "{}",
        stderr(&wrong)
    );
    server.shutdown().await.unwrap();

    // Nothing listens there any more.
    let gone = sluice(
        &[
            "adapter",
            "--url",
            &url,
            "--admin-token",
            ADMIN_TOKEN,
            "list",
        ],
        &[],
        data.path(),
    )
    .await;
    assert!(!gone.status.success());
    assert!(
        stderr(&gone).contains("cannot reach the gateway"),
        "{}",
        stderr(&gone)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_migrate_brings_a_fresh_postgres_database_up_to_date() {
    let pg = crate::pg::TestDatabase::create().await;
    let data = tempfile::tempdir().unwrap();

    let migrate = sluice(
        &["migrate"],
        &[
            ("SLUICE_DATABASE_URL", &pg.url),
            ("SLUICE_DATA_DIR", data.path().to_str().unwrap()),
        ],
        data.path(),
    )
    .await;

    assert!(migrate.status.success(), "{}", stderr(&migrate));
    let mut conn = sqlx::AnyConnection::connect(&pg.url).await.unwrap();
    let applied: i64 = sqlx::query("SELECT COUNT(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
    assert!(applied >= 1, "no migration applied");
    conn.close().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_migrate_creates_the_default_sqlite_database_in_the_data_dir() {
    let data = tempfile::tempdir().unwrap();

    let migrate = sluice(&["migrate"], &[], data.path()).await;

    assert!(migrate.status.success(), "{}", stderr(&migrate));
    assert!(data.path().join("data").join("sluice.db").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_invalid_config_file_is_a_clear_error() {
    let data = tempfile::tempdir().unwrap();
    let missing = sluice(&["--config", "nope.toml", "migrate"], &[], data.path()).await;
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("nope.toml"),
        "{}",
        stderr(&missing)
    );

    std::fs::write(data.path().join("sluice.toml"), "listen = 12\n").unwrap();
    let invalid = sluice(&["migrate"], &[], data.path()).await;
    assert!(!invalid.status.success());
    assert!(
        stderr(&invalid).contains("sluice.toml"),
        "{}",
        stderr(&invalid)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_demo_refuses_a_webhook_sender_count_outside_1_to_64_before_starting() {
    let data = tempfile::tempdir().unwrap();
    for bad in ["0", "65", "many"] {
        let out = sluice(&["demo", "--webhook-senders", bad], &[], data.path()).await;
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--webhook-senders"),
            "{bad}: {}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty(), "{bad}: {}", stdout(&out));
    }
}

/// Sends SIGTERM to a child and waits (bounded) for it to exit.
async fn terminate(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    let pid = child.id().expect("child is running").to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("run kill");
    assert!(killed.success());
    tokio::time::timeout(std::time::Duration::from_secs(20), child.wait())
        .await
        .expect("sluice exits within 20 s of SIGTERM")
        .expect("wait for sluice")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_demo_prints_what_it_loaded_serves_the_admin_api_and_stops_on_sigterm() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let data = tempfile::tempdir().unwrap();
    let dir = adapters_subset(&[WELL_BEHAVED, "stripe"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["demo", "--adapters-dir", dir.path().to_str().unwrap()])
        .args(["--webhook-senders", "4"])
        .env_remove("SLUICE_ADMIN_TOKEN")
        .env_remove("SLUICE_MASTER_KEY")
        .env_remove("SLUICE_DATABASE_URL")
        .env_remove("SLUICE_ADAPTERS_DIR")
        .env("SLUICE_LISTEN", "127.0.0.1:0")
        .env("SLUICE_DATA_DIR", data.path())
        .current_dir(data.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start sluice demo");
    // Drained all along, so the demo never blocks on a full pipe.
    let mut stderr_pipe = child.stderr.take().unwrap();
    let logs = tokio::spawn(async move {
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stderr_pipe, &mut text)
            .await
            .expect("read demo logs");
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut banner = String::new();
    let read_banner = async {
        while let Some(line) = lines.next_line().await.expect("read demo output") {
            banner.push_str(&line);
            banner.push('\n');
            if line.contains("Press ctrl-c") {
                return;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(120), read_banner)
        .await
        .unwrap_or_else(|_| panic!("no demo banner within 120 s"));

    for name in [WELL_BEHAVED, "stripe"] {
        let line = banner
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing from the banner:\n{banner}"));
        assert!(line.contains(&digest(&adapter_bytes(name))), "{line}");
    }
    let field = |label: &str| {
        banner
            .lines()
            .find_map(|l| {
                l.trim_start()
                    .strip_prefix(label)
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {label} in the banner:\n{banner}"))
    };
    let url = field("URL");
    let token = field("Admin token");
    let list = reqwest::Client::new()
        .get(format!("{url}/admin/adapters"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("list adapters of the demo gateway");
    assert_eq!(list.status(), reqwest::StatusCode::OK);
    // The console's sign-in from the banner works: its URL serves the page,
    // and the admin token with a printed operator key reads the admin API.
    let console = banner
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Operations console:"))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no console URL in the banner:\n{banner}"));
    assert_eq!(console, format!("{url}/console"));
    let page = reqwest::get(console).await.expect("GET the console");
    assert_eq!(page.status(), reqwest::StatusCode::OK);
    let operator_key = banner
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("alice-"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no operator key in the banner:\n{banner}"));
    let stats = reqwest::Client::new()
        .get(format!("{url}/admin/payments/stats"))
        .bearer_auth(&token)
        .header("Sluice-Operator-Key", operator_key)
        .send()
        .await
        .expect("the console's first call");
    assert_eq!(stats.status(), reqwest::StatusCode::OK);
    assert!(
        banner.contains("pm_sluice_commit_then_timeout"),
        "the banner shows a timeout converging:\n{banner}"
    );
    let list: serde_json::Value = list.json().await.unwrap();
    assert_eq!(adapter(&list, "stripe")["status"], "active");

    let status = terminate(&mut child).await;
    assert!(status.success(), "sluice demo exited with {status}");
    // A first run without surprises: adapters that load print no error.
    let logs = logs.await.unwrap();
    assert!(!logs.contains("ERROR"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_serve_without_a_master_key_refuses_to_start_and_says_which_setting_is_missing() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().display().to_string();
    let output = sluice(
        &["serve"],
        &[
            ("SLUICE_DATA_DIR", &data_dir),
            ("SLUICE_LISTEN", "127.0.0.1:0"),
        ],
        data.path(),
    )
    .await;
    assert!(!output.status.success(), "{}", stdout(&output));
    let message = stderr(&output);
    assert!(message.contains("SLUICE_MASTER_KEY"), "{message}");
    assert!(!data.path().join(crate::common::DEV_KEY_FILE).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_serve_answers_health_checks_and_shuts_down_gracefully_on_sigterm() {
    let data = tempfile::tempdir().unwrap();
    // Pick a free port; the tiny window before `sluice` binds it is acceptable here.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .env_remove("SLUICE_ADMIN_TOKEN")
        .env_remove("SLUICE_DATABASE_URL")
        .env_remove("SLUICE_ADAPTERS_DIR")
        .env("SLUICE_MASTER_KEY", TEST_MASTER_KEY)
        .env("SLUICE_LISTEN", &listen)
        .env("SLUICE_DATA_DIR", data.path())
        .current_dir(data.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start sluice serve");

    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let ready = loop {
        if let Ok(response) = client.get(format!("http://{listen}/readyz")).send().await {
            if response.status() == reqwest::StatusCode::OK {
                break response.json::<serde_json::Value>().await.unwrap();
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sluice serve never became ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(ready["database"], true);
    let health = client
        .get(format!("http://{listen}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), reqwest::StatusCode::OK);
    assert!(data.path().join("sluice.db").is_file());

    let status = terminate(&mut child).await;
    assert!(status.success(), "sluice serve exited with {status}");
}

/// The conformance kit needs no gateway: the real adapter passes with its
/// fixtures and gets a JUnit file; a panicking one fails with a non-zero exit.
#[tokio::test]
async fn adapter_test_passes_the_stripe_format_adapter_and_fails_a_panicking_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let junit = dir.path().join("kit.xml");
    let stripe = sluice_test_support::adapters::adapter_path("stripe");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../adapters/stripe/conformance");
    let output = sluice(
        &[
            "adapter",
            "test",
            &stripe.display().to_string(),
            "--fixtures",
            &fixtures.display().to_string(),
            "--junit",
            &junit.display().to_string(),
        ],
        &[],
        dir.path(),
    )
    .await;
    assert!(
        output.status.success(),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    assert!(stdout(&output).contains(" 0 failed"), "{}", stdout(&output));
    let xml = std::fs::read_to_string(&junit).expect("the JUnit file");
    assert!(
        xml.contains("<testsuites") && xml.contains("describe is sane and cheap"),
        "{xml}"
    );

    let panicking = sluice_test_support::adapters::adapter_path("test-panic");
    let output = sluice(
        &["adapter", "test", &panicking.display().to_string()],
        &[],
        dir.path(),
    )
    .await;
    assert!(!output.status.success(), "{}", stdout(&output));
    assert!(stdout(&output).contains("FAIL"), "{}", stdout(&output));
    assert!(
        stderr(&output).contains("conformance checks failed"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_payments_show_and_explain_print_a_payment_and_what_happens_next_through_the_merchant_api(
) {
    use reqwest::Method;
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let url = server.url();
    let http = Http::new(&server);
    let merchant = http
        .call(
            Method::POST,
            "/admin/merchants",
            None,
            Some(Body::Json(serde_json::json!({"name": "Acme"}))),
        )
        .await;
    let merchant_id = merchant.json["id"]
        .as_str()
        .expect("merchant id")
        .to_owned();
    let key = http
        .call(
            Method::POST,
            &format!("/admin/merchants/{merchant_id}/api_keys"),
            None,
            Some(Body::Json(serde_json::json!({"label": "cli"}))),
        )
        .await;
    let key = key.json["key"].as_str().expect("api key").to_owned();
    let payment = http
        .call(
            Method::POST,
            "/v1/payments",
            Some(&key),
            Some(Body::Json(serde_json::json!({
                "amount": 1999, "currency": "EUR", "merchant_order_no": "cli-1",
                "capture_mode": "automatic"
            }))),
        )
        .await;
    let id = payment.json["id"].as_str().expect("payment id").to_owned();

    let show = sluice(
        &["payments", "--url", &url, "show", &id],
        &[("SLUICE_API_KEY", &key)],
        data.path(),
    )
    .await;
    assert!(show.status.success(), "{}", stderr(&show));
    let text = stdout(&show);
    assert!(text.contains(&format!("payment         {id}")), "{text}");
    assert!(
        text.contains("status          created (state CREATED"),
        "{text}"
    );

    let explain = sluice(
        &["payments", "--url", &url, "--api-key", &key, "explain", &id],
        &[],
        data.path(),
    )
    .await;
    assert!(explain.status.success(), "{}", stderr(&explain));
    let text = stdout(&explain);
    assert!(text.starts_with("next: merchant"), "{text}");
    assert!(text.contains("confirm"), "{text}");
    assert!(
        text.contains("COMMAND_CREATE"),
        "the history follows: {text}"
    );

    let json = sluice(
        &[
            "payments",
            "--url",
            &url,
            "--api-key",
            &key,
            "--json",
            "explain",
            &id,
        ],
        &[],
        data.path(),
    )
    .await;
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON output");
    assert_eq!(value["next"]["mover"], "merchant");

    let other = sluice(
        &[
            "payments",
            "--url",
            &url,
            "--api-key",
            "sk_wrong",
            "show",
            &id,
        ],
        &[],
        data.path(),
    )
    .await;
    assert!(!other.status.success());
    assert!(
        stderr(&other).contains("refused the request (401"),
        "{}",
        stderr(&other)
    );
    server.shutdown().await.unwrap();
}
