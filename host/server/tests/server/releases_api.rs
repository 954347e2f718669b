//! The adapter release routes over HTTP: shadow and canary staged, reported, refused
//! with the JSON error shape, and recorded in the adapter's release history.

use reqwest::{Method, StatusCode};
use sluice_server::server::RunningServer;
use tempfile::TempDir;

use crate::common::*;

/// A gateway serving `test-well-behaved` v1; the digests of v1 and of a v2 (the same
/// component with a custom section), and the data directory the server lives in.
async fn with_two_versions() -> (RunningServer, Http, String, String, TempDir) {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);
    let v1 = adapter_bytes(WELL_BEHAVED);
    let v2 = with_custom_section(&v1, "sluice-test-release");
    assert_eq!(
        http.upload(WELL_BEHAVED, v1.clone(), true).await.status,
        StatusCode::OK
    );
    (server, http, digest(&v1), digest(&v2), data)
}

fn path(what: &str) -> String {
    format!("/admin/adapters/{WELL_BEHAVED}/{what}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_uploaded_as_the_shadow_is_staged_reported_and_ended_without_touching_the_active_one(
) {
    let (server, http, v1, v2, _data) = with_two_versions().await;
    let v2_bytes = with_custom_section(&adapter_bytes(WELL_BEHAVED), "sluice-test-release");
    let staged = http
        .call(
            Method::PUT,
            &format!("/admin/adapters/{WELL_BEHAVED}?shadow=true"),
            None,
            Some(Body::Wasm(v2_bytes)),
        )
        .await;
    assert_eq!(staged.status, StatusCode::OK, "{}", staged.json);
    assert_eq!(staged.json["digest"], v2);
    assert_eq!(staged.json["active"], false);

    let list = http.list().await;
    assert_eq!(adapter(&list, WELL_BEHAVED)["active_digest"], v1);
    assert_eq!(adapter(&list, WELL_BEHAVED)["shadow_digest"], v2);

    let report = http
        .call(Method::GET, &path("shadow?limit=5"), None, None)
        .await;
    assert_eq!(report.status, StatusCode::OK, "{}", report.json);
    assert_eq!(report.json["shadow"]["digest"], v2);
    assert_eq!(report.json["active_digest"], v1);
    assert_eq!(report.json["diffs"], serde_json::json!([]));

    let ended = http.call(Method::DELETE, &path("shadow"), None, None).await;
    assert_eq!(ended.status, StatusCode::OK, "{}", ended.json);
    let list = http.list().await;
    assert_eq!(
        adapter(&list, WELL_BEHAVED)["shadow_digest"],
        serde_json::Value::Null
    );
    assert_eq!(adapter(&list, WELL_BEHAVED)["active_digest"], v1);

    let history = http.call(Method::GET, &path("canary"), None, None).await;
    let kinds: Vec<&str> = history.json["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["shadow_cleared", "shadow_staged"], "newest first");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_is_started_shown_and_stopped_and_promoting_it_ends_it() {
    let (server, http, v1, v2, _data) = with_two_versions().await;
    let v2_bytes = with_custom_section(&adapter_bytes(WELL_BEHAVED), "sluice-test-release");
    assert_eq!(
        http.upload(WELL_BEHAVED, v2_bytes, false).await.status,
        StatusCode::OK
    );

    let body =
        serde_json::json!({ "digest": v2, "percent": 10, "accounts": ["ca_x"], "min_sample": 50 });
    let started = http
        .call(Method::POST, &path("canary"), None, Some(Body::Json(body)))
        .await;
    assert_eq!(started.status, StatusCode::OK, "{}", started.json);
    let canary = &started.json["canary"];
    assert_eq!(canary["digest"], v2);
    assert_eq!(canary["percent"], 10);
    assert_eq!(canary["accounts"], serde_json::json!(["ca_x"]));
    assert_eq!(canary["min_sample"], 50);
    assert_eq!(canary["max_excess_pct"], 10);
    assert_eq!(canary["canary_sends"]["total"], 0);
    assert_eq!(
        adapter(&http.list().await, WELL_BEHAVED)["canary_digest"],
        v2
    );

    let stopped = http.call(Method::DELETE, &path("canary"), None, None).await;
    assert_eq!(stopped.status, StatusCode::OK, "{}", stopped.json);
    assert_eq!(stopped.json["canary"], serde_json::Value::Null);
    assert_eq!(stopped.json["history"][0]["kind"], "canary_stopped");
    assert_eq!(stopped.json["history"][0]["actor"], "admin");

    let body = serde_json::json!({ "digest": v2, "percent": 100 });
    let again = http
        .call(Method::POST, &path("canary"), None, Some(Body::Json(body)))
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.json);
    assert_eq!(
        http.activate(WELL_BEHAVED, &v2).await.status,
        StatusCode::OK
    );
    let list = http.list().await;
    assert_eq!(
        adapter(&list, WELL_BEHAVED)["canary_digest"],
        serde_json::Value::Null,
        "promoted"
    );
    assert_eq!(adapter(&list, WELL_BEHAVED)["rollback_to"], v1);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_requests_that_cannot_be_served_are_refused_with_the_json_error_shape_and_change_nothing(
) {
    let (server, http, v1, v2, _data) = with_two_versions().await;
    let v2_bytes = with_custom_section(&adapter_bytes(WELL_BEHAVED), "sluice-test-release");
    assert_eq!(
        http.upload(WELL_BEHAVED, v2_bytes, false).await.status,
        StatusCode::OK
    );
    let cases = [
        (
            serde_json::json!({ "digest": v2, "percent": 101 }),
            StatusCode::BAD_REQUEST,
            "invalid_rollout",
        ),
        (
            serde_json::json!({ "digest": v2, "accounts": vec!["ca"; 257] }),
            StatusCode::BAD_REQUEST,
            "invalid_rollout",
        ),
        (
            serde_json::json!({ "digest": v2, "percent": 5, "min_sample": 1 }),
            StatusCode::BAD_REQUEST,
            "invalid_rollout",
        ),
        (
            serde_json::json!({ "digest": v1, "percent": 5 }),
            StatusCode::CONFLICT,
            "version_is_active",
        ),
        (
            serde_json::json!({ "digest": "0".repeat(64), "percent": 5 }),
            StatusCode::NOT_FOUND,
            "version_not_found",
        ),
        (
            serde_json::json!({ "digest": "nope", "percent": 5 }),
            StatusCode::BAD_REQUEST,
            "invalid_digest",
        ),
    ];
    for (body, status, code) in cases {
        let reply = http
            .call(
                Method::POST,
                &path("canary"),
                None,
                Some(Body::Json(body.clone())),
            )
            .await;
        assert_eq!(
            (reply.status, error_code(&reply)),
            (status, code.to_string()),
            "{body}"
        );
    }
    let shadow_active = http
        .call(
            Method::POST,
            &path("shadow"),
            None,
            Some(Body::Json(serde_json::json!({ "digest": v1 }))),
        )
        .await;
    assert_eq!(error_code(&shadow_active), "version_is_active");
    let both = http
        .call(
            Method::PUT,
            &format!("/admin/adapters/{WELL_BEHAVED}?shadow=true&activate=true"),
            None,
            Some(Body::Wasm(adapter_bytes(WELL_BEHAVED))),
        )
        .await;
    assert_eq!(
        (both.status, error_code(&both)),
        (StatusCode::BAD_REQUEST, "conflicting_parameters".into())
    );
    let limit = http
        .call(Method::GET, &path("shadow?limit=0"), None, None)
        .await;
    assert_eq!(error_code(&limit), "invalid_limit");
    let unknown = http
        .call(Method::GET, "/admin/adapters/no-such/canary", None, None)
        .await;
    assert_eq!(
        (unknown.status, error_code(&unknown)),
        (StatusCode::NOT_FOUND, "adapter_not_found".into())
    );

    let list = http.list().await;
    let adapter = adapter(&list, WELL_BEHAVED);
    assert_eq!(adapter["active_digest"], v1);
    assert_eq!(adapter["canary_digest"], serde_json::Value::Null);
    assert_eq!(adapter["shadow_digest"], serde_json::Value::Null);
    let history = http.call(Method::GET, &path("canary"), None, None).await;
    assert_eq!(
        history.json["history"],
        serde_json::json!([]),
        "nothing recorded"
    );
    server.shutdown().await.unwrap();
}
