//! Sub-agent tools (SPEC §4): `spawn_agent`, `wait_for_agent`,
//! `agent_status`, `agent_list`, `agent_cancel`, `close_agent`.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{Tool, ToolCtx, ToolOutput};
use crate::clock::rfc3339;
use crate::creation::{self, CreateError, NewAgentRequest, SpawnLink};
use crate::db::agents::{self, AgentRow, ListFilter};
use crate::db::waits::{self, NewWait};
use crate::db::{WriteCtx, WriteFuture};
use crate::handles::{describe_failure, resolve, Resolved};
use crate::lifecycle;
use crate::model::types::ToolSpec;
use crate::types::{AgentStatus, Origin};

/// Longest `wait_for_agent` timeout (one hour).
const MAX_WAIT_S: f64 = 3600.0;

/// Resolves a tool's `agent` argument among the caller's user's agents.
pub async fn resolve_agent(ctx: &ToolCtx<'_>, r: &str) -> Result<AgentRow, String> {
    match resolve(ctx.core, &ctx.agent.user_name, r).await {
        Ok(Resolved::Ok(a)) => Ok(*a),
        Ok(other) => Err(describe_failure(r, &other)),
        Err(e) => Err(format!("cannot look up `{r}`: {e}")),
    }
}

/// The parameters of a tool whose one argument is an agent.
pub fn agent_params() -> Value {
    json!({
        "type": "object",
        "properties": {"agent": {"type": "string", "description": "id or handle"}},
        "required": ["agent"],
        "additionalProperties": false
    })
}

/// Parses a one-agent tool's arguments and resolves the agent; the error
/// is the tool's answer. Also returns the reference as the model gave it.
pub async fn agent_arg(
    ctx: &ToolCtx<'_>,
    tool: &str,
    args: Value,
) -> Result<(String, AgentRow), ToolOutput> {
    let a: AgentArg = parse(tool, args)?;
    let row = resolve_agent(ctx, &a.agent)
        .await
        .map_err(ToolOutput::Err)?;
    Ok((a.agent, row))
}

fn parse<T: for<'de> Deserialize<'de>>(tool: &str, args: Value) -> Result<T, ToolOutput> {
    serde_json::from_value(args)
        .map_err(|e| ToolOutput::Err(format!("invalid arguments for `{tool}`: {e}")))
}

/// An agent's handle (its id's first 8 characters if the lookup fails).
pub async fn handle_of(ctx: &ToolCtx<'_>, a: &AgentRow) -> String {
    agents::handle(ctx.core.db.reader(), &a.user_name, &a.id)
        .await
        .unwrap_or_else(|_| a.id[..8].to_string())
}

fn create_error(e: CreateError) -> ToolOutput {
    match e {
        CreateError::Limit(m) => ToolOutput::Err(m),
        CreateError::Invalid { field, message } => {
            ToolOutput::Err(format!("invalid `{field}`: {message}"))
        }
        CreateError::Db(e) => ToolOutput::Err(format!("spawn failed on a storage error: {e}")),
    }
}

/// `spawn_agent`: a child in the foreground (the caller suspends until it
/// finishes), in the background (an id comes back at once), or an
/// independent level-1 agent (`top_level`).
pub struct SpawnAgent;

#[derive(Deserialize)]
struct SpawnArgs {
    task: String,
    #[serde(default)]
    briefing: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    system_prompt: Option<String>,
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
    background: bool,
    #[serde(default)]
    notify: Option<Value>,
    #[serde(default)]
    top_level: bool,
}

