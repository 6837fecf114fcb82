//! The recorded steps of a turn, each one write (one transaction through the
//! group-commit writer): start, take the inbox, record an assistant answer,
//! record a tool result, suspend, finish, stop on a limit, release. Every
//! step after `start` is guarded by the run token, so a cancelled agent or a
//! turn taken over by another worker cannot record anything.

use std::sync::Arc;

use serde_json::json;

use crate::core::Core;
use crate::db::agents::{self, AgentRow};
use crate::db::jobs::{self, ClaimedJob};
use crate::db::messages::{self, MessageRow, NewMessage};
use crate::db::{events, inbox, DbError, DbResult, WriteCtx, WriteFuture};
use crate::events::EventKind;
use crate::lifecycle::{self, Outcome};
use crate::model::Answer;
use crate::types::{AgentStatus, MsgRole, StopReason};

fn stale(agent_id: &str) -> DbError {
    DbError::Stale(format!("agent {agent_id} no longer runs under this turn"))
}

async fn guard(ctx: &mut WriteCtx, agent_id: &str, run_token: i64) -> DbResult<()> {
    if agents::holds_run(&mut ctx.conn, agent_id, run_token).await? {
        Ok(())
    } else {
        Err(stale(agent_id))
    }
}

/// What `start` decided.
#[derive(Debug)]
pub enum Start {
    /// Run the turn; the row carries the new run token.
    Run { agent: Box<AgentRow>, resumed: bool },
    /// Nothing to run (agent settled, gone, or quarantined); the job is done.
    Skip,
}

/// Takes the agent for this job. A `running` agent means its previous run
/// died mid-turn: that is a crash resume, counted per step, and after
/// `max_resumes` crashes in a row at the same step the agent is quarantined.
pub async fn start(core: &Arc<Core>, agent_id: &str, job: &ClaimedJob) -> DbResult<Start> {
    let core2 = Arc::clone(core);
    let id = agent_id.to_string();
    let job_id = job.id;
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, Start> {
            Box::pin(async move {
                let owner = core2.owner.clone();
                let Some(a) = agents::get_tx(&mut ctx.conn, &id).await? else {
                    jobs::fail(&mut ctx.conn, ctx.now, job_id, &owner, "agent not found").await?;
                    return Ok(Start::Skip);
                };
                let (resume_at, count, resumed) = match a.status {
                    AgentStatus::Queued => (None, 0, false),
                    AgentStatus::Running => {
                        let step = messages::last_id(&mut ctx.conn, &id).await?;
                        let count = if a.resume_msg_id == Some(step) {
                            a.resume_count + 1
                        } else {
                            1
                        };
                        if count >= core2.cfg.workers.max_resumes {
                            jobs::fail(&mut ctx.conn, ctx.now, job_id, &owner, "quarantined").await?;
                            let error = format!(
                                "quarantined: the turn crashed {count} times in a row at the same step \
                                 (after message {step}); it is not resumed again ([workers] max_resumes = {})",
                                core2.cfg.workers.max_resumes
                            );
                            tracing::error!(agent_id = %id, %error, "crash loop contained");
                            lifecycle::settle_tx(ctx, &core2, &a, Outcome::failed(StopReason::Quarantined, error), true)
                                .await?;
                            return Ok(Start::Skip);
                        }
                        (Some(step), count, true)
                    }
                    _ => {
                        // Settled or waiting: the turn this job was for is over.
                        jobs::complete(&mut ctx.conn, ctx.now, job_id, &owner).await?;
                        return Ok(Start::Skip);
                    }
                };
                let agent = agents::mark_running(&mut ctx.conn, ctx.now, &id, resume_at, count).await?;
                let ev = agent
                    .agent_ref()
                    .event(EventKind::TurnStarted, ctx.now, json!({"resumed": resumed}));
                events::emit(ctx, ev).await?;
                Ok(Start::Run {
                    agent: Box::new(agent),
                    resumed,
                })
            })
        })
        .await
}

/// Moves the inbox into the conversation (at a step boundary).
pub async fn take_inbox(core: &Arc<Core>, agent: &AgentRow) -> DbResult<Vec<MessageRow>> {
    let id = agent.id.clone();
    let token = agent.run_token;
    core.db
        .write(
            move |ctx: &mut WriteCtx| -> WriteFuture<'_, Vec<MessageRow>> {
                Box::pin(async move {
                    guard(ctx, &id, token).await?;
                    inbox::take(&mut ctx.conn, ctx.now, &id).await
                })
            },
        )
        .await
}

