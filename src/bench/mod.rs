//! `agentq bench`: the workloads of BENCH.md, each on a fresh temp
//! database. This module owns what they share: the benchmark config, the
//! agent definitions and mock scripts, waiting for agents to finish,
//! peak-RSS readings, and the report (one line per figure, or JSON).

pub mod w1;
pub mod w2;
pub mod w3;
pub mod w4;
pub mod w5;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use serde_json::{json, Value};
use sqlx::SqlitePool;

use crate::config::Config;
use crate::core::Core;
use crate::creation::{self, NewAgentRequest};

/// A workload of BENCH.md.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum Workload {
    W1,
    W2,
    W3,
    W4,
    W5,
    All,
}

impl Workload {
    /// The workloads this one stands for.
    pub fn expand(self) -> Vec<Workload> {
        match self {
            Workload::All => vec![
                Workload::W1,
                Workload::W2,
                Workload::W3,
                Workload::W4,
                Workload::W5,
            ],
            w => vec![w],
        }
    }

    /// The prefix of its figures (`W2`).
    pub fn label(self) -> &'static str {
        match self {
            Workload::W1 => "W1",
            Workload::W2 => "W2",
            Workload::W3 => "W3",
            Workload::W4 => "W4",
            Workload::W5 => "W5",
            Workload::All => "all",
        }
    }

    async fn run_once(self) -> anyhow::Result<Report> {
        match self {
            Workload::W1 => w1::run(&w1::Params::full()).await,
            Workload::W2 => w2::run(&w2::Params::full()).await,
            Workload::W3 => w3::run(&w3::Params::full()).await,
            Workload::W4 => w4::run(&w4::Params::full()).await,
            Workload::W5 => w5::run(&w5::Params::full()).await,
            Workload::All => anyhow::bail!("`all` is not one workload"),
        }
    }
}

/// What one run of a workload measured.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub workload: Workload,
    /// `(name, value)` in print order.
    pub figures: Vec<(String, f64)>,
    /// The settings the run used.
    pub settings: Value,
    /// What the run lost or got wrong (a non-empty list fails the command).
    pub failures: Vec<String>,
    /// Where the time or memory went, for the README's analysis (stderr).
    pub breakdown: Vec<String>,
}

impl Report {
    pub fn new(workload: Workload, settings: Value) -> Self {
        Self {
            workload,
            figures: Vec::new(),
            settings,
            failures: Vec::new(),
            breakdown: Vec::new(),
        }
    }

    pub fn figure(&mut self, name: &str, value: f64) {
        self.figures.push((name.to_string(), value));
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    pub fn fail(&mut self, what: impl Into<String>) {
        self.failures.push(what.into());
    }
}

/// Where the benchmark agents' model answers come from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// The mock brain inside the process.
    InProcess,
    /// An OpenAI-compatible server at this base URL (the HTTP mock).
    Http(String),
}

/// The knobs a workload turns.
#[derive(Debug, Clone)]
pub struct Setup {
    pub workers: usize,
    pub max_children: i64,
    pub model: ModelSource,
    /// `[tools] debug_log`: every tool execution, for W4's audit.
    pub debug_log: Option<PathBuf>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            workers: 16,
            max_children: 5,
            model: ModelSource::InProcess,
            debug_log: None,
        }
    }
}

/// A fresh directory for one run; kept (and named on stderr) when
/// `AGENTQ_BENCH_KEEP` is set, to look at the database and logs after.
pub fn workdir() -> anyhow::Result<tempfile::TempDir> {
    let mut dir = tempfile::Builder::new().prefix("agentq-bench-").tempdir()?;
    if std::env::var_os("AGENTQ_BENCH_KEEP").is_some() {
        dir.disable_cleanup(true);
        eprintln!("keeping {}", dir.path().display());
    }
    Ok(dir)
}

/// The database file of a benchmark directory.
pub fn db_path(dir: &Path) -> PathBuf {
    dir.join("bench.db")
}

/// The config file text for a benchmark directory: default storage
/// settings (WAL, `synchronous = NORMAL`), the given workers and model, and
/// limits raised out of the way.
pub fn config_text(dir: &Path, setup: &Setup) -> String {
    let provider = match &setup.model {
        ModelSource::InProcess => "kind = \"mock\"".to_string(),
        ModelSource::Http(url) => format!("kind = \"openai\"\nbase_url = {}", json!(url)),
    };
    let debug_log = setup
        .debug_log
        .as_ref()
        .map(|p| format!("debug_log = {}", json!(p.display().to_string())))
        .unwrap_or_default();
    format!(
        r#"[server]
bind = "127.0.0.1:0"
[database]
path = {db}
[workers]
concurrency = {workers}
[agents]
definitions_dir = {defs}
max_children_per_agent = {max_children}
max_active_agents_per_user = 1000000
[tools]
debug = true
{debug_log}
[providers.mock]
{provider}
max_concurrent = 1000000
[models.mock]
provider = "mock"
model = "mock"
[roles]
default = ["mock"]
"#,
        db = json!(db_path(dir).display().to_string()),
        workers = setup.workers,
        defs = json!(dir.join("agents").display().to_string()),
        max_children = setup.max_children,
    )
}

