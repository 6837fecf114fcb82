//! Agent SQL: insert, lookups, listings, lineage and the guarded status
//! updates of the turn lifecycle.

use sqlx::sqlite::SqliteConnection;
use sqlx::SqlitePool;

use super::{DbError, DbResult};
use crate::events::AgentRef;
use crate::types::{AgentStatus, StopReason};

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
}

pub(crate) const COLUMNS: &str = "id, user_name, level, parent_id, root_id, parent_call_id, background, \
    definition, role, task, status, result, error, stop_reason, created_at, started_at, finished_at, turns, \
    tokens_in, tokens_out, cost_usd, subtree_cost_usd, max_turns, max_cost_usd, timeout_s, \
    deadline_at, budgeted, auto_wake_budget, effective_tools, notify, closed, metadata, turn_calls, \
    run_token, resume_msg_id, resume_count";

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

    /// Ancestors other than itself (parent and root), for budget roll-ups.
    pub fn ancestors(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(p) = &self.parent_id {
            v.push(p.clone());
        }
        if self.root_id != self.id && self.parent_id.as_deref() != Some(self.root_id.as_str()) {
            v.push(self.root_id.clone());
        }
        v
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
}

/// Inserts the row with status `queued`.
pub async fn insert(conn: &mut SqliteConnection, now: i64, a: &NewAgent) -> DbResult<()> {
    let tools = serde_json::to_string(&a.effective_tools).unwrap_or_else(|_| "[]".into());
    sqlx::query(
        "INSERT INTO agents (id, user_name, level, parent_id, root_id, parent_call_id, background,
                             definition, role, task, status, created_at, max_turns, max_cost_usd,
                             timeout_s, deadline_at, budgeted, auto_wake_budget, effective_tools,
                             notify, metadata, idempotency_key)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&a.id)
    .bind(&a.user_name)
    .bind(a.level)
    .bind(&a.parent_id)
    .bind(&a.root_id)
    .bind(&a.parent_call_id)
    .bind(a.background)
    .bind(&a.definition)
    .bind(&a.role)
    .bind(&a.task)
    .bind(now)
    .bind(a.max_turns)
    .bind(a.max_cost_usd)
    .bind(a.timeout_s)
    .bind(a.deadline_at)
    .bind(a.budgeted)
    .bind(a.auto_wake_budget)
    .bind(tools)
    .bind(&a.notify)
    .bind(&a.metadata)
    .bind(&a.idempotency_key)
    .execute(conn)
    .await?;
    Ok(())
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

/// Unfinished agents of a user (the `max_active_agents_per_user` limit).
pub async fn count_active_for_user(conn: &mut SqliteConnection, user: &str) -> DbResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM agents WHERE user_name = ? AND status IN ('queued','running','waiting')",
    )
    .bind(user)
    .fetch_one(conn)
    .await?)
}

/// Unfinished children of an agent (the `max_children_per_agent` limit).
pub async fn count_active_children(conn: &mut SqliteConnection, parent_id: &str) -> DbResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM agents WHERE parent_id = ? AND status IN ('queued','running','waiting')",
    )
    .bind(parent_id)
    .fetch_one(conn)
    .await?)
}

/// Marks the agent running under a new run token, recording the crash-resume
/// bookkeeping decided by the caller.
pub async fn mark_running(
    conn: &mut SqliteConnection,
    now: i64,
    id: &str,
    resume_msg_id: Option<i64>,
    resume_count: i64,
) -> DbResult<AgentRow> {
    Ok(sqlx::query_as::<_, AgentRow>(&format!(
        "UPDATE agents SET status = 'running', started_at = COALESCE(started_at, ?),
                           run_token = run_token + 1, resume_msg_id = ?, resume_count = ?
          WHERE id = ?
         RETURNING {COLUMNS}"
    ))
    .bind(now)
    .bind(resume_msg_id)
    .bind(resume_count)
    .bind(id)
    .fetch_one(conn)
    .await?)
}

