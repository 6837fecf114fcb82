//! The HTTP API (axum, JSON, `/v1`). Each resource module owns its routes;
//! this module assembles them with the shared state.

pub mod agents;
pub mod approvals;
pub mod error;
pub mod extract;
pub mod health;
pub mod schedules;
pub mod views;

use std::sync::Arc;

use axum::Router;

use crate::core::Core;

/// The whole API.
pub fn router(core: Arc<Core>) -> Router {
    Router::new()
        .merge(agents::routes())
        .merge(approvals::routes())
        .merge(health::routes())
        .merge(schedules::routes())
        .fallback(|| async { error::ApiError::not_found("no such route") })
        .with_state(core)
}
