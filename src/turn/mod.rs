//! The tool loop. `run_turn` is the one function that runs a turn: it takes
//! the agent, rebuilds its context from rows once, then repeats
//! { run pending tool calls → take the inbox → check limits → check the
//! history invariant → call the model → record the answer } until the model
//! answers without tool calls, the agent suspends, or a limit stops it.
//! Every step is recorded before the next starts, so a crash resumes at the
//! first unrecorded step.

pub mod compaction;
pub mod conversation;
pub mod hints;
pub mod steps;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use tracing::Instrument;

use crate::core::Core;
use crate::db::agents::{self, AgentRow};
use crate::db::jobs::ClaimedJob;
use crate::db::messages;
use crate::db::DbError;
use crate::events::EventKind;
use crate::lifecycle::Outcome;
use crate::model::types::{ToolCall, ToolSpec};
use crate::model::ChainError;
use crate::signals::TurnSignal;
use crate::tools::{schema, ToolCtx, ToolOutput};
use crate::types::StopReason;
use compaction::{Compacted, ContextView};
use conversation::{check_invariant, Conversation};
use hints::TodoHints;
use steps::{Finish, Start, Suspend};

/// Why a turn run ended early.
#[derive(Debug)]
enum Halt {
    /// The agent no longer runs under this turn (cancelled, settled
    /// elsewhere, or taken over): nothing more may be recorded.
    Stale,
    /// Shutdown: the turn went back to the queue.
    Release,
    /// Shutdown in the middle of a step: the turn must go back to the queue.
    Stop,
    /// An unexpected storage error: the job is retried.
    Db(DbError),
}

impl From<DbError> for Halt {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Stale(_) => Halt::Stale,
            other => Halt::Db(other),
        }
    }
}

/// Runs the turn job `job` to the end of its turn (or suspension).
pub async fn run_turn(core: &Arc<Core>, job: &ClaimedJob) {
    let Some(agent_id) = job.agent_id.clone() else {
        tracing::error!(job_id = job.id, "turn job without an agent");
        let _ = steps::complete_job(core, &job.lease(&core.owner)).await;
        return;
    };
    let span = tracing::info_span!("turn", agent_id = %agent_id, job_id = job.id, level = tracing::field::Empty);
    async {
        // Registered before the agent is taken, so a cancel committed in
        // between still reaches this run.
        let guard = core.signals.register_turn(&agent_id);
        let mut token = None;
        let outcome = run(core, job, &agent_id, &guard.signal, &mut token).await;
        match outcome {
            Ok(()) => {}
            Err(Halt::Stale) => {
                tracing::debug!("turn stopped: the agent no longer runs under it");
                if let Err(e) = steps::complete_job(core, &job.lease(&core.owner)).await {
                    tracing::warn!(error = %e, "cannot complete the job of a stopped turn");
                }
            }
            Err(Halt::Release) | Err(Halt::Stop) => {}
            Err(Halt::Db(e)) => {
                tracing::error!(error = %e, "turn failed on a storage error; retrying the job");
                if let Err(e2) =
                    steps::retry_later(core, &agent_id, token, job, e.to_string()).await
                {
                    tracing::error!(error = %e2, "cannot reschedule the turn; the rescuer will");
                }
            }
        }
    }
    .instrument(span)
    .await
}

