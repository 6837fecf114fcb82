//! W4: crash. W2's agents run in the real binary against the HTTP mock;
//! the binary is SIGKILLed once about half of all steps are recorded and
//! restarted on the same database. Every agent must finish, and no step
//! recorded before the kill may run again: tool executions are audited in
//! the tools' debug log, model calls in the mock's request log.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde_json::{json, Value};

use super::{ModelSource, Report, Setup, Workload};
use crate::db::bench as observe;

#[derive(Debug, Clone)]
pub struct Params {
    pub agents: usize,
    pub workers: usize,
    pub echoes: usize,
    /// Share of all steps recorded when the kill comes.
    pub kill_at: f64,
    /// The binary to run (`agentq`).
    pub exe: PathBuf,
}

impl Params {
    pub fn full() -> Self {
        Self {
            agents: 1_000,
            workers: 16,
            echoes: 4,
            kill_at: 0.5,
            exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("agentq")),
        }
    }
}

/// A running `agentq serve`; killed when dropped.
struct Server {
    child: Child,
    url: String,
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    /// Starts the binary and waits for its listening line.
    async fn start(exe: &Path, config: &Path, stderr: &Path) -> anyhow::Result<Self> {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stderr)
            .with_context(|| format!("cannot open {}", stderr.display()))?;
        let mut child = Command::new(exe)
            .args(["serve", "--config"])
            .arg(config)
            .env("AGENTQ_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot run {}", exe.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (line, reader) = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let r = reader.read_line(&mut line);
            (r.map(|_| line), reader)
        })
        .await?;
        let line = line?;
        let Some(url) = line.trim().strip_prefix("agentq listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "the server did not start (first line {line:?}); see {}",
                stderr.display()
            );
        };
        Ok(Self {
            url: url.to_string(),
            child,
            _stdout: reader,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and reap.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn run(p: &Params) -> anyhow::Result<Report> {
    let dir = super::workdir()?;
    let mock_log = dir.path().join("mock.jsonl");
    let tools_log = dir.path().join("tools.jsonl");
    let stderr = dir.path().join("agentq.log");
    let mock = crate::model::mock_server::spawn(([127, 0, 0, 1], 0).into(), Some(mock_log.clone()))
        .await?;
    let setup = Setup {
        workers: p.workers,
        model: ModelSource::Http(mock.base_url()),
        debug_log: Some(tools_log.clone()),
        ..Setup::default()
    };
    super::prepare(dir.path(), &setup)?;
    let config = dir.path().join("agentq.toml");
    std::fs::write(&config, super::config_text(dir.path(), &setup))?;
    let mut report = Report::new(
        Workload::W4,
        json!({"agents": p.agents, "workers": p.workers, "model_calls_per_agent": p.echoes + 1,
               "kill_at_share_of_steps": p.kill_at, "model": "HTTP mock on loopback"}),
    );
    let r = crash_and_recover(p, dir.path(), &config, &stderr, &mut report).await;
    mock.shutdown.cancel();
    if let Err(e) = r {
        report.fail(format!(
            "{e:#} (server log: {})",
            std::fs::read_to_string(&stderr)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    Ok(report)
}

async fn crash_and_recover(
    p: &Params,
    dir: &Path,
    config: &Path,
    stderr: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    let total_steps = (p.agents * (2 * p.echoes + 1)) as i64;
    let kill_at = (total_steps as f64 * p.kill_at).round() as i64;
    let mut first = Server::start(&p.exe, config, stderr).await?;
    let db = observe::open_observer(&super::db_path(dir)).await?;
    submit_all(&first.url, p).await?;
    let began = Instant::now();
    loop {
        if observe::recorded_steps(&db).await? >= kill_at {
            break;
        }
        if began.elapsed() > Duration::from_secs(60) {
            anyhow::bail!("fewer than {kill_at} steps recorded after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    first.kill();
    let first_pid = first.pid();
    drop(first);
    // What was recorded when the process died; nothing in it may run again.
    let steps_at_kill = observe::recorded_steps(&db).await?;
    let recorded_calls = observe::recorded_tool_calls(&db).await?;
    let answers = observe::answers_by_task_line(&db).await?;
    let mock_log = dir.join("mock.jsonl");
    let tools_log = dir.join("tools.jsonl");
    let mock_mark = std::fs::metadata(&mock_log).map(|m| m.len()).unwrap_or(0);
    let tools_mark = std::fs::metadata(&tools_log).map(|m| m.len()).unwrap_or(0);

    let restarted = Instant::now();
    let second = Server::start(&p.exe, config, stderr).await?;
    let startup = restarted.elapsed();
    super::wait_all_done(
        &db,
        p.agents as i64,
        Duration::from_millis(2),
        Duration::from_secs(90),
    )
    .await?;
    let to_done = restarted.elapsed();
    let (done, _) = observe::finished_agents(&db).await?;
    let steps = observe::recorded_steps(&db).await?;
    drop(second);
    db.close().await;

    let tools_again = tool_reruns(&tools_log, tools_mark, &recorded_calls, first_pid)?;
    let models_again = model_reruns(&mock_log, mock_mark, &answers)?;
    report.figure("finished", done as f64);
    report.figure(
        "reexecuted_recorded_steps",
        (tools_again + models_again) as f64,
    );
    report.figure("restart_to_done_ms", to_done.as_secs_f64() * 1000.0);
    report.figure("restart_startup_ms", startup.as_secs_f64() * 1000.0);
    report.breakdown.push(format!(
        "killed with {steps_at_kill} of {total_steps} steps recorded; {} after recovery; \
         re-run after the restart: {tools_again} recorded tool calls, {models_again} recorded model calls",
        steps
    ));
    if done != p.agents as i64 {
        report.fail(format!("{done} of {} agents finished", p.agents));
    }
    if tools_again + models_again > 0 {
        report.fail(format!(
            "{tools_again} recorded tool calls and {models_again} recorded model calls ran again"
        ));
    }
    if steps != total_steps {
        report.fail(format!("{steps} steps recorded, expected {total_steps}"));
    }
    Ok(())
}

/// Creates every agent over HTTP, 64 requests at a time.
async fn submit_all(url: &str, p: &Params) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let mut submits = futures::stream::iter(0..p.agents)
        .map(|i| {
            let http = http.clone();
            let body = json!({"task": super::echo_task(&format!("bench agent {i}"), p.echoes, 0)});
            async move {
                let r = http
                    .post(format!("{url}/v1/agents"))
                    .json(&body)
                    .send()
                    .await?;
                let status = r.status();
                if !status.is_success() {
                    anyhow::bail!(
                        "POST /v1/agents: {status}: {}",
                        r.text().await.unwrap_or_default()
                    );
                }
                Ok(())
            }
        })
        .buffer_unordered(64);
    while let Some(r) = submits.next().await {
        r?;
    }
    Ok(())
}

/// Lines appended to `path` after byte `from`, as JSON.
fn lines_after(path: &Path, from: u64) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let tail = text.get(from as usize..).unwrap_or_default();
    Ok(String::from_utf8_lossy(tail)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Tool executions after the restart whose result was already recorded.
fn tool_reruns(
    log: &Path,
    mark: u64,
    recorded: &HashSet<String>,
    dead_pid: u32,
) -> anyhow::Result<usize> {
    Ok(lines_after(log, mark)?
        .iter()
        .filter(|e| e.get("pid").and_then(Value::as_u64) != Some(dead_pid as u64))
        .filter(|e| {
            e.get("tool_call_id")
                .and_then(Value::as_str)
                .is_some_and(|id| recorded.contains(id))
        })
        .count())
}

/// Model requests after the restart for a call whose answer was already
/// recorded: the request holds fewer answers than the agent had recorded.
fn model_reruns(log: &Path, mark: u64, answers: &HashMap<String, i64>) -> anyhow::Result<usize> {
    let mut again = 0;
    for req in lines_after(log, mark)? {
        let Some(messages) = req.get("messages").and_then(Value::as_array) else {
            continue;
        };
        let task_line = messages
            .iter()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            .and_then(|m| m.get("content").and_then(Value::as_str))
            .and_then(|c| c.lines().next())
            .unwrap_or_default();
        let prior = messages
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
            .count() as i64;
        if answers.get(task_line).is_some_and(|&n| prior < n) {
            again += 1;
        }
    }
    Ok(again)
}
