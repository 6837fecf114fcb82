//! Creating agents — from the API, from schedules and from `spawn_agent` —
//! in one place: the definition and role are resolved, the system prompt is
//! composed and frozen, the tool set is narrowed, limits are inherited and
//! capped by what the parent has left, concurrency limits are checked, and
//! the row, its first messages and its first turn job are written in one
//! transaction.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::core::Core;
use crate::db::agents::{self, AgentRow, NewAgent};
use crate::db::{DbError, WriteCtx, WriteFuture};
use crate::definitions::Definition;
use crate::events::EventKind;
use crate::tools::Narrowing;
use crate::types::Origin;

/// Separates the parts of a composed system prompt.
pub const PROMPT_SEPARATOR: &str = "\n\n---\n\n";

/// How a child is tied to the parent that spawned it.
#[derive(Debug, Clone)]
pub struct SpawnLink {
    pub parent_id: String,
    /// The spawn tool call: the child's idempotency key.
    pub call_id: String,
    pub background: bool,
    /// The parent's run token: a child is only created while the parent
    /// still runs under it (nothing spawns after a cancel).
    pub parent_run_token: i64,
}

/// Everything a new agent is made from.
#[derive(Debug, Clone)]
pub struct NewAgentRequest {
    pub user: String,
    pub definition: Option<String>,
    pub role: Option<String>,
    pub task: String,
    pub system_prompt: Option<String>,
    pub briefing: Option<String>,
    pub tools: Option<Vec<String>>,
    pub deny_tools: Vec<String>,
    pub max_turns: Option<i64>,
    pub max_cost_usd: Option<f64>,
    pub timeout_s: Option<f64>,
    pub notify: Option<Value>,
    pub metadata: Value,
    pub idempotency_key: Option<String>,
    /// Origin of the first message (`human` from the API, `cron` from a brief).
    pub origin: Origin,
    pub sender: Option<String>,
    pub parent: Option<SpawnLink>,
    /// Fixed id (tests and tools that need to know it up front); else random.
    pub id: Option<String>,
}

impl NewAgentRequest {
    /// A level-1 request with defaults for everything but the task.
    pub fn top_level(user: &str, task: &str) -> Self {
        Self {
            user: user.to_string(),
            definition: None,
            role: None,
            task: task.to_string(),
            system_prompt: None,
            briefing: None,
            tools: None,
            deny_tools: Vec::new(),
            max_turns: None,
            max_cost_usd: None,
            timeout_s: None,
            notify: None,
            metadata: json!({}),
            idempotency_key: None,
            origin: Origin::Human,
            sender: None,
            parent: None,
            id: None,
        }
    }
}

/// A created (or, for repeats, found) agent.
#[derive(Debug, Clone)]
pub struct Created {
    pub agent: AgentRow,
    /// False when an idempotency key or spawn call id found an earlier agent.
    pub created: bool,
    /// Requested tools dropped because the parent lacks them.
    pub dropped_tools: Vec<String>,
}

