//! Closed sets shared by every layer: agent statuses, message roles and
//! origins, job kinds and states. Each is an enum with one serde/SQL name;
//! the database keeps the same names in TEXT columns guarded by CHECKs.

use serde::{Deserialize, Serialize};

/// Where an agent is in its life (SPEC §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "TEXT", rename_all = "snake_case")]
pub enum AgentStatus {
    /// A turn job is waiting for a worker.
    Queued,
    /// A worker holds the turn's lease.
    Running,
    /// Suspended on children, an approval or a clarify answer.
    Waiting,
    /// The last turn ended with a final answer.
    Done,
    /// The last turn failed; a human message may wake it again.
    Failed,
    /// Cancelled by a user or a parent; terminal.
    Cancelled,
    /// Its deadline passed; terminal.
    TimedOut,
}

impl AgentStatus {
    /// Terminal for waiting purposes: nothing more happens without a new message.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            Self::Done | Self::Failed | Self::Cancelled | Self::TimedOut
        )
    }

    /// Never runs again, whatever arrives.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Cancelled | Self::TimedOut)
    }

    /// Holds or waits for a worker or for something it started.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Queued | Self::Running | Self::Waiting)
    }

    /// The name used in SQL, JSON and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::TimedOut => "timed_out",
        }
    }

    /// Parses the SQL/JSON name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "waiting" => Self::Waiting,
            "done" => Self::Done,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            "timed_out" => Self::TimedOut,
            _ => return None,
        })
    }
}

impl std::fmt::Display for AgentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who a message came from (SPEC §6). Decides whether waking costs budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "TEXT", rename_all = "snake_case")]
pub enum Origin {
    /// A person, through the API or the CLI: refills the budget, always wakes.
    Human,
    /// Another agent's `send_to_agent`: spends one auto-wake unit.
    Agent,
    /// Completion of the agent's own background child or command: free.
    Child,
    /// The runtime itself: spends one auto-wake unit.
    System,
    /// A cron brief: free.
    Cron,
    /// A heartbeat schedule: free.
    Heartbeat,
}

impl Origin {
    /// The name used in SQL and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Human => "human",
            Self::Agent => "agent",
            Self::Child => "child",
            Self::System => "system",
            Self::Cron => "cron",
            Self::Heartbeat => "heartbeat",
        }
    }

    /// Waking an idle agent with this origin costs one auto-wake unit.
    pub fn spends_wake_budget(self) -> bool {
        matches!(self, Self::Agent | Self::System)
    }
}

/// The role of one conversation message, as the OpenAI protocol names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "TEXT", rename_all = "snake_case")]
pub enum MsgRole {
    System,
    User,
    Assistant,
    Tool,
}

impl MsgRole {
    /// The protocol name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// Why an agent's last turn ended (drives the sub-agent result header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "TEXT", rename_all = "snake_case")]
pub enum StopReason {
    /// A final answer.
    Done,
    /// `max_turns` model calls in one turn.
    TurnLimit,
    /// The agent's or an ancestor's `max_cost_usd` is spent.
    CostLimit,
    /// `deadline_at` passed.
    Deadline,
    /// Cancelled by a user or a parent.
    Cancelled,
    /// The model or the loop failed.
    Error,
    /// Crashed `max_resumes` times at the same step.
    Quarantined,
}

/// What a queue job does when a worker claims it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "TEXT", rename_all = "snake_case")]
pub enum JobKind {
    /// Run one turn of one agent.
    Turn,
    /// Deliver one webhook.
    Notify,
    /// Does nothing; the queue benchmark uses it.
    Noop,
}

impl JobKind {
    /// The SQL name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Turn => "turn",
            Self::Notify => "notify",
            Self::Noop => "noop",
        }
    }
}

/// Where a job is in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "TEXT", rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Completed,
    Failed,
    Cancelled,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_round_trip() {
        for s in [
            AgentStatus::Queued,
            AgentStatus::Running,
            AgentStatus::Waiting,
            AgentStatus::Done,
            AgentStatus::Failed,
            AgentStatus::Cancelled,
            AgentStatus::TimedOut,
        ] {
            assert_eq!(AgentStatus::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::Value::String(s.as_str().into())
            );
        }
        assert_eq!(AgentStatus::parse("DONE"), None);
    }

    #[test]
    fn only_agent_and_system_spend_the_wake_budget() {
        let spending: Vec<Origin> = [
            Origin::Human,
            Origin::Agent,
            Origin::Child,
            Origin::System,
            Origin::Cron,
            Origin::Heartbeat,
        ]
        .into_iter()
        .filter(|o| o.spends_wake_budget())
        .collect();
        assert_eq!(spending, vec![Origin::Agent, Origin::System]);
    }
}
