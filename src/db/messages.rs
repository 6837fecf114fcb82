//! Conversation SQL: the append-only `messages` table.

use sqlx::sqlite::SqliteConnection;
use sqlx::SqlitePool;

use super::{DbError, DbResult};
use crate::model::types::{ChatMessage, ToolCall};
use crate::types::{MsgRole, Origin};

/// One stored message.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MessageRow {
    pub id: i64,
    pub agent_id: String,
    pub role: MsgRole,
    pub content: String,
    pub tool_calls: Option<String>,
    pub tool_call_id: Option<String>,
    pub tool_name: Option<String>,
    pub is_error: bool,
    pub origin: Option<Origin>,
    pub sender: Option<String>,
    pub model: Option<String>,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    pub cost_usd: Option<f64>,
    pub hidden: bool,
    pub created_at: i64,
}

/// The message columns, as a literal usable in `concat!`.
macro_rules! message_columns {
    () => {
        "id, agent_id, role, content, tool_calls, tool_call_id, tool_name, is_error, origin, \
         sender, model, tokens_in, tokens_out, cost_usd, hidden, created_at"
    };
}
pub(crate) use message_columns;

const COLUMNS: &str = message_columns!();

impl MessageRow {
    /// The tool calls of an assistant message.
    pub fn calls(&self) -> DbResult<Vec<ToolCall>> {
        match &self.tool_calls {
            None => Ok(Vec::new()),
            Some(s) => serde_json::from_str(s)
                .map_err(|e| DbError::Corrupt(format!("message {} tool_calls: {e}", self.id))),
        }
    }

    /// Parses a row returned by a statement.
    pub fn from_sqlite(row: &sqlx::sqlite::SqliteRow) -> DbResult<Self> {
        Ok(<Self as sqlx::FromRow<sqlx::sqlite::SqliteRow>>::from_row(
            row,
        )?)
    }

    /// The message as the model sees it.
    pub fn to_chat(&self) -> DbResult<ChatMessage> {
        Ok(ChatMessage {
            role: self.role,
            content: self.content.clone(),
            tool_calls: self.calls()?,
            tool_call_id: self.tool_call_id.clone(),
        })
    }
}

/// A message to append.
#[derive(Debug, Clone)]
pub struct NewMessage<'a> {
    pub agent_id: &'a str,
    pub role: MsgRole,
    pub content: &'a str,
    pub tool_calls: Option<String>,
    pub tool_call_id: Option<&'a str>,
    pub tool_name: Option<&'a str>,
    pub is_error: bool,
    pub origin: Option<Origin>,
    pub sender: Option<&'a str>,
    pub model: Option<&'a str>,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    pub cost_usd: Option<f64>,
}

impl<'a> NewMessage<'a> {
    /// A plain message of `role`.
    pub fn plain(agent_id: &'a str, role: MsgRole, content: &'a str) -> Self {
        Self {
            agent_id,
            role,
            content,
            tool_calls: None,
            tool_call_id: None,
            tool_name: None,
            is_error: false,
            origin: None,
            sender: None,
            model: None,
            tokens_in: None,
            tokens_out: None,
            cost_usd: None,
        }
    }
}

/// Appends one message; returns its id.
pub async fn insert(conn: &mut SqliteConnection, now: i64, m: &NewMessage<'_>) -> DbResult<i64> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO messages (agent_id, role, content, tool_calls, tool_call_id, tool_name, is_error,
                               origin, sender, model, tokens_in, tokens_out, cost_usd, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         RETURNING id",
    )
    .bind(m.agent_id)
    .bind(m.role)
    .bind(m.content)
    .bind(&m.tool_calls)
    .bind(m.tool_call_id)
    .bind(m.tool_name)
    .bind(m.is_error)
    .bind(m.origin)
    .bind(m.sender)
    .bind(m.model)
    .bind(m.tokens_in)
    .bind(m.tokens_out)
    .bind(m.cost_usd)
    .bind(now)
    .fetch_one(conn)
    .await?;
    Ok(id)
}

