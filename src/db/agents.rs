//! Agent SQL: insert, lookups, listings, lineage and the guarded status
//! updates of the turn lifecycle.

use sqlx::sqlite::SqliteConnection;
use sqlx::SqlitePool;

use super::jobs::Lease;
use super::writer::run_stmts;
use super::{DbError, DbResult, Stmt, StmtOutput, WriteCtx};
use crate::events::AgentRef;
use crate::types::{AgentStatus, Origin, StopReason};

/// One agent row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AgentRow {
    pub id: String,
    pub user_name: String,
    pub level: i64,
    pub parent_id: Option<String>,
    pub root_id: String,
    pub parent_call_id: Option<String>,
    pub background: bool,
    pub definition: String,
    pub role: String,
    pub task: String,
    pub status: AgentStatus,
    pub result: Option<String>,
    pub error: Option<String>,
    pub stop_reason: Option<StopReason>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub turns: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost_usd: f64,
    pub subtree_cost_usd: f64,
    pub max_turns: i64,
    pub max_cost_usd: Option<f64>,
    pub timeout_s: Option<f64>,
    pub deadline_at: Option<i64>,
    pub budgeted: bool,
    pub auto_wake_budget: i64,
    pub effective_tools: String,
    pub notify: Option<String>,
    pub closed: bool,
    pub metadata: String,
    pub turn_calls: i64,
    pub run_token: i64,
    pub resume_msg_id: Option<i64>,
    pub resume_count: i64,
    pub ancestors: String,
    pub active_children: i64,
    pub dropped_tools: Option<String>,
    pub compact_upto: Option<i64>,
}

/// The agent columns, as a literal usable in `concat!`.
macro_rules! agent_columns {
    () => {
        "id, user_name, level, parent_id, root_id, parent_call_id, background, definition, role, \
         task, status, result, error, stop_reason, created_at, started_at, finished_at, turns, \
         tokens_in, tokens_out, cost_usd, subtree_cost_usd, max_turns, max_cost_usd, timeout_s, \
         deadline_at, budgeted, auto_wake_budget, effective_tools, notify, closed, metadata, \
         turn_calls, run_token, resume_msg_id, resume_count, ancestors, active_children, dropped_tools, compact_upto"
    };
}
pub(crate) use agent_columns;

pub(crate) const COLUMNS: &str = agent_columns!();

impl AgentRow {
    /// The frozen effective tool names.
    pub fn tools(&self) -> Vec<String> {
        serde_json::from_str(&self.effective_tools).unwrap_or_default()
    }

    /// The lineage events need.
    pub fn agent_ref(&self) -> AgentRef {
        AgentRef {
            id: self.id.clone(),
            user: self.user_name.clone(),
            level: self.level,
            parent_id: self.parent_id.clone(),
            root_id: self.root_id.clone(),
        }
    }

    /// Requested tools that were not granted because the parent lacks them.
    pub fn dropped(&self) -> Vec<String> {
        self.dropped_tools
            .as_deref()
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or_default()
    }

    /// Whether `other` is this agent's descendant.
    pub fn is_ancestor_of(&self, other: &AgentRow) -> bool {
        other.ancestors().iter().any(|a| a == &self.id)
    }

    /// Ancestor ids, parent first, root last.
    pub fn ancestors(&self) -> Vec<String> {
        serde_json::from_str(&self.ancestors).unwrap_or_default()
    }

    /// Parses a row returned by a statement (`RETURNING` + `COLUMNS`).
    pub fn from_sqlite(row: &sqlx::sqlite::SqliteRow) -> DbResult<Self> {
        Ok(<Self as sqlx::FromRow<sqlx::sqlite::SqliteRow>>::from_row(
            row,
        )?)
    }
}

/// A new agent's row.
#[derive(Debug, Clone)]
pub struct NewAgent {
    pub id: String,
    pub user_name: String,
    pub level: i64,
    pub parent_id: Option<String>,
    pub root_id: String,
    pub ancestors: Vec<String>,
    pub parent_call_id: Option<String>,
    pub background: bool,
    pub definition: String,
    pub role: String,
    pub task: String,
    pub max_turns: i64,
    pub max_cost_usd: Option<f64>,
    pub timeout_s: Option<f64>,
    pub deadline_at: Option<i64>,
    pub budgeted: bool,
    pub auto_wake_budget: i64,
    pub effective_tools: Vec<String>,
    pub notify: Option<String>,
    pub metadata: String,
    pub idempotency_key: Option<String>,
    /// Requested tools the parent lacked.
    pub dropped_tools: Vec<String>,
}