/// Why an agent could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// A field of the request is invalid (HTTP 422 naming the field).
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// A concurrency or budget limit (HTTP 429; the tool result says it).
    #[error("{0}")]
    Limit(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

fn invalid(field: &'static str, message: impl Into<String>) -> CreateError {
    CreateError::Invalid {
        field,
        message: message.into(),
    }
}

/// Composes a system prompt from up to three parts (SPEC §4).
pub fn compose_system_prompt(
    def: &Definition,
    level: i64,
    extra: Option<&str>,
    briefing: Option<&str>,
) -> String {
    let base = if level > 1 {
        def.subagent_system_prompt
            .as_deref()
            .unwrap_or(&def.system_prompt)
    } else {
        &def.system_prompt
    };
    let mut parts: Vec<String> = Vec::new();
    for p in [Some(base), extra] {
        if let Some(p) = p.map(str::trim).filter(|p| !p.is_empty()) {
            parts.push(p.to_string());
        }
    }
    if let Some(b) = briefing.map(str::trim).filter(|b| !b.is_empty()) {
        parts.push(format!("## Task context\n\n{b}"));
    }
    parts.join(PROMPT_SEPARATOR)
}

/// Checks the parts of a request that need no database.
fn validate(core: &Core, r: &NewAgentRequest) -> Result<(), CreateError> {
    if r.task.trim().is_empty() {
        return Err(invalid("task", "must be a non-empty string"));
    }
    let slug = r.definition.as_deref().unwrap_or("default");
    if core.definitions.get(slug).is_none() {
        return Err(invalid(
            "agent",
            format!(
                "unknown definition `{slug}` (available: {})",
                core.definitions.slugs().join(", ")
            ),
        ));
    }
    if let Some(role) = &r.role {
        if !core.models.has_role(role) {
            return Err(invalid(
                "role",
                format!(
                    "unknown role `{role}` (configured: {})",
                    core.models.role_names().join(", ")
                ),
            ));
        }
    }
    for (field, list) in [
        ("tools", r.tools.as_deref().unwrap_or(&[])),
        ("deny_tools", &r.deny_tools[..]),
    ] {
        if let Some(t) = list.iter().find(|t| !core.catalog.contains(t)) {
            return Err(invalid(
                field,
                format!(
                    "unknown tool `{t}` (known: {})",
                    core.catalog.names().join(", ")
                ),
            ));
        }
    }
    if let Some(n) = r.max_turns {
        if n < 1 {
            return Err(invalid("max_turns", "must be at least 1"));
        }
    }
    if let Some(c) = r.max_cost_usd {
        if !c.is_finite() || c <= 0.0 {
            return Err(invalid("max_cost_usd", "must be a positive number"));
        }
    }
    if let Some(t) = r.timeout_s {
        if !t.is_finite() || t <= 0.0 || t > 31_536_000.0 {
            return Err(invalid(
                "timeout_s",
                "must be a positive number of seconds (at most a year)",
            ));
        }
    }
    if let Some(n) = &r.notify {
        let Some(obj) = n.as_object() else {
            return Err(invalid(
                "notify",
                "must be an object like {\"webhook_url\": \"https://…\"}",
            ));
        };
        if let Some(url) = obj.get("webhook_url") {
            let ok = url
                .as_str()
                .is_some_and(|u| u.starts_with("http://") || u.starts_with("https://"));
            if !ok {
                return Err(invalid(
                    "notify.webhook_url",
                    "must be an http:// or https:// URL",
                ));
            }
        }
    }
    if !r.metadata.is_object() {
        return Err(invalid("metadata", "must be a JSON object"));
    }
    if let Some(id) = &r.id {
        if uuid::Uuid::parse_str(id).is_err() || id.to_lowercase() != *id {
            return Err(invalid("id", "must be a lowercase UUID"));
        }
    }
    Ok(())
}

/// Creates the agent (or returns the earlier one for a repeated idempotency
/// key or spawn call).
pub async fn create(core: &Arc<Core>, req: NewAgentRequest) -> Result<Created, CreateError> {
    validate(core, &req)?;
    if req.parent.is_some() {
        return create_child(core, req).await;
    }
    if let Some(key) = &req.idempotency_key {
        let mut conn = core.db.reader().acquire().await.map_err(DbError::from)?;
        if let Some(found) = agents::by_idempotency_key(&mut conn, &req.user, key).await? {
            return Ok(Created {
                agent: found,
                created: false,
                dropped_tools: Vec::new(),
            });
        }
    }
    let now = core.now_ms();
    let plan = plan(core, &req, None, now)?;
    match core.db.exec(plan.script(&req, core, now)).await {
        Ok(out) => match agents::created(&out)? {
            Some(agent) => {
                core.signals.publish(plan.created_event(&agent, now));
                Ok(Created {
                    agent,
                    created: true,
                    dropped_tools: plan.dropped,
                })
            }
            None => Err(user_limit(core, &req.user).await),
        },
        Err(DbError::Sqlx(sqlx::Error::Database(d))) if d.is_unique_violation() => {
            // A concurrent request with the same idempotency key (or id) won.
            let mut conn = core.db.reader().acquire().await.map_err(DbError::from)?;
            match &req.idempotency_key {
                Some(key) => match agents::by_idempotency_key(&mut conn, &req.user, key).await? {
                    Some(found) => Ok(Created {
                        agent: found,
                        created: false,
                        dropped_tools: Vec::new(),
                    }),
                    None => Err(invalid("id", "an agent with this id already exists")),
                },
                None => Err(invalid(
                    "id",
                    format!("an agent with id `{}` already exists", plan.agent.id),
                )),
            }
        }
        Err(e) => Err(e.into()),
    }
}

async fn user_limit(core: &Core, user: &str) -> CreateError {
    let active = match core.db.reader().acquire().await {
        Ok(mut conn) => agents::active_for_user(&mut conn, user).await.unwrap_or(0),
        Err(_) => 0,
    };
    limit_error(core, user, active)
}

fn limit_error(core: &Core, user: &str, active: i64) -> CreateError {
    CreateError::Limit(format!(
        "too many active agents for user `{user}` ({active}/{}); wait for some to finish or cancel some",
        core.cfg.agents.max_active_agents_per_user
    ))
}

/// Writes a planned agent inside a write; its event goes out after COMMIT.
async fn insert_planned(
    ctx: &mut WriteCtx,
    core: &Core,
    req: &NewAgentRequest,
    plan: Plan,
) -> Result<Created, CreateError> {
    let now = ctx.now;
    let out = crate::db::writer::run_stmts(ctx, &plan.script(req, core, now)).await?;
    let Some(agent) = agents::created(&out)? else {
        let active = agents::active_for_user(&mut ctx.conn, &req.user).await?;
        return Err(limit_error(core, &req.user, active));
    };
    ctx.effects.events.push(plan.created_event(&agent, now));
    Ok(Created {
        agent,
        created: true,
        dropped_tools: plan.dropped,
    })
}

/// Creates a level-1 agent inside an existing write (a schedule's fire
/// creates its agent in the same transaction as the fire record).
pub async fn create_top_level_tx(
    ctx: &mut WriteCtx,
    core: &Core,
    req: NewAgentRequest,
) -> Result<Created, CreateError> {
    validate(core, &req)?;
    let plan = plan(core, &req, None, ctx.now)?;
    insert_planned(ctx, core, &req, plan).await
}

/// A child is created in a closure: the parent row (its budget, deadline,
/// tools and live child count) must be read in the same transaction.
async fn create_child(core: &Arc<Core>, req: NewAgentRequest) -> Result<Created, CreateError> {
    let core2 = Arc::clone(core);
    core.db
        .write(
            move |ctx: &mut WriteCtx| -> WriteFuture<'_, Result<Created, CreateError>> {
                Box::pin(async move {
                    match create_child_tx(ctx, &core2, req).await {
                        // A storage error rolls the whole write back.
                        Err(CreateError::Db(e)) => Err(e),
                        other => Ok(other),
                    }
                })
            },
        )
        .await?
}