async fn run(
    core: &Arc<Core>,
    job: &ClaimedJob,
    agent_id: &str,
    sig: &Arc<TurnSignal>,
    token: &mut Option<i64>,
) -> Result<(), Halt> {
    let (mut agent, resumed, inbox_waiting, context) =
        match steps::start(core, agent_id, job).await? {
            Start::Run {
                agent,
                resumed,
                inbox_waiting,
                context,
            } => (*agent, resumed, inbox_waiting, context),
            Start::Skip => return Ok(()),
        };
    *token = Some(agent.run_token);
    let lease = job.lease(&core.owner);
    tracing::Span::current().record("level", agent.level);
    if resumed {
        tracing::info!("resuming the turn after a crash");
    }
    let rows = match context {
        Some(rows) => rows,
        None => messages::context(core.db.reader(), agent_id).await?,
    };
    let mut conv = match Conversation::from_rows(&rows) {
        Ok(c) => c,
        Err(e) => {
            let error = format!("stored conversation is not a valid history: {e}");
            steps::stop(
                core,
                &agent,
                &lease,
                Outcome::failed(StopReason::Error, error),
            )
            .await?;
            return Ok(());
        }
    };
    let tool_names = agent.tools();
    let tools: Vec<ToolSpec> = core.catalog.specs(&tool_names);
    let mut hints = TodoHints::load(core, agent_id, &tool_names, &rows).await?;
    let mut view = ContextView::new(match agent.compact_upto {
        Some(upto) => Some(Compacted {
            upto,
            note: steps::compaction_note(core, agent_id).await?,
        }),
        None => None,
    });
    // Step timing (benchmarks): from an answer to the next request, minus
    // the time the tools themselves took.
    let mut answered: Option<(std::time::Instant, Duration)> = None;
    // Messages that arrived before this run are read at its first step
    // boundary (later ones raise the flag themselves).
    if inbox_waiting {
        sig.inbox.store(true, Ordering::SeqCst);
    }
    loop {
        if core.stop.soft.is_cancelled() {
            return release(core, &agent, job).await;
        }
        if sig.cancel.is_cancelled() {
            return Err(Halt::Stale);
        }
        let pending = conv.pending();
        if !pending.is_empty() {
            let waiting_on = run_tools(
                core,
                &agent,
                &tool_names,
                sig,
                &mut conv,
                &mut hints,
                &pending,
            )
            .await?;
            if let Some((_, spent)) = answered.as_mut() {
                *spent += waiting_on.tool_time;
            }
            if let Some(outcome) = waiting_on.stopped {
                steps::stop(core, &agent, &lease, outcome).await?;
                return Ok(());
            }
            if !waiting_on.ids.is_empty() {
                match steps::suspend(core, &agent, &lease, waiting_on.ids, waiting_on.gated).await?
                {
                    Suspend::Suspended => return Ok(()),
                    Suspend::Continue(rows) => push_all(&mut conv, &rows)?,
                }
            }
            continue;
        }
        if sig.inbox.swap(false, Ordering::SeqCst) {
            let rows = steps::take_inbox(core, &agent).await?;
            push_all(&mut conv, &rows)?;
        }
        if let Some(text) = conv.final_answer() {
            // The final answer is recorded but the turn never settled (the
            // process died in between, or the settling write failed):
            // settle with it rather than ask the model again.
            let text = text.to_string();
            if finish_turn(core, &mut agent, &lease, &mut conv, text).await? {
                return Ok(());
            }
            continue;
        }
        if let Some(outcome) = check_limits(core, &agent, &conv).await? {
            steps::stop(core, &agent, &lease, outcome).await?;
            return Ok(());
        }
        compact_if_needed(core, &agent, &conv, &mut view).await?;
        let messages = view.messages(&conv);
        if let Err(e) = check_invariant(messages) {
            let error = format!("history invariant violated before a model request: {e}");
            steps::stop(
                core,
                &agent,
                &lease,
                Outcome::failed(StopReason::Error, error),
            )
            .await?;
            return Ok(());
        }
        if let (Some(t), Some((at, tool_time))) = (&core.step_timings, answered.take()) {
            t.record(at.elapsed().saturating_sub(tool_time));
        }
        let answer = tokio::select! {
            biased;
            _ = core.stop.hard.cancelled() => return release(core, &agent, job).await,
            _ = sig.interrupt.notified() => continue,
            _ = sleep_until_ms(core, agent.deadline_at) => {
                steps::stop(core, &agent, &lease, deadline_outcome(&agent, &conv)).await?;
                return Ok(());
            }
            r = core.models.complete(&agent.role, messages, &tools, &sig.cancel) => r,
        };
        let answer = match answer {
            Ok(a) => a,
            Err(ChainError::Cancelled) => return Err(Halt::Stale),
            Err(e) => {
                let mut o = Outcome::failed(StopReason::Error, e.to_string());
                o.result = partial(&conv);
                steps::stop(core, &agent, &lease, o).await?;
                return Ok(());
            }
        };
        answered = Some((std::time::Instant::now(), Duration::ZERO));
        let message_id = steps::record_assistant(core, &agent, &answer).await?;
        agent.turn_calls += 1;
        conv.push_answer(message_id, &answer.reply.content, &answer.reply.tool_calls)
            .map_err(corrupt)?;
        if core.signals.has_listeners() {
            core.signals.publish(agent.agent_ref().event(
                EventKind::AssistantMessage,
                core.now_ms(),
                serde_json::json!({"message_id": message_id, "content": answer.reply.content,
                    "tool_calls": answer.reply.tool_calls, "model": answer.model}),
            ));
        }
        if answer.reply.tool_calls.is_empty()
            && finish_turn(core, &mut agent, &lease, &mut conv, answer.reply.content).await?
        {
            if let (Some(t), Some((at, _))) = (&core.step_timings, answered.take()) {
                t.record(at.elapsed());
            }
            return Ok(());
        }
    }
}

