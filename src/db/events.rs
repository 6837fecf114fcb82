//! Event journal SQL. `emit` journals lifecycle events and queues every event
//! for broadcast after the surrounding write commits.

use serde_json::Value;
use sqlx::SqlitePool;

use super::{DbResult, WriteCtx};
use crate::events::Event;

/// Journals (when the kind is journalled) and queues `e` for broadcast.
pub async fn emit(ctx: &mut WriteCtx, e: Event) -> DbResult<()> {
    if e.kind.is_journalled() {
        sqlx::query("INSERT INTO events (agent_id, kind, data, created_at) VALUES (?, ?, ?, ?)")
            .bind(&e.agent_id)
            .bind(e.kind.as_str())
            .bind(e.data.to_string())
            .bind(e.at)
            .execute(&mut ctx.conn)
            .await?;
    }
    ctx.effects.events.push(e);
    Ok(())
}

/// One journalled event.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRow {
    pub id: i64,
    pub agent_id: Option<String>,
    pub kind: String,
    pub data: String,
    pub created_at: i64,
}

impl EventRow {
    pub fn data_json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// The journal of one agent, oldest first, optionally of one kind.
pub async fn for_agent(
    pool: &SqlitePool,
    agent_id: &str,
    kind: Option<&str>,
) -> DbResult<Vec<EventRow>> {
    Ok(sqlx::query_as::<_, EventRow>(
        "SELECT id, agent_id, kind, data, created_at FROM events
          WHERE agent_id = ? AND (? IS NULL OR kind = ?) ORDER BY id",
    )
    .bind(agent_id)
    .bind(kind)
    .bind(kind)
    .fetch_all(pool)
    .await?)
}