async fn create_child_tx(
    ctx: &mut WriteCtx,
    core: &Core,
    req: NewAgentRequest,
) -> Result<Created, CreateError> {
    let Some(link) = &req.parent else {
        return Err(invalid("parent", "missing"));
    };
    if let Some(found) =
        agents::by_spawn_call(&mut ctx.conn, &link.parent_id, &link.call_id).await?
    {
        return Ok(Created {
            agent: found,
            created: false,
            dropped_tools: Vec::new(),
        });
    }
    let parent = agents::must_get_tx(&mut ctx.conn, &link.parent_id).await?;
    if parent.status != crate::types::AgentStatus::Running
        || parent.run_token != link.parent_run_token
    {
        return Err(CreateError::Limit(format!(
            "Cannot spawn sub-agent: this agent is {} and no longer runs this turn",
            parent.status
        )));
    }
    let cfg = &core.cfg.agents;
    if parent.level >= cfg.max_level {
        return Err(CreateError::Limit(format!(
            "Cannot spawn sub-agent: the maximum nesting level ({}) is reached",
            cfg.max_level
        )));
    }
    if parent.active_children >= cfg.max_children_per_agent {
        return Err(CreateError::Limit(format!(
            "Cannot spawn sub-agent: concurrency limit reached ({}/{} active). Wait for one to finish or cancel one.",
            parent.active_children, cfg.max_children_per_agent
        )));
    }
    let mut chain = vec![parent.id.clone()];
    chain.extend(parent.ancestors());
    let left = if parent.budgeted {
        agents::budget_left_tx(&mut ctx.conn, &chain)
            .await?
            .map(|(l, _)| l)
    } else {
        None
    };
    if left.is_some_and(|l| l <= 0.0) {
        return Err(CreateError::Limit(
            "Cannot spawn sub-agent: the cost budget of this agent tree is spent".into(),
        ));
    }
    let now = ctx.now;
    let plan = plan(
        core,
        &req,
        Some(ParentFacts {
            row: &parent,
            chain,
            budget_left: left,
        }),
        now,
    )?;
    insert_planned(ctx, core, &req, plan).await
}

/// What the parent contributes to a child.
struct ParentFacts<'a> {
    row: &'a AgentRow,
    /// The parent and its ancestors: the child's ancestors.
    chain: Vec<String>,
    /// What the tightest budget in the chain has left.
    budget_left: Option<f64>,
}

/// Everything decided about a new agent before it is written.
struct Plan {
    agent: NewAgent,
    system_prompt: String,
    dropped: Vec<String>,
    event_data: String,
}

impl Plan {
    /// The one script that writes the agent, its first messages, its first
    /// turn job and its event (refused over the user's active limit).
    fn script(&self, req: &NewAgentRequest, core: &Core, now: i64) -> crate::db::Stmt {
        let start = agents::Start {
            system_prompt: &self.system_prompt,
            first_origin: req.origin,
            first_sender: req.sender.as_deref(),
            job_max_attempts: core.cfg.workers.max_attempts,
            event_data: self.event_data.clone(),
        };
        agents::create_script(
            &self.agent,
            &start,
            core.cfg.agents.max_active_agents_per_user,
            now,
        )
    }

