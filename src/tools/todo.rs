//! Todo lists (SPEC §7): `todo_write` (replace, or merge by id) and
//! `todo_read`. The list is durable; every change journals `todo_updated`.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{Tool, ToolCtx, ToolOutput};
use crate::db::todos::{self, TodoRow};
use crate::db::{events, WriteCtx, WriteFuture};
use crate::events::EventKind;
use crate::model::types::ToolSpec;

/// The nudge appended to a tool result after 10 calls without an update.
pub const NUDGE: &str = "[10+ tool calls since your last todo update — consider todo_read]";
/// The hint appended to a failed tool's result when the list is non-empty.
pub const ERROR_HINT: &str = "[this error may affect your plan — consider todo_read]";
/// Tool calls without a todo update before the nudge.
pub const NUDGE_AFTER: usize = 10;

const STATUSES: [&str; 4] = ["pending", "in_progress", "completed", "cancelled"];
const PRIORITIES: [&str; 3] = ["high", "medium", "low"];

/// One item as the model writes it.
#[derive(Debug, Clone, Deserialize)]
pub struct ItemIn {
    #[serde(default)]
    pub id: Option<Value>,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub priority: Option<String>,
}

fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.trim().to_string(),
        other => other.to_string(),
    }
}

fn status_or_pending(s: Option<&str>) -> String {
    match s {
        Some(s) if STATUSES.contains(&s) => s.to_string(),
        _ => "pending".into(),
    }
}

fn priority_or_medium(s: Option<&str>) -> String {
    match s {
        Some(s) if PRIORITIES.contains(&s) => s.to_string(),
        _ => "medium".into(),
    }
}

fn next_id(list: &[TodoRow]) -> String {
    let max = list
        .iter()
        .filter_map(|t| t.item_id.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    (max + 1).to_string()
}

/// The new list: `merge = false` replaces it; `merge = true` updates items
/// by id and appends the rest. Missing or invalid status → `pending`,
/// priority → `medium`; missing ids are numbered.
pub fn apply(current: &[TodoRow], items: &[ItemIn], merge: bool) -> Result<Vec<TodoRow>, String> {
    let mut list: Vec<TodoRow> = if merge { current.to_vec() } else { Vec::new() };
    for (i, it) in items.iter().enumerate() {
        let id = it.id.as_ref().map(id_text).filter(|s| !s.is_empty());
        if merge {
            if let Some(existing) = id
                .as_ref()
                .and_then(|id| list.iter_mut().find(|t| &t.item_id == id))
            {
                if let Some(c) = &it.content {
                    if c.trim().is_empty() {
                        return Err(format!("todos[{i}].content must not be empty"));
                    }
                    existing.content = c.clone();
                }
                if it.status.is_some() {
                    existing.status = status_or_pending(it.status.as_deref());
                }
                if it.priority.is_some() {
                    existing.priority = priority_or_medium(it.priority.as_deref());
                }
                continue;
            }
        }
        let content = match &it.content {
            Some(c) if !c.trim().is_empty() => c.clone(),
            _ => return Err(format!("todos[{i}].content is required for a new item")),
        };
        let item_id = match id {
            Some(id) if !list.iter().any(|t| t.item_id == id) => id,
            Some(id) => return Err(format!("todos[{i}].id `{id}` appears twice")),
            None => next_id(&list),
        };
        list.push(TodoRow {
            item_id,
            content,
            status: status_or_pending(it.status.as_deref()),
            priority: priority_or_medium(it.priority.as_deref()),
        });
    }
    Ok(list)
}

/// The list as JSON, with counts.
pub fn render(list: &[TodoRow]) -> Value {
    let completed = list.iter().filter(|t| t.status == "completed").count();
    let remaining = list
        .iter()
        .filter(|t| t.status == "pending" || t.status == "in_progress")
        .count();
    json!({
        "todos": list.iter().map(|t| json!({
            "id": t.item_id, "content": t.content, "status": t.status, "priority": t.priority
        })).collect::<Vec<_>>(),
        "completed": completed,
        "remaining": remaining,
    })
}

/// `todo_write(todos, merge=false)`.
pub struct TodoWrite;

#[derive(Deserialize)]
struct WriteArgs {
    todos: Vec<ItemIn>,
    #[serde(default)]
    merge: bool,
}

#[async_trait::async_trait]
impl Tool for TodoWrite {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "todo_write".into(),
            description: "Write your todo list. merge=false (default) replaces the list (an empty list clears it); \
                          merge=true updates items by id and appends new ones. Returns the whole list."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "todos": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": ["string", "integer"]},
                            "content": {"type": "string"},
                            "status": {"type": "string", "description": "pending | in_progress | completed | cancelled"},
                            "priority": {"type": "string", "description": "high | medium | low"}
                        }
                    }},
                    "merge": {"type": "boolean"}
                },
                "required": ["todos"],
                "additionalProperties": false
            }),
        }
    }

    fn parallel(&self) -> bool {
        false
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        let a: WriteArgs = match serde_json::from_value(args) {
            Ok(a) => a,
            Err(e) => return ToolOutput::Err(format!("invalid arguments for `todo_write`: {e}")),
        };
        let agent = ctx.agent.agent_ref();
        let call_id = ctx.call_id.to_string();
        let r = ctx
            .core
            .db
            .write(
                move |w: &mut WriteCtx| -> WriteFuture<'_, Result<Value, String>> {
                    Box::pin(async move {
                        let current = todos::list_tx(&mut w.conn, &agent.id).await?;
                        // Re-running the call that was already applied changes nothing.
                        if todos::last_write(&mut w.conn, &agent.id).await?.as_deref()
                            == Some(call_id.as_str())
                        {
                            return Ok(Ok(render(&current)));
                        }
                        let list = match apply(&current, &a.todos, a.merge) {
                            Ok(l) => l,
                            Err(e) => return Ok(Err(e)),
                        };
                        todos::replace(&mut w.conn, w.now, &agent.id, &list).await?;
                        todos::mark_written(&mut w.conn, w.now, &agent.id, &call_id).await?;
                        let rendered = render(&list);
                        events::emit(
                            w,
                            agent.event(EventKind::TodoUpdated, w.now, rendered.clone()),
                        )
                        .await?;
                        Ok(Ok(rendered))
                    })
                },
            )
            .await;
        match r {
            Ok(Ok(v)) => ToolOutput::Ok(v.to_string()),
            Ok(Err(e)) => ToolOutput::Err(format!("todo_write: {e}")),
            Err(e) => ToolOutput::Err(format!("todo_write failed on a storage error: {e}")),
        }
    }
}