/// Records one model answer with its usage and cost (rolled up to the
/// ancestors' subtree spend).
pub async fn record_assistant(
    core: &Arc<Core>,
    agent: &AgentRow,
    answer: &Answer,
) -> DbResult<MessageRow> {
    let id = agent.id.clone();
    let token = agent.run_token;
    let ancestors = agent.ancestors();
    let reply = answer.reply.clone();
    let model = answer.model.clone();
    let cost = answer.cost_usd;
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, MessageRow> {
            Box::pin(async move {
                let u = reply.usage;
                if !agents::add_model_usage(
                    &mut ctx.conn,
                    &id,
                    token,
                    u.tokens_in,
                    u.tokens_out,
                    cost,
                    &ancestors,
                )
                .await?
                {
                    return Err(stale(&id));
                }
                let calls = (!reply.tool_calls.is_empty()).then(|| {
                    serde_json::to_string(&reply.tool_calls).unwrap_or_else(|_| "[]".into())
                });
                let mut m = NewMessage::plain(&id, MsgRole::Assistant, &reply.content);
                m.tool_calls = calls.clone();
                m.model = Some(&model);
                m.tokens_in = Some(u.tokens_in);
                m.tokens_out = Some(u.tokens_out);
                m.cost_usd = Some(cost);
                let mid = messages::insert(&mut ctx.conn, ctx.now, &m).await?;
                Ok(MessageRow {
                    id: mid,
                    agent_id: id.clone(),
                    role: MsgRole::Assistant,
                    content: reply.content.clone(),
                    tool_calls: calls,
                    tool_call_id: None,
                    tool_name: None,
                    is_error: false,
                    origin: None,
                    sender: None,
                    model: Some(model.clone()),
                    tokens_in: Some(u.tokens_in),
                    tokens_out: Some(u.tokens_out),
                    cost_usd: Some(cost),
                    hidden: false,
                    created_at: ctx.now,
                })
            })
        })
        .await
}

/// Records one tool result. None when the call already had a result (it is
/// never recorded twice).
pub async fn record_tool_result(
    core: &Arc<Core>,
    agent: &AgentRow,
    call_id: &str,
    tool_name: &str,
    content: String,
    is_error: bool,
) -> DbResult<Option<MessageRow>> {
    let id = agent.id.clone();
    let token = agent.run_token;
    let call_id = call_id.to_string();
    let tool_name = tool_name.to_string();
    core.db
        .write(
            move |ctx: &mut WriteCtx| -> WriteFuture<'_, Option<MessageRow>> {
                Box::pin(async move {
                    guard(ctx, &id, token).await?;
                    let Some(mid) = messages::insert_tool_result(
                        &mut ctx.conn,
                        ctx.now,
                        &id,
                        &call_id,
                        &tool_name,
                        &content,
                        is_error,
                    )
                    .await?
                    else {
                        return Ok(None);
                    };
                    Ok(Some(MessageRow {
                        id: mid,
                        agent_id: id,
                        role: MsgRole::Tool,
                        content,
                        tool_calls: None,
                        tool_call_id: Some(call_id),
                        tool_name: Some(tool_name),
                        is_error,
                        origin: None,
                        sender: None,
                        model: None,
                        tokens_in: None,
                        tokens_out: None,
                        cost_usd: None,
                        hidden: false,
                        created_at: ctx.now,
                    }))
                })
            },
        )
        .await
}

/// What `suspend` decided.
#[derive(Debug)]
pub enum Suspend {
    /// The agent waits; the job is done; whatever it waits on re-enqueues it.
    Suspended,
    /// Everything it would wait on already arrived: these are the results.
    Continue(Vec<MessageRow>),
}

/// Suspends the turn on calls whose results arrive later, unless they all
/// arrived already (checked in the same transaction as the status change, so
/// a completion can never slip between the check and the suspension).
pub async fn suspend(
    core: &Arc<Core>,
    agent: &AgentRow,
    job_id: i64,
    pending: Vec<String>,
) -> DbResult<Suspend> {
    let core2 = Arc::clone(core);
    let id = agent.id.clone();
    let token = agent.run_token;
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, Suspend> {
            Box::pin(async move {
                guard(ctx, &id, token).await?;
                let results = messages::results_for_calls(&mut ctx.conn, &id, &pending).await?;
                if results.len() >= pending.len() {
                    return Ok(Suspend::Continue(results));
                }
                agents::set_status(&mut ctx.conn, &id, AgentStatus::Waiting).await?;
                jobs::complete(&mut ctx.conn, ctx.now, job_id, &core2.owner).await?;
                let a = agents::must_get_tx(&mut ctx.conn, &id).await?;
                let ev = a.agent_ref().event(
                    EventKind::AgentWaiting,
                    ctx.now,
                    json!({"waiting_on": pending}),
                );
                events::emit(ctx, ev).await?;
                Ok(Suspend::Suspended)
            })
        })
        .await
}

