//! Messages between agents (SPEC §6): `send_to_agent` and `read_agent`,
//! both gated by the definition's permissions and limited to the user's
//! own agents (handle resolution is per user).

use serde::Deserialize;
use serde_json::{json, Value};

use super::agents::{agent_arg, agent_params, handle_of, resolve_agent};
use super::{Permission, Tool, ToolCtx, ToolOutput};
use crate::delivery::{self, DeliverError, Delivery, Message};
use crate::model::types::ToolSpec;
use crate::types::Origin;

/// `send_to_agent(agent, message)`: fire-and-forget delivery.
pub struct SendToAgent;

#[derive(Deserialize)]
struct SendArgs {
    agent: String,
    message: String,
}

#[async_trait::async_trait]
impl Tool for SendToAgent {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "send_to_agent".into(),
            description:
                "Send a message to another agent of your user (id or handle). It never blocks: the \
                          message is queued if the agent is busy, or starts a turn if it is idle."
                    .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "description": "id or handle"},
                    "message": {"type": "string", "minLength": 1}
                },
                "required": ["agent", "message"],
                "additionalProperties": false
            }),
        }
    }

    fn permission(&self) -> Option<Permission> {
        Some(Permission::SendToAgent)
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        let a: SendArgs = match serde_json::from_value(args) {
            Ok(a) => a,
            Err(e) => {
                return ToolOutput::Err(format!("invalid arguments for `send_to_agent`: {e}"))
            }
        };
        let target = match resolve_agent(ctx, &a.agent).await {
            Ok(t) => t,
            Err(e) => return ToolOutput::Err(e),
        };
        if target.id == ctx.agent.id {
            return ToolOutput::Err("send_to_agent cannot send to yourself".into());
        }
        let me = handle_of(ctx, ctx.agent).await;
        let h = handle_of(ctx, &target).await;
        let m = Message {
            target: target.id.clone(),
            content: format!("[message from agent {me}]\n\n{}", a.message),
            origin: Origin::Agent,
            sender: Some(ctx.agent.id.clone()),
            interrupt: false,
        };
        match delivery::deliver(ctx.core, m).await {
            Ok(d) if d.delivery == Delivery::Suppressed => ToolOutput::Ok(format!(
                "HELD — target {h} is out of auto-wake budget; your message is queued and will be read \
                 when a human next writes to it. Do not resend."
            )),
            Ok(d) => ToolOutput::Ok(format!(
                "Delivered to {h} ({} → {})",
                d.target.status,
                d.delivery.as_str()
            )),
            Err(e @ (DeliverError::Closed(_) | DeliverError::Final(..))) => {
                ToolOutput::Err(format!("cannot deliver to {h}: {e}"))
            }
            Err(DeliverError::Db(e)) => ToolOutput::Err(format!("send_to_agent failed on a storage error: {e}")),
        }
    }
}

/// `read_agent(agent)`: the last completed turn of another agent.
pub struct ReadAgent;

#[async_trait::async_trait]
impl Tool for ReadAgent {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read_agent".into(),
            description: "Read another agent's last completed answer (id or handle). Never blocks."
                .into(),
            parameters: agent_params(),
        }
    }

    fn permission(&self) -> Option<Permission> {
        Some(Permission::ReadAgent)
    }

    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput {
        let (_, t) = match agent_arg(ctx, "read_agent", args).await {
            Ok(x) => x,
            Err(e) => return e,
        };
        let h = handle_of(ctx, &t).await;
        // `result` holds the last completed turn; while a turn runs it is
        // still the previous one.
        let body = match t.result.as_deref() {
            Some(r) if !r.trim().is_empty() => r.to_string(),
            _ => "no completed turn yet".to_string(),
        };
        ToolOutput::Ok(format!(
            "<agent_response handle={h} status={}>{body}</agent_response>",
            t.status
        ))
    }
}
