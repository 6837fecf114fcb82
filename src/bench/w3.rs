//! W3: fan-out. One parent whose first answer spawns `children` background
//! sub-agents (each: `echoes` echo calls, then a final text), whose second
//! waits for all of them with `wait_for_agent`, and whose third answers.
//! Measures submit to the parent's final answer.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{Report, Setup, Workload};
use crate::clock::Clock;
use crate::creation::{self, NewAgentRequest};
use crate::types::AgentStatus;
use crate::App;

#[derive(Debug, Clone)]
pub struct Params {
    pub children: usize,
    pub echoes: usize,
}

impl Params {
    pub fn full() -> Self {
        Self {
            children: 100,
            echoes: 2,
        }
    }
}

/// The parent's task: spawn every child in one answer, wait for all the
/// ids the spawns returned, answer.
fn parent_task(p: &Params) -> String {
    let spawns: Vec<Value> = (0..p.children)
        .map(|k| {
            json!({"name": "spawn_agent", "args": {
                "task": super::echo_task(&format!("child {k}"), p.echoes, 0),
                "agent": "default",
                "background": true,
            }})
        })
        .collect();
    let script = json!([
        {"call": spawns},
        {"call": [{"name": "wait_for_agent", "args": {"ids": "$spawned_ids", "timeout_s": 120}}]},
        {"say": "all children reported"},
    ]);
    format!("fan-out parent\n#mock {script}")
}

pub async fn run(p: &Params) -> anyhow::Result<Report> {
    let dir = super::workdir()?;
    let setup = Setup {
        // Every child can run at once, next to the parent.
        workers: p.children + 16,
        max_children: p.children as i64,
        ..Setup::default()
    };
    let cfg = super::prepare(dir.path(), &setup)?;
    let app = App::start_opts(cfg, Clock::system(), false).await?;
    let core = app.core.clone();
    let mut report = Report::new(
        Workload::W3,
        json!({"children": p.children, "child_model_calls": p.echoes + 1,
               "workers": setup.workers, "max_children_per_agent": setup.max_children}),
    );
    let task = parent_task(p);
    let submitted_at = core.now_ms();
    let began = Instant::now();
    let mut req = NewAgentRequest::top_level("local", &task);
    req.definition = Some("fanout".into());
    let parent = creation::create(&core, req).await?.agent.id;
    let outcome = wait_parent(&core, &parent).await;
    let wall = began.elapsed();
    match outcome {
        Ok(result) => {
            report.figure("fanout_wall_ms", wall.as_secs_f64() * 1000.0);
            if result.as_deref() != Some("all children reported") {
                report.fail(format!("the parent answered {result:?}"));
            }
        }
        Err(e) => report.fail(format!("{e:#}")),
    }
    let (first, last, finished) =
        crate::db::bench::children_timeline(core.db.reader(), &parent).await?;
    let at = |t: Option<i64>| t.map(|t| t - submitted_at).unwrap_or(-1);
    report.breakdown.push(format!(
        "after submit (ms): first child created {}, last child created {}, last child finished {}, \
         parent answered {:.0}",
        at(first),
        at(last),
        at(finished),
        wall.as_secs_f64() * 1000.0
    ));
    let (done, other) = crate::db::bench::finished_agents(core.db.reader()).await?;
    if done != p.children as i64 + 1 || other != 0 {
        report.fail(format!(
            "{done} agents done and {other} ended otherwise; expected {} done",
            p.children + 1
        ));
    }
    app.shutdown().await;
    Ok(report)
}

/// Polls the parent until it is done (its result) or ended otherwise.
async fn wait_parent(core: &crate::core::Core, id: &str) -> anyhow::Result<Option<String>> {
    let began = Instant::now();
    loop {
        let Some(a) = crate::db::agents::get(core.db.reader(), id).await? else {
            anyhow::bail!("the parent {id} is gone");
        };
        match a.status {
            AgentStatus::Done => return Ok(a.result),
            s if s.is_settled() => anyhow::bail!("the parent ended {s:?}: {:?}", a.error),
            _ => {}
        }
        if began.elapsed() > Duration::from_secs(60) {
            anyhow::bail!("the parent is still {:?} after 60 s", a.status);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
