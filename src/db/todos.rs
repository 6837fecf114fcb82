//! Todo-list SQL.

use sqlx::sqlite::SqliteConnection;
use sqlx::SqlitePool;

use super::DbResult;

/// One stored item.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TodoRow {
    pub item_id: String,
    pub content: String,
    pub status: String,
    pub priority: String,
}

/// The list, in order.
pub async fn list(pool: &SqlitePool, agent_id: &str) -> DbResult<Vec<TodoRow>> {
    Ok(sqlx::query_as::<_, TodoRow>(
        "SELECT item_id, content, status, priority FROM todos WHERE agent_id = ? ORDER BY position",
    )
    .bind(agent_id)
    .fetch_all(pool)
    .await?)
}

/// The list, in order, inside a write.
pub async fn list_tx(conn: &mut SqliteConnection, agent_id: &str) -> DbResult<Vec<TodoRow>> {
    Ok(sqlx::query_as::<_, TodoRow>(
        "SELECT item_id, content, status, priority FROM todos WHERE agent_id = ? ORDER BY position",
    )
    .bind(agent_id)
    .fetch_all(conn)
    .await?)
}

/// Replaces the whole list.
pub async fn replace(
    conn: &mut SqliteConnection,
    now: i64,
    agent_id: &str,
    items: &[TodoRow],
) -> DbResult<()> {
    sqlx::query("DELETE FROM todos WHERE agent_id = ?")
        .bind(agent_id)
        .execute(&mut *conn)
        .await?;
    for (i, t) in items.iter().enumerate() {
        sqlx::query(
            "INSERT INTO todos (agent_id, item_id, position, content, status, priority, updated_at)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(agent_id)
        .bind(&t.item_id)
        .bind(i as i64)
        .bind(&t.content)
        .bind(&t.status)
        .bind(&t.priority)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The todo_write call last applied to this agent's list.
pub async fn last_write(conn: &mut SqliteConnection, agent_id: &str) -> DbResult<Option<String>> {
    Ok(
        sqlx::query_scalar("SELECT tool_call_id FROM todo_writes WHERE agent_id = ?")
            .bind(agent_id)
            .fetch_optional(conn)
            .await?,
    )
}

/// Remembers the todo_write call just applied.
pub async fn mark_written(
    conn: &mut SqliteConnection,
    now: i64,
    agent_id: &str,
    call_id: &str,
) -> DbResult<()> {
    sqlx::query(
        "INSERT INTO todo_writes (agent_id, tool_call_id, updated_at) VALUES (?, ?, ?)
         ON CONFLICT(agent_id) DO UPDATE SET tool_call_id = excluded.tool_call_id, updated_at = excluded.updated_at",
    )
    .bind(agent_id)
    .bind(call_id)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// How many items the list holds.
pub async fn count(pool: &SqlitePool, agent_id: &str) -> DbResult<i64> {
    Ok(
        sqlx::query_scalar("SELECT COUNT(*) FROM todos WHERE agent_id = ?")
            .bind(agent_id)
            .fetch_one(pool)
            .await?,
    )
}