    fn created_event(&self, agent: &AgentRow, now: i64) -> crate::events::Event {
        agent.agent_ref().event(
            EventKind::AgentCreated,
            now,
            serde_json::from_str(&self.event_data).unwrap_or_default(),
        )
    }
}

/// Resolves the definition, prompt, tools and limits of a new agent.
fn plan(
    core: &Core,
    req: &NewAgentRequest,
    parent: Option<ParentFacts<'_>>,
    now: i64,
) -> Result<Plan, CreateError> {
    let cfg = &core.cfg.agents;
    let slug = req.definition.clone().unwrap_or_else(|| "default".into());
    let def = core
        .definitions
        .get(&slug)
        .ok_or_else(|| invalid("agent", format!("unknown definition `{slug}`")))?;
    let id = req
        .id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let (level, root_id, ancestors, parent_tools, parent_left, parent_deadline, parent_budgeted) =
        match &parent {
            Some(p) => (
                p.row.level + 1,
                p.row.root_id.clone(),
                p.chain.clone(),
                Some(p.row.tools()),
                p.budget_left,
                p.row.deadline_at,
                p.row.budgeted,
            ),
            None => (1, id.clone(), Vec::new(), None, None, None, false),
        };
    let (effective, dropped) = core.catalog.narrow(Narrowing {
        permissions: &def.permissions,
        offered: &def.tools,
        parent: parent_tools.as_deref(),
        allow: req.tools.as_deref(),
        deny: &req.deny_tools,
        level,
        max_level: cfg.max_level,
    });
    let max_cost = match (req.max_cost_usd.or(def.max_cost_usd), parent_left) {
        (Some(asked), Some(left)) => Some(asked.min(left)),
        (None, Some(left)) => Some(left),
        (asked, None) => asked,
    };
    let timeout_s = req
        .timeout_s
        .or(def.timeout_s)
        .or((level > 1).then_some(cfg.default_timeout_s));
    let deadline_at = match (
        timeout_s.map(|t| now + (t * 1000.0) as i64),
        parent_deadline,
    ) {
        (Some(own), Some(p)) => Some(own.min(p)),
        (own, p) => own.or(p),
    };
    let background = req.parent.as_ref().is_some_and(|l| l.background);
    let agent = NewAgent {
        id,
        user_name: req.user.clone(),
        level,
        parent_id: parent.as_ref().map(|p| p.row.id.clone()),
        root_id,
        ancestors,
        parent_call_id: req.parent.as_ref().map(|l| l.call_id.clone()),
        background,
        definition: slug.clone(),
        role: req.role.clone().unwrap_or_else(|| def.role().to_string()),
        task: req.task.clone(),
        max_turns: req
            .max_turns
            .or(def.max_turns)
            .unwrap_or(cfg.default_max_turns),
        max_cost_usd: max_cost,
        timeout_s,
        deadline_at,
        budgeted: parent_budgeted || max_cost.is_some(),
        auto_wake_budget: cfg.max_auto_wakes,
        effective_tools: effective,
        notify: req.notify.as_ref().map(Value::to_string),
        metadata: req.metadata.to_string(),
        idempotency_key: req.idempotency_key.clone(),
        dropped_tools: dropped.clone(),
    };
    Ok(Plan {
        system_prompt: compose_system_prompt(
            def,
            level,
            req.system_prompt.as_deref(),
            req.briefing.as_deref(),
        ),
        dropped,
        event_data: json!({"definition": slug, "status": "queued", "background": background})
            .to_string(),
        agent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(sub: Option<&str>) -> Definition {
        Definition {
            slug: "d".into(),
            name: String::new(),
            description: String::new(),
            is_subagent: false,
            role: None,
            tools: vec![],
            system_prompt: "MAIN".into(),
            subagent_system_prompt: sub.map(str::to_string),
            max_turns: None,
            max_cost_usd: None,
            timeout_s: None,
            working_directory: None,
            permissions: Default::default(),
        }
    }

    #[test]
    fn prompt_parts_are_joined_with_the_separator() {
        let d = def(Some("SUB"));
        assert_eq!(compose_system_prompt(&d, 1, None, None), "MAIN");
        assert_eq!(
            compose_system_prompt(&d, 2, Some("ROLE"), Some("paths: /x")),
            "SUB\n\n---\n\nROLE\n\n---\n\n## Task context\n\npaths: /x"
        );
        assert_eq!(
            compose_system_prompt(&def(None), 2, None, Some("b")),
            "MAIN\n\n---\n\n## Task context\n\nb"
        );
    }
}
