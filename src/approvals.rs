//! Human approval of tool calls (`[tools] approval`, SPEC §13). A call of a
//! gated tool suspends the agent with an `approval_requested` event; a human
//! approves (the agent resumes and the call runs) or denies (the call's
//! result is `denied by user: <reason>`). A tool outside the agent's
//! effective set never reaches the gate.

use std::sync::Arc;

use serde_json::json;

use crate::core::{Core, User};
use crate::db::agents::{self, AgentRow};
use crate::db::approvals::{self, ApprovalRow};
use crate::db::{events, jobs, messages, DbError, WriteCtx, WriteFuture};
use crate::events::EventKind;
use crate::lifecycle;
use crate::model::types::ToolCall;
use crate::types::AgentStatus;

/// What the gate says about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    Run,
    /// Requested (now or before); the agent waits.
    Wait,
    Denied(String),
}

/// Checks (and on first sight requests) the approval of a call.
pub async fn gate(core: &Arc<Core>, agent: &AgentRow, call: &ToolCall) -> Result<Gate, DbError> {
    let a = agent.clone();
    let c = call.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, Gate> {
            Box::pin(async move {
                if let Some(row) = approvals::for_call(&mut ctx.conn, &a.id, &c.id).await? {
                    return Ok(match row.status.as_str() {
                        "approved" => Gate::Run,
                        "denied" => Gate::Denied(row.reason.unwrap_or_default()),
                        _ => Gate::Wait,
                    });
                }
                let row = approvals::insert(&mut ctx.conn, ctx.now, &a.id, &a.user_name, &c.id, &c.name, &c.arguments)
                    .await?;
                let ev = a.agent_ref().event(
                    EventKind::ApprovalRequested,
                    ctx.now,
                    json!({"approval_id": row.id, "tool": c.name, "arguments": c.arguments, "tool_call_id": c.id}),
                );
                events::emit(ctx, ev).await?;
                Ok(Gate::Wait)
            })
        })
        .await
}

/// Why a decision was refused.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("approval `{0}` not found")]
    NotFound(String),
    #[error("approval `{0}` was already decided ({1})")]
    Decided(String, String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A human decides. Approving requeues the waiting agent (the call then
/// runs); denying records the call's result and resumes the agent when
/// nothing else is pending. Only the agent's user or an admin may decide.
pub async fn decide(
    core: &Arc<Core>,
    user: &User,
    id: &str,
    approve: bool,
    reason: Option<String>,
) -> Result<ApprovalRow, DecideError> {
    let core2 = Arc::clone(core);
    let user = user.clone();
    let id = id.to_string();
    core.db
        .write(
            move |ctx: &mut WriteCtx| -> WriteFuture<'_, Result<ApprovalRow, DecideError>> {
                Box::pin(async move {
                    let Some(row) = approvals::get_tx(&mut ctx.conn, &id).await? else {
                        return Ok(Err(DecideError::NotFound(id)));
                    };
                    if row.user_name != user.name && !user.admin {
                        return Ok(Err(DecideError::NotFound(id)));
                    }
                    if !approvals::decide(
                        &mut ctx.conn,
                        ctx.now,
                        &id,
                        approve,
                        reason.as_deref(),
                        &user.name,
                    )
                    .await?
                    {
                        return Ok(Err(DecideError::Decided(id, row.status)));
                    }
                    if approve {
                        if let Some(a) = agents::get_tx(&mut ctx.conn, &row.agent_id).await? {
                            if a.status == AgentStatus::Waiting {
                                agents::set_status(&mut ctx.conn, &a.id, AgentStatus::Queued)
                                    .await?;
                                jobs::enqueue_turn(ctx, &a.id, core2.cfg.workers.max_attempts)
                                    .await?;
                            }
                            // A running agent sees the approval when it suspends.
                        }
                    } else {
                        let text = format!(
                            "denied by user: {}",
                            reason.as_deref().unwrap_or("no reason given")
                        );
                        messages::insert_tool_result(
                            &mut ctx.conn,
                            ctx.now,
                            &row.agent_id,
                            &row.tool_call_id,
                            &row.tool,
                            &text,
                            true,
                        )
                        .await?;
                        lifecycle::resume_if_ready(ctx, &core2, &row.agent_id).await?;
                    }
                    Ok(approvals::get_tx(&mut ctx.conn, &id)
                        .await?
                        .ok_or(DecideError::NotFound(id)))
                })
            },
        )
        .await?
}