/// Settles the turn with its final answer. False when messages arrived
/// meanwhile: they are in the conversation and the next turn goes on.
async fn finish_turn(
    core: &Arc<Core>,
    agent: &mut AgentRow,
    lease: &crate::db::jobs::Lease,
    conv: &mut Conversation,
    text: String,
) -> Result<bool, Halt> {
    match steps::finish(core, agent, lease, text).await? {
        Finish::Settled => Ok(true),
        // Settling only gives way to waiting messages; none taken would
        // loop on the same answer.
        Finish::NextTurn(rows) if rows.is_empty() => Err(Halt::Db(DbError::Conflict(format!(
            "agent {}: the turn could not settle, yet no message was waiting",
            agent.id
        )))),
        Finish::NextTurn(rows) => {
            agent.turn_calls = 0;
            push_all(conv, &rows)?;
            Ok(false)
        }
    }
}

fn corrupt(e: String) -> Halt {
    Halt::Db(DbError::Corrupt(e))
}

fn push_all(conv: &mut Conversation, rows: &[messages::MessageRow]) -> Result<(), Halt> {
    for r in rows {
        conv.push(r).map_err(corrupt)?;
    }
    Ok(())
}

async fn release(core: &Arc<Core>, agent: &AgentRow, job: &ClaimedJob) -> Result<(), Halt> {
    steps::release(core, agent, &job.lease(&core.owner)).await?;
    tracing::info!("turn released for shutdown");
    Err(Halt::Release)
}

/// The newest assistant text, kept as the result of a stopped turn.
fn partial(conv: &Conversation) -> Option<String> {
    conv.last_assistant_text
        .clone()
        .filter(|t| !t.trim().is_empty())
}

fn deadline_outcome(agent: &AgentRow, conv: &Conversation) -> Outcome {
    let secs = agent
        .deadline_at
        .map(|d| (d - agent.created_at) as f64 / 1000.0)
        .unwrap_or(0.0);
    let mut o = Outcome::timed_out(format!(
        "deadline passed: the agent's time ({secs:.0}s) ran out"
    ));
    o.result = partial(conv);
    o
}

/// Sleeps until `at` (ms since the epoch); never returns when `at` is None.
async fn sleep_until_ms(core: &Core, at: Option<i64>) {
    match at {
        Some(t) => {
            let wait = (t - core.now_ms()).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(wait)).await
        }
        None => std::future::pending().await,
    }
}

