//! The conversation as the model sees it, kept in memory for the length of a
//! turn run and extended as steps are recorded (never re-read per step).
//! Tool results are held back until every call of their assistant message
//! has one, then appended in call order, so the view is always a valid
//! history and each request is the previous one plus messages at the end.

use std::collections::HashMap;

use crate::db::messages::MessageRow;
use crate::model::types::{ChatMessage, ToolCall};
use crate::types::MsgRole;

/// The model's view of one agent's conversation.
#[derive(Debug, Default)]
pub struct Conversation {
    chat: Vec<ChatMessage>,
    /// The stored message id of each entry of `chat`.
    ids: Vec<i64>,
    open_calls: Vec<ToolCall>,
    results: HashMap<String, (ChatMessage, i64)>,
    /// Content of the newest assistant message (the partial result of a turn
    /// that is stopped by a limit).
    pub last_assistant_text: Option<String>,
}

impl Conversation {
    /// Rebuilds the view from stored rows (hidden rows already left out).
    pub fn from_rows(rows: &[MessageRow]) -> Result<Self, String> {
        let mut c = Self::default();
        for r in rows {
            c.push(r)?;
        }
        Ok(c)
    }

    /// Appends one recorded message.
    pub fn push(&mut self, row: &MessageRow) -> Result<(), String> {
        match row.role {
            MsgRole::Tool => {
                let id = row.tool_call_id.clone().unwrap_or_default();
                if self.open_calls.iter().any(|c| c.id == id) {
                    self.results.insert(
                        id.clone(),
                        (
                            ChatMessage {
                                role: MsgRole::Tool,
                                content: row.content.clone(),
                                tool_calls: Vec::new(),
                                tool_call_id: Some(id),
                            },
                            row.id,
                        ),
                    );
                    self.flush_if_complete();
                } else {
                    tracing::warn!(message_id = row.id, call_id = %id, "tool result without an open call; left out of the context");
                }
            }
            role => {
                if !self.open_calls.is_empty() {
                    return Err(format!(
                        "message {} ({}) follows tool calls without results ({})",
                        row.id,
                        role.as_str(),
                        self.pending_ids().join(", ")
                    ));
                }
                let msg = row.to_chat().map_err(|e| e.to_string())?;
                if role == MsgRole::Assistant {
                    self.last_assistant_text = Some(msg.content.clone());
                    self.open_calls = msg.tool_calls.clone();
                }
                self.chat.push(msg);
                self.ids.push(row.id);
                self.flush_if_complete();
            }
        }
        Ok(())
    }

    /// Appends a just-recorded answer without re-reading its stored form.
    pub fn push_answer(
        &mut self,
        id: i64,
        content: &str,
        calls: &[ToolCall],
    ) -> Result<(), String> {
        if !self.open_calls.is_empty() {
            return Err("an answer follows tool calls without results".into());
        }
        self.last_assistant_text = Some(content.to_string());
        self.open_calls = calls.to_vec();
        self.chat.push(ChatMessage {
            role: MsgRole::Assistant,
            content: content.to_string(),
            tool_calls: calls.to_vec(),
            tool_call_id: None,
        });
        self.ids.push(id);
        Ok(())
    }

    fn flush_if_complete(&mut self) {
        if self.open_calls.is_empty()
            || self
                .open_calls
                .iter()
                .any(|c| !self.results.contains_key(&c.id))
        {
            return;
        }
        for c in std::mem::take(&mut self.open_calls) {
            if let Some((r, id)) = self.results.remove(&c.id) {
                self.chat.push(r);
                self.ids.push(id);
            }
        }
        self.results.clear();
    }

    /// The newest message's text when it is a final answer (an assistant
    /// message without tool calls).
    pub fn final_answer(&self) -> Option<&str> {
        self.chat
            .last()
            .filter(|m| m.role == MsgRole::Assistant && m.tool_calls.is_empty())
            .map(|m| m.content.as_str())
    }

    /// Calls of the newest assistant message that still lack a result.
    pub fn pending(&self) -> Vec<ToolCall> {
        self.open_calls
            .iter()
            .filter(|c| !self.results.contains_key(&c.id))
            .cloned()
            .collect()
    }

    fn pending_ids(&self) -> Vec<String> {
        self.pending().into_iter().map(|c| c.id).collect()
    }

    /// The request history (valid only when nothing is pending).
    pub fn view(&self) -> &[ChatMessage] {
        &self.chat
    }

