//! Approval SQL: tool calls that wait for a human's decision.

use sqlx::sqlite::SqliteConnection;
use sqlx::SqlitePool;

use super::DbResult;

/// One approval.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApprovalRow {
    pub id: String,
    pub agent_id: String,
    pub user_name: String,
    pub tool_call_id: String,
    pub tool: String,
    pub arguments: String,
    pub status: String,
    pub reason: Option<String>,
    pub decided_by: Option<String>,
    pub created_at: i64,
    pub decided_at: Option<i64>,
}

const COLUMNS: &str =
    "id, agent_id, user_name, tool_call_id, tool, arguments, status, reason, decided_by, created_at, decided_at";

/// The approval of one tool call, if requested.
pub async fn for_call(
    conn: &mut SqliteConnection,
    agent_id: &str,
    call_id: &str,
) -> DbResult<Option<ApprovalRow>> {
    Ok(sqlx::query_as::<_, ApprovalRow>(&format!(
        "SELECT {COLUMNS} FROM approvals WHERE agent_id = ? AND tool_call_id = ?"
    ))
    .bind(agent_id)
    .bind(call_id)
    .fetch_optional(conn)
    .await?)
}

/// Requests an approval (pending).
pub async fn insert(
    conn: &mut SqliteConnection,
    now: i64,
    agent_id: &str,
    user: &str,
    call_id: &str,
    tool: &str,
    arguments: &str,
) -> DbResult<ApprovalRow> {
    let id = uuid::Uuid::new_v4().to_string();
    sqlx::query(
        "INSERT INTO approvals (id, agent_id, user_name, tool_call_id, tool, arguments, status, created_at)
         VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)",
    )
    .bind(&id)
    .bind(agent_id)
    .bind(user)
    .bind(call_id)
    .bind(tool)
    .bind(arguments)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    get_tx(conn, &id)
        .await
        .map(|r| r.unwrap_or_else(|| unreachable_row(&id)))
}

fn unreachable_row(id: &str) -> ApprovalRow {
    // Inserted in the same transaction just above.
    ApprovalRow {
        id: id.to_string(),
        agent_id: String::new(),
        user_name: String::new(),
        tool_call_id: String::new(),
        tool: String::new(),
        arguments: String::new(),
        status: "pending".into(),
        reason: None,
        decided_by: None,
        created_at: 0,
        decided_at: None,
    }
}

/// One approval by id, inside a write.
pub async fn get_tx(conn: &mut SqliteConnection, id: &str) -> DbResult<Option<ApprovalRow>> {
    Ok(
        sqlx::query_as::<_, ApprovalRow>(&format!("SELECT {COLUMNS} FROM approvals WHERE id = ?"))
            .bind(id)
            .fetch_optional(conn)
            .await?,
    )
}

/// Pending approvals, oldest first; of one user, or of everyone.
pub async fn pending(pool: &SqlitePool, user: Option<&str>) -> DbResult<Vec<ApprovalRow>> {
    Ok(sqlx::query_as::<_, ApprovalRow>(&format!(
        "SELECT {COLUMNS} FROM approvals
          WHERE status = 'pending' AND (? IS NULL OR user_name = ?)
          ORDER BY created_at, id LIMIT 500"
    ))
    .bind(user)
    .bind(user)
    .fetch_all(pool)
    .await?)
}

/// Records a decision on a pending approval; false when it was not pending.
pub async fn decide(
    conn: &mut SqliteConnection,
    now: i64,
    id: &str,
    approve: bool,
    reason: Option<&str>,
    by: &str,
) -> DbResult<bool> {
    let r = sqlx::query(
        "UPDATE approvals SET status = ?, reason = ?, decided_by = ?, decided_at = ?
          WHERE id = ? AND status = 'pending'",
    )
    .bind(if approve { "approved" } else { "denied" })
    .bind(reason)
    .bind(by)
    .bind(now)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}
