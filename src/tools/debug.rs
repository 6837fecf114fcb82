//! Debug tools `echo` and `sleep` (only with `[tools] debug = true`). With
//! `[tools] debug_log` set, each execution appends one JSON line
//! `{"tool_call_id","agent_id","tool","pid"}` before it runs, so tests can
//! prove that no recorded step ever runs twice.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use super::{Tool, ToolCtx, ToolOutput};
use crate::model::types::ToolSpec;

/// The append-only execution log of the debug tools.
pub struct DebugLog {
    file: Mutex<std::fs::File>,
}

impl DebugLog {
    /// Opens (creating) `path` for appending.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            file: Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        })
    }

    fn record(&self, ctx: &ToolCtx<'_>, tool: &str) {
        let mut line = json!({
            "tool_call_id": ctx.call_id,
            "agent_id": ctx.agent.id,
            "tool": tool,
            "pid": std::process::id(),
        })
        .to_string();
        line.push('\n');
        // One write of one short line on an O_APPEND file: lines from
        // concurrent calls never interleave.
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(line.as_bytes()) {
            tracing::warn!(error = %e, "cannot append to the debug tool log");
        }
    }
}

fn log(ctx: &ToolCtx<'_>, tool: &str) {
    if let Some(l) = &ctx.core.debug_log {
        l.record(ctx, tool);
    }
}

/// `echo(text)`: returns its text.
pub struct Echo;

#[async_trait::async_trait]
impl Tool for Echo {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "echo".into(),
            description: "Debug tool: returns `text` unchanged.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": "what to echo"}},
                "required": ["text"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        log(ctx, "echo");
        ToolOutput::Ok(args["text"].as_str().unwrap_or_default().to_string())
    }
}

/// `sleep(ms)`: waits, then says how long.
pub struct Sleep;

/// The longest debug sleep (one hour).
const MAX_SLEEP_MS: u64 = 3_600_000;

#[async_trait::async_trait]
impl Tool for Sleep {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "sleep".into(),
            description: "Debug tool: waits `ms` milliseconds.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0, "maximum": MAX_SLEEP_MS}},
                "required": ["ms"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        log(ctx, "sleep");
        let ms = args["ms"].as_u64().unwrap_or(0).min(MAX_SLEEP_MS);
        tokio::select! {
            _ = ctx.cancel.cancelled() => ToolOutput::Err("sleep interrupted".into()),
            _ = tokio::time::sleep(Duration::from_millis(ms)) => ToolOutput::Ok(format!("slept {ms} ms")),
        }
    }
}
