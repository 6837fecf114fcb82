//! Events: what happened to which agent. Lifecycle events are journalled in
//! the `events` table by the write that caused them; step events
//! (assistant messages, tool calls and results) are journalled by the
//! conversation itself and only broadcast. After a commit, events fan out on
//! a broadcast channel to SSE streams and long-polls.

use serde::Serialize;
use serde_json::Value;

/// The closed set of event names (SSE `event:` names, SPEC §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    AgentCreated,
    TurnStarted,
    AssistantMessage,
    ToolCall,
    ToolResult,
    AgentWaiting,
    AgentFinished,
    MessageQueued,
    WakeSuppressed,
    TodoUpdated,
    ApprovalRequested,
    Compacted,
    ScheduleFired,
    ScheduleMissed,
}

impl EventKind {
    /// The SSE event name and the `events.kind` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentCreated => "agent_created",
            Self::TurnStarted => "turn_started",
            Self::AssistantMessage => "assistant_message",
            Self::ToolCall => "tool_call",
            Self::ToolResult => "tool_result",
            Self::AgentWaiting => "agent_waiting",
            Self::AgentFinished => "agent_finished",
            Self::MessageQueued => "message_queued",
            Self::WakeSuppressed => "wake_suppressed",
            Self::TodoUpdated => "todo_updated",
            Self::ApprovalRequested => "approval_requested",
            Self::Compacted => "compacted",
            Self::ScheduleFired => "schedule_fired",
            Self::ScheduleMissed => "schedule_missed",
        }
    }

    /// Step events live in `messages`; writing them twice would double the
    /// hot path's writes for no new information.
    pub fn is_journalled(self) -> bool {
        !matches!(
            self,
            Self::AssistantMessage | Self::ToolCall | Self::ToolResult
        )
    }
}

/// One event about one agent (or one schedule).
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventKind,
    pub agent_id: Option<String>,
    pub user: String,
    pub level: Option<i64>,
    pub parent_id: Option<String>,
    pub root_id: Option<String>,
    pub at: i64,
    pub data: Value,
}

/// The lineage an event needs, cut from an agent row once.
#[derive(Debug, Clone)]
pub struct AgentRef {
    pub id: String,
    pub user: String,
    pub level: i64,
    pub parent_id: Option<String>,
    pub root_id: String,
}

impl AgentRef {
    /// An event about this agent.
    pub fn event(&self, kind: EventKind, at: i64, data: Value) -> Event {
        Event {
            kind,
            agent_id: Some(self.id.clone()),
            user: self.user.clone(),
            level: Some(self.level),
            parent_id: self.parent_id.clone(),
            root_id: Some(self.root_id.clone()),
            at,
            data,
        }
    }
}