/// What else a new agent starts with.
pub struct Start<'a> {
    pub system_prompt: &'a str,
    pub first_origin: Origin,
    pub first_sender: Option<&'a str>,
    pub job_max_attempts: i64,
    /// `agent_created` event data.
    pub event_data: String,
}

/// Inserts the agent (unless the user is at `max_active` unfinished agents),
/// its system prompt and task messages, its first turn job and its
/// `agent_created` event, as one all-or-nothing script. Read the new row
/// with `created`.
pub fn create_script(a: &NewAgent, start: &Start<'_>, max_active: i64, now: i64) -> Stmt {
    let tools = serde_json::to_string(&a.effective_tools).unwrap_or_else(|_| "[]".into());
    let ancestors = serde_json::to_string(&a.ancestors).unwrap_or_else(|_| "[]".into());
    Stmt::new(CREATE)
        .arg(a.id.as_str())
        .arg(a.user_name.as_str())
        .arg(a.level)
        .arg(a.parent_id.clone())
        .arg(a.root_id.as_str())
        .arg(ancestors)
        .arg(a.parent_call_id.clone())
        .arg(a.background)
        .arg(a.definition.as_str())
        .arg(a.role.as_str())
        .arg(a.task.as_str())
        .arg(now)
        .arg(a.max_turns)
        .arg(a.max_cost_usd)
        .arg(a.timeout_s)
        .arg(a.deadline_at)
        .arg(a.budgeted)
        .arg(a.auto_wake_budget)
        .arg(tools)
        .arg(a.notify.clone())
        .arg(a.metadata.as_str())
        .arg(a.idempotency_key.clone())
        .arg(
            (!a.dropped_tools.is_empty())
                .then(|| serde_json::to_string(&a.dropped_tools).unwrap_or_default()),
        )
        .arg(a.user_name.as_str())
        .arg(max_active)
        // the counters
        .arg(a.user_name.as_str())
        .arg(a.user_name.as_str())
        .arg(a.id.as_str())
        .arg(a.parent_id.clone())
        .arg(a.id.as_str())
        // the system prompt
        .arg(a.id.as_str())
        .arg(start.system_prompt)
        .arg(now)
        .arg(a.id.as_str())
        // the task
        .arg(a.id.as_str())
        .arg(a.task.as_str())
        .arg(start.first_origin.as_str())
        .arg(start.first_sender)
        .arg(now)
        .arg(a.id.as_str())
        // the first turn job
        .arg(a.id.as_str())
        .arg(now)
        .arg(start.job_max_attempts)
        .arg(now)
        .arg(a.id.as_str())
        // the event
        .arg(a.id.as_str())
        .arg(start.event_data.as_str())
        .arg(now)
        .arg(a.id.as_str())
        // the row
        .arg(a.id.as_str())
        .waking()
}

/// The row `create_script` inserted, or None when the user limit refused it.
pub fn created(out: &[StmtOutput]) -> DbResult<Option<AgentRow>> {
    match out.last().and_then(|o| o.rows.first()) {
        Some(row) => Ok(Some(AgentRow::from_sqlite(row)?)),
        None => Ok(None),
    }
}

