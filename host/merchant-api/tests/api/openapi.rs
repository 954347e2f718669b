//! The OpenAPI document states what the merchant API enforces. (The
//! gateway's whole document and its committed copy are checked in
//! `sluice-server`'s `tests/server/openapi.rs`.)

use crate::common::*;
use serde_json::{json, Value};

#[tokio::test]
async fn the_served_openapi_document_describes_the_merchant_api() {
    let gw = Gateway::start(test_db(Backend::Sqlite).await).await;
    let served = gw
        .send(gw.http.get(gw.url("/openapi.json")))
        .await
        .expect(200);
    assert_eq!(
        served.headers.get("content-type").unwrap(),
        "application/json"
    );
    let doc: serde_json::Value = serde_json::from_str(&served.text()).expect("JSON");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/payments",
        "/v1/payments/{id}",
        "/v1/payments/{id}/timeline",
        "/v1/refunds/{id}",
        "/admin/merchants",
        "/openapi.json",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
}

/// The document as served.
async fn served(gw: &Gateway) -> Value {
    gw.send(gw.http.get(gw.url("/openapi.json")))
        .await
        .expect(200)
        .json()
}

/// Every (method, path, operation) of the document.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            out.push((method.clone(), path.clone(), op.clone()));
        }
    }
    out
}

fn parameter<'a>(op: &'a Value, name: &str) -> Option<&'a Value> {
    op["parameters"]
        .as_array()?
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
}

fn property<'a>(doc: &'a Value, schema: &str, field: &str) -> &'a Value {
    let value = &doc["components"]["schemas"][schema]["properties"][field];
    assert!(value.is_object(), "{schema}.{field} is documented");
    value
}

#[tokio::test]
async fn the_review_queue_takes_its_filters_from_the_query_string() {
    let gw = Gateway::start(test_db(Backend::Sqlite).await).await;
    let doc = served(&gw).await;
    let op = &doc["paths"]["/admin/review/payments"]["get"];
    for (name, minimum, maximum) in [("unknown_older_than_ms", 0, None), ("limit", 1, Some(100))] {
        let param = parameter(op, name).unwrap_or_else(|| panic!("{name} is declared"));
        assert_eq!(param["in"], "query", "{param}");
        assert_eq!(param["required"], false, "{param}");
        assert_eq!(param["schema"]["minimum"], minimum, "{param}");
        assert_eq!(
            param["schema"].get("maximum").cloned(),
            maximum.map(Value::from),
            "{param}"
        );
    }
    assert!(
        parameter(op, "Sluice-Operator-Key").is_none(),
        "the operator key is a credential, not a parameter"
    );
}

#[tokio::test]
async fn the_review_and_operator_payment_routes_need_the_operator_key_together_with_the_admin_token(
) {
    let gw = Gateway::start(test_db(Backend::Sqlite).await).await;
    let doc = served(&gw).await;
    let scheme = &doc["components"]["securitySchemes"]["operator_key"];
    assert_eq!(scheme["type"], "apiKey", "{scheme}");
    assert_eq!(scheme["in"], "header", "{scheme}");
    assert_eq!(scheme["name"], "Sluice-Operator-Key", "{scheme}");
    let review: Vec<_> = operations(&doc)
        .into_iter()
        .filter(|(_, path, _)| {
            path.starts_with("/admin/review/") || path.starts_with("/admin/payments")
        })
        .collect();
    assert_eq!(
        review.len(),
        10,
        "6 review routes, 4 payment routes of the console"
    );
    for (method, path, op) in review {
        assert_eq!(
            op["security"],
            json!([{"admin_token": [], "operator_key": []}]),
            "{method} {path}"
        );
    }
}