/// Writes the agent definitions and returns the parsed config.
pub fn prepare(dir: &Path, setup: &Setup) -> anyhow::Result<Config> {
    write_definitions(dir)?;
    let text = config_text(dir, setup);
    Ok(Config::parse(
        &text,
        "<bench>",
        Vec::<(String, String)>::new(),
    )?)
}

/// The definitions: `default` (debug tools only) and `fanout` (spawns and
/// waits on sub-agents).
fn write_definitions(dir: &Path) -> anyhow::Result<()> {
    let defs = dir.join("agents");
    std::fs::create_dir_all(&defs)?;
    std::fs::write(
        defs.join("default.toml"),
        "slug = \"default\"\ntools = [\"echo\", \"sleep\"]\nsystem_prompt = \"bench\"\n",
    )?;
    std::fs::write(
        defs.join("fanout.toml"),
        "slug = \"fanout\"\ntools = [\"spawn_agent\", \"wait_for_agent\", \"echo\"]\n\
         system_prompt = \"bench parent\"\n",
    )?;
    Ok(())
}

/// A task whose mock script makes `echoes` calls answering one `echo` tool
/// call each, then a final text; every answer takes `delay_ms`.
pub fn echo_task(tag: &str, echoes: usize, delay_ms: u64) -> String {
    let steps: Vec<Value> = (0..echoes)
        .map(|i| {
            json!({"call": [{"name": "echo", "args": {"text": format!("{tag} step {i}")}}],
                   "delay_ms": delay_ms})
        })
        .chain([json!({"say": format!("{tag} done"), "delay_ms": delay_ms})])
        .collect();
    format!("{tag}\n#mock {}", Value::Array(steps))
}

