//! Queue SQL: enqueue (with dedupe keys), the one atomic claim for free
//! slots, lease heartbeat, completion, retry with backoff, release, the
//! rescuer's statements and pruning.

use sqlx::sqlite::SqliteConnection;
use sqlx::Row;

use super::{DbResult, RowKind, RowReq, Stmt, StmtOutput, WriteCtx};
use crate::types::JobKind;

/// A job to insert.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub kind: JobKind,
    pub agent_id: Option<String>,
    pub payload: String,
    pub priority: i64,
    /// None = now.
    pub run_at: Option<i64>,
    pub max_attempts: i64,
    pub dedupe_key: Option<String>,
}

impl NewJob {
    /// A job of `kind` with an empty payload, due now.
    pub fn new(kind: JobKind, max_attempts: i64) -> Self {
        Self {
            kind,
            agent_id: None,
            payload: "{}".into(),
            priority: 0,
            run_at: None,
            max_attempts,
            dedupe_key: None,
        }
    }
}

/// A job a worker now holds the lease of.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClaimedJob {
    pub id: i64,
    pub kind: JobKind,
    pub agent_id: Option<String>,
    pub payload: String,
    pub attempts: i64,
    pub max_attempts: i64,
}

impl ClaimedJob {
    /// The lease this claim holds.
    pub fn lease(&self, owner: &str) -> Lease {
        Lease {
            id: self.id,
            owner: owner.to_string(),
            attempts: self.attempts,
        }
    }
}

/// One claim of a job: updates are fenced by owner and claim generation
/// (`attempts`), so a run whose lease expired cannot touch the job's next
/// claim, even in the same process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    pub owner: String,
    pub attempts: i64,
}

/// Inserts one job; `None` when its dedupe key (or the one-live-turn rule)
/// already holds a job.
pub async fn insert(ctx: &mut WriteCtx, job: &NewJob) -> DbResult<Option<i64>> {
    let run_at = job.run_at.unwrap_or(ctx.now);
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT OR IGNORE INTO jobs
             (kind, agent_id, payload, state, priority, run_at, max_attempts, dedupe_key, created_at)
         VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?)
         RETURNING id",
    )
    .bind(job.kind)
    .bind(&job.agent_id)
    .bind(&job.payload)
    .bind(job.priority)
    .bind(run_at)
    .bind(job.max_attempts)
    .bind(&job.dedupe_key)
    .bind(ctx.now)
    .fetch_optional(&mut ctx.conn)
    .await?;
    if id.is_some() && run_at <= ctx.now {
        ctx.effects.job_ready = true;
    }
    Ok(id)
}

/// Enqueues a turn of `agent_id` unless one is already queued or running.
pub async fn enqueue_turn(ctx: &mut WriteCtx, agent_id: &str, max_attempts: i64) -> DbResult<bool> {
    let mut job = NewJob::new(JobKind::Turn, max_attempts);
    job.agent_id = Some(agent_id.to_string());
    Ok(insert(ctx, &job).await?.is_some())
}

/// The claim: up to `limit` due jobs in one statement, setting the lease
/// owner and expiry and counting the attempt.
pub fn claim_stmt(now: i64, node: &str, owner: &str, limit: i64, lease_ms: i64) -> Stmt {
    Stmt::new(
        "UPDATE jobs
            SET state = 'running', lease_node = ?, lease_owner = ?, lease_expires_at = ?,
                attempts = attempts + 1
          WHERE id IN (SELECT id FROM jobs
                        WHERE state = 'queued' AND run_at <= ?
                        ORDER BY priority DESC, run_at, id
                        LIMIT ?)
         RETURNING id, kind, agent_id, payload, attempts, max_attempts",
    )
    .arg(node)
    .arg(owner)
    .arg(now + lease_ms)
    .arg(now)
    .arg(limit)
}

/// Reads the claimed jobs out of `claim_stmt`'s output.
pub fn claimed(out: &[StmtOutput]) -> DbResult<Vec<ClaimedJob>> {
    out.iter()
        .flat_map(|o| o.rows.iter())
        .map(|r| Ok(<ClaimedJob as sqlx::FromRow<sqlx::sqlite::SqliteRow>>::from_row(r)?))
        .collect()
}

/// Extends every lease this owner holds, in one statement.
pub fn heartbeat_stmt(now: i64, owner: &str, lease_ms: i64) -> Stmt {
    Stmt::new("UPDATE jobs SET lease_expires_at = ? WHERE state = 'running' AND lease_owner = ?")
        .arg(now + lease_ms)
        .arg(owner)
}

