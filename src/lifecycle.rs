//! How agents settle, and what settling sets off. Settling is an outbox: the
//! terminal status, the result to the parent (a tool result for a foreground
//! child, an inbox message for a background one) and the webhook job are
//! written in one transaction, so a crash can delay a completion but never
//! lose it. Cancellation marks a whole subtree in one transaction before any
//! running turn is interrupted.

use std::sync::Arc;

use serde_json::json;

use crate::core::Core;
use crate::db::agents::{self, AgentRow, Settlement};
use crate::db::messages;
use crate::db::{jobs, waits, DbError, DbResult, WriteCtx, WriteFuture};
use crate::delivery::{self, DeliverError};
use crate::events::EventKind;
use crate::types::{AgentStatus, Origin, StopReason};

/// How an agent's turn ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: AgentStatus,
    pub reason: StopReason,
    /// None keeps the previous result (the partial result of a stopped turn).
    pub result: Option<String>,
    pub error: Option<String>,
}

impl Outcome {
    pub fn done(result: String) -> Self {
        Self {
            status: AgentStatus::Done,
            reason: StopReason::Done,
            result: Some(result),
            error: None,
        }
    }

    pub fn failed(reason: StopReason, error: String) -> Self {
        Self {
            status: AgentStatus::Failed,
            reason,
            result: None,
            error: Some(error),
        }
    }

    pub fn timed_out(error: String) -> Self {
        Self {
            status: AgentStatus::TimedOut,
            reason: StopReason::Deadline,
            result: None,
            error: Some(error),
        }
    }

    pub fn cancelled(error: String) -> Self {
        Self {
            status: AgentStatus::Cancelled,
            reason: StopReason::Cancelled,
            result: None,
            error: Some(error),
        }
    }
}

