//! Liveness and readiness.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::core::Core;

pub fn routes() -> Router<Arc<Core>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

async fn healthz() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// Ready when the database answers and every migration is applied.
async fn readyz(State(core): State<Arc<Core>>) -> impl IntoResponse {
    match core.db.ready().await {
        Ok(()) => (StatusCode::OK, Json(json!({"status": "ready"}))),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not_ready", "reason": e.to_string()})),
        ),
    }
}
