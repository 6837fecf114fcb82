//! Background services with one start/stop contract: each is an async
//! function of the core and a stop token, spawned by `Services::spawn` and
//! awaited by `Services::stop`. Here: the lease heartbeat, the rescuer, the
//! deadline sweeper and the pruner.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::core::Core;
use crate::db::agents;
use crate::db::jobs;
use crate::db::waits;
use crate::db::{WriteCtx, WriteFuture};
use crate::lifecycle::{self, Outcome};
use crate::types::{JobKind, StopReason};

/// Running background services.
pub struct Services {
    stop: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Default for Services {
    fn default() -> Self {
        Self::new()
    }
}

impl Services {
    pub fn new() -> Self {
        Self {
            stop: CancellationToken::new(),
            tasks: Vec::new(),
        }
    }

    /// Starts `f(core, stop)` as the service `name`.
    pub fn spawn<F, Fut>(&mut self, name: &'static str, core: &Arc<Core>, f: F)
    where
        F: FnOnce(Arc<Core>, CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let fut = f(Arc::clone(core), self.stop.clone());
        self.tasks.push((name, tokio::spawn(fut)));
    }

    /// Signals every service to stop and waits for each.
    pub async fn stop(self) {
        self.stop.cancel();
        for (name, t) in self.tasks {
            if let Err(e) = t.await {
                tracing::error!(service = name, error = %e, "service ended abnormally");
            }
        }
    }
}

/// Sleeps `d` unless stopped first; false when stopped.
async fn tick(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Extends every lease this process holds, in one statement per interval.
pub async fn lease_heartbeat(core: Arc<Core>, stop: CancellationToken) {
    let every = Duration::from_secs_f64(core.cfg.workers.heartbeat_s);
    let lease_ms = (core.cfg.workers.lease_s * 1000.0) as i64;
    while tick(&stop, every).await {
        let r = core
            .db
            .exec(jobs::heartbeat_stmt(core.now_ms(), &core.owner, lease_ms))
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "lease heartbeat failed");
        }
    }
}

/// Returns expired leases to the queue (or fails jobs out of attempts, and
/// their agents with them).
pub async fn rescuer(core: Arc<Core>, stop: CancellationToken) {
    let every = Duration::from_secs_f64((core.cfg.workers.lease_s / 2.0).clamp(0.5, 30.0));
    while tick(&stop, every).await {
        let core2 = Arc::clone(&core);
        let r = core
            .db
            .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, usize> {
                Box::pin(async move {
                    let rescued = jobs::rescue_expired(ctx).await?;
                    for j in &rescued {
                        if j.state == "failed" && j.kind == JobKind::Turn {
                            if let Some(agent_id) = &j.agent_id {
                                lifecycle::fail_tx(
                                    ctx,
                                    &core2,
                                    agent_id,
                                    StopReason::Error,
                                    "turn job failed: its lease expired on the last attempt".into(),
                                )
                                .await?;
                            }
                        }
                    }
                    Ok(rescued.len())
                })
            })
            .await;
        match r {
            Ok(0) => {}
            Ok(n) => tracing::warn!(jobs = n, "rescued jobs with expired leases"),
            Err(e) => tracing::error!(error = %e, "rescue failed"),
        }
    }
}

/// Times out active agents whose deadline passed (running turns also watch
/// their own deadline; whichever writes first wins, guarded by status) and
/// answers `wait_for_agent` calls whose timeout passed.
pub async fn deadline_sweeper(core: Arc<Core>, stop: CancellationToken) {
    loop {
        let now = core.now_ms();
        let next = match (
            agents::next_deadline(core.db.reader()).await,
            waits::next_deadline(core.db.reader()).await,
        ) {
            (Ok(a), Ok(w)) => [a, w].into_iter().flatten().min(),
            _ => None,
        };
        let wait = next.map(|t| (t - now).clamp(0, 1000)).unwrap_or(1000);
        if wait > 0 && !tick(&stop, Duration::from_millis(wait as u64)).await {
            return;
        }
        if stop.is_cancelled() {
            return;
        }
        match sweep_once(&core).await {
            Ok(0) => {
                // Nothing due after all (a deadline moved): do not spin.
                if !tick(&stop, Duration::from_millis(50)).await {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "deadline sweep failed");
                if !tick(&stop, Duration::from_secs(1)).await {
                    return;
                }
            }
        }
    }
}

/// One sweep; returns how many agents and waits it settled.
pub async fn sweep_once(core: &Arc<Core>) -> crate::db::DbResult<usize> {
    let now = core.now_ms();
    let due_agents = agents::past_deadline(core.db.reader(), now, 200).await?;
    let due_waits = waits::expired(core.db.reader(), now, 200).await?;
    if due_agents.is_empty() && due_waits.is_empty() {
        return Ok(0);
    }
    let core2 = Arc::clone(core);
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, usize> {
            Box::pin(async move {
                let mut n = 0;
                for id in due_agents {
                    let Some(a) = agents::get_tx(&mut ctx.conn, &id).await? else {
                        continue;
                    };
                    let passed = a.deadline_at.is_some_and(|d| d <= ctx.now);
                    if a.status.is_active() && passed {
                        let secs = a
                            .deadline_at
                            .map(|d| (d - a.created_at) / 1000)
                            .unwrap_or(0);
                        lifecycle::settle_tx(
                            ctx,
                            &core2,
                            &a,
                            Outcome::timed_out(format!(
                                "deadline passed: the agent's time ({secs}s) ran out"
                            )),
                            true,
                        )
                        .await?;
                        n += 1;
                    }
                }
                for id in due_waits {
                    let Some(w) = waits::get_tx(&mut ctx.conn, id).await? else {
                        continue;
                    };
                    if w.resolved_at.is_some() || w.deadline_at > ctx.now {
                        continue;
                    }
                    let mut rows = Vec::new();
                    for child in w.children() {
                        if let Some(r) = agents::get_tx(&mut ctx.conn, &child).await? {
                            rows.push(r);
                        }
                    }
                    lifecycle::finish_wait(ctx, &core2, &w, &rows, true).await?;
                    n += 1;
                }
                Ok(n)
            })
        })
        .await
}

/// Deletes finished jobs and finished sub-agents older than the retention,
/// in small batches so no write holds the lock for long; level-1 agents
/// stay until deleted.
pub async fn pruner(core: Arc<Core>, stop: CancellationToken) {
    let every = Duration::from_secs(60);
    while tick(&stop, every).await {
        match prune_once(&core, &stop).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(rows = n, "pruned"),
            Err(e) => tracing::error!(error = %e, "prune failed"),
        }
    }
}

/// One pruning pass; returns how many job and agent rows went.
pub async fn prune_once(core: &Arc<Core>, stop: &CancellationToken) -> crate::db::DbResult<u64> {
    let retention_ms = (core.cfg.agents.retention_h * 3_600_000.0) as i64;
    let before = core.now_ms() - retention_ms;
    let mut total = 0;
    loop {
        let n = core
            .db
            .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, u64> {
                Box::pin(async move {
                    let j = jobs::prune(ctx, before, 500).await?;
                    let a = agents::prune_finished_subagents(&mut ctx.conn, before, 100).await?;
                    Ok(j + a)
                })
            })
            .await?;
        total += n;
        if n == 0 || stop.is_cancelled() {
            return Ok(total);
        }
    }
}
