//! `/v1/schedules`: cron briefs and heartbeats (SPEC §10).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::agents::agent_for;
use super::error::ApiError;
use super::extract::{AuthUser, JsonBody};
use crate::clock::rfc3339;
use crate::core::{Core, User};
use crate::db::schedules::{self, FireRow, ScheduleRow};
use crate::db::{WriteCtx, WriteFuture};
use crate::scheduler::{self, CronSpec, Fired};

pub fn routes() -> Router<Arc<Core>> {
    Router::new()
        .route("/v1/schedules", post(create).get(list))
        .route("/v1/schedules/{id}", get(show).patch(patch).delete(remove))
        .route("/v1/schedules/{id}/run", post(run_now))
}

fn view(s: &ScheduleRow, fires: Option<&[FireRow]>) -> Value {
    let mut v = json!({
        "id": s.id,
        "name": s.name,
        "cron": s.cron,
        "timezone": s.timezone,
        "kind": s.kind,
        "agent": s.agent,
        "task": s.task,
        "target": s.target,
        "notify": s.notify.as_deref().and_then(|n| serde_json::from_str::<Value>(n).ok()),
        "enabled": s.enabled,
        "overlap": s.overlap,
        "last_fired_at": s.last_fired_at.map(rfc3339),
        "next_fire_at": s.next_fire_at.map(rfc3339),
        "last_agent_id": s.last_agent_id,
        "created_at": rfc3339(s.created_at),
        "updated_at": rfc3339(s.updated_at),
    });
    if let Some(fires) = fires {
        v["fires"] = Value::Array(
            fires
                .iter()
                .map(|f| {
                    json!({"fire_at": rfc3339(f.fire_at), "outcome": f.outcome, "agent_id": f.agent_id,
                           "detail": f.detail, "recorded_at": rfc3339(f.created_at)})
                })
                .collect(),
        );
    }
    v
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    #[serde(default)]
    name: Option<String>,
    cron: String,
    #[serde(default)]
    timezone: Option<String>,
    kind: String,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    task: Option<String>,
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    overlap: Option<String>,
    #[serde(default)]
    notify: Option<Value>,
}

fn check_overlap(o: Option<&str>) -> Result<String, ApiError> {
    match o.unwrap_or("skip") {
        v @ ("skip" | "queue") => Ok(v.to_string()),
        other => Err(ApiError::invalid(
            "overlap",
            format!("unknown value `{other}` (skip, queue)"),
        )),
    }
}

fn check_notify(n: &Option<Value>) -> Result<Option<String>, ApiError> {
    match n {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let url_ok = v
                .get("webhook_url")
                .map(|u| {
                    u.as_str()
                        .is_some_and(|u| u.starts_with("http://") || u.starts_with("https://"))
                })
                .unwrap_or(true);
            if !v.is_object() || !url_ok {
                return Err(ApiError::invalid(
                    "notify",
                    "must be {\"webhook_url\": \"http(s)://…\"}",
                ));
            }
            Ok(Some(v.to_string()))
        }
    }
}

async fn create(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    JsonBody(b): JsonBody<CreateBody>,
) -> Result<impl IntoResponse, ApiError> {
    let spec = CronSpec::parse(&b.cron, b.timezone.as_deref())
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    let overlap = check_overlap(b.overlap.as_deref())?;
    let notify = check_notify(&b.notify)?;
    let (agent, target) = match b.kind.as_str() {
        "brief" => {
            if b.task.as_deref().is_none_or(|t| t.trim().is_empty()) {
                return Err(ApiError::invalid("task", "a brief needs a non-empty task"));
            }
            if b.target.is_some() {
                return Err(ApiError::invalid("target", "only heartbeats have a target"));
            }
            let slug = b.agent.clone().unwrap_or_else(|| "default".into());
            if core.definitions.get(&slug).is_none() {
                return Err(ApiError::invalid(
                    "agent",
                    format!(
                        "unknown definition `{slug}` (available: {})",
                        core.definitions.slugs().join(", ")
                    ),
                ));
            }
            (Some(slug), None)
        }
        "heartbeat" => {
            let Some(t) = b.target.as_deref() else {
                return Err(ApiError::invalid(
                    "target",
                    "a heartbeat needs the target agent (id or handle)",
                ));
            };
            let a = agent_for(&core, &user, t)
                .await
                .map_err(|e| ApiError::invalid("target", e.message))?;
            if a.closed || a.status.is_final() {
                return Err(ApiError::invalid(
                    "target",
                    format!(
                        "agent `{}` is {} and accepts no messages",
                        a.id,
                        if a.closed {
                            "closed".to_string()
                        } else {
                            a.status.to_string()
                        }
                    ),
                ));
            }
            (None, Some(a.id))
        }
        other => {
            return Err(ApiError::invalid(
                "kind",
                format!("unknown kind `{other}` (brief, heartbeat)"),
            ))
        }
    };
    let now = core.now_ms();
    let id = uuid::Uuid::new_v4().to_string();
    let enabled = b.enabled.unwrap_or(true);
    let row = ScheduleRow {
        name: b
            .name
            .clone()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| format!("{} {}", b.kind, &id[..8])),
        id,
        user_name: user.name.clone(),
        cron: b.cron.trim().to_string(),
        timezone: b.timezone.clone().filter(|t| !t.trim().is_empty()),
        kind: b.kind.clone(),
        agent,
        task: b.task.clone().filter(|t| !t.trim().is_empty()),
        target,
        notify,
        enabled,
        overlap,
        last_fired_at: None,
        next_fire_at: if enabled { spec.next_after(now) } else { None },
        last_agent_id: None,
        created_at: now,
        updated_at: now,
    };
    let r = row.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move { schedules::insert(&mut ctx.conn, &r).await })
        })
        .await?;
    core.signals.schedules.notify_one();
    Ok((StatusCode::CREATED, Json(view(&row, None))))
}

