//! Schedule SQL: schedules and the record of their fires.

use sqlx::sqlite::SqliteConnection;
use sqlx::SqlitePool;

use super::DbResult;

/// One schedule.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ScheduleRow {
    pub id: String,
    pub user_name: String,
    pub name: String,
    pub cron: String,
    pub timezone: Option<String>,
    pub kind: String,
    pub agent: Option<String>,
    pub task: Option<String>,
    pub target: Option<String>,
    pub notify: Option<String>,
    pub enabled: bool,
    pub overlap: String,
    pub last_fired_at: Option<i64>,
    pub next_fire_at: Option<i64>,
    pub last_agent_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

const COLUMNS: &str =
    "id, user_name, name, cron, timezone, kind, agent, task, target, notify, enabled, \
                       overlap, last_fired_at, next_fire_at, last_agent_id, created_at, updated_at";

/// One fire.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FireRow {
    pub fire_at: i64,
    pub outcome: String,
    pub agent_id: Option<String>,
    pub detail: Option<String>,
    pub created_at: i64,
}

/// Inserts a schedule.
pub async fn insert(conn: &mut SqliteConnection, s: &ScheduleRow) -> DbResult<()> {
    sqlx::query(&format!(
        "INSERT INTO schedules ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ))
    .bind(&s.id)
    .bind(&s.user_name)
    .bind(&s.name)
    .bind(&s.cron)
    .bind(&s.timezone)
    .bind(&s.kind)
    .bind(&s.agent)
    .bind(&s.task)
    .bind(&s.target)
    .bind(&s.notify)
    .bind(s.enabled)
    .bind(&s.overlap)
    .bind(s.last_fired_at)
    .bind(s.next_fire_at)
    .bind(&s.last_agent_id)
    .bind(s.created_at)
    .bind(s.updated_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Rewrites the editable fields of a schedule.
pub async fn update(conn: &mut SqliteConnection, s: &ScheduleRow) -> DbResult<()> {
    sqlx::query(
        "UPDATE schedules SET name = ?, cron = ?, timezone = ?, task = ?, notify = ?, enabled = ?,
                              overlap = ?, next_fire_at = ?, updated_at = ?
          WHERE id = ?",
    )
    .bind(&s.name)
    .bind(&s.cron)
    .bind(&s.timezone)
    .bind(&s.task)
    .bind(&s.notify)
    .bind(s.enabled)
    .bind(&s.overlap)
    .bind(s.next_fire_at)
    .bind(s.updated_at)
    .bind(&s.id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Deletes a schedule and its history.
pub async fn delete(conn: &mut SqliteConnection, id: &str) -> DbResult<bool> {
    sqlx::query("DELETE FROM schedule_fires WHERE schedule_id = ?")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    let r = sqlx::query("DELETE FROM schedules WHERE id = ?")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// One schedule by id.
pub async fn get(pool: &SqlitePool, id: &str) -> DbResult<Option<ScheduleRow>> {
    Ok(
        sqlx::query_as::<_, ScheduleRow>(&format!("SELECT {COLUMNS} FROM schedules WHERE id = ?"))
            .bind(id)
            .fetch_optional(pool)
            .await?,
    )
}

/// One schedule by id, inside a write.
pub async fn get_tx(conn: &mut SqliteConnection, id: &str) -> DbResult<Option<ScheduleRow>> {
    Ok(
        sqlx::query_as::<_, ScheduleRow>(&format!("SELECT {COLUMNS} FROM schedules WHERE id = ?"))
            .bind(id)
            .fetch_optional(conn)
            .await?,
    )
}

/// A user's schedules, oldest first.
pub async fn list(pool: &SqlitePool, user: &str) -> DbResult<Vec<ScheduleRow>> {
    Ok(sqlx::query_as::<_, ScheduleRow>(&format!(
        "SELECT {COLUMNS} FROM schedules WHERE user_name = ? ORDER BY created_at, id"
    ))
    .bind(user)
    .fetch_all(pool)
    .await?)
}

/// Every enabled schedule (the timer's view).
pub async fn enabled(pool: &SqlitePool) -> DbResult<Vec<ScheduleRow>> {
    Ok(sqlx::query_as::<_, ScheduleRow>(&format!(
        "SELECT {COLUMNS} FROM schedules WHERE enabled = 1 ORDER BY id"
    ))
    .fetch_all(pool)
    .await?)
}

/// Enabled schedules whose next fire is due.
pub async fn due(pool: &SqlitePool, now: i64) -> DbResult<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM schedules WHERE enabled = 1 AND next_fire_at IS NOT NULL AND next_fire_at <= ?
          ORDER BY next_fire_at",
    )
    .bind(now)
    .fetch_all(pool)
    .await?)
}

/// The earliest next fire of an enabled schedule.
pub async fn next_due(pool: &SqlitePool) -> DbResult<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT MIN(next_fire_at) FROM schedules WHERE enabled = 1")
            .fetch_one(pool)
            .await?,
    )
}

/// Claims an occurrence: false when it was handled before (the dedupe key).
pub async fn claim_fire(
    conn: &mut SqliteConnection,
    now: i64,
    id: &str,
    fire_at: i64,
    outcome: &str,
) -> DbResult<bool> {
    let r = sqlx::query(
        "INSERT OR IGNORE INTO schedule_fires (schedule_id, fire_at, outcome, created_at) VALUES (?, ?, ?, ?)",
    )
    .bind(id)
    .bind(fire_at)
    .bind(outcome)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Completes the record of an occurrence.
pub async fn record_fire(
    conn: &mut SqliteConnection,
    id: &str,
    fire_at: i64,
    outcome: &str,
    agent_id: Option<&str>,
    detail: Option<&str>,
) -> DbResult<()> {
    sqlx::query("UPDATE schedule_fires SET outcome = ?, agent_id = ?, detail = ? WHERE schedule_id = ? AND fire_at = ?")
        .bind(outcome)
        .bind(agent_id)
        .bind(detail)
        .bind(id)
        .bind(fire_at)
        .execute(conn)
        .await?;
    Ok(())
}

/// Advances a schedule after handling an occurrence.
pub async fn advance(
    conn: &mut SqliteConnection,
    id: &str,
    fired_at: Option<i64>,
    next_fire_at: Option<i64>,
    last_agent_id: Option<&str>,
) -> DbResult<()> {
    sqlx::query(
        "UPDATE schedules SET last_fired_at = COALESCE(?, last_fired_at), next_fire_at = ?,
                              last_agent_id = COALESCE(?, last_agent_id)
          WHERE id = ?",
    )
    .bind(fired_at)
    .bind(next_fire_at)
    .bind(last_agent_id)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The latest fires of a schedule, newest first.
pub async fn fires(pool: &SqlitePool, id: &str, limit: i64) -> DbResult<Vec<FireRow>> {
    Ok(sqlx::query_as::<_, FireRow>(
        "SELECT fire_at, outcome, agent_id, detail, created_at FROM schedule_fires
          WHERE schedule_id = ? ORDER BY fire_at DESC LIMIT ?",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}