/// Usage of one model call, added to the agent (guarded by the run token)
/// and its subtree cost rolled up to its ancestors. False when stale.
pub async fn add_model_usage(
    conn: &mut SqliteConnection,
    id: &str,
    run_token: i64,
    tokens_in: i64,
    tokens_out: i64,
    cost: f64,
    ancestors: &[String],
) -> DbResult<bool> {
    let r = sqlx::query(
        "UPDATE agents SET turns = turns + 1, turn_calls = turn_calls + 1,
                           tokens_in = tokens_in + ?, tokens_out = tokens_out + ?,
                           cost_usd = cost_usd + ?, subtree_cost_usd = subtree_cost_usd + ?
          WHERE id = ? AND run_token = ? AND status = 'running'",
    )
    .bind(tokens_in)
    .bind(tokens_out)
    .bind(cost)
    .bind(cost)
    .bind(id)
    .bind(run_token)
    .execute(&mut *conn)
    .await?;
    if r.rows_affected() == 0 {
        return Ok(false);
    }
    if cost > 0.0 && !ancestors.is_empty() {
        let list = serde_json::to_string(ancestors).unwrap_or_else(|_| "[]".into());
        sqlx::query(
            "UPDATE agents SET subtree_cost_usd = subtree_cost_usd + ?
              WHERE id IN (SELECT value FROM json_each(?))",
        )
        .bind(cost)
        .bind(list)
        .execute(&mut *conn)
        .await?;
    }
    Ok(true)
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

/// The smallest budget left over the agent and its ancestors (None when no
/// one in the chain has a cost cap).
pub async fn budget_left(pool: &SqlitePool, ids: &[String]) -> DbResult<Option<(f64, String)>> {
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
    let row: Option<(f64, String)> = sqlx::query_as(
        "SELECT max_cost_usd - subtree_cost_usd AS left, id FROM agents
          WHERE id IN (SELECT value FROM json_each(?)) AND max_cost_usd IS NOT NULL
          ORDER BY left ASC LIMIT 1",
    )
    .bind(list)
    .fetch_optional(pool)
    .await?;
    Ok(row)
}

/// Ends the agent's turn in a settled status (done/failed/cancelled/timed_out).
pub async fn settle(
    conn: &mut SqliteConnection,
    now: i64,
    id: &str,
    status: AgentStatus,
    reason: StopReason,
    result: Option<&str>,
    error: Option<&str>,
) -> DbResult<()> {
    sqlx::query(
        "UPDATE agents SET status = ?, stop_reason = ?, result = COALESCE(?, result), error = ?,
                           finished_at = ?
          WHERE id = ?",
    )
    .bind(status)
    .bind(reason)
    .bind(result)
    .bind(error)
    .bind(now)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

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

/// Wakes an idle agent for a new turn: queued, new turn counter, and the
/// auto-wake budget set to `budget`.
pub async fn wake(conn: &mut SqliteConnection, id: &str, budget: i64) -> DbResult<()> {
    sqlx::query(
        "UPDATE agents SET status = 'queued', turn_calls = 0, auto_wake_budget = ?, error = NULL,
                           stop_reason = NULL, finished_at = NULL
          WHERE id = ?",
    )
    .bind(budget)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
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
          WHERE deadline_at IS NOT NULL AND deadline_at <= ? AND status IN ('queued','running','waiting')
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
        "SELECT MIN(deadline_at) FROM agents
          WHERE deadline_at IS NOT NULL AND status IN ('queued','running','waiting')",
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

/// `budget_left` inside a write.
pub async fn budget_left_tx(
    conn: &mut SqliteConnection,
    ids: &[String],
) -> DbResult<Option<(f64, String)>> {
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
    let row: Option<(f64, String)> = sqlx::query_as(
        "SELECT max_cost_usd - subtree_cost_usd AS left, id FROM agents
          WHERE id IN (SELECT value FROM json_each(?)) AND max_cost_usd IS NOT NULL
          ORDER BY left ASC LIMIT 1",
    )
    .bind(list)
    .fetch_optional(conn)
    .await?;
    Ok(row)
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