/// What `finish` decided.
#[derive(Debug)]
pub enum Finish {
    /// The agent settled `done`; the job is complete.
    Settled,
    /// Messages arrived during the turn: the next turn starts at once with
    /// them (already appended to the conversation).
    NextTurn(Vec<MessageRow>),
}

/// Ends the turn with the model's final answer.
pub async fn finish(
    core: &Arc<Core>,
    agent: &AgentRow,
    job_id: i64,
    result: String,
) -> DbResult<Finish> {
    let core2 = Arc::clone(core);
    let id = agent.id.clone();
    let token = agent.run_token;
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, Finish> {
            Box::pin(async move {
                guard(ctx, &id, token).await?;
                if inbox::count(&mut ctx.conn, &id).await? > 0 {
                    agents::set_turn_result(&mut ctx.conn, &id, &result).await?;
                    let rows = inbox::take(&mut ctx.conn, ctx.now, &id).await?;
                    let a = agents::must_get_tx(&mut ctx.conn, &id).await?;
                    let ev = a.agent_ref().event(
                        EventKind::TurnStarted,
                        ctx.now,
                        json!({"resumed": false}),
                    );
                    events::emit(ctx, ev).await?;
                    return Ok(Finish::NextTurn(rows));
                }
                jobs::complete(&mut ctx.conn, ctx.now, job_id, &core2.owner).await?;
                let a = agents::must_get_tx(&mut ctx.conn, &id).await?;
                lifecycle::settle_tx(ctx, &core2, &a, Outcome::done(result), true).await?;
                Ok(Finish::Settled)
            })
        })
        .await
}

/// Ends the turn on a limit or an error.
pub async fn stop(
    core: &Arc<Core>,
    agent: &AgentRow,
    job_id: i64,
    outcome: Outcome,
) -> DbResult<()> {
    let core2 = Arc::clone(core);
    let id = agent.id.clone();
    let token = agent.run_token;
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                guard(ctx, &id, token).await?;
                jobs::complete(&mut ctx.conn, ctx.now, job_id, &core2.owner).await?;
                let a = agents::must_get_tx(&mut ctx.conn, &id).await?;
                lifecycle::settle_tx(ctx, &core2, &a, outcome, true).await?;
                Ok(())
            })
        })
        .await
}

/// Gives the turn back to the queue untouched (graceful shutdown): the
/// agent is `queued` again, so the next start is not counted as a crash.
pub async fn release(core: &Arc<Core>, agent: &AgentRow, job_id: i64) -> DbResult<()> {
    let core2 = Arc::clone(core);
    let id = agent.id.clone();
    let token = agent.run_token;
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                if jobs::release(&mut ctx.conn, job_id, &core2.owner).await?
                    && agents::holds_run(&mut ctx.conn, &id, token).await?
                {
                    agents::set_status(&mut ctx.conn, &id, AgentStatus::Queued).await?;
                }
                Ok(())
            })
        })
        .await
}

/// After an unexpected error: retry the job later (the agent goes back to
/// `queued`), or fail the agent when the job is out of attempts.
pub async fn retry_later(
    core: &Arc<Core>,
    agent_id: &str,
    run_token: Option<i64>,
    job: &ClaimedJob,
    error: String,
) -> DbResult<()> {
    let core2 = Arc::clone(core);
    let id = agent_id.to_string();
    let job_id = job.id;
    let attempt = job.attempts.clamp(0, 16) as u32;
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                let retry_at = ctx.now + crate::model::backoff(500, attempt).as_millis() as i64;
                let fate = jobs::retry_or_fail(ctx, job_id, &core2.owner, &error, retry_at).await?;
                let holds = match run_token {
                    Some(t) => agents::holds_run(&mut ctx.conn, &id, t).await?,
                    None => false,
                };
                match fate {
                    jobs::JobFate::Retrying if holds => {
                        agents::set_status(&mut ctx.conn, &id, AgentStatus::Queued).await?;
                    }
                    jobs::JobFate::Failed => {
                        lifecycle::fail_tx(
                            ctx,
                            &core2,
                            &id,
                            StopReason::Error,
                            format!("turn job failed after its last attempt: {error}"),
                        )
                        .await?;
                    }
                    _ => {}
                }
                Ok(())
            })
        })
        .await
}

/// Completes the job when the turn ended without a step write (the agent
/// was cancelled or settled by someone else).
pub async fn complete_job(core: &Arc<Core>, job_id: i64) -> DbResult<()> {
    let owner = core.owner.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                jobs::complete(&mut ctx.conn, ctx.now, job_id, &owner).await?;
                Ok(())
            })
        })
        .await
}