/// Limits checked before every model call: deadline, turn limit, cost
/// (the agent's and every ancestor's budget).
async fn check_limits(
    core: &Arc<Core>,
    agent: &AgentRow,
    conv: &Conversation,
) -> Result<Option<Outcome>, Halt> {
    if let Some(d) = agent.deadline_at {
        if core.now_ms() >= d {
            return Ok(Some(deadline_outcome(agent, conv)));
        }
    }
    if agent.turn_calls >= agent.max_turns {
        let mut o = Outcome::failed(
            StopReason::TurnLimit,
            format!(
                "turn limit reached: {} model calls in this turn (max_turns = {})",
                agent.turn_calls, agent.max_turns
            ),
        );
        o.result = partial(conv);
        return Ok(Some(o));
    }
    if agent.budgeted {
        let mut chain = vec![agent.id.clone()];
        chain.extend(agent.ancestors());
        if let Some((left, who)) = agents::budget_left(core.db.reader(), &chain).await? {
            if left <= 0.0 {
                let error = if who == agent.id {
                    format!(
                        "cost limit reached: max_cost_usd = ${:.4} is spent",
                        agent.max_cost_usd.unwrap_or(0.0)
                    )
                } else {
                    format!("cost limit reached: the budget of ancestor {who} is spent")
                };
                let mut o = Outcome::failed(StopReason::CostLimit, error);
                o.result = partial(conv);
                return Ok(Some(o));
            }
        }
    }
    Ok(None)
}

/// Compacts the view when the request outgrows `compact_at` of the
/// primary model's context window (and there is something old to stub).
async fn compact_if_needed(
    core: &Arc<Core>,
    agent: &AgentRow,
    conv: &Conversation,
    view: &mut ContextView,
) -> Result<(), Halt> {
    let Some(model) = core.models.primary(&agent.role) else {
        return Ok(());
    };
    let limit = model.context_window as f64 * model.compact_at;
    if (view.estimated_tokens(conv) as f64) <= limit {
        return Ok(());
    }
    let Some(upto) = view.plan(conv, model.keep_recent) else {
        return Ok(());
    };
    let note = steps::record_compaction(core, agent, upto).await?;
    tracing::info!(upto, "context compacted");
    view.apply(Compacted { upto, note });
    Ok(())
}

/// The result of running a batch of pending calls.
struct ToolRun {
    /// Calls whose results arrive later (the agent suspends on them).
    ids: Vec<String>,
    /// Those of them that wait on a human's approval.
    gated: Vec<String>,
    /// Time spent inside the tools (not recording them).
    tool_time: Duration,
    /// The run was stopped by the deadline.
    stopped: Option<Outcome>,
}

/// Runs the pending calls: consecutive calls of tools that allow it run
/// concurrently; each result is recorded as soon as it is ready.
async fn run_tools(
    core: &Arc<Core>,
    agent: &AgentRow,
    allowed: &[String],
    sig: &Arc<TurnSignal>,
    conv: &mut Conversation,
    hints: &mut TodoHints,
    pending: &[ToolCall],
) -> Result<ToolRun, Halt> {
    let mut waiting = Vec::new();
    let mut gated = Vec::new();
    let mut tool_time = Duration::ZERO;
    let mut i = 0;
    let parallel = |c: &ToolCall| core.catalog.get(&c.name).is_none_or(|t| t.parallel());
    while i < pending.len() {
        let mut j = i + 1;
        if parallel(&pending[i]) {
            while j < pending.len() && parallel(&pending[j]) {
                j += 1;
            }
        }
        let since = hints.since();
        let mut running: FuturesUnordered<_> = pending[i..j]
            .iter()
            .map(|call| async move {
                let began = std::time::Instant::now();
                let output = execute(core, agent, allowed, sig, call, since).await;
                (call, output, began.elapsed())
            })
            .collect();
        loop {
            let next = tokio::select! {
                biased;
                _ = core.stop.hard.cancelled() => return Err(Halt::Stop),
                _ = sig.cancel.cancelled() => return Err(Halt::Stale),
                _ = sleep_until_ms(core, agent.deadline_at) => {
                    return Ok(ToolRun { ids: waiting, gated, tool_time, stopped: Some(deadline_outcome(agent, conv)) });
                }
                n = running.next() => n,
            };
            let Some((call, output, took)) = next else {
                break;
            };
            tool_time += took;
            let (mut text, is_error) = match output {
                ToolOutput::Ok(t) => (t, false),
                ToolOutput::Err(t) => (t, true),
                ToolOutput::Pending => {
                    waiting.push(call.id.clone());
                    continue;
                }
                ToolOutput::AwaitingApproval => {
                    waiting.push(call.id.clone());
                    gated.push(call.id.clone());
                    continue;
                }
            };
            hints.decorate(&call.name, &mut text, is_error);
            if let Some(row) =
                steps::record_tool_result(core, agent, &call.id, &call.name, text, is_error).await?
            {
                if core.signals.has_listeners() {
                    core.signals.publish(agent.agent_ref().event(
                        EventKind::ToolResult,
                        row.created_at,
                        serde_json::json!({"message_id": row.id, "tool_call_id": call.id,
                            "tool": call.name, "is_error": is_error, "content": row.content}),
                    ));
                }
                conv.push(&row).map_err(corrupt)?;
            }
        }
        i = j;
    }
    Ok(ToolRun {
        ids: waiting,
        gated,
        tool_time,
        stopped: None,
    })
}

