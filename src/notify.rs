//! Webhook notifications. Settling an agent with a webhook configured (its
//! `notify.webhook_url`, else `[webhooks] url`) writes a durable `notify`
//! job in the same transaction; a worker POSTs it, signed with
//! HMAC-SHA256, retrying with backoff until the receiver answers 2xx or the
//! attempts run out.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::clock::rfc3339;
use crate::core::Core;
use crate::db::agents::AgentRow;
use crate::db::jobs::{self, ClaimedJob, NewJob};
use crate::db::{DbResult, WriteCtx, WriteFuture};
use crate::types::JobKind;

/// The signature header: `sha256=<hex of HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "x-agentq-signature";

/// The webhook URL for this agent, if any.
fn target_url(core: &Core, agent: &AgentRow) -> Option<String> {
    let own = agent
        .notify
        .as_deref()
        .and_then(|n| serde_json::from_str::<Value>(n).ok())
        .and_then(|v| {
            v.get("webhook_url")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    own.or_else(|| {
        let u = core.cfg.webhooks.url.trim();
        (!u.is_empty()).then(|| u.to_string())
    })
}

/// Whether settling this agent writes a webhook job.
pub fn has_target(core: &Core, agent: &AgentRow) -> bool {
    target_url(core, agent).is_some()
}

/// Signs `body` with `secret`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Enqueues the completion webhook of a settled agent (inside its settle
/// transaction).
pub async fn enqueue_tx(ctx: &mut WriteCtx, core: &Core, agent: &AgentRow) -> DbResult<()> {
    let Some(url) = target_url(core, agent) else {
        return Ok(());
    };
    let handle = crate::lifecycle::handle_tx(ctx, agent).await?;
    let preview: String = agent
        .result
        .as_deref()
        .unwrap_or("")
        .chars()
        .take(500)
        .collect();
    let body = json!({
        "event": "agent_finished",
        "agent": {
            "id": agent.id,
            "handle": handle,
            "level": agent.level,
            "parent_id": agent.parent_id,
            "root_id": agent.root_id,
            "status": agent.status,
            "error": agent.error,
            "result_preview": preview,
            "usage": {
                "turns": agent.turns,
                "tokens_in": agent.tokens_in,
                "tokens_out": agent.tokens_out,
                "cost_usd": agent.cost_usd,
            },
            "finished_at": agent.finished_at.map(rfc3339),
        }
    });
    let mut job = NewJob::new(
        JobKind::Notify,
        core.cfg
            .webhooks
            .max_attempts
            .unwrap_or(core.cfg.workers.max_attempts.max(5)),
    );
    job.agent_id = Some(agent.id.clone());
    job.payload = json!({"url": url, "body": body}).to_string();
    job.dedupe_key = Some(format!(
        "notify:{}:{}",
        agent.id,
        agent.finished_at.unwrap_or(ctx.now)
    ));
    jobs::insert(ctx, &job).await?;
    Ok(())
}

/// Delivers one webhook job.
pub async fn run_job(core: &Arc<Core>, job: &ClaimedJob) {
    let payload: Value = serde_json::from_str(&job.payload).unwrap_or(Value::Null);
    let url = payload
        .get("url")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let body = payload
        .get("body")
        .cloned()
        .unwrap_or(Value::Null)
        .to_string();
    let result = post(core, job, &url, body).await;
    let lease = job.lease(&core.owner);
    let id = job.id;
    let attempt = job.attempts.clamp(0, 16) as u32;
    let r = core
        .db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                match result {
                    Ok(()) => {
                        jobs::complete(&mut ctx.conn, ctx.now, &lease).await?;
                    }
                    Err(e) => {
                        let retry_at =
                            ctx.now + crate::model::backoff(500, attempt).as_millis() as i64;
                        let fate = jobs::retry_or_fail(ctx, &lease, &e, retry_at).await?;
                        tracing::warn!(job_id = id, error = %e, ?fate, "webhook delivery failed");
                    }
                }
                Ok(())
            })
        })
        .await;
    if let Err(e) = r {
        tracing::error!(job_id = job.id, error = %e, "cannot record the webhook outcome");
    }
}

async fn post(core: &Core, job: &ClaimedJob, url: &str, body: String) -> Result<(), String> {
    if url.is_empty() {
        return Err("no webhook URL in the job".into());
    }
    let mut req = core
        .http
        .post(url)
        .timeout(Duration::from_secs(10))
        .header("content-type", "application/json")
        .header("x-agentq-event", "agent_finished")
        .header("x-agentq-delivery", job.id.to_string());
    if let Some(secret) = &core.webhook_secret {
        req = req.header(SIGNATURE_HEADER, sign(secret.as_bytes(), body.as_bytes()));
    }
    let resp = req.body(body).send().await.map_err(|e| e.to_string())?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(format!("receiver answered HTTP {}", resp.status().as_u16()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