#[async_trait::async_trait]
impl Tool for SpawnAgent {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "spawn_agent".into(),
            description: "Start a sub-agent on a task. Foreground (default): you wait until it finishes and \
                          get its result. background=true: you get its id at once and a message when it \
                          completes. Its tools are a subset of yours."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "task": {"type": "string", "minLength": 1, "description": "what to do; the child's first message"},
                    "briefing": {"type": "string", "description": "context, paths, constraints for the child"},
                    "agent": {"type": "string", "description": "definition slug (default: yours)"},
                    "system_prompt": {"type": "string", "description": "role specialisation for the child"},
                    "tools": {"type": "array", "items": {"type": "string"}, "description": "allow list"},
                    "deny_tools": {"type": "array", "items": {"type": "string"}, "description": "deny list"},
                    "max_turns": {"type": "integer", "minimum": 1},
                    "max_cost_usd": {"type": "number", "minimum": 0},
                    "timeout_s": {"type": "number", "minimum": 0},
                    "background": {"type": "boolean"},
                    "notify": {"type": "object", "properties": {"webhook_url": {"type": "string"}}},
                    "top_level": {"type": "boolean", "description": "an independent level-1 agent (needs permission; not waitable)"}
                },
                "required": ["task"],
                "additionalProperties": false
            }),
        }
    }

    fn spawns(&self) -> bool {
        true
    }

    /// Spawns of one answer are created in call order (the children then
    /// run in parallel), so limits refuse the later calls, predictably.
    fn parallel(&self) -> bool {
        false
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        let a: SpawnArgs = match parse("spawn_agent", args) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let core = ctx.core;
        let mut req = NewAgentRequest::top_level(&ctx.agent.user_name, &a.task);
        req.definition = Some(a.agent.unwrap_or_else(|| ctx.agent.definition.clone()));
        req.system_prompt = a.system_prompt;
        req.briefing = a.briefing;
        req.tools = a.tools;
        req.deny_tools = a.deny_tools.unwrap_or_default();
        req.max_turns = a.max_turns;
        req.max_cost_usd = a.max_cost_usd.filter(|c| *c > 0.0);
        req.timeout_s = a.timeout_s.filter(|t| *t > 0.0);
        req.notify = a.notify;
        req.origin = Origin::Agent;
        req.sender = Some(ctx.agent.id.clone());
        if a.top_level {
            let allowed = core
                .definitions
                .get(&ctx.agent.definition)
                .is_some_and(|d| d.permissions.top_level);
            if !allowed {
                return ToolOutput::Err(
                    "top_level needs the `top_level` permission, which your definition does not grant; \
                     spawn a sub-agent instead"
                        .into(),
                );
            }
            // Re-running this call finds the agent it created.
            req.idempotency_key = Some(format!("spawn:{}:{}", ctx.agent.id, ctx.call_id));
            return match creation::create(core, req).await {
                Ok(c) => {
                    let h = handle_of(ctx, &c.agent).await;
                    ToolOutput::Ok(format!(
                        "Top-level agent started. ID: {} (handle {h}). It runs on its own and cannot be waited on.",
                        c.agent.id
                    ))
                }
                Err(e) => create_error(e),
            };
        }
        req.parent = Some(SpawnLink {
            parent_id: ctx.agent.id.clone(),
            call_id: ctx.call_id.to_string(),
            background: a.background,
            parent_run_token: ctx.agent.run_token,
        });
        match creation::create(core, req).await {
            Ok(c) if a.background => {
                let h = handle_of(ctx, &c.agent).await;
                let mut text = format!(
                    "Sub-agent spawned in background. ID: {} (handle {h}). You will be notified when it completes.",
                    c.agent.id
                );
                let dropped = c.agent.dropped();
                if !dropped.is_empty() {
                    text.push_str(&format!(
                        "\nNote: requested tools not granted (you lack them): {}",
                        dropped.join(", ")
                    ));
                }
                ToolOutput::Ok(text)
            }
            // The child's settling writes this call's result.
            Ok(_) => ToolOutput::Pending,
            Err(e) => create_error(e),
        }
    }
}

/// `wait_for_agent`: suspends until own descendants finish (all or any) or
/// the timeout passes.
pub struct WaitForAgent;