const CREATE: &str = concat!(
    "INSERT INTO agents (id, user_name, level, parent_id, root_id, ancestors, parent_call_id,
                         background, definition, role, task, status, created_at, max_turns,
                         max_cost_usd, timeout_s, deadline_at, budgeted, auto_wake_budget,
                         effective_tools, notify, metadata, idempotency_key, dropped_tools)
     SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?
      WHERE COALESCE((SELECT active_agents FROM user_stats WHERE user_name = ?), 0) < ?;
     INSERT OR IGNORE INTO user_stats (user_name, active_agents) VALUES (?, 0);
     UPDATE user_stats SET active_agents = active_agents + 1
      WHERE user_name = ? AND EXISTS (SELECT 1 FROM agents WHERE id = ?);
     UPDATE agents SET active_children = active_children + 1
      WHERE id = ? AND EXISTS (SELECT 1 FROM agents WHERE id = ?);
     INSERT INTO messages (agent_id, role, content, created_at)
     SELECT ?, 'system', ?, ? WHERE EXISTS (SELECT 1 FROM agents WHERE id = ?);
     INSERT INTO messages (agent_id, role, content, origin, sender, created_at)
     SELECT ?, 'user', ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM agents WHERE id = ?);
     INSERT OR IGNORE INTO jobs (kind, agent_id, payload, state, priority, run_at, max_attempts, created_at)
     SELECT 'turn', ?, '{}', 'queued', 0, ?, ?, ? WHERE EXISTS (SELECT 1 FROM agents WHERE id = ?);
     INSERT INTO events (agent_id, kind, data, created_at)
     SELECT ?, 'agent_created', ?, ? WHERE EXISTS (SELECT 1 FROM agents WHERE id = ?);
     SELECT ",
    agent_columns!(),
    " FROM agents WHERE id = ?"
);

/// Unfinished agents of a user (for the limit's error message).
pub async fn active_for_user(conn: &mut SqliteConnection, user: &str) -> DbResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COALESCE((SELECT active_agents FROM user_stats WHERE user_name = ?), 0)",
    )
    .bind(user)
    .fetch_one(conn)
    .await?)
}

/// One agent by id.
pub async fn get(pool: &SqlitePool, id: &str) -> DbResult<Option<AgentRow>> {
    Ok(
        sqlx::query_as::<_, AgentRow>(&format!("SELECT {COLUMNS} FROM agents WHERE id = ?"))
            .bind(id)
            .fetch_optional(pool)
            .await?,
    )
}

/// One agent by id, inside a write.
pub async fn get_tx(conn: &mut SqliteConnection, id: &str) -> DbResult<Option<AgentRow>> {
    Ok(
        sqlx::query_as::<_, AgentRow>(&format!("SELECT {COLUMNS} FROM agents WHERE id = ?"))
            .bind(id)
            .fetch_optional(conn)
            .await?,
    )
}

/// One agent by id, inside a write; missing is an error.
pub async fn must_get_tx(conn: &mut SqliteConnection, id: &str) -> DbResult<AgentRow> {
    get_tx(conn, id).await?.ok_or_else(|| DbError::NotFound {
        what: "agent",
        id: id.to_string(),
    })
}

/// The agent a user submitted with this idempotency key, if any.
pub async fn by_idempotency_key(
    conn: &mut SqliteConnection,
    user: &str,
    key: &str,
) -> DbResult<Option<AgentRow>> {
    Ok(sqlx::query_as::<_, AgentRow>(&format!(
        "SELECT {COLUMNS} FROM agents WHERE user_name = ? AND idempotency_key = ?"
    ))
    .bind(user)
    .bind(key)
    .fetch_optional(conn)
    .await?)
}

/// The child a spawn tool call created, if it already ran.
pub async fn by_spawn_call(
    conn: &mut SqliteConnection,
    parent_id: &str,
    call_id: &str,
) -> DbResult<Option<AgentRow>> {
    Ok(sqlx::query_as::<_, AgentRow>(&format!(
        "SELECT {COLUMNS} FROM agents WHERE parent_id = ? AND parent_call_id = ?"
    ))
    .bind(parent_id)
    .bind(call_id)
    .fetch_optional(conn)
    .await?)
}

/// Filters of the agent listing.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub user: String,
    pub status: Option<AgentStatus>,
    pub parent_id: Option<String>,
    pub level: Option<i64>,
    /// Only agents strictly older than this (created_at, id) cursor.
    pub before: Option<(i64, String)>,
    pub limit: i64,
}

/// A user's agents, newest first.
pub async fn list(pool: &SqlitePool, f: &ListFilter) -> DbResult<Vec<AgentRow>> {
    let (before_at, before_id) = match &f.before {
        Some((at, id)) => (Some(*at), Some(id.clone())),
        None => (None, None),
    };
    Ok(sqlx::query_as::<_, AgentRow>(&format!(
        "SELECT {COLUMNS} FROM agents
          WHERE user_name = ?
            AND (? IS NULL OR status = ?)
            AND (? IS NULL OR parent_id = ?)
            AND (? IS NULL OR level = ?)
            AND (? IS NULL OR created_at < ? OR (created_at = ? AND id < ?))
          ORDER BY created_at DESC, id DESC
          LIMIT ?"
    ))
    .bind(&f.user)
    .bind(f.status)
    .bind(f.status)
    .bind(&f.parent_id)
    .bind(&f.parent_id)
    .bind(f.level)
    .bind(f.level)
    .bind(before_at)
    .bind(before_at)
    .bind(before_at)
    .bind(&before_id)
    .bind(f.limit)
    .fetch_all(pool)
    .await?)
}