    /// The stored message id of each entry of `view()`.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }
}

/// The history invariant checked before every request: every tool call has
/// exactly one result, right after its assistant message, and there is no
/// result without a call.
pub fn check_invariant(msgs: &[ChatMessage]) -> Result<(), String> {
    let mut i = 0;
    while i < msgs.len() {
        let m = &msgs[i];
        match m.role {
            MsgRole::Tool => {
                return Err(format!(
                    "message #{i}: tool result for `{}` without a preceding call",
                    m.tool_call_id.as_deref().unwrap_or("?")
                ))
            }
            MsgRole::Assistant if !m.tool_calls.is_empty() => {
                let mut seen = std::collections::HashSet::new();
                let mut j = i + 1;
                while j < msgs.len() && msgs[j].role == MsgRole::Tool {
                    let id = msgs[j].tool_call_id.as_deref().unwrap_or("");
                    if !m.tool_calls.iter().any(|c| c.id == id) {
                        return Err(format!("message #{j}: result for unknown call `{id}`"));
                    }
                    if !seen.insert(id.to_string()) {
                        return Err(format!("message #{j}: second result for call `{id}`"));
                    }
                    j += 1;
                }
                if let Some(c) = m.tool_calls.iter().find(|c| !seen.contains(&c.id)) {
                    return Err(format!(
                        "message #{i}: call `{}` ({}) has no result",
                        c.id, c.name
                    ));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        id: i64,
        role: MsgRole,
        content: &str,
        calls: &[&str],
        call_id: Option<&str>,
    ) -> MessageRow {
        let tc: Vec<ToolCall> = calls
            .iter()
            .map(|c| ToolCall {
                id: c.to_string(),
                name: "echo".into(),
                arguments: "{}".into(),
            })
            .collect();
        MessageRow {
            id,
            agent_id: "a".into(),
            role,
            content: content.into(),
            tool_calls: (!tc.is_empty()).then(|| serde_json::to_string(&tc).unwrap()),
            tool_call_id: call_id.map(str::to_string),
            tool_name: None,
            is_error: false,
            origin: None,
            sender: None,
            model: None,
            tokens_in: None,
            tokens_out: None,
            cost_usd: None,
            hidden: false,
            created_at: 0,
        }
    }

    #[test]
    fn results_are_appended_in_call_order_once_complete() {
        let rows = vec![
            row(1, MsgRole::System, "s", &[], None),
            row(2, MsgRole::User, "u", &[], None),
            row(3, MsgRole::Assistant, "", &["a", "b"], None),
            row(4, MsgRole::Tool, "rb", &[], Some("b")),
        ];
        let mut c = Conversation::from_rows(&rows).unwrap();
        assert_eq!(c.pending().len(), 1);
        assert_eq!(c.view().len(), 3);
        c.push(&row(5, MsgRole::Tool, "ra", &[], Some("a")))
            .unwrap();
        assert!(c.pending().is_empty());
        let v = c.view();
        assert_eq!(v[3].tool_call_id.as_deref(), Some("a"));
        assert_eq!(v[4].tool_call_id.as_deref(), Some("b"));
        assert_eq!(check_invariant(v), Ok(()));
    }

    #[test]
    fn a_user_message_between_calls_and_results_is_refused() {
        let rows = vec![
            row(1, MsgRole::User, "u", &[], None),
            row(2, MsgRole::Assistant, "", &["a"], None),
            row(3, MsgRole::User, "x", &[], None),
        ];
        assert!(Conversation::from_rows(&rows).is_err());
    }

    #[test]
    fn invariant_catches_missing_and_stray_results() {
        let call = |id: &str| ToolCall {
            id: id.into(),
            name: "echo".into(),
            arguments: "{}".into(),
        };
        let asst = ChatMessage {
            role: MsgRole::Assistant,
            content: String::new(),
            tool_calls: vec![call("a"), call("b")],
            tool_call_id: None,
        };
        let res = |id: &str| ChatMessage {
            role: MsgRole::Tool,
            content: String::new(),
            tool_calls: vec![],
            tool_call_id: Some(id.into()),
        };
        assert!(check_invariant(&[asst.clone(), res("a")])
            .unwrap_err()
            .contains("`b`"));
        assert!(check_invariant(&[res("a")]).is_err());
        assert!(check_invariant(&[asst.clone(), res("a"), res("a"), res("b")]).is_err());
        assert_eq!(check_invariant(&[asst, res("b"), res("a")]), Ok(()));
    }
}
