//! The protocol-neutral shapes of a chat exchange: messages, tool calls,
//! requests, replies and usage.

use serde::{Deserialize, Serialize};

use crate::types::MsgRole;

/// One tool call as the model asked for it. `arguments` is kept exactly as
/// received (it may not even be JSON) so the conversation replays verbatim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message of the context sent to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: MsgRole,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn system(content: impl Into<String>) -> Self {
        Self::plain(MsgRole::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::plain(MsgRole::User, content)
    }

    pub fn plain(role: MsgRole, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// Rough token estimate (chars / 4) used when the server sends no usage
    /// and for the compaction budget.
    pub fn estimated_tokens(&self) -> u64 {
        let chars = self.content.len()
            + self
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len() + c.id.len())
                .sum::<usize>();
        (chars as u64).div_ceil(4) + 4
    }
}

/// A tool as advertised to the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

/// Token counts of one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub tokens_in: i64,
    pub tokens_out: i64,
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    ToolCalls,
    /// Output was cut at the server's length limit.
    Length,
    Other,
}

/// What the model answered.
#[derive(Debug, Clone)]
pub struct ModelReply {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub finish_reason: FinishReason,
}

/// A request to one model.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    /// The model name the server knows.
    pub model: &'a str,
    pub messages: &'a [ChatMessage],
    pub tools: &'a [ToolSpec],
}

/// Estimated tokens of a whole request.
pub fn estimate_tokens(messages: &[ChatMessage]) -> u64 {
    messages.iter().map(ChatMessage::estimated_tokens).sum()
}
