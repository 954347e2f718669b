//! The served OpenAPI document covers exactly the routes the gateway serves,
//! and the committed copy (`docs/openapi.json`) is the served one.

use reqwest::Method;
use serde_json::Value;

use crate::common::{config, start};

const REGENERATE: &str =
    "SLUICE_UPDATE_OPENAPI=1 cargo test -p sluice-server --test server openapi";

fn committed_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

async fn served(base: &str) -> String {
    let response = reqwest::get(format!("{base}/openapi.json"))
        .await
        .expect("GET /openapi.json");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "the document is JSON"
    );
    response.text().await.expect("body")
}

/// Every (method, path) of the document.
fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            out.push((method.clone(), path.clone()));
        }
    }
    out
}

/// `/a/{x}/b` → `/a/x/b`.
fn concrete(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => in_param = true,
            '}' => {
                in_param = false;
                out.push('x');
            }
            _ if in_param => {}
            _ => out.push(c),
        }
    }
    out
}

#[tokio::test]
async fn the_committed_openapi_document_is_the_served_one() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let served = served(&server.url()).await;
    let doc: Value = serde_json::from_str(&served).expect("JSON");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let path = committed_path();
    if std::env::var_os("SLUICE_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &served).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}); regenerate it with `{REGENERATE}`",
            path.display()
        )
    });
    assert!(
        committed == served,
        "docs/openapi.json differs from the document the gateway serves; regenerate it with `{REGENERATE}` and commit it"
    );
}

#[tokio::test]
async fn every_route_family_the_gateway_serves_is_in_the_document() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let doc: Value = serde_json::from_str(&served(&server.url()).await).expect("JSON");
    let ops = operations(&doc);
    for (method, path) in [
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
        ("get", "/admin/adapters"),
        ("get", "/admin/adapters/{name}"),
        ("put", "/admin/adapters/{name}"),
        ("post", "/admin/adapters/{name}/activate"),
        ("post", "/admin/adapters/{name}/rollback"),
        ("get", "/admin/merchants/{merchant_id}/webhook-endpoints"),
        ("post", "/admin/merchants/{merchant_id}/webhook-endpoints"),
        ("get", "/admin/deliveries/dead"),
        ("post", "/admin/deliveries/{delivery_id}/replay"),
        ("post", "/webhooks/{adapter}/{connector_account}"),
        ("post", "/v1/payments"),
        ("get", "/admin/merchants"),
    ] {
        assert!(
            ops.contains(&(method.to_owned(), path.to_owned())),
            "{method} {path} is documented"
        );
    }
}

/// Every operation of the document reaches a handler (or the layer in front
/// of it): no `route_not_found`, no 405.
#[tokio::test]
async fn every_documented_operation_is_routed() {
    let data = tempfile::tempdir().unwrap();
    let server = start(&config(data.path(), None)).await;
    let base = server.url();
    let doc: Value = serde_json::from_str(&served(&base).await).expect("JSON");
    let client = reqwest::Client::new();
    let ops = operations(&doc);
    assert!(ops.len() > 30, "{} operations", ops.len());
    for (method, path) in ops {
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let response = client
            .request(method.clone(), format!("{base}{}", concrete(&path)))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_ne!(status, 405, "{method} {path} is routed: {body}");
        assert_ne!(
            body["error"]["code"], "route_not_found",
            "{method} {path} is routed"
        );
    }
}

/// Every route of the gateway is registered through a `utoipa_axum` router
/// (`.routes(routes!(handler))`), which registers the handler's description
/// with it: a plain axum registration, the one way to serve a route the
/// document does not describe, fails this test.
#[test]
fn no_gateway_route_is_registered_outside_the_documented_routers() {
    let host = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut offenders = Vec::new();
    for krate in ["server", "merchant-api", "delivery"] {
        let mut dirs = vec![host.join(krate).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for (n, line) in text.lines().enumerate() {
                        let code = line.split("//").next().unwrap_or("");
                        for call in [
                            ".route(\"",
                            ".route_service(\"",
                            ".nest(\"",
                            ".nest_service(\"",
                        ] {
                            if code.contains(call) {
                                offenders.push(format!(
                                    "{}:{}: {}",
                                    path.display(),
                                    n + 1,
                                    line.trim()
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "routes registered without their OpenAPI description:\n{}",
        offenders.join("\n")
    );
}
