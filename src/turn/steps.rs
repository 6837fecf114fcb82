//! The recorded steps of a turn, each one write through the group-commit
//! writer (and each one round trip to SQLite): start, take the inbox, record
//! an assistant answer, record a tool result, suspend, finish, stop on a
//! limit, release. Every step after `start` is guarded by the run token, so
//! a cancelled agent or a turn taken over by another worker records nothing.

use std::sync::Arc;

use serde_json::json;

use crate::core::Core;
use crate::db::agents::{self, AgentRow};
use crate::db::jobs::{self, ClaimedJob, Lease};
use crate::db::messages::MessageRow;
use crate::db::{steps as sql, DbError, DbResult, WriteCtx, WriteFuture};
use crate::events::EventKind;
use crate::lifecycle::{self, Outcome};
use crate::model::Answer;
use crate::types::{AgentStatus, MsgRole, StopReason};

fn stale(agent_id: &str) -> DbError {
    DbError::Stale(format!("agent {agent_id} no longer runs under this turn"))
}

/// What `start` decided.
#[derive(Debug)]
pub enum Start {
    /// Run the turn; the row carries the new run token.
    Run {
        agent: Box<AgentRow>,
        resumed: bool,
        inbox_waiting: bool,
        /// The conversation, when it came back with the start.
        context: Option<Vec<MessageRow>>,
    },
    /// Nothing to run (agent settled, waiting, gone, or quarantined); the
    /// job is finished.
    Skip,
}

/// Takes the agent for this job. A `running` agent means its previous run
/// died mid-turn: that is a crash resume, counted per step, and after
/// `max_resumes` crashes in a row at the same step the agent is quarantined.
pub async fn start(core: &Arc<Core>, agent_id: &str, job: &ClaimedJob) -> DbResult<Start> {
    let now = core.now_ms();
    let out = core.db.exec(sql::start(agent_id, now)).await?;
    let Some(started) = sql::started(&out)? else {
        // Settled, waiting or gone: the turn this job was for is over.
        complete_job(core, &job.lease(&core.owner)).await?;
        return Ok(Start::Skip);
    };
    let a = started.agent;
    if a.resume_count >= core.cfg.workers.max_resumes {
        quarantine(core, a, job.lease(&core.owner)).await?;
        return Ok(Start::Skip);
    }
    let resumed = a.resume_count > 0;
    core.signals.publish(a.agent_ref().event(
        EventKind::TurnStarted,
        now,
        json!({"resumed": resumed}),
    ));
    Ok(Start::Run {
        agent: Box::new(a),
        resumed,
        inbox_waiting: started.inbox_waiting,
        context: started.context,
    })
}

/// Fails an agent whose turn keeps crashing the process at the same step.
async fn quarantine(core: &Arc<Core>, a: AgentRow, lease: Lease) -> DbResult<()> {
    let core2 = Arc::clone(core);
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                jobs::fail(&mut ctx.conn, ctx.now, &lease, "quarantined").await?;
                let error = format!(
                    "quarantined: the turn crashed {} times in a row at the same step \
                     (after message {}); it is not resumed again ([workers] max_resumes = {})",
                    a.resume_count,
                    a.resume_msg_id.unwrap_or(0),
                    core2.cfg.workers.max_resumes
                );
                tracing::error!(agent_id = %a.id, %error, "crash loop contained");
                lifecycle::settle_tx(
                    ctx,
                    &core2,
                    &a,
                    Outcome::failed(StopReason::Quarantined, error),
                    true,
                )
                .await?;
                Ok(())
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
                    let rows = sql::take_inbox(ctx, &id, token).await?;
                    if rows.is_empty() && !agents::holds_run(&mut ctx.conn, &id, token).await? {
                        return Err(stale(&id));
                    }
                    Ok(rows)
                })
            },
        )
        .await
}

