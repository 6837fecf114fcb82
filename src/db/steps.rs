//! SQL of the turn lifecycle, each operation one round trip: start a run,
//! record an answer or a tool result (rows the writer merges across agents),
//! move the inbox into the conversation, suspend.

use sqlx::Row;

use super::agents::{agent_columns, AgentRow};
use super::jobs::Lease;
use super::messages::{message_columns, MessageRow};
use super::writer::run_stmts;
use super::{DbResult, RowKind, RowReq, Stmt, StmtOutput, WriteCtx};

/// A started run.
pub struct Started {
    pub agent: AgentRow,
    /// Messages wait in the inbox.
    pub inbox_waiting: bool,
    /// The conversation the model sees, when it is short enough to come back
    /// with the start (else None: read it from the read pool).
    pub context: Option<Vec<MessageRow>>,
}

/// Conversations up to this many messages come back with the start script;
/// longer ones are read on the read pool so the writer never does a big read.
pub const START_CONTEXT_LIMIT: usize = 256;

/// Takes a queued agent (or one whose previous run crashed: then the crash
/// is counted per step in `resume_count`), journals `turn_started`, and
/// reports whether the inbox holds messages.
const START: &str = concat!(
    "UPDATE agents
        SET resume_count = CASE WHEN status = 'running' THEN
                (CASE WHEN resume_msg_id = (SELECT COALESCE(MAX(m.id), 0) FROM messages m WHERE m.agent_id = agents.id)
                      THEN resume_count + 1 ELSE 1 END)
                ELSE 0 END,
            resume_msg_id = CASE WHEN status = 'running' THEN
                (SELECT COALESCE(MAX(m.id), 0) FROM messages m WHERE m.agent_id = agents.id) ELSE NULL END,
            status = 'running', started_at = COALESCE(started_at, ?), run_token = run_token + 1
      WHERE id = ? AND (status = 'queued' OR status = 'running');
     INSERT INTO events (agent_id, kind, data, created_at)
     SELECT id, 'turn_started',
            CASE WHEN resume_count > 0 THEN '{\"resumed\":true}' ELSE '{\"resumed\":false}' END, ?
       FROM agents WHERE id = ? AND changes() = 1;
     SELECT ",
    agent_columns!(),
    " FROM agents WHERE id = ? AND changes() = 1;
     SELECT EXISTS (SELECT 1 FROM inbox WHERE agent_id = ?);
     SELECT ",
    message_columns!(),
    " FROM messages WHERE agent_id = ? AND hidden = 0 ORDER BY id LIMIT 257"
);

/// The start script for `id`.
pub fn start(id: &str, now: i64) -> Stmt {
    Stmt::new(START)
        .arg(now)
        .arg(id)
        .arg(now)
        .arg(id)
        .arg(id)
        .arg(id)
        .arg(id)
}

/// Reads the start script's output: None when the agent was not startable
/// (settled, waiting, gone).
pub fn started(out: &[StmtOutput]) -> DbResult<Option<Started>> {
    let Some(row) = out.get(2).and_then(|o| o.rows.first()) else {
        return Ok(None);
    };
    let agent = AgentRow::from_sqlite(row)?;
    let inbox_waiting = out
        .get(3)
        .and_then(|o| o.rows.first())
        .map(|r| r.get::<i64, _>(0) != 0)
        .unwrap_or(false);
    let context = match out.get(4) {
        Some(o) if o.rows.len() <= START_CONTEXT_LIMIT => Some(
            o.rows
                .iter()
                .map(MessageRow::from_sqlite)
                .collect::<DbResult<Vec<_>>>()?,
        ),
        _ => None,
    };
    Ok(Some(Started {
        agent,
        inbox_waiting,
        context,
    }))
}

/// A model answer as a row; the `messages_assistant_usage` trigger adds its
/// usage and cost to the agent and its ancestors. No id comes back when the
/// agent no longer runs under `run_token`.
#[allow(clippy::too_many_arguments)]
pub fn assistant_row(
    agent_id: &str,
    run_token: i64,
    now: i64,
    content: &str,
    tool_calls: Option<String>,
    model: &str,
    tokens_in: i64,
    tokens_out: i64,
    cost_usd: f64,
) -> RowReq {
    RowReq {
        kind: RowKind::Assistant,
        args: vec![
            agent_id.into(),
            content.into(),
            tool_calls.into(),
            model.into(),
            tokens_in.into(),
            tokens_out.into(),
            cost_usd.into(),
            now.into(),
            run_token.into(),
        ],
        key: (agent_id.to_string(), String::new()),
    }
}