/// `todo_read()`: the list, counts, and tool calls since the last update.
pub struct TodoRead;

#[async_trait::async_trait]
impl Tool for TodoRead {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "todo_read".into(),
            description: "Read your todo list with completed/remaining counts and tool calls since your last update.".into(),
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        }
    }

    async fn call(&self, ctx: &ToolCtx<'_>, _args: Value) -> ToolOutput {
        match todos::list(ctx.core.db.reader(), &ctx.agent.id).await {
            Ok(list) => {
                let mut v = render(&list);
                v["tool_calls_since_update"] = json!(ctx.todo_calls_since);
                ToolOutput::Ok(v.to_string())
            }
            Err(e) => ToolOutput::Err(format!("todo_read failed on a storage error: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(
        id: Option<&str>,
        content: Option<&str>,
        status: Option<&str>,
        priority: Option<&str>,
    ) -> ItemIn {
        ItemIn {
            id: id.map(|s| Value::String(s.into())),
            content: content.map(str::to_string),
            status: status.map(str::to_string),
            priority: priority.map(str::to_string),
        }
    }

    fn row(id: &str, content: &str, status: &str, priority: &str) -> TodoRow {
        TodoRow {
            item_id: id.into(),
            content: content.into(),
            status: status.into(),
            priority: priority.into(),
        }
    }

    #[test]
    fn replace_numbers_items_and_applies_defaults() {
        let list = apply(
            &[row("9", "old", "pending", "low")],
            &[
                item(None, Some("a"), None, None),
                item(None, Some("b"), Some("bogus"), Some("high")),
                item(Some("x"), Some("c"), Some("completed"), Some("urgent")),
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            list,
            vec![
                row("1", "a", "pending", "medium"),
                row("2", "b", "pending", "high"),
                row("x", "c", "completed", "medium"),
            ]
        );
    }

    #[test]
    fn merge_updates_by_id_and_appends() {
        let current = vec![
            row("1", "a", "pending", "medium"),
            row("2", "b", "pending", "medium"),
        ];
        let list = apply(
            &current,
            &[
                item(Some("2"), None, Some("completed"), None),
                item(None, Some("c"), None, Some("low")),
            ],
            true,
        )
        .unwrap();
        assert_eq!(
            list,
            vec![
                row("1", "a", "pending", "medium"),
                row("2", "b", "completed", "medium"),
                row("3", "c", "pending", "low"),
            ]
        );
    }

    #[test]
    fn empty_replace_clears_and_bad_items_are_named() {
        assert!(apply(&[row("1", "a", "pending", "medium")], &[], false)
            .unwrap()
            .is_empty());
        assert_eq!(
            apply(&[], &[item(None, None, None, None)], false),
            Err("todos[0].content is required for a new item".into())
        );
    }

    #[test]
    fn render_counts() {
        let v = render(&[
            row("1", "a", "completed", "medium"),
            row("2", "b", "in_progress", "high"),
            row("3", "c", "cancelled", "low"),
        ]);
        assert_eq!(v["completed"], 1);
        assert_eq!(v["remaining"], 1);
        assert_eq!(v["todos"][1]["status"], "in_progress");
    }
}
