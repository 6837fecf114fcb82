//! The worker pool: one dispatcher claims up to the free slots in one
//! statement whenever it is woken (in-process `Notify` on enqueue and on
//! every finished job) or the poll fallback fires, and runs each job on its
//! own task holding a slot permit. On shutdown it stops claiming, lets
//! running turns reach a step boundary within the grace period, then
//! aborts what is left.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::core::Core;
use crate::db::jobs::{self, ClaimedJob};
use crate::types::JobKind;

/// Claims up to `limit` due jobs for this process.
pub async fn claim(core: &Arc<Core>, limit: usize) -> crate::db::DbResult<Vec<ClaimedJob>> {
    let lease_ms = (core.cfg.workers.lease_s * 1000.0) as i64;
    let out = core
        .db
        .exec(jobs::claim_stmt(
            core.now_ms(),
            &core.node,
            &core.owner,
            limit as i64,
            lease_ms,
        ))
        .await?;
    jobs::claimed(&out)
}

/// Runs the dispatcher until the soft stop, then drains.
pub async fn run_pool(core: Arc<Core>) {
    let slots = core.cfg.workers.concurrency;
    let sem = Arc::new(Semaphore::new(slots));
    let poll = Duration::from_millis(core.cfg.workers.poll_ms.max(10));
    loop {
        if core.stop.soft.is_cancelled() {
            break;
        }
        let free = sem.available_permits();
        let mut claimed = 0;
        if free > 0 {
            match claim(&core, free).await {
                Ok(batch) => {
                    claimed = batch.len();
                    for job in batch {
                        let Ok(permit) = Arc::clone(&sem).try_acquire_owned() else {
                            // Only this loop acquires, so a permit counted as
                            // free is still there; the rescuer would return
                            // the job otherwise.
                            tracing::error!(job_id = job.id, "no free slot for a claimed job");
                            continue;
                        };
                        tokio::spawn(execute(Arc::clone(&core), job, permit));
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "claim failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        if claimed > 0 && claimed == free {
            // There may be more; claim again once a slot frees up or now.
            continue;
        }
        let wait = if free == 0 {
            poll
        } else {
            match jobs::next_run_at(core.db.reader()).await {
                Ok(Some(t)) => Duration::from_millis(
                    (t - core.now_ms()).clamp(0, poll.as_millis() as i64) as u64,
                ),
                _ => poll,
            }
        };
        if wait.is_zero() && free > 0 && claimed == 0 {
            // Due jobs exist but none was claimable yet (written by others a
            // moment ago): yield briefly instead of spinning.
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        tokio::select! {
            _ = core.signals.job_ready.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = core.stop.soft.cancelled() => break,
        }
    }
    drain(&core, &sem, slots).await;
}

async fn drain(core: &Arc<Core>, sem: &Arc<Semaphore>, slots: usize) {
    let grace = Duration::from_secs_f64(core.cfg.workers.shutdown_grace_s.max(0.0));
    let all = slots as u32;
    tokio::select! {
        _ = sem.acquire_many(all) => return,
        _ = tokio::time::sleep(grace) => {}
    }
    tracing::warn!(
        running = slots - sem.available_permits(),
        "grace period over; aborting in-flight steps"
    );
    core.stop.hard.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), sem.acquire_many(all)).await;
}

async fn execute(core: Arc<Core>, job: ClaimedJob, permit: OwnedSemaphorePermit) {
    match job.kind {
        JobKind::Turn => crate::turn::run_turn(&core, &job).await,
        JobKind::Notify => crate::notify::run_job(&core, &job).await,
        JobKind::Noop => {
            if let Err(e) = crate::turn::steps::complete_job(&core, &job.lease(&core.owner)).await {
                tracing::warn!(job_id = job.id, error = %e, "cannot complete a no-op job");
            }
        }
    }
    drop(permit);
    core.signals.job_ready.notify_one();
}
