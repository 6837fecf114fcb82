//! W2: 200 agents, at most 16 running, 5 model calls each (4 echo, 1 final).

use std::time::Instant;

use serde_json::json;

use super::{bench_config, write_definitions};
use crate::creation::{self, NewAgentRequest};
use crate::events::EventKind;
use crate::App;

pub async fn run(agents: usize) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let defs = write_definitions(dir.path())?;
    let cfg = bench_config(dir.path(), &defs, "")?;
    let app = App::start(cfg).await?;
    let core = app.core.clone();
    let mut rx = core.signals.subscribe();
    let steps: Vec<serde_json::Value> = (0..4)
        .map(|i| json!({"call": [{"name": "echo", "args": {"text": format!("step {i}")}}]}))
        .chain([json!({"say": "done"})])
        .collect();
    let start = Instant::now();
    // Submitted concurrently, as independent clients would.
    let submits = (0..agents).map(|i| {
        let core = core.clone();
        let task = format!("bench agent {i}\n#mock {}", json!(steps));
        async move { creation::create(&core, NewAgentRequest::top_level("local", &task)).await }
    });
    for r in futures::future::join_all(submits).await {
        r?;
    }
    let mut finished = 0;
    while finished < agents {
        let e = rx.recv().await?;
        if e.kind == EventKind::AgentFinished {
            finished += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let calls = (agents * 5) as f64;
    {
        use crate::db::writer::*;
        use std::sync::atomic::Ordering::Relaxed;
        eprintln!(
            "batches {} ops {} closures {} hops {} busy_us {}",
            BATCHES.load(Relaxed),
            OPS.load(Relaxed),
            CLOS.load(Relaxed),
            HOPS.load(Relaxed),
            BUSY.load(Relaxed)
        );
        for e in T.lock().unwrap().iter() {
            eprintln!(
                "  {:45} n={:5} total_us={:7} avg={}",
                e.0,
                e.1,
                e.2,
                e.2 / e.1.max(1)
            );
        }
    }
    app.shutdown().await;
    Ok(calls / secs)
}