/// The agent and all its descendants (breadth-first by level).
pub async fn subtree(pool: &SqlitePool, root: &str) -> DbResult<Vec<AgentRow>> {
    Ok(sqlx::query_as::<_, AgentRow>(&format!(
        "WITH RECURSIVE tree(id) AS (
             SELECT ? UNION ALL SELECT a.id FROM agents a JOIN tree t ON a.parent_id = t.id)
         SELECT {COLUMNS} FROM agents WHERE id IN (SELECT id FROM tree)
          ORDER BY level, created_at, id"
    ))
    .bind(root)
    .fetch_all(pool)
    .await?)
}

/// Ids and statuses of the agent and its descendants, inside a write.
pub async fn subtree_tx(conn: &mut SqliteConnection, root: &str) -> DbResult<Vec<AgentRow>> {
    Ok(sqlx::query_as::<_, AgentRow>(&format!(
        "WITH RECURSIVE tree(id) AS (
             SELECT ? UNION ALL SELECT a.id FROM agents a JOIN tree t ON a.parent_id = t.id)
         SELECT {COLUMNS} FROM agents WHERE id IN (SELECT id FROM tree)
          ORDER BY level, created_at, id"
    ))
    .bind(root)
    .fetch_all(conn)
    .await?)
}

/// True when the agent still runs under this token (a step may be recorded).
pub async fn holds_run(conn: &mut SqliteConnection, id: &str, run_token: i64) -> DbResult<bool> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM agents WHERE id = ? AND run_token = ? AND status = 'running'",
    )
    .bind(id)
    .bind(run_token)
    .fetch_one(conn)
    .await?;
    Ok(n == 1)
}

/// The tightest budget over `ids` (an agent and its ancestors): for each
/// one with `max_cost_usd`, its cap minus what its whole subtree has spent.
/// Returns (what is left, whose budget) or None when none has a cap.
pub async fn budget_left(pool: &SqlitePool, ids: &[String]) -> DbResult<Option<(f64, String)>> {
    let mut conn = pool.acquire().await?;
    budget_left_tx(&mut conn, ids).await
}

/// How a turn ended, as stored.
#[derive(Debug, Clone)]
pub struct Settlement<'a> {
    pub status: AgentStatus,
    pub reason: StopReason,
    /// None keeps the previous result.
    pub result: Option<&'a str>,
    pub error: Option<&'a str>,
    /// `agent_finished` event data.
    pub event_data: String,
}

/// Settles an agent (whatever its state) and journals `agent_finished`;
/// an agent that was active stops counting against its user and parent.
pub async fn settle(ctx: &mut WriteCtx, id: &str, s: &Settlement<'_>) -> DbResult<AgentRow> {
    let script = Stmt::new(SETTLE)
        // the counters
        .arg(id)
        .arg(id)
        .arg(id)
        .arg(id)
        // the row
        .arg(s.status.as_str())
        .arg(reason_name(s.reason))
        .arg(s.result)
        .arg(s.error)
        .arg(ctx.now)
        .arg(id)
        // the event
        .arg(id)
        .arg(s.event_data.as_str())
        .arg(ctx.now)
        .arg(id)
        .arg(id);
    let out = run_stmts(ctx, &script).await?;
    match out.last().and_then(|o| o.rows.first()) {
        Some(row) => AgentRow::from_sqlite(row),
        None => Err(DbError::NotFound {
            what: "agent",
            id: id.to_string(),
        }),
    }
}

