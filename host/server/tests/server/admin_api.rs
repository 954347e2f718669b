//! The admin API for adapters, over real HTTP with real compiled components.

use reqwest::{Method, StatusCode};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploaded_adapter_is_listed_active_and_serving() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);
    let wasm = adapter_bytes(WELL_BEHAVED);

    let reply = http.upload(WELL_BEHAVED, wasm.clone(), true).await;

    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(reply.json["name"], WELL_BEHAVED);
    assert_eq!(reply.json["digest"], digest(&wasm));
    assert_eq!(reply.json["active"], true);
    let list = http.list().await;
    let listed = adapter(&list, WELL_BEHAVED);
    assert_eq!(listed["status"], "active");
    assert_eq!(listed["active_digest"], digest(&wasm));
    assert_eq!(listed["versions"].as_array().unwrap().len(), 1);
    assert_eq!(
        active_describe(&server, WELL_BEHAVED).await,
        (WELL_BEHAVED.to_string(), digest(&wasm))
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_uploads_get_422_with_the_reason_and_the_previous_version_keeps_serving() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);
    let good = adapter_bytes(WELL_BEHAVED);
    assert_eq!(
        http.upload(WELL_BEHAVED, good.clone(), true).await.status,
        StatusCode::OK
    );

    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        (
            "garbage",
            b"this is not webassembly".to_vec(),
            "invalid_component",
            "not a valid adapter component",
        ),
        (
            "a component of another world",
            adapter_bytes("test-wrong-world"),
            "wrong_world",
            "psp-adapter world",
        ),
        (
            "a component of contract 0.1.0 (it read secrets through get-secret)",
            sluice_adapter_runtime::testing::with_contract_version(&good, "0.2.0", "0.1.0"),
            "unsupported_contract_version",
            "sluice:psp/adapter@0.2.x",
        ),
        (
            "a component describing itself under another name",
            adapter_bytes("stripe"),
            "name_mismatch",
            "\"stripe\"",
        ),
        (
            "an empty body",
            Vec::new(),
            "invalid_component",
            "component",
        ),
    ];
    for (what, bytes, code, reason) in cases {
        let reply = http.upload(WELL_BEHAVED, bytes, true).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{what}: {}",
            reply.json
        );
        assert_eq!(error_code(&reply), code, "{what}");
        let message = reply.json["error"]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{what}: {message}");

        let list = http.list().await;
        let listed = adapter(&list, WELL_BEHAVED);
        assert_eq!(listed["active_digest"], digest(&good), "{what}");
        assert_eq!(listed["versions"].as_array().unwrap().len(), 1, "{what}");
        assert_eq!(
            active_describe(&server, WELL_BEHAVED).await,
            (WELL_BEHAVED.to_string(), digest(&good)),
            "{what}"
        );
    }
    // Nothing of the refused uploads was persisted.
    let stored: Vec<_> = std::fs::read_dir(data.path().join("adapters").join(WELL_BEHAVED))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "wasm"))
        .collect();
    assert_eq!(stored.len(), 1);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_version_is_activated_by_its_digest() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);
    let v1 = adapter_bytes(WELL_BEHAVED);
    let v2 = with_custom_section(&v1, "sluice-test-v2");
    assert_eq!(
        http.upload(WELL_BEHAVED, v1.clone(), true).await.status,
        StatusCode::OK
    );

    let staged = http.upload(WELL_BEHAVED, v2.clone(), false).await;
    assert_eq!(staged.status, StatusCode::OK, "{}", staged.json);
    assert_eq!(staged.json["active"], false);
    let list = http.list().await;
    assert_eq!(adapter(&list, WELL_BEHAVED)["active_digest"], digest(&v1));
    assert_eq!(
        adapter(&list, WELL_BEHAVED)["versions"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    let activated = http.activate(WELL_BEHAVED, &digest(&v2)).await;
    assert_eq!(activated.status, StatusCode::OK, "{}", activated.json);
    assert_eq!(activated.json["digest"], digest(&v2));
    let list = http.list().await;
    assert_eq!(adapter(&list, WELL_BEHAVED)["active_digest"], digest(&v2));
    assert_eq!(adapter(&list, WELL_BEHAVED)["rollback_to"], digest(&v1));
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v2));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activation_requests_for_unknown_or_malformed_targets_are_4xx() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);
    let v1 = adapter_bytes(WELL_BEHAVED);
    assert_eq!(
        http.upload(WELL_BEHAVED, v1.clone(), true).await.status,
        StatusCode::OK
    );

    let unknown_digest = http.activate(WELL_BEHAVED, &"0".repeat(64)).await;
    assert_eq!(unknown_digest.status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&unknown_digest), "version_not_found");

    let unknown_adapter = http.activate("no-such-adapter", &digest(&v1)).await;
    assert_eq!(unknown_adapter.status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&unknown_adapter), "adapter_not_found");

    let bad_digest = http.activate(WELL_BEHAVED, "../../etc/passwd").await;
    assert_eq!(bad_digest.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&bad_digest), "invalid_digest");
    assert_eq!(bad_digest.json["error"]["param"], "digest");

    let bad_name = http.upload("Not_A_Name", v1.clone(), true).await;
    assert_eq!(bad_name.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&bad_name), "invalid_adapter_name");

    let bad_json = http
        .call(
            Method::POST,
            &format!("/admin/adapters/{WELL_BEHAVED}/activate"),
            None,
            Some(Body::Raw("application/json", "{\"digest\": ".into())),
        )
        .await;
    assert_eq!(bad_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&bad_json), "invalid_json");

    let missing_field = http
        .call(
            Method::POST,
            &format!("/admin/adapters/{WELL_BEHAVED}/activate"),
            None,
            Some(Body::Raw("application/json", "{}".into())),
        )
        .await;
    assert!(
        missing_field.status.is_client_error(),
        "{}",
        missing_field.json
    );
    error_code(&missing_field);

    let bad_query = http
        .call(
            Method::PUT,
            &format!("/admin/adapters/{WELL_BEHAVED}?activate=maybe"),
            None,
            Some(Body::Wasm(v1.clone())),
        )
        .await;
    assert_eq!(bad_query.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&bad_query), "invalid_query");

    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v1));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_returns_to_the_previously_active_version() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);
    let v1 = adapter_bytes(WELL_BEHAVED);
    let v2 = with_custom_section(&v1, "sluice-test-v2");
    assert_eq!(
        http.upload(WELL_BEHAVED, v1.clone(), true).await.status,
        StatusCode::OK
    );
    assert_eq!(
        http.upload(WELL_BEHAVED, v2.clone(), true).await.status,
        StatusCode::OK
    );
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v2));

    let rolled_back = http.rollback(WELL_BEHAVED).await;

    assert_eq!(rolled_back.status, StatusCode::OK, "{}", rolled_back.json);
    assert_eq!(rolled_back.json["digest"], digest(&v1));
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v1));
    let again = http.rollback(WELL_BEHAVED).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.json);
    assert_eq!(error_code(&again), "nothing_to_roll_back_to");
    assert_eq!(active_describe(&server, WELL_BEHAVED).await.1, digest(&v1));

    let unknown = http.rollback("no-such-adapter").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&unknown), "adapter_not_found");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_refuse_a_missing_or_wrong_token_with_401() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);
    let wasm = adapter_bytes(WELL_BEHAVED);
    let requests: Vec<(Method, String, Option<Body>)> = vec![
        (Method::GET, "/admin/adapters".into(), None),
        (Method::GET, format!("/admin/adapters/{WELL_BEHAVED}"), None),
        // A small body: the server refuses before reading the upload, and a
        // client still writing a large body may see the connection close
        // instead of the 401 (an HTTP race, not what this test is about).
        (
            Method::PUT,
            format!("/admin/adapters/{WELL_BEHAVED}"),
            Some(Body::Wasm(wasm[..64].to_vec())),
        ),
        (
            Method::POST,
            format!("/admin/adapters/{WELL_BEHAVED}/activate"),
            Some(Body::Json(serde_json::json!({ "digest": digest(&wasm) }))),
        ),
        (
            Method::POST,
            format!("/admin/adapters/{WELL_BEHAVED}/rollback"),
            None,
        ),
    ];
    for (method, path, body) in requests {
        for (token, code) in [
            ("", "admin_token_missing"),
            ("wrong-token-0123456789abcdef", "admin_token_invalid"),
            (&ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1], "admin_token_invalid"),
        ] {
            let body = match &body {
                None => None,
                Some(Body::Wasm(b)) => Some(Body::Wasm(b.clone())),
                Some(Body::Json(v)) => Some(Body::Json(v.clone())),
                Some(Body::Raw(t, s)) => Some(Body::Raw(t, s.clone())),
            };
            let reply = http.call(method.clone(), &path, Some(token), body).await;
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{method} {path}");
            assert_eq!(reply.json["error"]["type"], "authentication_error");
            assert_eq!(error_code(&reply), code, "{method} {path}");
            assert!(!reply.json.to_string().contains(ADMIN_TOKEN));
        }
    }
    // Nothing was loaded by the refused calls.
    assert_eq!(http.list().await["adapters"], serde_json::json!([]));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_token_the_admin_api_is_disabled() {
    let data = tempfile::tempdir().unwrap();
    let mut config = config(data.path(), None);
    config.admin_token = None;
    let server = start(&config).await;
    let http = Http::new(&server);

    let reply = http
        .call(
            Method::GET,
            "/admin/adapters",
            Some("anything-at-all-0123"),
            None,
        )
        .await;

    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&reply), "admin_api_disabled");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_over_the_size_limit_is_refused_with_413() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);
    let too_big = vec![0u8; sluice_server::app::MAX_ADAPTER_UPLOAD_BYTES + 1];

    let reply = http.upload(WELL_BEHAVED, too_big, true).await;

    assert_eq!(
        reply.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        reply.json
    );
    assert_eq!(error_code(&reply), "body_too_large");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_body_over_the_size_limit_is_refused_with_413_in_the_json_shape() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);
    let digest = "a".repeat(sluice_server::app::MAX_BODY_BYTES + 1);

    let reply = http
        .call(
            Method::POST,
            &format!("/admin/adapters/{WELL_BEHAVED}/activate"),
            None,
            Some(Body::Json(serde_json::json!({ "digest": digest }))),
        )
        .await;

    assert_eq!(
        reply.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        reply.json
    );
    assert_eq!(error_code(&reply), "body_too_large");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_answer_with_the_json_error_shape() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let http = Http::new(&server);

    let missing = http
        .call(Method::GET, "/no/such/route", Some(""), None)
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&missing), "route_not_found");

    let wrong_method = http.call(Method::DELETE, "/healthz", Some(""), None).await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_code(&wrong_method), "method_not_allowed");
    server.shutdown().await.unwrap();
}