#[tokio::test]
async fn every_post_under_v1_declares_the_idempotency_key_format_the_server_enforces() {
    let gw = Gateway::start(test_db(Backend::Sqlite).await).await;
    let doc = served(&gw).await;
    let m = gw.merchant("Acme").await;
    let payment = gw
        .post(&m.key, "/v1/payments", &payment_body("order-idem", 100))
        .await
        .expect(201)
        .json();
    let id = payment["id"].as_str().unwrap();
    let posts: Vec<_> = operations(&doc)
        .into_iter()
        .filter(|(method, path, _)| method == "post" && path.starts_with("/v1/"))
        .collect();
    assert_eq!(posts.len(), 6);
    for (_, path, op) in posts {
        let key = parameter(&op, "Idempotency-Key").unwrap_or_else(|| panic!("{path}"));
        assert_eq!(key["in"], "header");
        assert_eq!(key["required"], false);
        assert_eq!(key["schema"]["minLength"], 1, "{path}");
        assert_eq!(key["schema"]["maxLength"], 255, "{path}");
        let pattern = regex::Regex::new(key["schema"]["pattern"].as_str().unwrap()).unwrap();
        let url = gw.url(&path.replace("{id}", id));
        for bad in ["", &"k".repeat(256)] {
            assert!(!pattern.is_match(bad) || bad.len() > 255, "{path}: {bad:?}");
            let reply = gw
                .send(
                    gw.http
                        .post(&url)
                        .header("authorization", format!("Bearer {}", m.key))
                        .header("content-type", "application/json")
                        .header("idempotency-key", bad)
                        .body("{}"),
                )
                .await;
            let error = reply.expect_error(400, "idempotency_key_invalid");
            assert_eq!(error["param"], "Idempotency-Key", "{path}");
        }
    }
    assert_eq!(gw.count("idempotency_keys").await, 0);
}

#[tokio::test]
async fn every_body_the_document_requires_is_refused_when_missing_and_no_other() {
    let gw = Gateway::start(test_db(Backend::Sqlite).await).await;
    let doc = served(&gw).await;
    let m = gw.merchant("Acme").await;
    let payment = gw
        .post(&m.key, "/v1/payments", &payment_body("order-empty", 100))
        .await
        .expect(201)
        .json();
    let payment_id = payment["id"].as_str().unwrap();
    let operator = gw
        .admin_post("/admin/operators", &json!({"name": "alice"}))
        .await
        .expect(201)
        .json();
    let operator_key = operator["key"].as_str().unwrap();
    let mut checked = 0;
    for (method, path, op) in operations(&doc) {
        let Some(body) = op.get("requestBody") else {
            continue;
        };
        if !body["content"]["application/json"].is_object() {
            continue; // the webhook route: the PSP's raw bytes
        }
        let url = gw.url(
            &path
                .replace("{id}", payment_id)
                .replace("{payment_id}", payment_id)
                .replace("{merchant_id}", &m.id)
                .replace("{proposal_id}", "rp_missing")
                .replace("{operator_id}", "op_missing"),
        );
        let request = match method.as_str() {
            "post" => gw.http.post(&url),
            "put" => gw.http.put(&url),
            other => panic!("{other} with a body"),
        };
        let credential = if path.starts_with("/v1/") {
            &m.key
        } else {
            ADMIN_TOKEN
        };
        let reply = gw
            .send(
                request
                    .header("authorization", format!("Bearer {credential}"))
                    .header("sluice-operator-key", operator_key)
                    .header("content-type", "application/json"),
            )
            .await;
        let missing = reply.status == 400 && reply.json()["error"]["code"] == "body_missing";
        let required = body["required"] == true;
        assert_eq!(
            missing,
            required,
            "{method} {path}: the document says required={required}, the server answered {} {}",
            reply.status,
            reply.text()
        );
        checked += 1;
    }
    assert!(checked >= 14, "{checked} operations with a JSON body");
}

