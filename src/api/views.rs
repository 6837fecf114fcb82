//! JSON shapes of API answers, built from rows (times as RFC 3339).

use serde_json::{json, Value};

use crate::clock::rfc3339;
use crate::db::agents::AgentRow;
use crate::db::messages::MessageRow;

/// An agent as the API shows it.
pub fn agent(a: &AgentRow, handle: &str) -> Value {
    json!({
        "id": a.id,
        "handle": handle,
        "level": a.level,
        "parent_id": a.parent_id,
        "root_id": a.root_id,
        "user": a.user_name,
        "definition": a.definition,
        "role": a.role,
        "task": a.task,
        "status": a.status,
        "result": a.result,
        "error": a.error,
        "stop_reason": a.stop_reason,
        "background": a.background,
        "created_at": rfc3339(a.created_at),
        "started_at": a.started_at.map(rfc3339),
        "finished_at": a.finished_at.map(rfc3339),
        "usage": {
            "turns": a.turns,
            "tokens_in": a.tokens_in,
            "tokens_out": a.tokens_out,
            "cost_usd": a.cost_usd,
        },
        "limits": {
            "max_turns": a.max_turns,
            "max_cost_usd": a.max_cost_usd,
            "timeout_s": a.timeout_s,
            "deadline_at": a.deadline_at.map(rfc3339),
        },
        "auto_wake_budget": a.auto_wake_budget,
        "effective_tools": a.tools(),
        "notify": a.notify.as_deref().and_then(|n| serde_json::from_str::<Value>(n).ok()),
        "closed": a.closed,
        "metadata": serde_json::from_str::<Value>(&a.metadata).unwrap_or(Value::Null),
    })
}

/// One conversation message.
pub fn message(m: &MessageRow) -> Value {
    let calls = m
        .tool_calls
        .as_deref()
        .and_then(|c| serde_json::from_str::<Value>(c).ok());
    json!({
        "id": m.id,
        "role": m.role,
        "content": m.content,
        "tool_calls": calls,
        "tool_call_id": m.tool_call_id,
        "tool_name": m.tool_name,
        "is_error": m.is_error,
        "origin": m.origin,
        "sender": m.sender,
        "model": m.model,
        "usage": if m.tokens_in.is_some() || m.tokens_out.is_some() {
            json!({"tokens_in": m.tokens_in, "tokens_out": m.tokens_out, "cost_usd": m.cost_usd})
        } else {
            Value::Null
        },
        "hidden": m.hidden,
        "created_at": rfc3339(m.created_at),
    })
}