/// Settles a running agent under its run token and completes its job,
/// unless the guard fails or (with `require_empty_inbox`) messages wait in
/// its inbox; journals `agent_finished`. Read the row with `settled_row`.
#[allow(clippy::too_many_arguments)]
pub fn settle_running_script(
    id: &str,
    run_token: i64,
    lease: &Lease,
    require_empty_inbox: bool,
    s: &Settlement<'_>,
    now: i64,
) -> Stmt {
    Stmt::new(SETTLE_RUNNING)
        // the counters, guarded like the settle itself
        .arg(id)
        .arg(id)
        .arg(run_token)
        .arg(require_empty_inbox)
        .arg(id)
        .arg(id)
        .arg(run_token)
        .arg(require_empty_inbox)
        // the settle
        .arg(s.status.as_str())
        .arg(reason_name(s.reason))
        .arg(s.result)
        .arg(s.error)
        .arg(now)
        .arg(id)
        .arg(run_token)
        .arg(require_empty_inbox)
        // the row
        .arg(id)
        // the event
        .arg(id)
        .arg(s.event_data.as_str())
        .arg(now)
        // the job
        .arg(now)
        .arg(lease.id)
        .arg(lease.owner.as_str())
        .arg(lease.attempts)
}

/// `settle_running_script` for a caller that needs no row back (its
/// `settled_lean` says whether it settled).
pub fn settle_running_lean(
    id: &str,
    run_token: i64,
    lease: &Lease,
    require_empty_inbox: bool,
    s: &Settlement<'_>,
    now: i64,
) -> Stmt {
    let mut st = settle_running_script(id, run_token, lease, require_empty_inbox, s, now);
    st.sql = SETTLE_RUNNING_LEAN;
    st
}

/// Where a settle script reports the settled row.
const SETTLED_ROW_AT: usize = 3;

/// Whether a `settle_running_lean` script settled the agent.
pub fn settled_lean(out: &[StmtOutput]) -> bool {
    out.get(SETTLED_ROW_AT).is_some_and(|o| !o.rows.is_empty())
}

/// The row a settle script settled, if it did.
pub fn settled_row(out: &[StmtOutput]) -> DbResult<Option<AgentRow>> {
    match out.get(SETTLED_ROW_AT).and_then(|o| o.rows.first()) {
        Some(row) => Ok(Some(AgentRow::from_sqlite(row)?)),
        None => Ok(None),
    }
}

/// `settle_running_script` inside a write closure.
pub async fn settle_running(
    ctx: &mut WriteCtx,
    id: &str,
    run_token: i64,
    lease: &Lease,
    require_empty_inbox: bool,
    s: &Settlement<'_>,
) -> DbResult<Option<AgentRow>> {
    let script = settle_running_script(id, run_token, lease, require_empty_inbox, s, ctx.now);
    let out = run_stmts(ctx, &script).await?;
    settled_row(&out)
}

fn reason_name(r: StopReason) -> &'static str {
    match r {
        StopReason::Done => "done",
        StopReason::TurnLimit => "turn_limit",
        StopReason::CostLimit => "cost_limit",
        StopReason::Deadline => "deadline",
        StopReason::Cancelled => "cancelled",
        StopReason::Error => "error",
        StopReason::Quarantined => "quarantined",
    }
}

/// An agent counts as active (against its user's and parent's limits) while
/// queued, running or waiting. Plain comparisons: IN lists are slower here.
macro_rules! active {
    ($t:literal) => {
        concat!(
            "(",
            $t,
            ".status = 'queued' OR ",
            $t,
            ".status = 'running' OR ",
            $t,
            ".status = 'waiting')"
        )
    };
}

