//! `/v1/approvals`: pending tool approvals and decisions.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{AuthUser, JsonBody};
use crate::approvals::{self, DecideError};
use crate::clock::rfc3339;
use crate::core::Core;
use crate::db::approvals::{self as rows, ApprovalRow};

pub fn routes() -> Router<Arc<Core>> {
    Router::new()
        .route("/v1/approvals", get(list))
        .route("/v1/approvals/{id}", post(decide))
}

fn view(a: &ApprovalRow) -> Value {
    json!({
        "id": a.id,
        "agent_id": a.agent_id,
        "user": a.user_name,
        "tool_call_id": a.tool_call_id,
        "tool": a.tool,
        "arguments": serde_json::from_str::<Value>(&a.arguments).unwrap_or(Value::String(a.arguments.clone())),
        "status": a.status,
        "reason": a.reason,
        "decided_by": a.decided_by,
        "created_at": rfc3339(a.created_at),
        "decided_at": a.decided_at.map(rfc3339),
    })
}

/// Pending approvals of the caller's agents (an admin sees everyone's).
async fn list(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
) -> Result<impl IntoResponse, ApiError> {
    let scope = (!user.admin).then_some(user.name.as_str());
    let pending = rows::pending(core.db.reader(), scope).await?;
    Ok(Json(
        json!({"approvals": pending.iter().map(view).collect::<Vec<_>>()}),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideBody {
    decision: String,
    #[serde(default)]
    reason: Option<String>,
}

async fn decide(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<DecideBody>,
) -> Result<impl IntoResponse, ApiError> {
    let approve = match body.decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => {
            return Err(ApiError::invalid(
                "decision",
                format!("unknown decision `{other}` (approve, deny)"),
            ))
        }
    };
    match approvals::decide(&core, &user, &id, approve, body.reason).await {
        Ok(a) => Ok(Json(view(&a))),
        Err(DecideError::NotFound(id)) => {
            Err(ApiError::not_found(format!("approval `{id}` not found")))
        }
        Err(e @ DecideError::Decided(..)) => Err(ApiError::conflict(e.to_string())),
        Err(DecideError::Db(e)) => Err(e.into()),
    }
}