/// A compact count: 950, 2.1k, 1.3M.
fn compact(n: i64) -> String {
    match n {
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// The one place that formats a sub-agent result header (SPEC §4).
/// `handle` is given for background completions (`[Sub-agent <h> …]`).
pub fn result_header(a: &AgentRow, handle: Option<&str>) -> String {
    let who = match handle {
        Some(h) => format!("Sub-agent {h}"),
        None => "Sub-agent".to_string(),
    };
    let elapsed_ms = a.finished_at.unwrap_or(a.created_at) - a.created_at;
    let stats = format!(
        "{} turns · {} tokens · ${:.4} · {:.1}s",
        a.turns,
        compact(a.tokens_in + a.tokens_out),
        a.cost_usd,
        elapsed_ms as f64 / 1000.0
    );
    match (a.status, a.stop_reason) {
        (AgentStatus::Done, _) => format!("[{who} completed · {stats}]"),
        (AgentStatus::Failed, Some(StopReason::TurnLimit)) => {
            format!("[{who} hit turn limit · {stats}]")
        }
        (AgentStatus::Failed, _) => format!(
            "[{who} failed: {}]",
            a.error.as_deref().unwrap_or("unknown error")
        ),
        (AgentStatus::TimedOut, _) => {
            let secs = a
                .deadline_at
                .map(|d| ((d - a.created_at) as f64 / 1000.0).round() as i64)
                .or(a.timeout_s.map(|t| t.round() as i64))
                .unwrap_or(0);
            format!("[{who} timed out after {secs}s]")
        }
        (AgentStatus::Cancelled, _) => format!("[{who} cancelled]"),
        (s, _) => format!("[{who} is {s}]"),
    }
}

/// Header, blank line, result (the result is left out when empty). A note
/// names requested tools the child did not get because its parent lacks
/// them.
pub fn result_message(a: &AgentRow, handle: Option<&str>) -> String {
    let mut text = result_header(a, handle);
    let dropped = a.dropped();
    if !dropped.is_empty() {
        text.push_str(&format!(
            "\nNote: requested tools not granted (the parent lacks them): {}",
            dropped.join(", ")
        ));
    }
    if let Some(r) = a.result.as_deref().map(str::trim).filter(|r| !r.is_empty()) {
        text.push_str("\n\n");
        text.push_str(r);
    }
    text
}

/// The handle of an agent inside a write.
pub async fn handle_tx(ctx: &mut WriteCtx, a: &AgentRow) -> DbResult<String> {
    let (prev, next) = agents::neighbours(&mut ctx.conn, &a.user_name, &a.id).await?;
    Ok(crate::handles::from_neighbours(
        &a.id,
        prev.as_deref(),
        next.as_deref(),
    ))
}

/// The stored form of an outcome, with its `agent_finished` event data.
pub fn settlement(o: &Outcome) -> Settlement<'_> {
    let preview: Option<String> = o.result.as_deref().map(|r| r.chars().take(200).collect());
    Settlement {
        status: o.status,
        reason: o.reason,
        result: o.result.as_deref(),
        error: o.error.as_deref(),
        event_data: json!({"status": o.status, "reason": o.reason, "error": o.error,
                           "result_preview": preview})
        .to_string(),
    }
}

/// Settles `agent` (whatever its state) and sends its completion where it
/// belongs.
pub async fn settle_tx(
    ctx: &mut WriteCtx,
    core: &Core,
    agent: &AgentRow,
    o: Outcome,
    tell_parent: bool,
) -> DbResult<AgentRow> {
    let settled = agents::settle(ctx, &agent.id, &settlement(&o)).await?;
    after_settle_tx(ctx, core, &settled, tell_parent).await?;
    Ok(settled)
}

/// Broadcasts `agent_finished` for a settle that needed no follow-up.
pub fn publish_finished(core: &Core, settled: &AgentRow, at: i64) {
    if core.signals.has_listeners() {
        core.signals.publish(finished_event(settled, at));
    }
}

fn finished_event(settled: &AgentRow, at: i64) -> crate::events::Event {
    let preview: String = settled
        .result
        .as_deref()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect();
    settled.agent_ref().event(
        EventKind::AgentFinished,
        at,
        json!({"status": settled.status, "reason": settled.stop_reason, "error": settled.error,
               "result_preview": preview}),
    )
}

/// What follows a settle in the same transaction: queued jobs of a final
/// agent are cancelled and its running turn interrupted (after commit), the
/// `agent_finished` event is broadcast, the webhook job is written, and the
/// parent is told.
pub async fn after_settle_tx(
    ctx: &mut WriteCtx,
    core: &Core,
    settled: &AgentRow,
    tell_parent: bool,
) -> DbResult<()> {
    if settled.status.is_final() {
        jobs::cancel_queued_for_agent(ctx, &settled.id).await?;
        ctx.effects.cancel.push(settled.id.clone());
    }
    ctx.effects.events.push(finished_event(settled, ctx.now));
    crate::notify::enqueue_tx(ctx, core, settled).await?;
    // Ancestors waiting on this agent are answered even when the parent is
    // not told (a cancelled subtree's members), so no wait is left hanging.
    let awaited_by_parent = resolve_waits_on(ctx, core, settled).await?;
    if tell_parent {
        report_to_parent(ctx, core, settled, awaited_by_parent).await?;
    }
    Ok(())
}

/// The child's completion reaches its parent: a foreground child's result
/// becomes the spawn call's tool result (and resumes the parent when nothing
/// else is pending); a background child's result is delivered to the
/// parent's inbox with origin `child`.
async fn report_to_parent(
    ctx: &mut WriteCtx,
    core: &Core,
    child: &AgentRow,
    awaited_by_parent: bool,
) -> DbResult<()> {
    let Some(parent_id) = child.parent_id.clone() else {
        return Ok(());
    };
    // A parent waiting on this child gets it through its wait and needs no
    // inbox message about it.
    if child.background && awaited_by_parent {
        return Ok(());
    }
    if child.background {
        let handle = handle_tx(ctx, child).await?;
        let m = delivery::Message {
            target: parent_id.clone(),
            content: result_message(child, Some(&handle)),
            origin: Origin::Child,
            sender: Some(child.id.clone()),
            interrupt: false,
        };
        match delivery::deliver_tx(ctx, core, &m).await {
            Ok(_) => {}
            Err(DeliverError::Db(e)) => return Err(e),
            Err(refused) => {
                // The parent is closed, cancelled or timed out: nobody is
                // left to read the completion.
                tracing::info!(agent_id = %child.id, parent_id = %parent_id, reason = %refused,
                    "background completion not delivered");
            }
        }
    } else if let Some(call_id) = &child.parent_call_id {
        let text = result_message(child, None);
        messages::insert_tool_result(
            &mut ctx.conn,
            ctx.now,
            &parent_id,
            call_id,
            "spawn_agent",
            &text,
            child.status != AgentStatus::Done,
        )
        .await?;
        resume_if_ready(ctx, core, &parent_id).await?;
    }
    Ok(())
}

/// Resolves the open waits (of the child's ancestors) that this child's
/// settling satisfies. Returns whether the child's parent has an open wait
/// on it (satisfied or not).
async fn resolve_waits_on(ctx: &mut WriteCtx, core: &Core, child: &AgentRow) -> DbResult<bool> {
    let ancestors = child.ancestors();
    if ancestors.is_empty() {
        return Ok(false);
    }
    let mut awaited_by_parent = false;
    for w in waits::open_for(&mut ctx.conn, &ancestors).await? {
        let ids = w.children();
        if !ids.contains(&child.id) {
            continue;
        }
        if Some(&w.agent_id) == child.parent_id.as_ref() {
            awaited_by_parent = true;
        }
        let mut rows = Vec::with_capacity(ids.len());
        for id in &ids {
            if let Some(r) = agents::get_tx(&mut ctx.conn, id).await? {
                rows.push(r);
            }
        }
        let settled = rows.iter().filter(|r| r.status.is_settled()).count();
        let satisfied = if w.any() {
            settled > 0
        } else {
            settled == rows.len()
        };
        if satisfied {
            finish_wait(ctx, core, &w, &rows, false).await?;
        }
    }
    Ok(awaited_by_parent)
}

/// Writes a wait's result (each agent's header and result, or its current
/// status), resolves it and resumes the waiter when nothing else is pending.
pub async fn finish_wait(
    ctx: &mut WriteCtx,
    core: &Core,
    w: &waits::WaitRow,
    rows: &[AgentRow],
    timed_out: bool,
) -> DbResult<()> {
    let mut parts = Vec::with_capacity(rows.len() + 1);
    if timed_out {
        parts.push(format!(
            "wait_for_agent timed out after {}s; where each agent stands:",
            w.timeout_s
        ));
    }
    for r in rows {
        let h = handle_tx(ctx, r).await?;
        parts.push(if r.status.is_settled() {
            result_message(r, Some(&h))
        } else {
            format!("[Sub-agent {h} is {}]", r.status)
        });
    }
    messages::insert_tool_result(
        &mut ctx.conn,
        ctx.now,
        &w.agent_id,
        &w.tool_call_id,
        "wait_for_agent",
        &parts.join("\n\n"),
        false,
    )
    .await?;
    waits::resolve(&mut ctx.conn, ctx.now, w.id).await?;
    resume_if_ready(ctx, core, &w.agent_id).await?;
    Ok(())
}

/// The tool calls of the agent's newest assistant message that have no
/// recorded result yet and are not approved to run (an approved call is
/// ready: the resumed turn runs it).
pub async fn pending_calls_tx(ctx: &mut WriteCtx, agent_id: &str) -> DbResult<Vec<String>> {
    let Some(last) = messages::last_assistant(&mut ctx.conn, agent_id).await? else {
        return Ok(Vec::new());
    };
    let calls: Vec<String> = last.calls()?.into_iter().map(|c| c.id).collect();
    if calls.is_empty() {
        return Ok(calls);
    }
    let done = messages::results_for_calls(&mut ctx.conn, agent_id, &calls).await?;
    let mut pending = Vec::new();
    for c in calls {
        if done
            .iter()
            .any(|r| r.tool_call_id.as_deref() == Some(c.as_str()))
        {
            continue;
        }
        let approved = crate::db::approvals::for_call(&mut ctx.conn, agent_id, &c)
            .await?
            .is_some_and(|a| a.status == "approved");
        if !approved {
            pending.push(c);
        }
    }
    Ok(pending)
}

/// A waiting agent whose pending tool calls all have results goes back to
/// the queue (same turn: its turn counter is kept).
pub async fn resume_if_ready(ctx: &mut WriteCtx, core: &Core, agent_id: &str) -> DbResult<bool> {
    let Some(a) = agents::get_tx(&mut ctx.conn, agent_id).await? else {
        return Ok(false);
    };
    if a.status != AgentStatus::Waiting || !pending_calls_tx(ctx, agent_id).await?.is_empty() {
        return Ok(false);
    }
    agents::set_status(&mut ctx.conn, agent_id, AgentStatus::Queued).await?;
    jobs::enqueue_turn(ctx, agent_id, core.cfg.workers.max_attempts).await?;
    Ok(true)
}

/// Cancels the agent and every descendant in one transaction: active agents
/// (and the agent itself, unless already final) become `cancelled`, queued
/// jobs are cancelled, and running turns are interrupted after commit. Only
/// the agent's own parent is told (`[Sub-agent cancelled]`).
pub async fn cancel_tx(
    ctx: &mut WriteCtx,
    core: &Core,
    root_id: &str,
    by: &str,
) -> DbResult<Vec<String>> {
    let rows = agents::subtree_tx(&mut ctx.conn, root_id).await?;
    let mut cancelled = Vec::new();
    for r in &rows {
        let is_root = r.id == root_id;
        let outcome = Outcome::cancelled(format!("cancelled by {by}"));
        if r.status.is_active() {
            settle_tx(ctx, core, r, outcome, is_root).await?;
            cancelled.push(r.id.clone());
        } else if is_root && !r.status.is_final() {
            // Already finished and reported: it only stops accepting work;
            // its parent and webhook are not told a second time.
            agents::settle(ctx, &r.id, &settlement(&outcome)).await?;
            cancelled.push(r.id.clone());
        }
    }
    Ok(cancelled)
}

/// Cancels in its own write; returns the agent as it is afterwards.
pub async fn cancel(core: &Arc<Core>, agent_id: &str, by: &str) -> DbResult<AgentRow> {
    let core2 = Arc::clone(core);
    let id = agent_id.to_string();
    let by = by.to_string();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, AgentRow> {
            Box::pin(async move {
                cancel_tx(ctx, &core2, &id, &by).await?;
                agents::must_get_tx(&mut ctx.conn, &id).await
            })
        })
        .await
}

/// Closes an agent: it accepts no more messages and its handle is freed.
pub async fn close(core: &Arc<Core>, agent_id: &str) -> DbResult<AgentRow> {
    let id = agent_id.to_string();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, AgentRow> {
            Box::pin(async move {
                agents::close(&mut ctx.conn, &id).await?;
                agents::must_get_tx(&mut ctx.conn, &id).await
            })
        })
        .await
}

/// Fails an agent from outside its turn (rescuer, quarantine) unless it
/// already settled.
pub async fn fail_tx(
    ctx: &mut WriteCtx,
    core: &Core,
    agent_id: &str,
    reason: StopReason,
    error: String,
) -> DbResult<()> {
    let Some(a) = agents::get_tx(&mut ctx.conn, agent_id).await? else {
        return Err(DbError::NotFound {
            what: "agent",
            id: agent_id.to_string(),
        });
    };
    if a.status.is_active() {
        settle_tx(ctx, core, &a, Outcome::failed(reason, error), true).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_counts() {
        assert_eq!(compact(950), "950");
        assert_eq!(compact(2100), "2.1k");
        assert_eq!(compact(1_300_000), "1.3M");
    }
}
