//! `/v1/agents`: submit, list, show, conversation, send, wait, cancel, close.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{AuthUser, JsonBody};
use super::views;
use crate::core::{Core, User};
use crate::creation::{self, NewAgentRequest};
use crate::db::agents::{self, AgentRow, ListFilter};
use crate::db::messages;
use crate::delivery::{self, Message};
use crate::events::EventKind;
use crate::handles::{describe_failure, resolve, Resolved};
use crate::lifecycle;
use crate::types::{AgentStatus, Origin};

pub fn routes() -> Router<Arc<Core>> {
    Router::new()
        .route("/v1/agents", post(submit).get(list))
        .route("/v1/agents/{r}", get(show))
        .route("/v1/agents/{r}/messages", get(conversation).post(send))
        .route("/v1/agents/{r}/wait", get(wait))
        .route("/v1/agents/{r}/cancel", post(cancel))
        .route("/v1/agents/{r}/close", post(close))
        .route("/v1/agents/{r}/tree", get(tree))
        .route("/v1/agents/{r}/todos", get(todos))
}

/// Resolves a `{ref}` for the caller, as an HTTP error when it does not
/// name exactly one of their agents.
pub async fn agent_for(core: &Core, user: &User, r: &str) -> Result<AgentRow, ApiError> {
    let res = resolve(core, &user.name, r).await?;
    match res {
        Resolved::Ok(a) => Ok(*a),
        Resolved::Invalid(_) => Err(ApiError::bad_request(describe_failure(r, &res))),
        Resolved::None(_) => Err(ApiError::not_found(describe_failure(r, &res))),
        Resolved::Ambiguous(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "ambiguous_handle",
            describe_failure(r, &res),
        )),
    }
}

/// The API view of an agent, with its handle.
pub async fn view(core: &Core, a: &AgentRow) -> Result<Value, ApiError> {
    let h = agents::handle(core.db.reader(), &a.user_name, &a.id).await?;
    Ok(views::agent(a, &h))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    task: String,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    system_prompt: Option<String>,
    #[serde(default)]
    briefing: Option<String>,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    deny_tools: Option<Vec<String>>,
    #[serde(default)]
    max_turns: Option<i64>,
    #[serde(default)]
    max_cost_usd: Option<f64>,
    #[serde(default)]
    timeout_s: Option<f64>,
    #[serde(default)]
    notify: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
}

async fn submit(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    headers: HeaderMap,
    JsonBody(body): JsonBody<SubmitBody>,
) -> Result<impl IntoResponse, ApiError> {
    let idempotency_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let k = v
                .to_str()
                .map_err(|_| ApiError::bad_request("Idempotency-Key must be visible ASCII"))?
                .trim();
            if k.is_empty() || k.len() > 255 {
                return Err(ApiError::bad_request(
                    "Idempotency-Key must be 1 to 255 characters",
                ));
            }
            Some(k.to_string())
        }
    };
    let mut req = NewAgentRequest::top_level(&user.name, &body.task);
    req.definition = body.agent;
    req.role = body.role;
    req.system_prompt = body.system_prompt;
    req.briefing = body.briefing;
    req.tools = body.tools;
    req.deny_tools = body.deny_tools.unwrap_or_default();
    req.max_turns = body.max_turns;
    req.max_cost_usd = body.max_cost_usd;
    req.timeout_s = body.timeout_s;
    req.notify = body.notify.filter(|n| !n.is_null());
    req.metadata = body.metadata.unwrap_or_else(|| json!({}));
    req.idempotency_key = idempotency_key;
    let created = creation::create(&core, req).await?;
    let status = if created.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view(&core, &created.agent).await?)))
}

fn param<'a>(q: &'a HashMap<String, String>, k: &str) -> Option<&'a str> {
    q.get(k).map(String::as_str).filter(|v| !v.is_empty())
}

async fn list(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Query(q): Query<HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    for k in q.keys() {
        if !["status", "parent", "level", "limit", "before"].contains(&k.as_str()) {
            return Err(ApiError::invalid(
                k,
                "unknown query parameter (known: status, parent, level, limit, before)",
            ));
        }
    }
    let status = match param(&q, "status") {
        None => None,
        Some(s) => Some(AgentStatus::parse(s).ok_or_else(|| {
            ApiError::invalid(
                "status",
                format!("unknown status `{s}` (queued, running, waiting, done, failed, cancelled, timed_out)"),
            )
        })?),
    };
    let parent_id = match param(&q, "parent") {
        None => None,
        Some(r) => Some(agent_for(&core, &user, r).await?.id),
    };
    let level = match param(&q, "level") {
        None => None,
        Some(l) => Some(
            l.parse::<i64>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| ApiError::invalid("level", "must be a positive integer"))?,
        ),
    };
    let limit = match param(&q, "limit") {
        None => 50,
        Some(l) => l
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=500).contains(n))
            .ok_or_else(|| ApiError::invalid("limit", "must be an integer from 1 to 500"))?,
    };
    let before = match param(&q, "before") {
        None => None,
        Some(r) => {
            let a = agent_for(&core, &user, r).await?;
            Some((a.created_at, a.id))
        }
    };
    let rows = agents::list(
        core.db.reader(),
        &ListFilter {
            user: user.name.clone(),
            status,
            parent_id,
            level,
            before,
            limit,
        },
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for a in &rows {
        out.push(view(&core, a).await?);
    }
    let next = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|a| a.id.clone()))
        .flatten();
    Ok(Json(json!({"agents": out, "next_before": next})))
}