async fn owned(core: &Core, user: &User, id: &str) -> Result<ScheduleRow, ApiError> {
    match schedules::get(core.db.reader(), id).await? {
        Some(s) if s.user_name == user.name => Ok(s),
        _ => Err(ApiError::not_found(format!("schedule `{id}` not found"))),
    }
}

async fn list(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
) -> Result<impl IntoResponse, ApiError> {
    let rows = schedules::list(core.db.reader(), &user.name).await?;
    Ok(Json(
        json!({"schedules": rows.iter().map(|s| view(s, None)).collect::<Vec<_>>()}),
    ))
}

async fn show(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let s = owned(&core, &user, &id).await?;
    let fires = schedules::fires(core.db.reader(), &s.id, 20).await?;
    Ok(Json(view(&s, Some(&fires))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    timezone: Option<String>,
    #[serde(default)]
    task: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    overlap: Option<String>,
    #[serde(default)]
    notify: Option<Value>,
}

async fn patch(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<PatchBody>,
) -> Result<impl IntoResponse, ApiError> {
    let mut s = owned(&core, &user, &id).await?;
    if let Some(n) = b.name {
        if n.trim().is_empty() {
            return Err(ApiError::invalid("name", "must not be empty"));
        }
        s.name = n;
    }
    if let Some(c) = b.cron {
        s.cron = c.trim().to_string();
    }
    if let Some(t) = b.timezone {
        s.timezone = Some(t).filter(|t| !t.trim().is_empty());
    }
    if let Some(t) = b.task {
        if s.kind == "brief" && t.trim().is_empty() {
            return Err(ApiError::invalid("task", "a brief needs a non-empty task"));
        }
        s.task = Some(t).filter(|t| !t.trim().is_empty());
    }
    if let Some(o) = b.overlap {
        s.overlap = check_overlap(Some(&o))?;
    }
    if b.notify.is_some() {
        s.notify = check_notify(&b.notify)?;
    }
    if let Some(e) = b.enabled {
        s.enabled = e;
    }
    let spec = CronSpec::parse(&s.cron, s.timezone.as_deref())
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    let now = core.now_ms();
    s.next_fire_at = if s.enabled {
        spec.next_after(now)
    } else {
        None
    };
    s.updated_at = now;
    let r = s.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move { schedules::update(&mut ctx.conn, &r).await })
        })
        .await?;
    core.signals.schedules.notify_one();
    Ok(Json(view(&s, None)))
}

async fn remove(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let s = owned(&core, &user, &id).await?;
    let sid = s.id.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, bool> {
            Box::pin(async move { schedules::delete(&mut ctx.conn, &sid).await })
        })
        .await?;
    core.signals.schedules.notify_one();
    Ok(Json(json!({"id": s.id, "deleted": true})))
}

/// Fires once now (ignoring `overlap`; the schedule's timing is unchanged).
async fn run_now(
    State(core): State<Arc<Core>>,
    AuthUser(user): AuthUser,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let s = owned(&core, &user, &id).await?;
    let core2 = Arc::clone(&core);
    let fired = core
        .db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, Fired> {
            Box::pin(async move {
                let fire_at = ctx.now;
                scheduler::fire_tx(ctx, &core2, &s, fire_at, true).await
            })
        })
        .await?;
    Ok(match fired {
        Fired::Fired { agent_id } => Json(json!({"outcome": "fired", "agent_id": agent_id})),
        Fired::Skipped(why) => Json(json!({"outcome": "skipped", "detail": why})),
        Fired::AlreadyFired => Json(json!({"outcome": "already_fired"})),
        Fired::Failed(why) => Json(json!({"outcome": "failed", "detail": why})),
    })
}
