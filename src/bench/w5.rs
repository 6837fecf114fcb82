//! W5: scale. Many agents active at once, each answer taking `delay_ms`
//! in the in-process mock, workers and provider limits raised so all of
//! them run together; meanwhile a client polls `GET /v1/agents/{id}` at a
//! fixed rate. Measures peak RSS, the API's p99 latency and the makespan.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Report, Setup, Workload};
use crate::clock::Clock;
use crate::App;

#[derive(Debug, Clone)]
pub struct Params {
    pub agents: usize,
    /// Echo calls before the final answer (3 model calls = 2 echoes).
    pub echoes: usize,
    pub delay_ms: u64,
    /// API reads per second while the agents run.
    pub poll_per_s: u64,
}

impl Params {
    pub fn full() -> Self {
        Self {
            agents: 10_000,
            echoes: 2,
            delay_ms: 2_000,
            poll_per_s: 200,
        }
    }
}

pub async fn run(p: &Params) -> anyhow::Result<Report> {
    let dir = super::workdir()?;
    let setup = Setup {
        workers: p.agents + 64,
        ..Setup::default()
    };
    let cfg = super::prepare(dir.path(), &setup)?;
    let app = App::start_opts(cfg, Clock::system(), false).await?;
    let core = app.core.clone();
    let mut report = Report::new(
        Workload::W5,
        json!({"agents": p.agents, "model_calls_per_agent": p.echoes + 1,
               "model_delay_ms": p.delay_ms, "api_polls_per_s": p.poll_per_s,
               "workers": setup.workers}),
    );
    let tasks: Vec<String> = (0..p.agents)
        .map(|i| super::echo_task(&format!("bench agent {i}"), p.echoes, p.delay_ms))
        .collect();
    let ids = Arc::new(Mutex::new(Vec::with_capacity(p.agents)));
    let stop = tokio_util::sync::CancellationToken::new();
    let poller = tokio::spawn(poll_api(
        app.url(),
        Arc::clone(&ids),
        p.poll_per_s,
        stop.clone(),
    ));

    let mark = super::WriterMark::take(&core.db);
    let began = Instant::now();
    super::submit(&core, &tasks, 256, |id| {
        ids.lock().unwrap_or_else(|p| p.into_inner()).push(id)
    })
    .await?;
    let submitted = began.elapsed();
    let waited = super::wait_all_done(
        core.db.reader(),
        p.agents as i64,
        Duration::from_millis(20),
        Duration::from_secs(100),
    )
    .await;
    let makespan = began.elapsed();
    let (transactions, writes, busy) = mark.since(&core.db);
    let writer = format!(
        "writer: {transactions} transactions, {writes} writes, busy {:.0}% of the makespan",
        busy * 100.0
    );
    stop.cancel();
    let polls = poller.await?;
    let rss = super::peak_rss_mb();
    app.shutdown().await;
    waited?;

    if let Some(rss) = rss {
        report.figure("peak_rss_mb", rss);
    }
    let mut latencies = polls.latencies_us;
    latencies.sort_unstable();
    let p99 = super::percentile(&latencies, 0.99).unwrap_or(0);
    report.figure("api_p99_ms", p99 as f64 / 1000.0);
    report.figure("makespan_s", makespan.as_secs_f64());
    report.breakdown.push(format!(
        "submitted {} agents in {:.0} ms; {} API reads (p50 {} µs, max {} µs), {} errors",
        p.agents,
        submitted.as_secs_f64() * 1000.0,
        latencies.len(),
        super::percentile(&latencies, 0.5).unwrap_or(0),
        latencies.last().copied().unwrap_or(0),
        polls.errors,
    ));
    report.breakdown.push(writer);
    if latencies.is_empty() {
        report.fail("no API read completed during the run");
    }
    if polls.errors > 0 {
        report.fail(format!("{} API reads failed", polls.errors));
    }
    Ok(report)
}

struct Polls {
    latencies_us: Vec<u64>,
    errors: usize,
}

/// Reads a random created agent at `per_s` requests per second (each on
/// its own task, so a slow answer does not slow the rate) until `stop`.
async fn poll_api(
    url: String,
    ids: Arc<Mutex<Vec<String>>>,
    per_s: u64,
    stop: tokio_util::sync::CancellationToken,
) -> Polls {
    let http = reqwest::Client::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_s.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut inflight = tokio::task::JoinSet::new();
    let mut n: usize = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let id = {
            let ids = ids.lock().unwrap_or_else(|p| p.into_inner());
            if ids.is_empty() {
                continue;
            }
            // A cheap spread over the ids without a random source.
            n = n.wrapping_add(7919);
            ids[n % ids.len()].clone()
        };
        let http = http.clone();
        let url = format!("{url}/v1/agents/{id}");
        inflight.spawn(async move {
            let began = Instant::now();
            let ok = matches!(http.get(&url).send().await, Ok(r) if r.status().is_success());
            (ok, began.elapsed().as_micros() as u64)
        });
    }
    let mut polls = Polls {
        latencies_us: Vec::new(),
        errors: 0,
    };
    while let Some(r) = inflight.join_next().await {
        match r {
            Ok((true, us)) => polls.latencies_us.push(us),
            _ => polls.errors += 1,
        }
    }
    polls
}