/// A tool result as a row; no id comes back when the call already has a
/// result or the agent no longer runs under `run_token`.
pub fn tool_result_row(
    agent_id: &str,
    run_token: i64,
    now: i64,
    call_id: &str,
    tool_name: &str,
    content: &str,
    is_error: bool,
) -> RowReq {
    RowReq {
        kind: RowKind::ToolResult,
        args: vec![
            agent_id.into(),
            content.into(),
            call_id.into(),
            tool_name.into(),
            is_error.into(),
            now.into(),
            run_token.into(),
        ],
        key: (agent_id.to_string(), call_id.to_string()),
    }
}

const TAKE_INBOX: &str = concat!(
    "INSERT INTO messages (agent_id, role, content, origin, sender, created_at)
     SELECT agent_id, 'user', content, origin, sender, ? FROM inbox
      WHERE agent_id = ?
        AND EXISTS (SELECT 1 FROM agents WHERE id = ? AND run_token = ? AND status = 'running')
      ORDER BY id
     RETURNING ",
    message_columns!(),
    ";
     DELETE FROM inbox WHERE agent_id = ?
        AND EXISTS (SELECT 1 FROM agents WHERE id = ? AND run_token = ? AND status = 'running')"
);

/// Moves the inbox into the conversation (in delivery order) if the agent
/// still runs under `run_token`.
pub async fn take_inbox(ctx: &mut WriteCtx, id: &str, run_token: i64) -> DbResult<Vec<MessageRow>> {
    let now = ctx.now;
    let script = Stmt::new(TAKE_INBOX)
        .arg(now)
        .arg(id)
        .arg(id)
        .arg(run_token)
        .arg(id)
        .arg(id)
        .arg(run_token);
    let out = run_stmts(ctx, &script).await?;
    let mut rows = Vec::new();
    if let Some(o) = out.first() {
        for r in &o.rows {
            rows.push(MessageRow::from_sqlite(r)?);
        }
    }
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}

const SUSPEND: &str = "UPDATE agents SET status = 'waiting'
      WHERE id = ? AND run_token = ? AND status = 'running'
        AND (SELECT COUNT(*) FROM messages
              WHERE agent_id = ? AND role = 'tool'
                AND tool_call_id IN (SELECT value FROM json_each(?)))
          + (SELECT COUNT(*) FROM approvals
              WHERE agent_id = ? AND status = 'approved'
                AND tool_call_id IN (SELECT value FROM json_each(?))) < ?
     RETURNING id;
     UPDATE jobs SET state = 'completed', finished_at = ?, lease_owner = NULL, lease_expires_at = NULL
      WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ?
        AND EXISTS (SELECT 1 FROM agents WHERE id = ? AND run_token = ? AND status = 'waiting');
     INSERT INTO events (agent_id, kind, data, created_at)
     SELECT ?, 'agent_waiting', ?, ?
      WHERE EXISTS (SELECT 1 FROM agents WHERE id = ? AND run_token = ? AND status = 'waiting')";

/// Suspends the run: `waiting`, job completed, `agent_waiting` journalled —
/// unless every call in `pending` already has a result, or (for the calls
/// in `gated`, which wait on a human) an approval that came in meanwhile.
/// True when suspended.
#[allow(clippy::too_many_arguments)]
pub async fn suspend(
    ctx: &mut WriteCtx,
    id: &str,
    run_token: i64,
    lease: &Lease,
    pending: &[String],
    gated: &[String],
    event_data: &str,
) -> DbResult<bool> {
    let now = ctx.now;
    let calls = serde_json::to_string(pending).unwrap_or_else(|_| "[]".into());
    let gated = serde_json::to_string(gated).unwrap_or_else(|_| "[]".into());
    let script = Stmt::new(SUSPEND)
        .arg(id)
        .arg(run_token)
        .arg(id)
        .arg(calls)
        .arg(id)
        .arg(gated)
        .arg(pending.len() as i64)
        .arg(now)
        .arg(lease.id)
        .arg(lease.owner.as_str())
        .arg(lease.attempts)
        .arg(id)
        .arg(run_token)
        .arg(id)
        .arg(event_data)
        .arg(now)
        .arg(id)
        .arg(run_token);
    let out = run_stmts(ctx, &script).await?;
    Ok(out.first().is_some_and(|o| !o.rows.is_empty()))
}