/// Records a tool result unless the call already has one. Returns the new
/// id, or None when a result was already recorded (the step is not redone).
pub async fn insert_tool_result(
    conn: &mut SqliteConnection,
    now: i64,
    agent_id: &str,
    call_id: &str,
    tool_name: &str,
    content: &str,
    is_error: bool,
) -> DbResult<Option<i64>> {
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT OR IGNORE INTO messages (agent_id, role, content, tool_call_id, tool_name, is_error, created_at)
         VALUES (?, 'tool', ?, ?, ?, ?, ?)
         RETURNING id",
    )
    .bind(agent_id)
    .bind(content)
    .bind(call_id)
    .bind(tool_name)
    .bind(is_error)
    .bind(now)
    .fetch_optional(conn)
    .await?;
    Ok(id)
}

/// The messages the model sees (hidden ones left out), in order.
pub async fn context(pool: &SqlitePool, agent_id: &str) -> DbResult<Vec<MessageRow>> {
    Ok(sqlx::query_as::<_, MessageRow>(&format!(
        "SELECT {COLUMNS} FROM messages WHERE agent_id = ? AND hidden = 0 ORDER BY id"
    ))
    .bind(agent_id)
    .fetch_all(pool)
    .await?)
}

/// The same, inside a write.
pub async fn context_tx(conn: &mut SqliteConnection, agent_id: &str) -> DbResult<Vec<MessageRow>> {
    Ok(sqlx::query_as::<_, MessageRow>(&format!(
        "SELECT {COLUMNS} FROM messages WHERE agent_id = ? AND hidden = 0 ORDER BY id"
    ))
    .bind(agent_id)
    .fetch_all(conn)
    .await?)
}

/// Messages after `after_id` (hidden ones included), up to `limit`.
pub async fn page(
    pool: &SqlitePool,
    agent_id: &str,
    after_id: i64,
    limit: i64,
) -> DbResult<Vec<MessageRow>> {
    Ok(sqlx::query_as::<_, MessageRow>(&format!(
        "SELECT {COLUMNS} FROM messages WHERE agent_id = ? AND id > ? ORDER BY id LIMIT ?"
    ))
    .bind(agent_id)
    .bind(after_id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Tool results recorded for these call ids (inside a write).
pub async fn results_for_calls(
    conn: &mut SqliteConnection,
    agent_id: &str,
    call_ids: &[String],
) -> DbResult<Vec<MessageRow>> {
    let list = serde_json::to_string(call_ids).unwrap_or_else(|_| "[]".into());
    Ok(sqlx::query_as::<_, MessageRow>(&format!(
        "SELECT {COLUMNS} FROM messages
          WHERE agent_id = ? AND role = 'tool'
            AND tool_call_id IN (SELECT value FROM json_each(?))
          ORDER BY id"
    ))
    .bind(agent_id)
    .bind(list)
    .fetch_all(conn)
    .await?)
}

/// The id of the agent's newest message (its current step).
pub async fn last_id(conn: &mut SqliteConnection, agent_id: &str) -> DbResult<i64> {
    Ok(
        sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM messages WHERE agent_id = ?")
            .bind(agent_id)
            .fetch_one(conn)
            .await?,
    )
}

/// The newest assistant message (inside a write).
pub async fn last_assistant(
    conn: &mut SqliteConnection,
    agent_id: &str,
) -> DbResult<Option<MessageRow>> {
    Ok(sqlx::query_as::<_, MessageRow>(&format!(
        "SELECT {COLUMNS} FROM messages WHERE agent_id = ? AND role = 'assistant' AND hidden = 0
          ORDER BY id DESC LIMIT 1"
    ))
    .bind(agent_id)
    .fetch_optional(conn)
    .await?)
}

/// Hides messages with ids in `[from_id, to_id]` from the model's context.
pub async fn hide_range(
    conn: &mut SqliteConnection,
    agent_id: &str,
    from_id: i64,
    to_id: i64,
) -> DbResult<u64> {
    let r = sqlx::query("UPDATE messages SET hidden = 1 WHERE agent_id = ? AND id BETWEEN ? AND ?")
        .bind(agent_id)
        .bind(from_id)
        .bind(to_id)
        .execute(conn)
        .await?;
    Ok(r.rows_affected())
}

/// The newest visible messages of an agent, newest first.
pub async fn recent_tx(
    conn: &mut SqliteConnection,
    agent_id: &str,
    limit: i64,
) -> DbResult<Vec<MessageRow>> {
    Ok(sqlx::query_as::<_, MessageRow>(&format!(
        "SELECT {COLUMNS} FROM messages WHERE agent_id = ? AND hidden = 0 ORDER BY id DESC LIMIT ?"
    ))
    .bind(agent_id)
    .bind(limit)
    .fetch_all(conn)
    .await?)
}
