//! In-process signals: the event broadcast, the "a job is ready" wake-up and
//! the per-turn handles (cancellation token, inbox flag, interrupt). All of
//! it is rebuildable: losing it in a crash loses nothing recorded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

use crate::events::Event;

/// What a committed write asks the process to do next.
#[derive(Debug, Default)]
pub struct Effects {
    pub events: Vec<Event>,
    /// A job became claimable now.
    pub job_ready: bool,
    /// Agents whose running turn must stop at once.
    pub cancel: Vec<String>,
    /// Agents whose inbox received a message while they may be running.
    pub inbox: Vec<String>,
    /// Agents whose in-flight model call must restart with new input.
    pub interrupt: Vec<String>,
}

/// Where in `Effects` a write started, so a failed write's effects can be
/// dropped with its rolled-back rows.
#[derive(Debug, Clone, Copy)]
pub struct EffectsMark([usize; 4], bool);

impl Effects {
    pub fn mark(&self) -> EffectsMark {
        EffectsMark(
            [
                self.events.len(),
                self.cancel.len(),
                self.inbox.len(),
                self.interrupt.len(),
            ],
            self.job_ready,
        )
    }

    pub fn truncate(&mut self, m: EffectsMark) {
        self.events.truncate(m.0[0]);
        self.cancel.truncate(m.0[1]);
        self.inbox.truncate(m.0[2]);
        self.interrupt.truncate(m.0[3]);
        self.job_ready = m.1;
    }
}

/// The handle of one running turn.
#[derive(Debug, Default)]
pub struct TurnSignal {
    /// Fired after the database says the agent is cancelled or timed out.
    pub cancel: CancellationToken,
    /// Set when a message lands in the inbox; read at step boundaries.
    pub inbox: AtomicBool,
    /// Woken for `mode = "interrupt"` human messages.
    pub interrupt: Notify,
}

/// The process-wide signal hub.
pub struct Signals {
    events: broadcast::Sender<Arc<Event>>,
    /// Wakes the worker dispatcher without polling.
    pub job_ready: Notify,
    /// Wakes the scheduler: a schedule changed, or a cron tick passed.
    pub schedules: Notify,
    turns: Mutex<HashMap<String, Arc<TurnSignal>>>,
}

impl Default for Signals {
    fn default() -> Self {
        Self::new()
    }
}

impl Signals {
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        Self {
            events,
            job_ready: Notify::new(),
            schedules: Notify::new(),
            turns: Mutex::new(HashMap::new()),
        }
    }

    /// Subscribes to every event published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    /// Whether anyone listens (step events are only built when someone does).
    pub fn has_listeners(&self) -> bool {
        self.events.receiver_count() > 0
    }

    /// Publishes one event outside a write (step events).
    pub fn publish(&self, e: Event) {
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(Arc::new(e));
        }
    }

    /// Registers a running turn; the returned guard unregisters it on drop.
    pub fn register_turn(self: &Arc<Self>, agent_id: &str) -> TurnGuard {
        let sig = Arc::new(TurnSignal::default());
        self.lock_turns()
            .insert(agent_id.to_string(), Arc::clone(&sig));
        TurnGuard {
            signals: Arc::clone(self),
            agent_id: agent_id.to_string(),
            signal: sig,
        }
    }

    fn lock_turns(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TurnSignal>>> {
        // A poisoned map only means a panic elsewhere while inserting; the
        // map itself is still consistent.
        self.turns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn turn(&self, agent_id: &str) -> Option<Arc<TurnSignal>> {
        self.lock_turns().get(agent_id).cloned()
    }

    /// Applies what a committed write asked for.
    pub fn apply(&self, effects: Effects) {
        for id in &effects.cancel {
            if let Some(t) = self.turn(id) {
                t.cancel.cancel();
            }
        }
        for id in &effects.inbox {
            if let Some(t) = self.turn(id) {
                t.inbox.store(true, Ordering::SeqCst);
            }
        }
        for id in &effects.interrupt {
            if let Some(t) = self.turn(id) {
                t.inbox.store(true, Ordering::SeqCst);
                t.interrupt.notify_one();
            }
        }
        if effects.job_ready {
            self.job_ready.notify_one();
        }
        if self.events.receiver_count() > 0 {
            for e in effects.events {
                let _ = self.events.send(Arc::new(e));
            }
        }
    }

    /// Cancels every registered turn (shutdown after the grace period).
    pub fn cancel_all_turns(&self) {
        for t in self.lock_turns().values() {
            t.cancel.cancel();
        }
    }

    /// How many turns are registered as running in this process.
    pub fn running_turns(&self) -> usize {
        self.lock_turns().len()
    }
}

/// Keeps a turn registered while it runs.
pub struct TurnGuard {
    signals: Arc<Signals>,
    agent_id: String,
    pub signal: Arc<TurnSignal>,
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        let mut map = self.signals.lock_turns();
        if map
            .get(&self.agent_id)
            .is_some_and(|s| Arc::ptr_eq(s, &self.signal))
        {
            map.remove(&self.agent_id);
        }
    }
}