/// Completes one held job.
pub fn complete_stmt(now: i64, lease: &Lease) -> Stmt {
    Stmt::new(
        "UPDATE jobs SET state = 'completed', finished_at = ?, lease_owner = NULL, lease_expires_at = NULL
          WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ?",
    )
    .arg(now)
    .arg(lease.id)
    .arg(lease.owner.as_str())
    .arg(lease.attempts)
}

/// One job as a row of the enqueue fast path (merged with concurrent
/// enqueues into one statement). A dedupe key already taken inserts nothing.
pub fn job_row(now: i64, job: &NewJob) -> RowReq {
    RowReq {
        kind: RowKind::Job,
        args: vec![
            job.kind.as_str().into(),
            job.agent_id.clone().into(),
            job.payload.as_str().into(),
            job.priority.into(),
            job.run_at.unwrap_or(now).into(),
            job.max_attempts.into(),
            job.dedupe_key.clone().into(),
            now.into(),
        ],
        key: (String::new(), String::new()),
    }
}

/// Many jobs in one statement (the batch enqueue): the jobs travel as one
/// JSON array, so any number of them binds as one argument.
pub fn insert_many_stmt(now: i64, jobs: &[NewJob]) -> Stmt {
    let list: Vec<serde_json::Value> = jobs
        .iter()
        .map(|j| {
            serde_json::json!({
                "kind": j.kind.as_str(),
                "agent_id": j.agent_id,
                "payload": j.payload,
                "priority": j.priority,
                "run_at": j.run_at.unwrap_or(now),
                "max_attempts": j.max_attempts,
                "dedupe_key": j.dedupe_key,
            })
        })
        .collect();
    Stmt::new(
        "INSERT OR IGNORE INTO jobs
             (kind, agent_id, payload, state, priority, run_at, max_attempts, dedupe_key, created_at)
         SELECT value ->> 'kind', value ->> 'agent_id', value ->> 'payload', 'queued',
                value ->> 'priority', value ->> 'run_at', value ->> 'max_attempts',
                value ->> 'dedupe_key', ?
           FROM json_each(?)",
    )
    .arg(now)
    .arg(serde_json::Value::Array(list).to_string())
    .waking()
}

/// Completes many held jobs in one statement.
pub fn complete_many_stmt(now: i64, ids: &[i64], owner: &str) -> Stmt {
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
    Stmt::new(
        "UPDATE jobs SET state = 'completed', finished_at = ?, lease_owner = NULL, lease_expires_at = NULL
          WHERE id IN (SELECT value FROM json_each(?)) AND state = 'running' AND lease_owner = ?",
    )
    .arg(now)
    .arg(list)
    .arg(owner)
}

/// Marks a held job completed. False when the lease was lost meanwhile.
pub async fn complete(conn: &mut SqliteConnection, now: i64, lease: &Lease) -> DbResult<bool> {
    let r = sqlx::query(
        "UPDATE jobs SET state = 'completed', finished_at = ?, lease_owner = NULL, lease_expires_at = NULL
          WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ?",
    )
    .bind(now)
    .bind(lease.id)
    .bind(&lease.owner)
    .bind(lease.attempts)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// What happened to a job that failed an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobFate {
    /// Back in the queue for `run_at`.
    Retrying,
    /// Out of attempts.
    Failed,
    /// The lease was lost; someone else owns the job now.
    LeaseLost,
}

/// Retries the job at `retry_at` if attempts remain, else fails it.
pub async fn retry_or_fail(
    ctx: &mut WriteCtx,
    lease: &Lease,
    error: &str,
    retry_at: i64,
) -> DbResult<JobFate> {
    let row = sqlx::query(
        "UPDATE jobs
            SET state = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END,
                run_at = ?, last_error = ?, lease_owner = NULL, lease_expires_at = NULL,
                finished_at = CASE WHEN attempts >= max_attempts THEN ? ELSE NULL END
          WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ?
         RETURNING state",
    )
    .bind(retry_at)
    .bind(error)
    .bind(ctx.now)
    .bind(lease.id)
    .bind(&lease.owner)
    .bind(lease.attempts)
    .fetch_optional(&mut ctx.conn)
    .await?;
    Ok(match row {
        None => JobFate::LeaseLost,
        Some(r) => {
            if r.get::<String, _>(0) == "failed" {
                JobFate::Failed
            } else {
                JobFate::Retrying
            }
        }
    })
}