#[tokio::test]
async fn every_bound_the_server_checks_is_stated_in_the_document() {
    let gw = Gateway::start(test_db(Backend::Sqlite).await).await;
    let doc = served(&gw).await;
    let amount = property(&doc, "CreatePaymentRequest", "amount");
    assert_eq!(amount["minimum"], 1);
    assert_eq!(amount["maximum"], 999_999_999_999_i64);
    for schema in ["CaptureRequestBody", "RefundRequestBody"] {
        let amount = property(&doc, schema, "amount");
        assert_eq!(amount["minimum"], 1, "{schema}");
        assert_eq!(amount["maximum"], 999_999_999_999_i64, "{schema}");
    }
    let currencies = property(&doc, "CreatePaymentRequest", "currency")["enum"].clone();
    assert!(
        currencies.as_array().unwrap().contains(&json!("EUR")),
        "{currencies}"
    );
    assert!(
        !currencies.as_array().unwrap().contains(&json!("XYZ")),
        "{currencies}"
    );
    let order_no = property(&doc, "CreatePaymentRequest", "merchant_order_no");
    assert_eq!(
        (order_no["minLength"].clone(), order_no["maxLength"].clone()),
        (json!(1), json!(64))
    );
    let metadata = property(&doc, "CreatePaymentRequest", "metadata");
    assert_eq!(metadata["maxProperties"], 50);
    assert_eq!(metadata["propertyNames"]["maxLength"], 40);
    assert_eq!(metadata["additionalProperties"]["maxLength"], 500);
    let fulfillment = &doc["components"]["schemas"]["FulfillmentParams"]["properties"];
    assert!(fulfillment["biz_key"].is_object());
    assert!(
        fulfillment.get("endpoint").is_none(),
        "a per-payment endpoint is refused, so it is no part of the contract"
    );
    let secret = property(&doc, "FulfillmentEndpointRequest", "secret");
    assert_eq!(
        (secret["minLength"].clone(), secret["maxLength"].clone()),
        (json!(16), json!(500))
    );
    let timeout = property(&doc, "FulfillmentEndpointRequest", "timeout_ms");
    assert_eq!(
        (timeout["minimum"].clone(), timeout["maximum"].clone()),
        (json!(1), json!(30_000))
    );
    assert_eq!(
        property(&doc, "CreateConnectorAccountRequest", "adapter")["pattern"],
        "^[a-z0-9-]+$"
    );
    let list = &doc["paths"]["/v1/payments"]["get"];
    let limit = parameter(list, "limit").unwrap();
    assert_eq!(
        (
            limit["schema"]["minimum"].clone(),
            limit["schema"]["maximum"].clone()
        ),
        (json!(1), json!(100))
    );
    let status = parameter(list, "status").unwrap();
    assert_eq!(
        status["schema"]["$ref"],
        "#/components/schemas/PaymentStatus"
    );
    let proposal = &doc["components"]["schemas"]["CreateProposalRequest"];
    assert_eq!(
        proposal["oneOf"].as_array().map(Vec::len),
        Some(6),
        "{proposal}"
    );
    // An operator's attempt success carries the PSP reference (issue 11 §3).
    let success = proposal["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["properties"]["outcome"]["enum"] == json!(["attempt_succeeded"]))
        .expect("an attempt_succeeded variant");
    assert!(
        success["required"]
            .as_array()
            .unwrap()
            .contains(&json!("psp_reference")),
        "{success}"
    );
}

#[tokio::test]
async fn every_operation_declares_the_errors_its_layers_answer_with() {
    let gw = Gateway::start(test_db(Backend::Sqlite).await).await;
    let doc = served(&gw).await;
    for (method, path, op) in operations(&doc) {
        let responses = &op["responses"];
        let json_body = op["requestBody"]["content"]["application/json"].is_object();
        for status in ["400", "413", "415"].iter().filter(|_| json_body) {
            assert!(responses[*status].is_object(), "{method} {path} {status}");
        }
        if op["security"].as_array().is_some_and(|s| !s.is_empty()) {
            assert!(responses["401"].is_object(), "{method} {path} 401");
        }
        if path.contains('{') {
            assert!(responses["404"].is_object(), "{method} {path} 404");
            for param in op["parameters"].as_array().unwrap() {
                if param["in"] == "path" {
                    assert!(
                        param["schema"]["pattern"].is_string(),
                        "{method} {path} {param}"
                    );
                }
            }
        }
    }
}
