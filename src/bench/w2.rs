//! W2: agent turns. Agents with a 5-call mock script (4 `echo` calls, then
//! a final text), at most `workers` running at once; once with the mock
//! in-process and once over loopback HTTP. Also samples the per-step time
//! spent outside the model and the tools.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{ModelSource, Report, Setup, Workload};
use crate::clock::Clock;
use crate::App;

#[derive(Debug, Clone)]
pub struct Params {
    pub agents: usize,
    pub workers: usize,
    /// Echo calls before the final answer.
    pub echoes: usize,
}

impl Params {
    pub fn full() -> Self {
        Self {
            agents: 200,
            workers: 16,
            echoes: 4,
        }
    }

    fn calls(&self) -> usize {
        self.agents * (self.echoes + 1)
    }
}

/// What one pass measured.
pub struct Pass {
    pub turns_per_s: f64,
    /// Per-step orchestration time, microseconds, sorted.
    pub step_us: Vec<u32>,
    /// Writer transactions and its busy share of the wall time.
    pub transactions: u64,
    pub writer_busy: f64,
}

pub async fn run(p: &Params) -> anyhow::Result<Report> {
    let mut report = Report::new(
        Workload::W2,
        json!({"agents": p.agents, "workers": p.workers, "model_calls_per_agent": p.echoes + 1}),
    );
    let local = pass(p, ModelSource::InProcess, &mut report).await?;
    let rss = super::peak_rss_mb();
    let mock = crate::model::mock_server::spawn(([127, 0, 0, 1], 0).into(), None).await?;
    let http = pass(p, ModelSource::Http(mock.base_url()), &mut report).await;
    mock.shutdown.cancel();
    let http = http?;
    report.figure("turns_per_s", local.turns_per_s);
    report.figure("http_turns_per_s", http.turns_per_s);
    let p99 = super::percentile(&local.step_us, 0.99).unwrap_or(0);
    report.figure("p99_step_overhead_ms", p99 as f64 / 1000.0);
    if let Some(rss) = rss {
        report.figure("peak_rss_mb", rss);
    }
    for (name, pass) in [("in-process", &local), ("http", &http)] {
        report.breakdown.push(format!(
            "{name}: {} writer transactions for {} model calls; writer busy {:.0}% of the wall; \
             step overhead p50 {} µs, p90 {} µs, p99 {} µs, max {} µs",
            pass.transactions,
            p.calls(),
            pass.writer_busy * 100.0,
            super::percentile(&pass.step_us, 0.5).unwrap_or(0),
            super::percentile(&pass.step_us, 0.9).unwrap_or(0),
            super::percentile(&pass.step_us, 0.99).unwrap_or(0),
            pass.step_us.last().copied().unwrap_or(0),
        ));
    }
    Ok(report)
}

/// One pass on a fresh database.
pub async fn pass(p: &Params, model: ModelSource, report: &mut Report) -> anyhow::Result<Pass> {
    let dir = super::workdir()?;
    let setup = Setup {
        workers: p.workers,
        model,
        ..Setup::default()
    };
    let cfg = super::prepare(dir.path(), &setup)?;
    let app = App::start_opts(cfg, Clock::system(), true).await?;
    let core = app.core.clone();
    let tasks: Vec<String> = (0..p.agents)
        .map(|i| super::echo_task(&format!("bench agent {i}"), p.echoes, 0))
        .collect();
    let mark = super::WriterMark::take(&core.db);
    let began = Instant::now();
    // A few concurrent clients: a burst of hundreds of creates at once would
    // sit in front of the first steps' writes and measure the burst, not
    // the steps.
    super::submit(&core, &tasks, 8, drop).await?;
    let waited = super::wait_all_done(
        core.db.reader(),
        p.agents as i64,
        Duration::from_millis(1),
        Duration::from_secs(60),
    )
    .await;
    let wall = began.elapsed();
    let (transactions, _, writer_busy) = mark.since(&core.db);
    let recorded = crate::db::bench::recorded_steps(core.db.reader()).await;
    let step_us = core
        .step_timings
        .as_ref()
        .map(|t| t.sorted())
        .unwrap_or_default();
    app.shutdown().await;
    waited?;
    let expected = (p.agents * (2 * p.echoes + 1)) as i64;
    let recorded = recorded?;
    if recorded != expected {
        report.fail(format!(
            "{recorded} steps recorded, expected {expected} (each agent: {} answers, {} tool results)",
            p.echoes + 1,
            p.echoes
        ));
    }
    Ok(Pass {
        turns_per_s: p.calls() as f64 / wall.as_secs_f64(),
        step_us,
        transactions,
        writer_busy,
    })
}
