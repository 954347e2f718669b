//! The committed OpenAPI document is the one the code serves.

use crate::common::*;

const REGENERATE: &str =
    "SLUICE_UPDATE_OPENAPI=1 cargo test -p sluice-merchant-api --test api openapi";

fn committed_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

#[tokio::test]
async fn the_committed_openapi_document_is_the_served_one() {
    let gw = Gateway::start(TestDb::sqlite().await).await;
    let served = gw
        .send(gw.http.get(gw.url("/openapi.json")))
        .await
        .expect(200);
    assert_eq!(
        served.headers.get("content-type").unwrap(),
        "application/json"
    );
    let served = served.text();
    let doc: serde_json::Value = serde_json::from_str(&served).expect("JSON");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/payments",
        "/v1/payments/{id}",
        "/v1/payments/{id}/timeline",
        "/v1/refunds/{id}",
        "/admin/merchants",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
    let path = committed_path();
    if std::env::var_os("SLUICE_UPDATE_OPENAPI").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
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
        "docs/openapi.json differs from the document the code serves; regenerate it with `{REGENERATE}` and commit it"
    );
}
