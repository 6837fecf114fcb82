//! Context compaction (SPEC §3). When a request's estimated tokens exceed
//! `compact_at` of the model's context window, tool results older than the
//! most recent `keep_recent` exchanges are shown as one-line stubs, and one
//! note with the current todo list follows the compacted region. The rows
//! stay untouched; only the view sent to the model changes. Between
//! compactions the view only grows at the end, so every request is the
//! previous one plus new messages (prompt caches keep working).

use std::collections::HashMap;

use super::conversation::Conversation;
use crate::model::types::ChatMessage;
use crate::types::MsgRole;

/// A compaction: stored messages up to `upto` (by id) are old.
#[derive(Debug, Clone, PartialEq)]
pub struct Compacted {
    pub upto: i64,
    /// The note injected after the compacted region.
    pub note: String,
}

/// The messages sent to the model: the conversation, or its compacted form
/// (built once, then extended).
#[derive(Debug, Default)]
pub struct ContextView {
    compaction: Option<Compacted>,
    built: Vec<ChatMessage>,
    /// Conversation entries already copied into `built`.
    consumed: usize,
    note_placed: bool,
    tool_names: HashMap<String, String>,
}

/// The stub that replaces an old tool result.
pub fn stub(tool: &str, content: &str) -> String {
    format!(
        "[compacted: `{tool}` returned {} characters; the full result stays on record]",
        content.chars().count()
    )
}

impl ContextView {
    pub fn new(compaction: Option<Compacted>) -> Self {
        Self {
            compaction,
            ..Self::default()
        }
    }

    /// Whether a compaction is in force.
    pub fn compacted(&self) -> bool {
        self.compaction.is_some()
    }

    /// The request messages.
    pub fn messages<'a>(&'a mut self, conv: &'a Conversation) -> &'a [ChatMessage] {
        let Some(c) = &self.compaction else {
            return conv.view();
        };
        let view = conv.view();
        let ids = conv.ids();
        for i in self.consumed..view.len() {
            let (m, id) = (&view[i], ids[i]);
            if !self.note_placed && id > c.upto {
                self.built.push(ChatMessage::user(c.note.clone()));
                self.note_placed = true;
            }
            for call in &m.tool_calls {
                self.tool_names.insert(call.id.clone(), call.name.clone());
            }
            if m.role == MsgRole::Tool && id <= c.upto {
                let id = m.tool_call_id.clone().unwrap_or_default();
                let name = self
                    .tool_names
                    .get(&id)
                    .map(String::as_str)
                    .unwrap_or("tool");
                self.built.push(ChatMessage {
                    role: MsgRole::Tool,
                    content: stub(name, &m.content),
                    tool_calls: Vec::new(),
                    tool_call_id: Some(id),
                });
            } else {
                self.built.push(m.clone());
            }
        }
        self.consumed = view.len();
        &self.built
    }

    /// Estimated tokens of the current request.
    pub fn estimated_tokens(&mut self, conv: &Conversation) -> u64 {
        crate::model::types::estimate_tokens(self.messages(conv))
    }

    /// Where a new compaction would end: the largest message id before the
    /// most recent `keep_recent` exchanges, if that stubs something new.
    pub fn plan(&self, conv: &Conversation, keep_recent: usize) -> Option<i64> {
        let view = conv.view();
        let ids = conv.ids();
        let starts: Vec<usize> = view
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == MsgRole::Assistant)
            .map(|(i, _)| i)
            .collect();
        if starts.len() <= keep_recent {
            return None;
        }
        let boundary = starts[starts.len() - keep_recent.max(1)];
        let old = 0..boundary;
        let upto = old.clone().map(|i| ids[i]).max()?;
        let previous = self.compaction.as_ref().map(|c| c.upto).unwrap_or(0);
        let fresh_stubs = old
            .filter(|&i| view[i].role == MsgRole::Tool && ids[i] > previous)
            .count();
        (upto > previous && fresh_stubs > 0).then_some(upto)
    }

    /// Puts a new compaction in force (the view is rebuilt).
    pub fn apply(&mut self, c: Compacted) {
        *self = Self::new(Some(c));
    }
}
