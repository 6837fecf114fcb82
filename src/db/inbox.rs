//! Inbox SQL: messages delivered to an agent and not yet appended to its
//! conversation. Taking the inbox moves rows into `messages` in one write.

use sqlx::sqlite::SqliteConnection;

use super::messages::MessageRow;
use super::DbResult;
use crate::types::Origin;

/// Puts one message in an agent's inbox.
pub async fn push(
    conn: &mut SqliteConnection,
    now: i64,
    agent_id: &str,
    content: &str,
    origin: Origin,
    sender: Option<&str>,
) -> DbResult<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO inbox (agent_id, content, origin, sender, created_at) VALUES (?, ?, ?, ?, ?)
         RETURNING id",
    )
    .bind(agent_id)
    .bind(content)
    .bind(origin)
    .bind(sender)
    .bind(now)
    .fetch_one(conn)
    .await?)
}

/// How many messages wait in the inbox.
pub async fn count(conn: &mut SqliteConnection, agent_id: &str) -> DbResult<i64> {
    Ok(
        sqlx::query_scalar("SELECT COUNT(*) FROM inbox WHERE agent_id = ?")
            .bind(agent_id)
            .fetch_one(conn)
            .await?,
    )
}

/// Moves the whole inbox into the conversation as user messages, in
/// delivery order, and returns the new message rows.
pub async fn take(
    conn: &mut SqliteConnection,
    now: i64,
    agent_id: &str,
) -> DbResult<Vec<MessageRow>> {
    let rows = sqlx::query_as::<_, MessageRow>(
        "INSERT INTO messages (agent_id, role, content, origin, sender, created_at)
         SELECT agent_id, 'user', content, origin, sender, ? FROM inbox WHERE agent_id = ? ORDER BY id
         RETURNING id, agent_id, role, content, tool_calls, tool_call_id, tool_name, is_error,
                   origin, sender, model, tokens_in, tokens_out, cost_usd, hidden, created_at",
    )
    .bind(now)
    .bind(agent_id)
    .fetch_all(&mut *conn)
    .await?;
    if !rows.is_empty() {
        sqlx::query("DELETE FROM inbox WHERE agent_id = ?")
            .bind(agent_id)
            .execute(&mut *conn)
            .await?;
    }
    let mut rows = rows;
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}
