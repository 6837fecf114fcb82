//! `wait_for_agent` SQL: open waits, their resolution and deadlines.

use sqlx::sqlite::SqliteConnection;
use sqlx::SqlitePool;

use super::DbResult;

/// One wait.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WaitRow {
    pub id: i64,
    pub agent_id: String,
    pub tool_call_id: String,
    pub child_ids: String,
    pub mode: String,
    pub timeout_s: f64,
    pub deadline_at: i64,
    pub created_at: i64,
    pub resolved_at: Option<i64>,
}

impl WaitRow {
    /// The awaited agent ids.
    pub fn children(&self) -> Vec<String> {
        serde_json::from_str(&self.child_ids).unwrap_or_default()
    }

    /// True for mode `any`.
    pub fn any(&self) -> bool {
        self.mode == "any"
    }
}

const COLUMNS: &str =
    "id, agent_id, tool_call_id, child_ids, mode, timeout_s, deadline_at, created_at, resolved_at";

/// A new wait (or the existing one of this call, which is idempotent).
pub struct NewWait<'a> {
    pub agent_id: &'a str,
    pub call_id: &'a str,
    pub children: &'a [String],
    pub any: bool,
    pub timeout_s: f64,
    pub deadline_at: i64,
}

/// Records a wait unless this call already has one; returns the row.
pub async fn insert(conn: &mut SqliteConnection, now: i64, w: &NewWait<'_>) -> DbResult<WaitRow> {
    let children = serde_json::to_string(w.children).unwrap_or_else(|_| "[]".into());
    sqlx::query(
        "INSERT OR IGNORE INTO waits (agent_id, tool_call_id, child_ids, mode, timeout_s, deadline_at, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(w.agent_id)
    .bind(w.call_id)
    .bind(children)
    .bind(if w.any { "any" } else { "all" })
    .bind(w.timeout_s)
    .bind(w.deadline_at)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query_as::<_, WaitRow>(&format!(
        "SELECT {COLUMNS} FROM waits WHERE agent_id = ? AND tool_call_id = ?"
    ))
    .bind(w.agent_id)
    .bind(w.call_id)
    .fetch_one(conn)
    .await?)
}

/// The unresolved waits of these (waiting) agents.
pub async fn open_for(conn: &mut SqliteConnection, waiters: &[String]) -> DbResult<Vec<WaitRow>> {
    let list = serde_json::to_string(waiters).unwrap_or_else(|_| "[]".into());
    Ok(sqlx::query_as::<_, WaitRow>(&format!(
        "SELECT {COLUMNS} FROM waits
          WHERE resolved_at IS NULL AND agent_id IN (SELECT value FROM json_each(?))
          ORDER BY id"
    ))
    .bind(list)
    .fetch_all(conn)
    .await?)
}

/// Marks a wait resolved.
pub async fn resolve(conn: &mut SqliteConnection, now: i64, id: i64) -> DbResult<()> {
    sqlx::query("UPDATE waits SET resolved_at = ? WHERE id = ?")
        .bind(now)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Resolves the open wait of one tool call, if any.
pub async fn resolve_call(
    conn: &mut SqliteConnection,
    now: i64,
    agent_id: &str,
    call_id: &str,
) -> DbResult<()> {
    sqlx::query("UPDATE waits SET resolved_at = ? WHERE agent_id = ? AND tool_call_id = ? AND resolved_at IS NULL")
        .bind(now)
        .bind(agent_id)
        .bind(call_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// One wait by id, inside a write.
pub async fn get_tx(conn: &mut SqliteConnection, id: i64) -> DbResult<Option<WaitRow>> {
    Ok(
        sqlx::query_as::<_, WaitRow>(&format!("SELECT {COLUMNS} FROM waits WHERE id = ?"))
            .bind(id)
            .fetch_optional(conn)
            .await?,
    )
}

/// Unresolved waits whose deadline passed.
pub async fn expired(pool: &SqlitePool, now: i64, limit: i64) -> DbResult<Vec<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM waits WHERE resolved_at IS NULL AND deadline_at <= ? ORDER BY deadline_at LIMIT ?",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// The earliest deadline of an unresolved wait.
pub async fn next_deadline(pool: &SqlitePool) -> DbResult<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT MIN(deadline_at) FROM waits WHERE resolved_at IS NULL")
            .fetch_one(pool)
            .await?,
    )
}
