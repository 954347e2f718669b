//! Admin HTTP routes for webhook endpoints and dead letters. The server
//! mounts them behind its admin-token layer; errors use the server's JSON
//! shape `{"error": {"type", "code", "message", "param"}}`.

use crate::deliveries::{self, Delivery};
use crate::endpoints::{
    self, CreatedEndpoint, EndpointPolicy, NewWebhookEndpoint, WebhookEndpoint,
};
use crate::DeliveryError;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sluice_store::{Store, StoreError};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Most dead letters one `GET /admin/deliveries/dead` returns.
pub const MAX_DEAD_LIMIT: i64 = 1000;

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
    let (router, _) = admin_routes().split_for_parts();
    router.with_state(state)
}

/// The OpenAPI description of [`admin_router`]'s routes (the server merges
/// it into the one document it serves; the shared rules, such as the error
/// body of every 4xx, are added there).
pub fn admin_openapi() -> utoipa::openapi::OpenApi {
    let (_, doc) = admin_routes().split_for_parts();
    doc
}

fn admin_routes() -> OpenApiRouter<DeliveryAdmin> {
    OpenApiRouter::new()
        .routes(routes!(create_endpoint, list_endpoints))
        .routes(routes!(list_dead))
        .routes(routes!(replay))
}

/// A list response.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListBody<T> {
    pub data: Vec<T>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct DeadQuery {
    /// How many dead letters, oldest first: 1 to 1000, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

fn path_param(rejection: PathRejection) -> AdminError {
    AdminError::bad_request("invalid_path", rejection.body_text())
}

fn body_error(rejection: JsonRejection) -> AdminError {
    let mut error = AdminError::bad_request("invalid_body", rejection.body_text());
    if matches!(rejection, JsonRejection::MissingJsonContentType(_)) {
        error.status = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        error.code = "unsupported_media_type".into();
    } else if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        error.status = StatusCode::PAYLOAD_TOO_LARGE;
        error.code = "body_too_large".into();
    }
    error
}

/// `POST /admin/merchants/{merchant_id}/webhook-endpoints`.
#[utoipa::path(
    post, path = "/admin/merchants/{merchant_id}/webhook-endpoints", tag = "delivery",
    params(("merchant_id" = String, Path)),
    request_body = NewWebhookEndpoint,
    responses(
        (status = 201, description = "The endpoint, with its signing secret (shown only now)", body = CreatedEndpoint),
        (status = 400, description = "Invalid input; nothing was written"),
        (status = 404, description = "No such merchant"),
    ),
    security(("admin_token" = []))
)]
async fn create_endpoint(
    State(admin): State<DeliveryAdmin>,
    merchant_id: Result<Path<String>, PathRejection>,
    body: Result<Json<NewWebhookEndpoint>, JsonRejection>,
) -> Result<(StatusCode, Json<CreatedEndpoint>), AdminError> {
    let Path(merchant_id) = merchant_id.map_err(path_param)?;
    let Json(new) = body.map_err(body_error)?;
    let created =
        endpoints::create_endpoint(&admin.store, &merchant_id, &new, admin.endpoint_policy).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// `GET /admin/merchants/{merchant_id}/webhook-endpoints`.
#[utoipa::path(
    get, path = "/admin/merchants/{merchant_id}/webhook-endpoints", tag = "delivery",
    params(("merchant_id" = String, Path)),
    responses(
        (status = 200, description = "The merchant's endpoints, without their secrets", body = ListBody<WebhookEndpoint>),
        (status = 404, description = "No such merchant"),
    ),
    security(("admin_token" = []))
)]
async fn list_endpoints(
    State(admin): State<DeliveryAdmin>,
    merchant_id: Result<Path<String>, PathRejection>,
) -> Result<Json<ListBody<WebhookEndpoint>>, AdminError> {
    let Path(merchant_id) = merchant_id.map_err(path_param)?;
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

/// `GET /admin/deliveries/dead?limit=N`.
#[utoipa::path(
    get, path = "/admin/deliveries/dead", tag = "delivery",
    params(DeadQuery),
    responses(
        (status = 200, description = "Dead-lettered deliveries, oldest first", body = ListBody<Delivery>),
        (status = 400, description = "Invalid query parameters"),
    ),
    security(("admin_token" = []))
)]
async fn list_dead(
    State(admin): State<DeliveryAdmin>,
    query: Result<Query<DeadQuery>, QueryRejection>,
) -> Result<Json<ListBody<Delivery>>, AdminError> {
    let Query(query) =
        query.map_err(|e| AdminError::bad_request("invalid_query", e.body_text()))?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=MAX_DEAD_LIMIT).contains(&limit) {
        return Err(AdminError::bad_request(
            "invalid_query",
            format!("limit must be 1 to {MAX_DEAD_LIMIT}"),
        ));
    }
    let data = deliveries::list_dead(&admin.store, limit).await?;
    Ok(Json(ListBody { data }))
}

/// `POST /admin/deliveries/{delivery_id}/replay`.
#[utoipa::path(
    post, path = "/admin/deliveries/{delivery_id}/replay", tag = "delivery",
    params(("delivery_id" = String, Path)),
    responses(
        (status = 200, description = "The delivery, pending again", body = Delivery),
        (status = 404, description = "No such delivery"),
        (status = 409, description = "The delivery is not dead-lettered"),
    ),
    security(("admin_token" = []))
)]
async fn replay(
    State(admin): State<DeliveryAdmin>,
    delivery_id: Result<Path<String>, PathRejection>,
) -> Result<Json<Delivery>, AdminError> {
    let Path(delivery_id) = delivery_id.map_err(path_param)?;
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