/// Polls until `expected` agents are done. Fails when one ended otherwise
/// or `limit` passes. Polls the active-agent counter, not the agents
/// table: scanning thousands of rows every few milliseconds would be a
/// load of its own.
pub async fn wait_all_done(
    pool: &SqlitePool,
    expected: i64,
    every: Duration,
    limit: Duration,
) -> anyhow::Result<()> {
    let began = Instant::now();
    loop {
        if crate::db::bench::active_agents(pool).await? == 0 {
            let (done, other) = crate::db::bench::finished_agents(pool).await?;
            if other > 0 {
                anyhow::bail!("{other} agents ended without finishing ({done} done)");
            }
            if done >= expected {
                return Ok(());
            }
        }
        if began.elapsed() > limit {
            let (done, _) = crate::db::bench::finished_agents(pool).await?;
            anyhow::bail!("only {done} of {expected} agents done after {limit:?}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Creates one level-1 agent per task from `clients` concurrent callers
/// (as independent clients would), handing each new id to `created`.
pub async fn submit(
    core: &Arc<Core>,
    tasks: &[String],
    clients: usize,
    mut created: impl FnMut(String),
) -> anyhow::Result<()> {
    let mut submits = futures::stream::iter(tasks.iter())
        .map(|task| {
            let core = Arc::clone(core);
            async move { creation::create(&core, NewAgentRequest::top_level("local", task)).await }
        })
        .buffer_unordered(clients.max(1));
    while let Some(r) = submits.next().await {
        created(r?.agent.id);
    }
    Ok(())
}

/// The writer's counters at one moment, to report what it did since.
pub struct WriterMark {
    transactions: u64,
    writes: u64,
    busy_us: u64,
    at: Instant,
}

impl WriterMark {
    pub fn take(db: &crate::db::Db) -> Self {
        let s = db.writer_stats();
        Self {
            transactions: s.batches.load(Relaxed),
            writes: s.writes.load(Relaxed),
            busy_us: s.busy_us.load(Relaxed),
            at: Instant::now(),
        }
    }

    /// Transactions and writes since the mark, and the share of the wall
    /// time the writer was busy.
    pub fn since(&self, db: &crate::db::Db) -> (u64, u64, f64) {
        let s = db.writer_stats();
        let wall = self.at.elapsed().as_micros().max(1) as f64;
        (
            s.batches.load(Relaxed) - self.transactions,
            s.writes.load(Relaxed) - self.writes,
            (s.busy_us.load(Relaxed) - self.busy_us) as f64 / wall,
        )
    }
}

/// Forgets the peak RSS so far (Linux `clear_refs`), so that each workload
/// reports its own.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident set size of this process, in MB (`VmHWM`).
pub fn peak_rss_mb() -> Option<f64> {
    status_kb("/proc/self/status", "VmHWM:").map(|kb| kb / 1024.0)
}

fn status_kb(path: &str, key: &str) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The percentile `p` (0..=1) of sorted samples.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

/// Nproc, memory and commit, for `--json`.
pub fn machine() -> Value {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mem_mb = status_kb("/proc/meminfo", "MemTotal:").map(|kb| (kb / 1024.0).round());
    let commit = std::process::Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    json!({
        "nproc": nproc,
        "memory_mb": mem_mb,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "git_commit": commit,
        "version": env!("CARGO_PKG_VERSION"),
    })
}

/// Median, min and max of each figure over the runs of one workload.
fn summarise(runs: &[Report]) -> Vec<(String, f64, f64, f64)> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .figures
        .iter()
        .map(|(name, _)| {
            let mut v: Vec<f64> = runs.iter().filter_map(|r| r.get(name)).collect();
            v.sort_by(f64::total_cmp);
            let median = if v.len() % 2 == 1 {
                v[v.len() / 2]
            } else {
                (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
            };
            (name.clone(), median, v[0], v[v.len() - 1])
        })
        .collect()
}

/// Runs one workload once in a fresh process (`agentq bench W
/// --one-run`), so that no run inherits another's heap, threads or page
/// cache state, and peak RSS is the run's own.
async fn run_isolated(w: Workload) -> anyhow::Result<Report> {
    let exe = std::env::current_exe()?;
    let name = format!("{w:?}").to_lowercase();
    let out = tokio::process::Command::new(&exe)
        .args(["bench", &name, "--one-run"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).map_err(|e| {
        anyhow::anyhow!(
            "the {} run ended with {} and no report ({e}): {last:?}",
            w.label(),
            out.status
        )
    })
}

/// `agentq bench W --one-run`: one run in this process, its report as one
/// JSON line.
pub async fn one_run(workload: Workload) -> i32 {
    reset_peak_rss();
    match workload.run_once().await {
        Ok(r) => {
            println!("{}", json!(r));
            i32::from(!r.failures.is_empty())
        }
        Err(e) => {
            eprintln!("{}: {e:#}", workload.label());
            1
        }
    }
}

/// `agentq bench`: runs each workload `runs` times, each in a fresh
/// process, prints one line per figure (the median; with several runs, the
/// spread after it) and, with `json`, one JSON object. Returns the exit
/// code: non-zero when a run failed or lost anything.
pub async fn main(workload: Workload, runs: usize, as_json: bool) -> i32 {
    let runs = runs.max(1);
    let mut code = 0;
    let mut results = serde_json::Map::new();
    for w in workload.expand() {
        let mut reports = Vec::new();
        let mut errors = Vec::new();
        for i in 0..runs {
            match run_isolated(w).await {
                Ok(r) => {
                    for line in &r.breakdown {
                        eprintln!("{} run {}: {line}", w.label(), i + 1);
                    }
                    for f in &r.failures {
                        eprintln!("{} run {}: FAILED: {f}", w.label(), i + 1);
                        errors.push(f.clone());
                    }
                    reports.push(r);
                }
                Err(e) => {
                    eprintln!("{} run {}: FAILED: {e:#}", w.label(), i + 1);
                    errors.push(format!("{e:#}"));
                }
            }
        }
        if !errors.is_empty() {
            code = 1;
        }
        let summary = summarise(&reports);
        let mut figures = serde_json::Map::new();
        for (name, median, min, max) in &summary {
            if runs > 1 {
                println!(
                    "{} {name} {median:.1} (median of {}, spread {min:.1}..{max:.1})",
                    w.label(),
                    reports.len()
                );
            } else {
                println!("{} {name} {median:.1}", w.label());
            }
            figures.insert(
                name.clone(),
                json!({"median": median, "min": min, "max": max}),
            );
        }
        results.insert(
            w.label().to_string(),
            json!({
                "figures": figures,
                "runs": reports.len(),
                "settings": reports.first().map(|r| r.settings.clone()),
                "failures": errors,
            }),
        );
    }
    if as_json {
        let out = json!({
            "workloads": results,
            "runs_per_workload": runs,
            "storage": {"journal_mode": "wal", "synchronous": "normal"},
            "machine": machine(),
        });
        println!("{out}");
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_sample_at_or_above() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile::<u32>(&[], 0.5), None);
    }

    #[test]
    fn summaries_are_medians_with_spread() {
        let runs: Vec<Report> = [3.0, 1.0, 2.0]
            .iter()
            .map(|v| {
                let mut r = Report::new(Workload::W1, Value::Null);
                r.figure("x", *v);
                r
            })
            .collect();
        assert_eq!(summarise(&runs), vec![("x".to_string(), 2.0, 1.0, 3.0)]);
    }

    #[test]
    fn the_config_parses_for_both_model_sources() {
        let dir = tempfile::tempdir().unwrap();
        for model in [
            ModelSource::InProcess,
            ModelSource::Http("http://127.0.0.1:9/v1".into()),
        ] {
            let setup = Setup {
                model,
                debug_log: Some(dir.path().join("tools.jsonl")),
                ..Setup::default()
            };
            let cfg = prepare(dir.path(), &setup).unwrap();
            assert_eq!(cfg.workers.concurrency, 16);
        }
    }
}
