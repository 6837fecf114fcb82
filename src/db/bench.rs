//! Read-only queries the benchmarks use to watch and audit a run from
//! outside the service (W4 reads the database of the process it kills).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use super::DbResult;

/// A read-only pool on another process's database.
pub async fn open_observer(path: &Path) -> DbResult<SqlitePool> {
    let opts = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .busy_timeout(std::time::Duration::from_secs(10));
    Ok(SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await?)
}

/// Steps recorded so far: assistant answers plus tool results.
pub async fn recorded_steps(pool: &SqlitePool) -> DbResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM messages WHERE role = 'assistant' OR role = 'tool'",
    )
    .fetch_one(pool)
    .await?)
}

/// Agents not yet finished, over all users (the kept counter: cheap to
/// poll, unlike counting the agents table).
pub async fn active_agents(pool: &SqlitePool) -> DbResult<i64> {
    Ok(
        sqlx::query_scalar("SELECT COALESCE(sum(active_agents), 0) FROM user_stats")
            .fetch_one(pool)
            .await?,
    )
}

/// Finished agents: `(done, ended otherwise)` (failed, cancelled, timed out).
pub async fn finished_agents(pool: &SqlitePool) -> DbResult<(i64, i64)> {
    let (done, other): (Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT sum(status = 'done'),
                sum(status = 'failed' OR status = 'cancelled' OR status = 'timed_out')
           FROM agents",
    )
    .fetch_one(pool)
    .await?;
    Ok((done.unwrap_or(0), other.unwrap_or(0)))
}

/// Tool-call ids whose results are recorded.
pub async fn recorded_tool_calls(pool: &SqlitePool) -> DbResult<HashSet<String>> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT tool_call_id FROM messages WHERE role = 'tool' AND tool_call_id IS NOT NULL",
    )
    .fetch_all(pool)
    .await?;
    Ok(ids.into_iter().collect())
}

/// Recorded assistant answers per agent, keyed by the first line of the
/// agent's task.
pub async fn answers_by_task_line(pool: &SqlitePool) -> DbResult<HashMap<String, i64>> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT a.task, (SELECT count(*) FROM messages m
                          WHERE m.agent_id = a.id AND m.role = 'assistant')
           FROM agents a",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(task, n)| (task.lines().next().unwrap_or_default().to_string(), n))
        .collect())
}

/// When the children of `parent` were created (first, last) and when the
/// last of them finished, in epoch milliseconds.
pub async fn children_timeline(
    pool: &SqlitePool,
    parent: &str,
) -> DbResult<(Option<i64>, Option<i64>, Option<i64>)> {
    Ok(sqlx::query_as(
        "SELECT min(created_at), max(created_at), max(finished_at)
           FROM agents WHERE parent_id = ?",
    )
    .bind(parent)
    .fetch_one(pool)
    .await?)
}
