//! The one delivery path (SPEC §6) used by the API, `send_to_agent`,
//! background completions, schedules and heartbeats. The message is written
//! to the target's inbox first and never dropped; then the target's status
//! and the auto-wake budget decide whether it waits for the next step
//! boundary (`queued`), starts a new turn (`started`) or stays in the inbox
//! without waking (`suppressed`).

use std::sync::Arc;

use serde::Serialize;
use serde_json::json;

use crate::core::Core;
use crate::db::agents::{self, AgentRow};
use crate::db::{events, inbox, jobs, DbError, WriteCtx, WriteFuture};
use crate::events::EventKind;
use crate::types::{AgentStatus, Origin};

/// What delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// The target is busy; it reads the message at its next step boundary.
    Queued,
    /// The target was idle; a new turn starts.
    Started,
    /// The target is out of auto-wake budget; the message waits for a human.
    Suppressed,
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Started => "started",
            Self::Suppressed => "suppressed",
        }
    }
}

/// A message to deliver.
#[derive(Debug, Clone)]
pub struct Message {
    pub target: String,
    pub content: String,
    pub origin: Origin,
    /// The sending agent's id (or the schedule id), if any.
    pub sender: Option<String>,
    /// Human messages only: abort the running model call and restart the
    /// step with this message appended.
    pub interrupt: bool,
}

/// Why a message was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeliverError {
    #[error("agent `{0}` is closed and accepts no messages")]
    Closed(String),
    #[error("agent `{0}` is {1} and accepts no messages")]
    Final(String, AgentStatus),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// The outcome with the target as it was before the delivery.
#[derive(Debug, Clone)]
pub struct Delivered {
    pub delivery: Delivery,
    pub target: AgentRow,
}

/// Delivers in its own write.
pub async fn deliver(core: &Arc<Core>, m: Message) -> Result<Delivered, DeliverError> {
    let core2 = Arc::clone(core);
    core.db
        .write(
            move |ctx: &mut WriteCtx| -> WriteFuture<'_, Result<Delivered, DeliverError>> {
                Box::pin(async move {
                    match deliver_tx(ctx, &core2, &m).await {
                        // A storage error rolls the whole write back.
                        Err(DeliverError::Db(e)) => Err(e),
                        other => Ok(other),
                    }
                })
            },
        )
        .await?
}

/// Delivers inside an existing write (completions and schedule fires
/// deliver in the same transaction as what caused them).
pub async fn deliver_tx(
    ctx: &mut WriteCtx,
    core: &Core,
    m: &Message,
) -> Result<Delivered, DeliverError> {
    let target = agents::must_get_tx(&mut ctx.conn, &m.target).await?;
    if target.closed {
        return Err(DeliverError::Closed(target.id));
    }
    if target.status.is_final() {
        return Err(DeliverError::Final(target.id, target.status));
    }
    let now = ctx.now;
    inbox::push(
        &mut ctx.conn,
        now,
        &target.id,
        &m.content,
        m.origin,
        m.sender.as_deref(),
    )
    .await?;
    let full = core.cfg.agents.max_auto_wakes;
    let delivery = match target.status {
        AgentStatus::Queued | AgentStatus::Running | AgentStatus::Waiting => {
            if m.origin == Origin::Human && target.auto_wake_budget != full {
                agents::set_wake_budget(&mut ctx.conn, &target.id, full).await?;
            }
            if m.interrupt && m.origin == Origin::Human {
                ctx.effects.interrupt.push(target.id.clone());
            } else {
                ctx.effects.inbox.push(target.id.clone());
            }
            Delivery::Queued
        }
        AgentStatus::Done | AgentStatus::Failed => {
            let budget = if m.origin == Origin::Human {
                Some(full)
            } else if m.origin.spends_wake_budget() {
                (target.auto_wake_budget > 0).then(|| target.auto_wake_budget - 1)
            } else {
                Some(target.auto_wake_budget)
            };
            match budget {
                Some(b) => {
                    agents::wake(ctx, &target.id, b).await?;
                    jobs::enqueue_turn(ctx, &target.id, core.cfg.workers.max_attempts).await?;
                    Delivery::Started
                }
                None => Delivery::Suppressed,
            }
        }
        AgentStatus::Cancelled | AgentStatus::TimedOut => unreachable_final(&target)?,
    };
    let kind = if delivery == Delivery::Suppressed {
        EventKind::WakeSuppressed
    } else {
        EventKind::MessageQueued
    };
    let ev = target.agent_ref().event(
        kind,
        now,
        json!({"origin": m.origin, "sender": m.sender, "delivery": delivery}),
    );
    events::emit(ctx, ev).await?;
    Ok(Delivered { delivery, target })
}

fn unreachable_final(target: &AgentRow) -> Result<Delivery, DeliverError> {
    // Checked above; kept as an error rather than a panic.
    Err(DeliverError::Final(target.id.clone(), target.status))
}
