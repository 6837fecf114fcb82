//! Todo hints appended to tool results (SPEC §7): after 10 tool calls
//! without a todo update on a non-empty list, the next (11th) result gets
//! the nudge (once until the next update); a failed tool's result gets the error
//! hint while the list is non-empty. The counters are derived from the
//! conversation at the start of a run, so nothing extra is stored per step.

use crate::core::Core;
use crate::db::messages::MessageRow;
use crate::db::{todos, DbResult};
use crate::tools::todo::{ERROR_HINT, NUDGE, NUDGE_AFTER};
use crate::types::MsgRole;

/// The todo-hint state of one run.
#[derive(Debug, Default, Clone)]
pub struct TodoHints {
    enabled: bool,
    nonempty: bool,
    since: usize,
    nudged: bool,
}

impl TodoHints {
    /// Derives the state from the conversation (and the list's size).
    pub async fn load(
        core: &Core,
        agent_id: &str,
        tools: &[String],
        rows: &[MessageRow],
    ) -> DbResult<Self> {
        let enabled = tools.iter().any(|t| t == "todo_write" || t == "todo_read");
        if !enabled {
            return Ok(Self::default());
        }
        let last_write = rows.iter().rposition(|r| {
            r.role == MsgRole::Tool && r.tool_name.as_deref() == Some("todo_write") && !r.is_error
        });
        let after = &rows[last_write.map(|i| i + 1).unwrap_or(0)..];
        let results = after.iter().filter(|r| r.role == MsgRole::Tool);
        Ok(Self {
            enabled,
            nonempty: todos::count(core.db.reader(), agent_id).await? > 0,
            since: results.clone().count(),
            nudged: results.clone().any(|r| r.content.contains(NUDGE)),
        })
    }

    /// Tool calls since the last todo update.
    pub fn since(&self) -> usize {
        self.since
    }

    /// Counts one tool result and appends the hints it calls for.
    pub fn decorate(&mut self, tool: &str, text: &mut String, is_error: bool) {
        if !self.enabled {
            return;
        }
        if tool == "todo_write" && !is_error {
            self.since = 0;
            self.nudged = false;
            self.nonempty = serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|v| v["todos"].as_array().map(|a| !a.is_empty()))
                .unwrap_or(self.nonempty);
            return;
        }
        self.since += 1;
        if !self.nonempty {
            return;
        }
        if is_error {
            text.push('\n');
            text.push_str(ERROR_HINT);
        }
        if self.since > NUDGE_AFTER && !self.nudged {
            text.push('\n');
            text.push_str(NUDGE);
            self.nudged = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn active() -> TodoHints {
        TodoHints {
            enabled: true,
            nonempty: true,
            since: 0,
            nudged: false,
        }
    }

    #[test]
    fn the_eleventh_result_is_nudged_once() {
        let mut h = active();
        for i in 0..10 {
            let mut t = format!("r{i}");
            h.decorate("echo", &mut t, false);
            assert_eq!(t, format!("r{i}"));
        }
        let mut t = "eleventh".to_string();
        h.decorate("echo", &mut t, false);
        assert_eq!(t, format!("eleventh\n{NUDGE}"));
        let mut t = "twelfth".to_string();
        h.decorate("echo", &mut t, false);
        assert_eq!(t, "twelfth");
        let mut w = r#"{"todos":[{"id":"1"}]}"#.to_string();
        h.decorate("todo_write", &mut w, false);
        assert_eq!(h.since(), 0);
    }

    #[test]
    fn errors_get_the_hint_only_with_a_list() {
        let mut h = active();
        let mut t = "boom".to_string();
        h.decorate("echo", &mut t, true);
        assert_eq!(t, format!("boom\n{ERROR_HINT}"));
        let mut w = r#"{"todos":[]}"#.to_string();
        h.decorate("todo_write", &mut w, false);
        let mut t = "boom".to_string();
        h.decorate("echo", &mut t, true);
        assert_eq!(t, "boom");
    }
}