const SETTLE: &str = concat!(
    "UPDATE user_stats SET active_agents = active_agents - 1
      WHERE user_name = (SELECT user_name FROM agents WHERE id = ?)
        AND EXISTS (SELECT 1 FROM agents g WHERE g.id = ? AND ",
    active!("g"),
    ");
     UPDATE agents SET active_children = active_children - 1
      WHERE id = (SELECT parent_id FROM agents WHERE id = ?)
        AND EXISTS (SELECT 1 FROM agents g WHERE g.id = ? AND ",
    active!("g"),
    ");
     UPDATE agents SET status = ?, stop_reason = ?, result = COALESCE(?, result), error = ?,
                       finished_at = ?
      WHERE id = ?;
     INSERT INTO events (agent_id, kind, data, created_at)
     SELECT ?, 'agent_finished', ?, ? WHERE EXISTS (SELECT 1 FROM agents WHERE id = ?);
     SELECT ",
    agent_columns!(),
    " FROM agents WHERE id = ?"
);

/// Guard of a settle by the turn that runs the agent (`g` is the agent).
macro_rules! running_guard {
    () => {
        "g.id = ? AND g.run_token = ? AND g.status = 'running'
         AND (? = 0 OR NOT EXISTS (SELECT 1 FROM inbox WHERE inbox.agent_id = g.id))"
    };
}

/// The statements of a settle by the running turn, up to the final SELECT.
macro_rules! settle_running_head {
    () => {
        concat!(
            "UPDATE user_stats SET active_agents = active_agents - 1
              WHERE user_name = (SELECT user_name FROM agents WHERE id = ?)
                AND EXISTS (SELECT 1 FROM agents g WHERE ", running_guard!(), ");
             UPDATE agents SET active_children = active_children - 1
              WHERE id = (SELECT parent_id FROM agents WHERE id = ?)
                AND EXISTS (SELECT 1 FROM agents g WHERE ", running_guard!(), ");
             UPDATE agents SET status = ?, stop_reason = ?, result = COALESCE(?, result), error = ?,
                               finished_at = ?
              WHERE id = ? AND run_token = ? AND status = 'running'
                AND (? = 0 OR NOT EXISTS (SELECT 1 FROM inbox WHERE inbox.agent_id = agents.id));
             SELECT "
        )
    };
}

/// After the row: each statement runs only if the one before it changed a
/// row, so the event and the job completion follow this settle and no
/// other (a concurrent settle in the same batch changes nothing here).
macro_rules! settle_running_tail {
    () => {
        " FROM agents WHERE id = ? AND changes() = 1;
         INSERT INTO events (agent_id, kind, data, created_at)
         SELECT ?, 'agent_finished', ?, ? WHERE changes() = 1;
         UPDATE jobs SET state = 'completed', finished_at = ?, lease_owner = NULL, lease_expires_at = NULL
          WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ? AND changes() = 1"
    };
}

const SETTLE_RUNNING: &str = concat!(
    settle_running_head!(),
    agent_columns!(),
    settle_running_tail!()
);

const SETTLE_RUNNING_LEAN: &str = concat!(settle_running_head!(), "id", settle_running_tail!());

/// Sets a plain status (queued, waiting) without touching results.
pub async fn set_status(
    conn: &mut SqliteConnection,
    id: &str,
    status: AgentStatus,
) -> DbResult<()> {
    sqlx::query("UPDATE agents SET status = ? WHERE id = ?")
        .bind(status)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Records the result of a completed turn while the agent keeps running
/// (its inbox already holds the next turn's input).
pub async fn set_turn_result(conn: &mut SqliteConnection, id: &str, result: &str) -> DbResult<()> {
    sqlx::query("UPDATE agents SET result = ?, turn_calls = 0 WHERE id = ?")
        .bind(result)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Wakes a settled agent for a new turn: queued, new turn counter, the
/// auto-wake budget set to `budget`; it counts as active again.
pub async fn wake(ctx: &mut WriteCtx, id: &str, budget: i64) -> DbResult<()> {
    let script = Stmt::new(concat!(
        "UPDATE user_stats SET active_agents = active_agents + 1
          WHERE user_name = (SELECT user_name FROM agents WHERE id = ?)
            AND EXISTS (SELECT 1 FROM agents g WHERE g.id = ? AND NOT ",
        active!("g"),
        ");
         UPDATE agents SET active_children = active_children + 1
          WHERE id = (SELECT parent_id FROM agents WHERE id = ?)
            AND EXISTS (SELECT 1 FROM agents g WHERE g.id = ? AND NOT ",
        active!("g"),
        ");
         UPDATE agents SET status = 'queued', turn_calls = 0, auto_wake_budget = ?, error = NULL,
                           stop_reason = NULL, finished_at = NULL
          WHERE id = ?"
    ))
    .arg(id)
    .arg(id)
    .arg(id)
    .arg(id)
    .arg(budget)
    .arg(id);
    run_stmts(ctx, &script).await?;
    Ok(())
}

/// Moves the compaction boundary of a running agent; false when stale.
pub async fn set_compaction(
    conn: &mut SqliteConnection,
    id: &str,
    run_token: i64,
    upto: i64,
) -> DbResult<bool> {
    let r = sqlx::query(
        "UPDATE agents SET compact_upto = ? WHERE id = ? AND run_token = ? AND status = 'running'",
    )
    .bind(upto)
    .bind(id)
    .bind(run_token)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Sets the auto-wake budget (a human message refills it).
pub async fn set_wake_budget(conn: &mut SqliteConnection, id: &str, budget: i64) -> DbResult<()> {
    sqlx::query("UPDATE agents SET auto_wake_budget = ? WHERE id = ?")
        .bind(budget)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Marks the agent closed: it accepts no more messages.
pub async fn close(conn: &mut SqliteConnection, id: &str) -> DbResult<()> {
    sqlx::query("UPDATE agents SET closed = 1 WHERE id = ?")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Active agents whose deadline passed.
pub async fn past_deadline(pool: &SqlitePool, now: i64, limit: i64) -> DbResult<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM agents
          WHERE deadline_at IS NOT NULL AND finished_at IS NULL AND deadline_at <= ?
          ORDER BY deadline_at LIMIT ?",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// The earliest deadline of any active agent.
pub async fn next_deadline(pool: &SqlitePool) -> DbResult<Option<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT MIN(deadline_at) FROM agents WHERE deadline_at IS NOT NULL AND finished_at IS NULL",
    )
    .fetch_one(pool)
    .await?)
}

/// Deletes finished sub-agents (level > 1) older than `before` with their
/// conversations, inboxes and journals; returns how many agents went.
pub async fn prune_finished_subagents(
    conn: &mut SqliteConnection,
    before: i64,
    limit: i64,
) -> DbResult<u64> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM agents
          WHERE level > 1 AND status IN ('done','failed','cancelled','timed_out')
            AND finished_at IS NOT NULL AND finished_at < ?
          LIMIT ?",
    )
    .bind(before)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    let list = serde_json::to_string(&ids).unwrap_or_else(|_| "[]".into());
    for table in ["messages", "inbox", "events"] {
        sqlx::query(&format!(
            "DELETE FROM {table} WHERE agent_id IN (SELECT value FROM json_each(?))"
        ))
        .bind(&list)
        .execute(&mut *conn)
        .await?;
    }
    let r = sqlx::query("DELETE FROM agents WHERE id IN (SELECT value FROM json_each(?))")
        .bind(&list)
        .execute(&mut *conn)
        .await?;
    Ok(r.rows_affected())
}

/// Upserts a configured user name.
pub async fn upsert_user(
    conn: &mut SqliteConnection,
    now: i64,
    name: &str,
    admin: bool,
) -> DbResult<()> {
    sqlx::query(
        "INSERT INTO users (name, admin, created_at) VALUES (?, ?, ?)
         ON CONFLICT(name) DO UPDATE SET admin = excluded.admin",
    )
    .bind(name)
    .bind(admin)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// `budget_left` on any connection.
pub async fn budget_left_tx(
    conn: &mut SqliteConnection,
    ids: &[String],
) -> DbResult<Option<(f64, String)>> {
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
    let row: Option<(f64, String)> = sqlx::query_as(
        "SELECT a.max_cost_usd - (SELECT COALESCE(SUM(d.cost_usd), 0) FROM agents d
                                   WHERE d.root_id = a.root_id
                                     AND (d.id = a.id OR instr(d.ancestors, a.id) > 0)) AS left,
                a.id
           FROM agents a
          WHERE a.id IN (SELECT value FROM json_each(?)) AND a.max_cost_usd IS NOT NULL
          ORDER BY left ASC LIMIT 1",
    )
    .bind(list)
    .fetch_optional(conn)
    .await?;
    Ok(row)
}

/// What the agent's whole subtree (it included) has spent.
pub async fn subtree_cost(pool: &SqlitePool, a: &AgentRow) -> DbResult<f64> {
    Ok(sqlx::query_scalar(
        "SELECT COALESCE(SUM(cost_usd), 0) FROM agents
          WHERE root_id = ? AND (id = ? OR instr(ancestors, ?) > 0)",
    )
    .bind(&a.root_id)
    .bind(&a.id)
    .bind(&a.id)
    .fetch_one(pool)
    .await?)
}

/// The open agents of `user` just before and after `id` in id order.
pub async fn neighbours(
    conn: &mut SqliteConnection,
    user: &str,
    id: &str,
) -> DbResult<(Option<String>, Option<String>)> {
    let prev: Option<String> = sqlx::query_scalar(
        "SELECT id FROM agents WHERE user_name = ? AND closed = 0 AND id < ? ORDER BY id DESC LIMIT 1",
    )
    .bind(user)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let next: Option<String> = sqlx::query_scalar(
        "SELECT id FROM agents WHERE user_name = ? AND closed = 0 AND id > ? ORDER BY id LIMIT 1",
    )
    .bind(user)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok((prev, next))
}

/// Open agents of `user` whose id starts with the sanitised `prefix`
/// (an index range scan, no LIKE), at most `limit`.
pub async fn open_with_prefix(
    conn: &mut SqliteConnection,
    user: &str,
    prefix: &str,
    limit: i64,
) -> DbResult<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM agents WHERE user_name = ? AND closed = 0 AND id >= ? AND id < ?
          ORDER BY id LIMIT ?",
    )
    .bind(user)
    .bind(prefix)
    .bind(crate::handles::range_end(prefix))
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// Open agents of `user` (id order), at most `limit`: for "did you mean" lists.
pub async fn open_ids(
    conn: &mut SqliteConnection,
    user: &str,
    limit: i64,
) -> DbResult<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM agents WHERE user_name = ? AND closed = 0 ORDER BY created_at DESC LIMIT ?",
    )
    .bind(user)
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// The handle of an agent (read pool).
pub async fn handle(pool: &SqlitePool, user: &str, id: &str) -> DbResult<String> {
    let mut conn = pool.acquire().await?;
    let (prev, next) = neighbours(&mut conn, user, id).await?;
    Ok(crate::handles::from_neighbours(
        id,
        prev.as_deref(),
        next.as_deref(),
    ))
}

/// `open_with_prefix` on the read pool.
pub async fn open_with_prefix_ro(
    pool: &SqlitePool,
    user: &str,
    prefix: &str,
    limit: i64,
) -> DbResult<Vec<String>> {
    let mut conn = pool.acquire().await?;
    open_with_prefix(&mut conn, user, prefix, limit).await
}

/// `open_ids` on the read pool.
pub async fn open_ids_ro(pool: &SqlitePool, user: &str, limit: i64) -> DbResult<Vec<String>> {
    let mut conn = pool.acquire().await?;
    open_ids(&mut conn, user, limit).await
}

/// Settles a running agent `done` without a trace beyond the row (a quiet
/// heartbeat: no event, no report), keeping its previous result. True when
/// it settled (the guard held and the inbox is empty).
pub async fn settle_quietly(
    ctx: &mut WriteCtx,
    id: &str,
    run_token: i64,
    lease: &Lease,
) -> DbResult<bool> {
    let script = Stmt::new(concat!(
        "UPDATE user_stats SET active_agents = active_agents - 1
          WHERE user_name = (SELECT user_name FROM agents WHERE id = ?)
            AND EXISTS (SELECT 1 FROM agents g WHERE ", running_guard!(), ");
         UPDATE agents SET active_children = active_children - 1
          WHERE id = (SELECT parent_id FROM agents WHERE id = ?)
            AND EXISTS (SELECT 1 FROM agents g WHERE ", running_guard!(), ");
         UPDATE agents SET status = 'done', stop_reason = 'done', error = NULL, finished_at = ?
          WHERE id = ? AND run_token = ? AND status = 'running'
            AND NOT EXISTS (SELECT 1 FROM inbox WHERE inbox.agent_id = agents.id);
         SELECT id FROM agents WHERE id = ? AND changes() = 1;
         UPDATE jobs SET state = 'completed', finished_at = ?, lease_owner = NULL, lease_expires_at = NULL
          WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ? AND changes() = 1"
    ))
    .arg(id)
    .arg(id)
    .arg(run_token)
    .arg(true)
    .arg(id)
    .arg(id)
    .arg(run_token)
    .arg(true)
    .arg(ctx.now)
    .arg(id)
    .arg(run_token)
    .arg(id)
    .arg(ctx.now)
    .arg(lease.id)
    .arg(lease.owner.as_str())
    .arg(lease.attempts);
    let out = run_stmts(ctx, &script).await?;
    Ok(out.get(3).is_some_and(|o| !o.rows.is_empty()))
}