/// Validates and runs one call. Problems the model can fix come back as
/// error results; a tool outside the agent's effective set never runs.
async fn execute(
    core: &Arc<Core>,
    agent: &AgentRow,
    allowed: &[String],
    sig: &Arc<TurnSignal>,
    call: &ToolCall,
    todo_calls_since: usize,
) -> ToolOutput {
    if !allowed.iter().any(|t| t == &call.name) {
        let list = if allowed.is_empty() {
            "none".to_string()
        } else {
            allowed.join(", ")
        };
        return ToolOutput::Err(if core.catalog.contains(&call.name) {
            format!(
                "tool `{}` is not available to this agent; available tools: {list}",
                call.name
            )
        } else {
            format!("unknown tool `{}`; available tools: {list}", call.name)
        });
    }
    let (Some(tool), Some(spec)) = (core.catalog.get(&call.name), core.catalog.spec(&call.name))
    else {
        return ToolOutput::Err(format!(
            "tool `{}` is not installed on this server",
            call.name
        ));
    };
    let raw = if call.arguments.trim().is_empty() {
        "{}"
    } else {
        call.arguments.as_str()
    };
    let args: Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        Err(e) => {
            return ToolOutput::Err(format!(
                "arguments for `{}` are not valid JSON ({e}); send one JSON object matching this schema: {}",
                call.name, spec.parameters
            ))
        }
    };
    if let Err(e) = schema::validate(&spec.parameters, &args) {
        return ToolOutput::Err(format!(
            "invalid arguments for `{}`: {e}; schema: {}",
            call.name, spec.parameters
        ));
    }
    if core.cfg.tools.needs_approval(&call.name) {
        match crate::approvals::gate(core, agent, call).await {
            Ok(crate::approvals::Gate::Run) => {}
            Ok(crate::approvals::Gate::Wait) => return ToolOutput::AwaitingApproval,
            Ok(crate::approvals::Gate::Denied(reason)) => {
                return ToolOutput::Err(format!("denied by user: {reason}"))
            }
            Err(e) => {
                return ToolOutput::Err(format!(
                    "cannot check the approval of `{}`: {e}",
                    call.name
                ))
            }
        }
    }
    if core.signals.has_listeners() {
        core.signals.publish(agent.agent_ref().event(
            EventKind::ToolCall,
            core.now_ms(),
            serde_json::json!({"tool_call_id": call.id, "tool": call.name, "arguments": args}),
        ));
    }
    let ctx = ToolCtx {
        core,
        agent,
        call_id: &call.id,
        cancel: &sig.cancel,
        todo_calls_since,
    };
    tool.call(&ctx, args).await
}