/// Fails a held job at once (no retry).
pub async fn fail(
    conn: &mut SqliteConnection,
    now: i64,
    lease: &Lease,
    error: &str,
) -> DbResult<bool> {
    let r = sqlx::query(
        "UPDATE jobs SET state = 'failed', last_error = ?, finished_at = ?, lease_owner = NULL,
                         lease_expires_at = NULL
          WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ?",
    )
    .bind(error)
    .bind(now)
    .bind(lease.id)
    .bind(&lease.owner)
    .bind(lease.attempts)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Gives a held job back to the queue untouched (graceful shutdown); the
/// attempt it cost is returned too.
pub async fn release(conn: &mut SqliteConnection, lease: &Lease) -> DbResult<bool> {
    let r = sqlx::query(
        "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL,
                         attempts = MAX(attempts - 1, 0)
          WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ?",
    )
    .bind(lease.id)
    .bind(&lease.owner)
    .bind(lease.attempts)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Start-up rescue: every job this node's previous instances held goes back
/// to the queue at once (they cannot be running: that process is gone).
pub async fn rescue_node(ctx: &mut WriteCtx, node: &str, me: &str) -> DbResult<u64> {
    let r = sqlx::query(
        "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL, run_at = ?
          WHERE state = 'running' AND lease_node = ? AND lease_owner <> ?",
    )
    .bind(ctx.now)
    .bind(node)
    .bind(me)
    .execute(&mut ctx.conn)
    .await?;
    if r.rows_affected() > 0 {
        ctx.effects.job_ready = true;
    }
    Ok(r.rows_affected())
}

/// A job the rescuer took back from an expired lease.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RescuedJob {
    pub id: i64,
    pub kind: JobKind,
    pub agent_id: Option<String>,
    pub state: String,
}

/// Periodic rescue, one guarded statement: expired leases go back to the
/// queue, or fail when out of attempts.
pub async fn rescue_expired(ctx: &mut WriteCtx) -> DbResult<Vec<RescuedJob>> {
    let rows = sqlx::query_as::<_, RescuedJob>(
        "UPDATE jobs
            SET state = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END,
                finished_at = CASE WHEN attempts >= max_attempts THEN ? ELSE NULL END,
                last_error = 'lease expired', lease_owner = NULL, lease_expires_at = NULL
          WHERE state = 'running' AND lease_expires_at < ?
         RETURNING id, kind, agent_id, state",
    )
    .bind(ctx.now)
    .bind(ctx.now)
    .fetch_all(&mut ctx.conn)
    .await?;
    if rows.iter().any(|r| r.state == "queued") {
        ctx.effects.job_ready = true;
    }
    Ok(rows)
}

/// Cancels the queued jobs of these agents (they will never run).
pub async fn cancel_queued_for_agent(ctx: &mut WriteCtx, agent_id: &str) -> DbResult<u64> {
    let r = sqlx::query(
        "UPDATE jobs SET state = 'cancelled', finished_at = ?
          WHERE agent_id = ? AND state = 'queued'",
    )
    .bind(ctx.now)
    .bind(agent_id)
    .execute(&mut ctx.conn)
    .await?;
    Ok(r.rows_affected())
}

/// When the earliest queued job becomes due (the dispatcher sleeps until then).
pub async fn next_run_at(pool: &sqlx::SqlitePool) -> DbResult<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT MIN(run_at) FROM jobs WHERE state = 'queued'")
            .fetch_one(pool)
            .await?,
    )
}

/// Deletes up to `limit` finished jobs older than `before`.
pub async fn prune(ctx: &mut WriteCtx, before: i64, limit: i64) -> DbResult<u64> {
    let r = sqlx::query(
        "DELETE FROM jobs WHERE id IN (
            SELECT id FROM jobs WHERE finished_at IS NOT NULL AND finished_at < ? LIMIT ?)",
    )
    .bind(before)
    .bind(limit)
    .execute(&mut ctx.conn)
    .await?;
    Ok(r.rows_affected())
}

/// Counts jobs by state (metrics, tests, benchmarks).
pub async fn count_by_state(pool: &sqlx::SqlitePool) -> DbResult<Vec<(String, i64)>> {
    let rows = sqlx::query("SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state")
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1)))
        .collect())
}
