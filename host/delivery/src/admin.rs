//! Admin HTTP routes for webhook endpoints and dead letters. The server
//! mounts them behind its admin-token layer; errors use the server's JSON
//! shape `{"error": {"type", "code", "message", "param"}}`.

use crate::deliveries::{self, Delivery};
use crate::endpoints::{
    self, CreatedEndpoint, EndpointPolicy, NewWebhookEndpoint, WebhookEndpoint,
};
use crate::DeliveryError;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sluice_store::{Store, StoreError};

/// What the admin routes need.
#[derive(Debug, Clone)]
pub struct DeliveryAdmin {
    pub store: Store,
    pub endpoint_policy: EndpointPolicy,
}

impl DeliveryAdmin {
    pub fn new(store: Store, endpoint_policy: EndpointPolicy) -> DeliveryAdmin {
        DeliveryAdmin {
            store,
            endpoint_policy,
        }
    }
}

/// `POST/GET /admin/merchants/{merchant_id}/webhook-endpoints`,
/// `GET /admin/deliveries/dead?limit=N`, `POST /admin/deliveries/{id}/replay`.
/// Paths are absolute: merge the router (with the admin-token layer on it)
/// into the server's top-level router.
pub fn admin_router(state: DeliveryAdmin) -> Router {
    Router::new()
        .route(
            "/admin/merchants/{merchant_id}/webhook-endpoints",
            post(create_endpoint).get(list_endpoints),
        )
        .route("/admin/deliveries/dead", get(list_dead))
        .route("/admin/deliveries/{delivery_id}/replay", post(replay))
        .with_state(state)
}

/// A list response.
#[derive(Debug, Serialize, Deserialize)]
pub struct ListBody<T> {
    pub data: Vec<T>,
}

#[derive(Debug, Deserialize)]
struct DeadQuery {
    limit: Option<i64>,
}

async fn create_endpoint(
    State(admin): State<DeliveryAdmin>,
    Path(merchant_id): Path<String>,
    body: Result<Json<NewWebhookEndpoint>, JsonRejection>,
) -> Result<(StatusCode, Json<CreatedEndpoint>), AdminError> {
    let Json(new) = body.map_err(|e| AdminError::bad_request("invalid_body", e.body_text()))?;
    let created =
        endpoints::create_endpoint(&admin.store, &merchant_id, &new, admin.endpoint_policy).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

async fn list_endpoints(
    State(admin): State<DeliveryAdmin>,
    Path(merchant_id): Path<String>,
) -> Result<Json<ListBody<WebhookEndpoint>>, AdminError> {
    match admin.store.get_merchant(&merchant_id).await {
        Ok(_) => {}
        Err(StoreError::NotFound { .. }) => {
            return Err(DeliveryError::not_found("merchant", merchant_id).into())
        }
        Err(e) => return Err(DeliveryError::from(e).into()),
    }
    let data = endpoints::list_endpoints(&admin.store, &merchant_id).await?;
    Ok(Json(ListBody { data }))
}

async fn list_dead(
    State(admin): State<DeliveryAdmin>,
    query: Result<Query<DeadQuery>, QueryRejection>,
) -> Result<Json<ListBody<Delivery>>, AdminError> {
    let Query(query) =
        query.map_err(|e| AdminError::bad_request("invalid_query", e.body_text()))?;
    let data = deliveries::list_dead(&admin.store, query.limit.unwrap_or(100)).await?;
    Ok(Json(ListBody { data }))
}

async fn replay(
    State(admin): State<DeliveryAdmin>,
    Path(delivery_id): Path<String>,
) -> Result<Json<Delivery>, AdminError> {
    Ok(Json(
        deliveries::replay_dead_letter(&admin.store, &delivery_id).await?,
    ))
}

/// An admin error in the server's JSON shape.
#[derive(Debug)]
struct AdminError {
    status: StatusCode,
    kind: &'static str,
    code: String,
    message: String,
}

impl AdminError {
    fn bad_request(code: &str, message: String) -> AdminError {
        AdminError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: code.to_owned(),
            message,
        }
    }
}

impl From<DeliveryError> for AdminError {
    fn from(err: DeliveryError) -> AdminError {
        let invalid = |status, code: String, message: String| AdminError {
            status,
            kind: "invalid_request_error",
            code,
            message,
        };
        match err {
            DeliveryError::NotFound { entity, .. } => invalid(
                StatusCode::NOT_FOUND,
                format!("{}_not_found", entity.replace(' ', "_")),
                err.to_string(),
            ),
            DeliveryError::InvalidState { .. } => invalid(
                StatusCode::CONFLICT,
                "delivery_not_dead".into(),
                err.to_string(),
            ),
            DeliveryError::InvalidRequest(message) => {
                invalid(StatusCode::BAD_REQUEST, "invalid_endpoint".into(), message)
            }
            other => {
                tracing::error!(error = %other, "admin delivery request failed");
                AdminError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    kind: "api_error",
                    code: "internal_error".into(),
                    message: "internal error; see the gateway logs".into(),
                }
            }
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": {
                "type": self.kind,
                "code": self.code,
                "message": self.message,
                "param": null,
            }
        });
        (self.status, Json(body)).into_response()
    }
}