/// Records one model answer with its usage; returns the message id.
pub async fn record_assistant(
    core: &Arc<Core>,
    agent: &AgentRow,
    answer: &Answer,
) -> DbResult<i64> {
    let reply = &answer.reply;
    let u = reply.usage;
    let calls = (!reply.tool_calls.is_empty())
        .then(|| serde_json::to_string(&reply.tool_calls).unwrap_or_else(|_| "[]".into()));
    let id = core
        .db
        .insert_row(sql::assistant_row(
            &agent.id,
            agent.run_token,
            core.now_ms(),
            &reply.content,
            calls,
            &answer.model,
            u.tokens_in,
            u.tokens_out,
            answer.cost_usd,
        ))
        .await?;
    id.ok_or_else(|| stale(&agent.id))
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
    let now = core.now_ms();
    let id = core
        .db
        .insert_row(sql::tool_result_row(
            &agent.id,
            agent.run_token,
            now,
            call_id,
            tool_name,
            &content,
            is_error,
        ))
        .await?;
    let Some(id) = id else {
        // Either the result exists already or the agent stopped running.
        let mut conn = core.db.reader().acquire().await?;
        return if agents::holds_run(&mut conn, &agent.id, agent.run_token).await? {
            Ok(None)
        } else {
            Err(stale(&agent.id))
        };
    };
    Ok(Some(MessageRow {
        id,
        agent_id: agent.id.clone(),
        role: MsgRole::Tool,
        content,
        tool_calls: None,
        tool_call_id: Some(call_id.to_string()),
        tool_name: Some(tool_name.to_string()),
        is_error,
        origin: None,
        sender: None,
        model: None,
        tokens_in: None,
        tokens_out: None,
        cost_usd: None,
        hidden: false,
        created_at: now,
    }))
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
    lease: &Lease,
    pending: Vec<String>,
    gated: Vec<String>,
) -> DbResult<Suspend> {
    let a = agent.clone();
    let lease = lease.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, Suspend> {
            Box::pin(async move {
                let data = json!({"waiting_on": pending}).to_string();
                if sql::suspend(ctx, &a.id, a.run_token, &lease, &pending, &gated, &data).await? {
                    ctx.effects.events.push(a.agent_ref().event(
                        EventKind::AgentWaiting,
                        ctx.now,
                        json!({"waiting_on": pending}),
                    ));
                    return Ok(Suspend::Suspended);
                }
                if !agents::holds_run(&mut ctx.conn, &a.id, a.run_token).await? {
                    return Err(stale(&a.id));
                }
                let results =
                    crate::db::messages::results_for_calls(&mut ctx.conn, &a.id, &pending).await?;
                Ok(Suspend::Continue(results))
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

/// Ends the turn with the model's final answer. A level-1 agent without a
/// webhook settles with one script; anything that must report its
/// completion (to a parent, to a webhook) settles in a closure that writes
/// the report in the same transaction.
pub async fn finish(
    core: &Arc<Core>,
    agent: &AgentRow,
    lease: &Lease,
    result: String,
) -> DbResult<Finish> {
    if result.trim() == core.cfg.heartbeat.ok_token && finish_quietly(core, agent, lease).await? {
        return Ok(Finish::Settled);
    }
    if agent.parent_id.is_none() && !crate::notify::has_target(core, agent) {
        let outcome = Outcome::done(result);
        let settlement = lifecycle::settlement(&outcome);
        let now = core.now_ms();
        let script =
            agents::settle_running_lean(&agent.id, agent.run_token, lease, true, &settlement, now);
        let out = core.db.exec(script).await?;
        if agents::settled_lean(&out) {
            if core.signals.has_listeners() {
                if let Some(row) = agents::get(core.db.reader(), &agent.id).await? {
                    lifecycle::publish_finished(core, &row, now);
                }
            }
            return Ok(Finish::Settled);
        }
        return next_turn(core, agent, outcome.result.unwrap_or_default()).await;
    }
    let core2 = Arc::clone(core);
    let id = agent.id.clone();
    let token = agent.run_token;
    let lease = lease.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, Finish> {
            Box::pin(async move {
                let outcome = Outcome::done(result);
                let settlement = lifecycle::settlement(&outcome);
                let settled =
                    agents::settle_running(ctx, &id, token, &lease, true, &settlement).await?;
                if let Some(row) = settled {
                    lifecycle::after_settle_tx(ctx, &core2, &row, true).await?;
                    return Ok(Finish::Settled);
                }
                next_turn_tx(ctx, &id, token, outcome.result.as_deref().unwrap_or("")).await
            })
        })
        .await
}

/// A turn whose only input was heartbeat messages and whose answer is the
/// ok token is quiet (SPEC §10): the agent settles without an event or a
/// webhook, keeps its previous result, and the whole heartbeat exchange is
/// hidden from its future context (the rows stay, marked). False when the
/// turn was not such a turn (or messages wait: then the next turn starts).
async fn finish_quietly(core: &Arc<Core>, agent: &AgentRow, lease: &Lease) -> DbResult<bool> {
    let id = agent.id.clone();
    let token = agent.run_token;
    let lease = lease.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, bool> {
            Box::pin(async move {
                let recent = crate::db::messages::recent_tx(&mut ctx.conn, &id, 1000).await?;
                let Some(answer) = recent.first() else {
                    return Ok(false);
                };
                let mut start = answer.id;
                let mut origins = Vec::new();
                for m in recent.iter().skip(1) {
                    let previous_answer = m.role == MsgRole::Assistant && m.tool_calls.is_none();
                    if previous_answer || m.role == MsgRole::System {
                        break;
                    }
                    if m.role == MsgRole::User {
                        origins.push(m.origin);
                    }
                    start = m.id;
                }
                let heartbeat_only = !origins.is_empty()
                    && origins
                        .iter()
                        .all(|o| *o == Some(crate::types::Origin::Heartbeat));
                if !heartbeat_only || !agents::settle_quietly(ctx, &id, token, &lease).await? {
                    return Ok(false);
                }
                crate::db::messages::hide_range(&mut ctx.conn, &id, start, answer.id).await?;
                Ok(true)
            })
        })
        .await
}

/// The turn ended but messages wait: keep running with them.
async fn next_turn(core: &Arc<Core>, agent: &AgentRow, result: String) -> DbResult<Finish> {
    let id = agent.id.clone();
    let token = agent.run_token;
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, Finish> {
            Box::pin(async move { next_turn_tx(ctx, &id, token, &result).await })
        })
        .await
}

async fn next_turn_tx(ctx: &mut WriteCtx, id: &str, token: i64, result: &str) -> DbResult<Finish> {
    if !agents::holds_run(&mut ctx.conn, id, token).await? {
        return Err(stale(id));
    }
    // Still running under this token, so the inbox is not empty.
    agents::set_turn_result(&mut ctx.conn, id, result).await?;
    let rows = sql::take_inbox(ctx, id, token).await?;
    let a = agents::must_get_tx(&mut ctx.conn, id).await?;
    crate::db::events::emit(
        ctx,
        a.agent_ref()
            .event(EventKind::TurnStarted, ctx.now, json!({"resumed": false})),
    )
    .await?;
    Ok(Finish::NextTurn(rows))
}

/// Ends the turn on a limit or an error.
pub async fn stop(
    core: &Arc<Core>,
    agent: &AgentRow,
    lease: &Lease,
    outcome: Outcome,
) -> DbResult<()> {
    let core2 = Arc::clone(core);
    let id = agent.id.clone();
    let token = agent.run_token;
    let lease = lease.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                let settlement = lifecycle::settlement(&outcome);
                match agents::settle_running(ctx, &id, token, &lease, false, &settlement).await? {
                    Some(row) => {
                        lifecycle::after_settle_tx(ctx, &core2, &row, true).await?;
                        // Messages that arrived during the failed turn start
                        // the next one, as after any turn (§6).
                        if row.status == AgentStatus::Failed
                            && crate::db::inbox::count(&mut ctx.conn, &id).await? > 0
                        {
                            agents::wake(ctx, &id, row.auto_wake_budget).await?;
                            jobs::enqueue_turn(ctx, &id, core2.cfg.workers.max_attempts).await?;
                        }
                        Ok(())
                    }
                    None => Err(stale(&id)),
                }
            })
        })
        .await
}