async fn show(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(r): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let a = agent_for(&core, &user, &r).await?;
    Ok(Json(view(&core, &a).await?))
}

async fn conversation(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(r): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let a = agent_for(&core, &user, &r).await?;
    let after = match param(&q, "after") {
        None => 0,
        Some(v) => v
            .parse::<i64>()
            .map_err(|_| ApiError::invalid("after", "must be a message id"))?,
    };
    let limit = match param(&q, "limit") {
        None => 1000,
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=10_000).contains(n))
            .ok_or_else(|| ApiError::invalid("limit", "must be an integer from 1 to 10000"))?,
    };
    let rows = messages::page(core.db.reader(), &a.id, after, limit).await?;
    let out: Vec<Value> = rows.iter().map(views::message).collect();
    Ok(Json(json!({"agent_id": a.id, "messages": out})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    content: String,
    #[serde(default)]
    mode: Option<String>,
}

async fn send(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(r): Path<String>,
    JsonBody(body): JsonBody<SendBody>,
) -> Result<impl IntoResponse, ApiError> {
    if body.content.trim().is_empty() {
        return Err(ApiError::invalid("content", "must be a non-empty string"));
    }
    let interrupt = match body.mode.as_deref() {
        None | Some("queue") => false,
        Some("interrupt") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "mode",
                format!("unknown mode `{other}` (queue, interrupt)"),
            ))
        }
    };
    let a = agent_for(&core, &user, &r).await?;
    let d = delivery::deliver(
        &core,
        Message {
            target: a.id.clone(),
            content: body.content,
            origin: Origin::Human,
            sender: Some(user.name.clone()),
            interrupt,
        },
    )
    .await?;
    Ok(Json(
        json!({"delivery": d.delivery, "agent_id": a.id, "previous_status": d.target.status}),
    ))
}

/// Long-polls until the agent is settled or the timeout passes.
async fn wait(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(r): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let timeout = match param(&q, "timeout_s") {
        None => 30.0,
        Some(v) => v
            .parse::<f64>()
            .ok()
            .filter(|t| t.is_finite() && *t >= 0.0 && *t <= 3600.0)
            .ok_or_else(|| {
                ApiError::invalid("timeout_s", "must be a number of seconds from 0 to 3600")
            })?,
    };
    // Subscribe before reading, so a settle between the two is not missed.
    let mut rx = core.signals.subscribe();
    let mut a = agent_for(&core, &user, &r).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(timeout);
    while !a.status.is_settled() {
        let recheck = tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break,
            _ = core.stop.soft.cancelled() => break,
            ev = rx.recv() => match ev {
                Ok(e) => e.agent_id.as_deref() == Some(a.id.as_str()) && e.kind == EventKind::AgentFinished,
                // Lagged: we may have missed it; read again.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
        };
        if recheck {
            a = agents::get(core.db.reader(), &a.id)
                .await?
                .ok_or_else(|| ApiError::not_found("agent was deleted"))?;
        }
    }
    Ok(Json(view(&core, &a).await?))
}

async fn cancel(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(r): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let a = agent_for(&core, &user, &r).await?;
    let a = lifecycle::cancel(&core, &a.id, &format!("user {}", user.name)).await?;
    Ok(Json(view(&core, &a).await?))
}

async fn close(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(r): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let a = agent_for(&core, &user, &r).await?;
    let a = lifecycle::close(&core, &a.id).await?;
    Ok(Json(view(&core, &a).await?))
}

/// The agent and all its descendants, nested; each node also shows what its
/// subtree spent.
async fn tree(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(r): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let root = agent_for(&core, &user, &r).await?;
    let rows = agents::subtree(core.db.reader(), &root.id).await?;
    let mut views: std::collections::HashMap<String, Value> = std::collections::HashMap::new();
    // Deepest first, so children are complete before their parent takes them.
    let mut ordered = rows.clone();
    ordered.sort_by_key(|a| std::cmp::Reverse(a.level));
    for a in &ordered {
        let mut v = view(&core, a).await?;
        let mut children: Vec<Value> = rows
            .iter()
            .filter(|c| c.parent_id.as_deref() == Some(a.id.as_str()))
            .filter_map(|c| views.remove(&c.id))
            .collect();
        children.sort_by(|x, y| x["created_at"].as_str().cmp(&y["created_at"].as_str()));
        let below: f64 = children
            .iter()
            .map(|c| c["usage"]["subtree_cost_usd"].as_f64().unwrap_or(0.0))
            .sum();
        v["usage"]["subtree_cost_usd"] = json!(a.cost_usd + below);
        v["children"] = Value::Array(children);
        views.insert(a.id.clone(), v);
    }
    views
        .remove(&root.id)
        .map(Json)
        .ok_or_else(|| ApiError::not_found("agent vanished while building its tree"))
}

/// The agent's todo list with counts.
async fn todos(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(r): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let a = agent_for(&core, &user, &r).await?;
    let list = crate::db::todos::list(core.db.reader(), &a.id).await?;
    let mut v = crate::tools::todo::render(&list);
    v["agent_id"] = json!(a.id);
    Ok(Json(v))
}