#[derive(Deserialize)]
#[serde(untagged)]
enum Ids {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct WaitArgs {
    ids: Ids,
    #[serde(default)]
    timeout_s: Option<f64>,
    #[serde(default)]
    mode: Option<String>,
}

#[async_trait::async_trait]
impl Tool for WaitForAgent {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "wait_for_agent".into(),
            description: "Wait until your sub-agents finish (mode all, default) or the first of them \
                          finishes (mode any), up to timeout_s. Returns each one's result or current status."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "ids": {"type": ["array", "string"], "items": {"type": "string"},
                            "description": "ids or handles of your sub-agents"},
                    "timeout_s": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
                    "mode": {"type": "string", "enum": ["all", "any"]}
                },
                "required": ["ids"],
                "additionalProperties": false
            }),
        }
    }

    fn spawns(&self) -> bool {
        true
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        let a: WaitArgs = match parse("wait_for_agent", args) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let refs = match a.ids {
            Ids::One(s) => vec![s],
            Ids::Many(v) => v,
        };
        if refs.is_empty() {
            return ToolOutput::Err("`ids` is empty: name at least one sub-agent".into());
        }
        let any = a.mode.as_deref() == Some("any");
        let timeout_s = a.timeout_s.unwrap_or(300.0).clamp(0.0, MAX_WAIT_S);
        let mut ids = Vec::with_capacity(refs.len());
        for r in &refs {
            let target = match resolve_agent(ctx, r).await {
                Ok(t) => t,
                Err(e) => return ToolOutput::Err(e),
            };
            if !ctx.agent.is_ancestor_of(&target) {
                return ToolOutput::Err(format!(
                    "`{r}` is not one of your sub-agents; wait_for_agent only waits on agents you (or your \
                     sub-agents) spawned"
                ));
            }
            if !ids.contains(&target.id) {
                ids.push(target.id);
            }
        }
        let waiter = ctx.agent.id.clone();
        let call_id = ctx.call_id.to_string();
        // Checking and recording happen in one write, so a child settling in
        // between cannot be missed.
        let outcome = ctx
            .core
            .db
            .write(
                move |wctx: &mut WriteCtx| -> WriteFuture<'_, Option<String>> {
                    Box::pin(async move {
                        let mut rows = Vec::with_capacity(ids.len());
                        for id in &ids {
                            rows.push(agents::must_get_tx(&mut wctx.conn, id).await?);
                        }
                        let settled = rows.iter().filter(|r| r.status.is_settled()).count();
                        let satisfied = if any {
                            settled > 0
                        } else {
                            settled == rows.len()
                        };
                        if satisfied {
                            let mut parts = Vec::with_capacity(rows.len());
                            for r in &rows {
                                let h = lifecycle::handle_tx(wctx, r).await?;
                                parts.push(if r.status.is_settled() {
                                    lifecycle::result_message(r, Some(&h))
                                } else {
                                    format!("[Sub-agent {h} is {}]", r.status)
                                });
                            }
                            return Ok(Some(parts.join("\n\n")));
                        }
                        let deadline_at = wctx.now + (timeout_s * 1000.0) as i64;
                        waits::insert(
                            &mut wctx.conn,
                            wctx.now,
                            &NewWait {
                                agent_id: &waiter,
                                call_id: &call_id,
                                children: &ids,
                                any,
                                timeout_s,
                                deadline_at,
                            },
                        )
                        .await?;
                        Ok(None)
                    })
                },
            )
            .await;
        match outcome {
            Ok(Some(text)) => ToolOutput::Ok(text),
            Ok(None) => ToolOutput::Pending,
            Err(e) => ToolOutput::Err(format!("wait_for_agent failed on a storage error: {e}")),
        }
    }
}

/// `agent_status`: where one agent stands.
pub struct AgentStatusTool;

#[derive(Deserialize)]
struct AgentArg {
    agent: String,
}

fn preview(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().count() > n {
        out.push('…');
    }
    out
}

#[async_trait::async_trait]
impl Tool for AgentStatusTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "agent_status".into(),
            description: "Status, level, role, elapsed time, task and result preview of one agent (id or handle).".into(),
            parameters: agent_params(),
        }
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        let (_, t) = match agent_arg(ctx, "agent_status", args).await {
            Ok(x) => x,
            Err(e) => return e,
        };
        let h = handle_of(ctx, &t).await;
        let end = t.finished_at.unwrap_or_else(|| ctx.core.now_ms());
        let elapsed = (end - t.created_at) as f64 / 1000.0;
        let result = match t.result.as_deref() {
            Some(r) if !r.trim().is_empty() => preview(r, 500),
            _ => "no completed turn yet".into(),
        };
        let mut text = format!(
            "agent {h} ({})\nstatus: {} · level {} · role {} · elapsed {elapsed:.1}s\ntask: {}\nresult: {result}",
            t.id,
            t.status,
            t.level,
            t.role,
            preview(&t.task, 200)
        );
        if let Some(e) = &t.error {
            text.push_str(&format!("\nerror: {e}"));
        }
        ToolOutput::Ok(text)
    }
}