/// Gives the turn back to the queue untouched (graceful shutdown): the
/// agent is `queued` again, so the next start is not counted as a crash.
pub async fn release(core: &Arc<Core>, agent: &AgentRow, lease: &Lease) -> DbResult<()> {
    let id = agent.id.clone();
    let token = agent.run_token;
    let lease = lease.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                if jobs::release(&mut ctx.conn, &lease).await?
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
    let lease = job.lease(&core.owner);
    let attempt = job.attempts.clamp(0, 16) as u32;
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                let retry_at = ctx.now + crate::model::backoff(500, attempt).as_millis() as i64;
                let fate = jobs::retry_or_fail(ctx, &lease, &error, retry_at).await?;
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
pub async fn complete_job(core: &Arc<Core>, lease: &Lease) -> DbResult<()> {
    core.db
        .exec(jobs::complete_stmt(core.now_ms(), lease))
        .await?;
    Ok(())
}

/// Records a compaction up to message `upto`: the boundary on the agent
/// row, the note (with the current todo list) in the `compacted` event.
/// Returns the note.
pub async fn record_compaction(core: &Arc<Core>, agent: &AgentRow, upto: i64) -> DbResult<String> {
    let list = crate::db::todos::list(core.db.reader(), &agent.id).await?;
    let todo = if list.is_empty() {
        "(empty)".to_string()
    } else {
        crate::tools::todo::render(&list).to_string()
    };
    let note = format!(
        "[Context compacted: older tool results above are shortened to stubs; the full results stay on \
         record.]\nCurrent todo list: {todo}"
    );
    let a = agent.clone();
    let n = note.clone();
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                if !agents::set_compaction(&mut ctx.conn, &a.id, a.run_token, upto).await? {
                    return Err(stale(&a.id));
                }
                let ev = a.agent_ref().event(
                    EventKind::Compacted,
                    ctx.now,
                    json!({"upto_message_id": upto, "note": n}),
                );
                crate::db::events::emit(ctx, ev).await
            })
        })
        .await?;
    Ok(note)
}

/// The note of the compaction in force (from its `compacted` event).
pub async fn compaction_note(core: &Arc<Core>, agent_id: &str) -> DbResult<String> {
    let evs = crate::db::events::for_agent(core.db.reader(), agent_id, Some("compacted")).await?;
    Ok(evs
        .last()
        .and_then(|e| e.data_json()["note"].as_str().map(str::to_string))
        .unwrap_or_default())
}
