//! Start-up loading, persistence across restarts, health and readiness.

use reqwest::{Method, StatusCode};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_directory_is_loaded_at_start_up_and_readiness_reports_it() {
    let data = tempfile::tempdir().unwrap();
    let dir = adapters_subset(&[WELL_BEHAVED, "stripe"]);
    let server = start(&config(data.path(), Some(dir.path().to_path_buf()))).await;
    let http = Http::new(&server);

    let health = http.call(Method::GET, "/healthz", Some(""), None).await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json["status"], "ok");
    let ready = http.call(Method::GET, "/readyz", Some(""), None).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.json);
    assert_eq!(ready.json["adapters_loaded"], true);
    assert_eq!(ready.json["database"], true);
    assert_eq!(ready.json["active_adapters"], 2);

    let list = http.list().await;
    for name in [WELL_BEHAVED, "stripe"] {
        let listed = adapter(&list, name);
        assert_eq!(listed["status"], "active");
        assert_eq!(listed["active_digest"], digest(&adapter_bytes(name)));
        assert_eq!(active_describe(&server, name).await.0, name);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_in_the_adapters_directory_does_not_stop_the_others() {
    let data = tempfile::tempdir().unwrap();
    let dir = adapters_subset(&[WELL_BEHAVED]);
    std::fs::write(dir.path().join("broken.wasm"), b"not wasm").unwrap();
    let server = start(&config(data.path(), Some(dir.path().to_path_buf()))).await;

    let report = server.ready().await;

    let broken = report
        .items
        .iter()
        .find(|item| item.source.ends_with("broken.wasm"))
        .expect("broken.wasm is reported");
    assert!(broken.result.is_err());
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.0, WELL_BEHAVED);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_survive_a_restart_and_are_reloaded_from_the_compile_cache() {
    let data = tempfile::tempdir().unwrap();
    let v1 = adapter_bytes(WELL_BEHAVED);
    let v2 = with_custom_section(&v1, "sluice-test-v2");
    let v3 = with_custom_section(&v1, "sluice-test-v3");
    {
        let server = start(&config(data.path(), None)).await;
        let http = Http::new(&server);
        for (bytes, activate) in [(&v1, true), (&v2, true), (&v3, false)] {
            let reply = http.upload(WELL_BEHAVED, bytes.clone(), activate).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
            assert_eq!(reply.json["from_cache"], false);
        }
        server.shutdown().await.unwrap();
    }

    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);

    let list = http.list().await;
    let listed = adapter(&list, WELL_BEHAVED);
    assert_eq!(listed["active_digest"], digest(&v2));
    assert_eq!(listed["rollback_to"], digest(&v1));
    let versions = listed["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 3, "{listed}");
    for version in versions {
        assert_eq!(version["from_cache"], true, "{version}");
    }
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v2));
    // The activation history came back too.
    let rolled_back = http.rollback(WELL_BEHAVED).await;
    assert_eq!(rolled_back.status, StatusCode::OK, "{}", rolled_back.json);
    assert_eq!(rolled_back.json["digest"], digest(&v1));
    server.shutdown().await.unwrap();

    // And the rollback itself is durable.
    let server = start(&config(data.path(), None)).await;
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v1));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_version_wins_over_the_adapters_directory_after_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let dir = adapters_subset(&[WELL_BEHAVED]);
    let shipped = adapter_bytes(WELL_BEHAVED);
    let uploaded = with_custom_section(&shipped, "sluice-test-hotfix");
    {
        let server = start(&config(data.path(), Some(dir.path().to_path_buf()))).await;
        let reply = Http::new(&server)
            .upload(WELL_BEHAVED, uploaded.clone(), true)
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        server.shutdown().await.unwrap();
    }

    let server = start(&config(data.path(), Some(dir.path().to_path_buf()))).await;

    assert_eq!(
        active_describe(&server, WELL_BEHAVED).await.1,
        digest(&uploaded)
    );
    let list = Http::new(&server).list().await;
    assert_eq!(
        adapter(&list, WELL_BEHAVED)["rollback_to"],
        digest(&shipped)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_when_the_database_goes_away() {
    let pg = crate::pg::TestDatabase::create().await;
    let data = tempfile::tempdir().unwrap();
    let mut config = config(data.path(), None);
    config.database_url = sluice_server::config::Secret::new(pg.url.clone());
    let server = start(&config).await;
    let http = Http::new(&server);
    let ready = http.call(Method::GET, "/readyz", Some(""), None).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.json);

    pg.drop_now().await;

    let ready = http.call(Method::GET, "/readyz", Some(""), None).await;
    assert_eq!(
        ready.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        ready.json
    );
    assert_eq!(ready.json["database"], false);
    assert_eq!(ready.json["status"], "not_ready");
    let health = http.call(Method::GET, "/healthz", Some(""), None).await;
    assert_eq!(health.status, StatusCode::OK);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_limits_apply_per_adapter_over_the_defaults() {
    let data = tempfile::tempdir().unwrap();
    let dir = adapters_subset(&[WELL_BEHAVED, "stripe"]);
    let mut config = config(data.path(), Some(dir.path().to_path_buf()));
    config.default_limits.memory_bytes = Some(32 << 20);
    config.adapter_limits.insert(
        WELL_BEHAVED.to_string(),
        sluice_server::config::LimitsConfig {
            cpu_deadline_ms: Some(750),
            ..Default::default()
        },
    );
    let server = start(&config).await;
    let http = Http::new(&server);

    let list = http.list().await;

    let limits = |name: &str| adapter(&list, name)["versions"][0]["limits"].clone();
    assert_eq!(limits(WELL_BEHAVED)["cpu_deadline_ms"], 750);
    assert_eq!(limits(WELL_BEHAVED)["memory_bytes"], 32 << 20);
    assert_eq!(limits("stripe")["memory_bytes"], 32 << 20);
    assert_ne!(limits("stripe")["cpu_deadline_ms"], 750);
    // Uploads get the same per-adapter limits.
    let v2 = with_custom_section(&adapter_bytes(WELL_BEHAVED), "sluice-test-limits");
    let reply = http.upload(WELL_BEHAVED, v2, true).await;
    assert_eq!(
        reply.json["limits"]["cpu_deadline_ms"], 750,
        "{}",
        reply.json
    );
    server.shutdown().await.unwrap();
}