/// `agent_list`: the user's agents, newest first.
pub struct AgentList;

#[derive(Deserialize)]
struct ListArgs {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    limit: Option<i64>,
}

#[async_trait::async_trait]
impl Tool for AgentList {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "agent_list".into(),
            description: "List your user's agents, newest first, optionally by status.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["queued", "running", "waiting", "done", "failed", "cancelled", "timed_out"]},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100}
                },
                "additionalProperties": false
            }),
        }
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        let a: ListArgs = match parse("agent_list", args) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let rows = agents::list(
            ctx.core.db.reader(),
            &ListFilter {
                user: ctx.agent.user_name.clone(),
                status: a.status.as_deref().and_then(AgentStatus::parse),
                limit: a.limit.unwrap_or(10).clamp(1, 100),
                ..ListFilter::default()
            },
        )
        .await;
        let rows = match rows {
            Ok(r) => r,
            Err(e) => return ToolOutput::Err(format!("agent_list failed on a storage error: {e}")),
        };
        if rows.is_empty() {
            return ToolOutput::Ok("no agents".into());
        }
        let mut lines = Vec::with_capacity(rows.len());
        for r in &rows {
            let h = handle_of(ctx, r).await;
            lines.push(format!(
                "{h} {} L{} {} {} — {}",
                r.status,
                r.level,
                r.definition,
                rfc3339(r.created_at),
                preview(&r.task.replace('\n', " "), 80)
            ));
        }
        ToolOutput::Ok(lines.join("\n"))
    }
}

/// `agent_cancel`: cancels an agent and its whole subtree (admin users
/// only; needs a human's approval unless configured otherwise).
pub struct AgentCancel;

#[async_trait::async_trait]
impl Tool for AgentCancel {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "agent_cancel".into(),
            description: "Cancel an agent and all its sub-agents. Admin users only; asks a human for approval.".into(),
            parameters: agent_params(),
        }
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        let admin = ctx
            .core
            .auth
            .users()
            .iter()
            .any(|u| u.name == ctx.agent.user_name && u.admin);
        if !admin {
            return ToolOutput::Err(format!(
                "agent_cancel is for admin users; user `{}` is not one",
                ctx.agent.user_name
            ));
        }
        let (_, t) = match agent_arg(ctx, "agent_cancel", args).await {
            Ok(x) => x,
            Err(e) => return e,
        };
        if t.id == ctx.agent.id || t.is_ancestor_of(ctx.agent) {
            return ToolOutput::Err(
                "agent_cancel cannot cancel yourself or one of your ancestors".into(),
            );
        }
        let h = handle_of(ctx, &t).await;
        let by = format!("agent {}", ctx.agent.id);
        match lifecycle::cancel(ctx.core, &t.id, &by).await {
            Ok(row) => ToolOutput::Ok(format!(
                "Cancelled {h} and its sub-agents (now {}).",
                row.status
            )),
            Err(e) => ToolOutput::Err(format!("agent_cancel failed on a storage error: {e}")),
        }
    }
}

/// `close_agent`: closes a child the caller spawned (no more messages).
pub struct CloseAgent;

#[async_trait::async_trait]
impl Tool for CloseAgent {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "close_agent".into(),
            description: "Close a sub-agent you spawned: it accepts no more messages.".into(),
            parameters: agent_params(),
        }
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        let (reference, t) = match agent_arg(ctx, "close_agent", args).await {
            Ok(x) => x,
            Err(e) => return e,
        };
        if t.parent_id.as_deref() != Some(ctx.agent.id.as_str()) {
            return ToolOutput::Err(format!("`{}` is not a sub-agent you spawned", reference));
        }
        let h = handle_of(ctx, &t).await;
        match lifecycle::close(ctx.core, &t.id).await {
            Ok(_) => ToolOutput::Ok(format!("Closed {h}; it accepts no more messages.")),
            Err(e) => ToolOutput::Err(format!("close_agent failed on a storage error: {e}")),
        }
    }
}
