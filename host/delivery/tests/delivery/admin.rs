//! The admin routes, driven through axum as the server will mount them.

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use sluice_core::recovery::OutboxRetryPolicy;
use sluice_delivery::{
    admin_router, deliveries_for_payment, DeliveryAdmin, EndpointPolicy, PublisherConfig,
};
use tower::ServiceExt;

async fn call(
    router: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<serde_json::Value>,
) -> (StatusCode, serde_json::Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", "Bearer admin-token");
    let body = match body {
        Some(json) => {
            request = request.header("content-type", "application/json");
            Body::from(json.to_string())
        }
        None => Body::empty(),
    };
    let response = router
        .clone()
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// The admin-token check, as the server layers it on its admin routes.
async fn require_token(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
    {
        Some("Bearer admin-token") => next.run(request).await,
        _ => StatusCode::UNAUTHORIZED.into_response(),
    }
}

dual_test! {
    async fn admin_routes_create_and_list_endpoints_list_dead_letters_and_replay_them(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let router = admin_router(DeliveryAdmin::new(store.clone(), EndpointPolicy { allow_http: true }))
            .route_layer(axum::middleware::from_fn(require_token));
        let merchant = TestMerchant::start().await;
        merchant.respond_with(500);
        let path = format!("/admin/merchants/{}/webhook-endpoints", fx.merchant.id);

        let (status, created) = call(&router, "POST", &path, Some(serde_json::json!({
            "url": merchant.url, "event_types": ["payment.*"], "description": "orders service"
        }))).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        assert!(created["secret"].as_str().unwrap().starts_with("whsec_"));
        assert_eq!(created["event_types"], serde_json::json!(["payment.*"]));
        assert_eq!(created["enabled"], true);
        let (status, listed) = call(&router, "GET", &path, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(listed["data"].as_array().unwrap().len(), 1);
        assert_eq!(listed["data"][0]["id"], created["id"]);
        assert!(listed["data"][0].get("secret").is_none(), "the secret is shown only at creation");

        let (status, refused) = call(&router, "POST", &path, Some(serde_json::json!({"url": "not a url"}))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(refused["error"]["code"], "invalid_endpoint");
        let (status, refused) = call(&router, "POST", &path, Some(serde_json::json!({"nope": 1}))).await;
        assert_eq!((status, refused["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_body")));
        let (status, missing) = call(&router, "GET", "/admin/merchants/mer_missing/webhook-endpoints", None).await;
        assert_eq!((status, missing["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("merchant_not_found")));
        let (status, _) = call(&router, "POST", "/admin/merchants/mer_missing/webhook-endpoints",
            Some(serde_json::json!({"url": merchant.url}))).await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // One try only, so the failing endpoint dead-letters at once.
        let payment = fx.succeeded(store, "AD-1", 100).await;
        let one_try = PublisherConfig {
            retry_policy: OutboxRetryPolicy { first_delay_ms: 1, max_delay_ms: 1, max_deliveries: 1 },
            ..test_config()
        };
        publisher(store, one_try.clone()).publish_once().await.unwrap();
        let (status, dead) = call(&router, "GET", "/admin/deliveries/dead?limit=10", None).await;
        assert_eq!(status, StatusCode::OK);
        let dead = dead["data"].as_array().unwrap().clone();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0]["payment_id"], payment.id.as_str());
        assert_eq!(dead[0]["sink"], "webhook");
        assert_eq!(dead[0]["last_response_status"], 500);
        let id = dead[0]["id"].as_str().unwrap();

        merchant.respond_with(204);
        let (status, replayed) = call(&router, "POST", &format!("/admin/deliveries/{id}/replay"), None).await;
        assert_eq!(status, StatusCode::OK, "{replayed}");
        assert_eq!((replayed["status"].as_str(), replayed["replays"].as_i64()), (Some("pending"), Some(1)));
        let (status, conflict) = call(&router, "POST", &format!("/admin/deliveries/{id}/replay"), None).await;
        assert_eq!((status, conflict["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("delivery_not_dead")));
        let (status, _) = call(&router, "POST", "/admin/deliveries/dlv_missing/replay", None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        publisher(store, one_try).publish_once().await.unwrap();
        let rows = deliveries_for_payment(store, &payment.id).await.unwrap();
        assert_eq!((rows[0].status.as_str(), rows[0].last_response_status), ("sent", Some(204)));
        assert_eq!(merchant.received().len(), 2);

        // Behind the admin layer: no token, no access.
        let anonymous = Request::builder().uri("/admin/deliveries/dead").body(Body::empty()).unwrap();
        let response = router.clone().oneshot(anonymous).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
}

dual_test! {
    async fn out_of_range_limits_non_json_bodies_and_bad_descriptions_are_refused_with_the_json_error_shape(&db) {
        let store = &db.store;
        let fx = Fixture::new(store, "Acme").await;
        let router = admin_router(DeliveryAdmin::new(store.clone(), EndpointPolicy { allow_http: true }));
        for limit in ["0", "-5", "1001"] {
            let (status, refused) = call(&router, "GET", &format!("/admin/deliveries/dead?limit={limit}"), None).await;
            assert_eq!(
                (status, refused["error"]["code"].as_str()),
                (StatusCode::BAD_REQUEST, Some("invalid_query")),
                "limit={limit} is refused, not clamped"
            );
        }
        let (status, _) = call(&router, "GET", "/admin/deliveries/dead?limit=1000", None).await;
        assert_eq!(status, StatusCode::OK);

        let path = format!("/admin/merchants/{}/webhook-endpoints", fx.merchant.id);
        let request = Request::builder()
            .method("POST")
            .uri(&path)
            .header("content-type", "text/plain")
            .body(Body::from(r#"{"url": "https://merchant.example/"}"#))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["error"]["code"], "unsupported_media_type");

        for bad in [
            serde_json::json!({"url": "https://merchant.example/", "description": "a\u{0}b"}),
            serde_json::json!({"url": "https://merchant.example/", "description": "x".repeat(1025)}),
            serde_json::json!({"url": "https://user@merchant.example/"}),
            serde_json::json!({"url": "https://merchant.example:99999/"}),
        ] {
            let (status, refused) = call(&router, "POST", &path, Some(bad.clone())).await;
            assert_eq!(
                (status, refused["error"]["code"].as_str()),
                (StatusCode::BAD_REQUEST, Some("invalid_endpoint")),
                "{bad}"
            );
        }

        let (status, refused) = call(&router, "POST", "/admin/deliveries/%FF/replay", None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(refused["error"]["code"], "invalid_path", "a path that does not decode is the JSON shape");
    }
}
