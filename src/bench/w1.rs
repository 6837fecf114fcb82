//! W1: the queue alone. Enqueue no-op jobs one committed call each (many
//! callers at once, sharing commits), then through the batch statement,
//! then drain them with concurrent workers that claim a batch, run no-ops
//! and complete the batch, every claim and completion committed before it
//! is acknowledged.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use serde_json::json;

use super::{Report, Workload};
use crate::clock::Clock;
use crate::db::jobs::{self, NewJob};
use crate::db::Db;
use crate::signals::Signals;
use crate::types::JobKind;

#[derive(Debug, Clone)]
pub struct Params {
    /// Jobs enqueued each way (single, then batch).
    pub jobs: usize,
    /// Jobs per batch call.
    pub batch: usize,
    /// Single enqueue calls in flight at once.
    pub in_flight: usize,
    /// Concurrent drain workers.
    pub workers: usize,
    /// Jobs one claim takes.
    pub claim_batch: usize,
}

impl Params {
    pub fn full() -> Self {
        Self {
            jobs: 20_000,
            batch: 1_000,
            in_flight: 1_024,
            workers: 4,
            claim_batch: 100,
        }
    }
}

/// A no-op job with a ~100-byte payload.
fn noop_job(i: usize) -> NewJob {
    let mut job = NewJob::new(JobKind::Noop, 1);
    job.payload = json!({"job": i, "kind": "noop", "note": "x".repeat(64)}).to_string();
    job
}

pub async fn run(p: &Params) -> anyhow::Result<Report> {
    let dir = super::workdir()?;
    let cfg = super::prepare(dir.path(), &super::Setup::default())?;
    let db = Db::open(&cfg.database, Clock::system(), Arc::new(Signals::new())).await?;
    let mut report = Report::new(
        Workload::W1,
        json!({"jobs_each_way": p.jobs, "batch_size": p.batch, "single_in_flight": p.in_flight,
               "drain_workers": p.workers, "claim_batch": p.claim_batch}),
    );

    let began = Instant::now();
    let mut singles = futures::stream::iter(0..p.jobs)
        .map(|i| {
            let db = db.clone();
            async move {
                let job = noop_job(i);
                db.insert_row(jobs::job_row(db.clock.now_ms(), &job)).await
            }
        })
        .buffer_unordered(p.in_flight.max(1));
    while let Some(r) = singles.next().await {
        r?;
    }
    drop(singles);
    report.figure(
        "enqueue_single_per_s",
        p.jobs as f64 / began.elapsed().as_secs_f64(),
    );

    let batches: Vec<Vec<NewJob>> = (0..p.jobs)
        .map(|i| noop_job(p.jobs + i))
        .collect::<Vec<_>>()
        .chunks(p.batch.max(1))
        .map(<[NewJob]>::to_vec)
        .collect();
    let began = Instant::now();
    for b in &batches {
        let out = db
            .exec(jobs::insert_many_stmt(db.clock.now_ms(), b))
            .await?;
        let inserted = out.first().map(|o| o.rows_affected).unwrap_or(0);
        if inserted != b.len() as u64 {
            report.fail(format!("a batch of {} inserted {inserted} jobs", b.len()));
        }
    }
    report.figure(
        "enqueue_batch_per_s",
        p.jobs as f64 / began.elapsed().as_secs_f64(),
    );

    let total = 2 * p.jobs;
    let mark = super::WriterMark::take(&db);
    let began = Instant::now();
    let workers: Vec<_> = (0..p.workers.max(1))
        .map(|w| {
            tokio::spawn(drain_worker(
                db.clone(),
                format!("bench:w{w}"),
                p.claim_batch,
            ))
        })
        .collect();
    let mut completed = 0;
    for w in workers {
        completed += w.await??;
    }
    let drain = began.elapsed();
    report.figure("drain_per_s", completed as f64 / drain.as_secs_f64());
    let (transactions, _, busy) = mark.since(&db);
    report.breakdown.push(format!(
        "drain: {transactions} transactions, writer busy {:.0}% of the wall time",
        busy * 100.0
    ));

    let counts = jobs::count_by_state(db.reader()).await?;
    let done = counts
        .iter()
        .find(|(s, _)| s == "completed")
        .map(|(_, n)| *n)
        .unwrap_or(0);
    if completed != total || done != total as i64 {
        report.fail(format!(
            "{total} jobs enqueued, {completed} drained, {done} completed in the table ({counts:?})"
        ));
    }
    db.close().await;
    Ok(report)
}

/// Claims up to `claim_batch` due jobs, runs them (no-ops), completes them
/// in one statement; stops when a claim comes back empty. Returns how many
/// it completed.
async fn drain_worker(db: Db, owner: String, claim_batch: usize) -> anyhow::Result<usize> {
    let mut completed = 0;
    loop {
        let now = db.clock.now_ms();
        let out = db
            .exec(jobs::claim_stmt(
                now,
                "bench",
                &owner,
                claim_batch as i64,
                60_000,
            ))
            .await?;
        let claimed = jobs::claimed(&out)?;
        if claimed.is_empty() {
            return Ok(completed);
        }
        let ids: Vec<i64> = claimed.iter().map(|j| std::hint::black_box(j.id)).collect();
        let out = db
            .exec(jobs::complete_many_stmt(db.clock.now_ms(), &ids, &owner))
            .await?;
        let n = out.first().map(|o| o.rows_affected).unwrap_or(0) as usize;
        if n != ids.len() {
            anyhow::bail!("{owner} completed {n} of the {} jobs it claimed", ids.len());
        }
        completed += n;
    }
}
