//! The integration-test harness: starts the real service on an ephemeral
//! port with a temp database and the mock model over HTTP (with its request
//! log), and offers HTTP helpers that wait on long-polls, never on sleeps.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentq::model::mock_server::{self, MockServer};
use agentq::{App, Config, RunningApp};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// The repository root (for the shipped config and definitions).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A temp directory with the mock model serving over HTTP.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub mock: MockServer,
}

impl Drop for Env {
    fn drop(&mut self) {
        // `AGENTQ_TEST_KEEP=1` keeps the directory (database, logs) to inspect.
        if std::env::var_os("AGENTQ_TEST_KEEP").is_some() {
            eprintln!("kept test directory {}", self.dir.path().display());
            let kept = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
            let _ = kept.keep();
        }
    }
}

impl Env {
    pub async fn new() -> Self {
        // `AGENTQ_TEST_LOG=debug cargo test …` shows the service's logs.
        if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("AGENTQ_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_test_writer()
                .try_init();
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let agents = dir.path().join("agents");
        std::fs::create_dir_all(&agents).expect("agents dir");
        for e in std::fs::read_dir(repo().join("config/agents")).expect("shipped definitions") {
            let p = e.expect("entry").path();
            std::fs::copy(&p, agents.join(p.file_name().expect("name"))).expect("copy definition");
        }
        let log = dir.path().join("mock.log");
        let mock = mock_server::spawn("127.0.0.1:0".parse().expect("addr"), Some(log))
            .await
            .expect("mock server");
        Self { dir, mock }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Adds a definition file `agents/<slug>.toml`.
    pub fn add_definition(&self, slug: &str, body: &str) {
        std::fs::write(
            self.path("agents").join(format!("{slug}.toml")),
            format!("slug = \"{slug}\"\n{body}"),
        )
        .expect("write definition");
    }

    /// The test configuration, with `overrides` (TOML) merged over it.
    pub fn config_text(&self, overrides: &str) -> String {
        let base = format!(
            r#"
[server]
bind = "127.0.0.1:0"
[database]
path = "{db}"
[workers]
concurrency = 16
lease_s = 10.0
heartbeat_s = 1.0
poll_ms = 200
shutdown_grace_s = 2.0
[agents]
definitions_dir = "{agents}"
[tools]
debug = true
debug_log = "{debug}"
[providers.mock]
kind = "openai"
base_url = "{url}"
max_retries = 2
retry_base_ms = 20
timeout_s = 5.0
max_concurrent = 64
[models.primary]
provider = "mock"
model = "primary"
price_in_per_mtok = 1.0
price_out_per_mtok = 2.0
[models.backup]
provider = "mock"
model = "backup"
price_in_per_mtok = 1.0
price_out_per_mtok = 2.0
[roles]
default = ["primary"]
"#,
            db = self.path("agentq.db").display(),
            agents = self.path("agents").display(),
            debug = self.path("debug.log").display(),
            url = self.mock.base_url(),
        );
        let mut table: toml::Table = base.parse().expect("base config");
        let over: toml::Table = overrides.parse().expect("override TOML");
        merge(&mut table, over);
        toml::to_string(&table).expect("config text")
    }

    pub fn config(&self, overrides: &str) -> Config {
        Config::parse(
            &self.config_text(overrides),
            "test.toml",
            Vec::<(String, String)>::new(),
        )
        .expect("valid test config")
    }

    /// Starts the service in-process.
    pub async fn start(&self, overrides: &str) -> Harness {
        let app = App::start(self.config(overrides))
            .await
            .expect("service starts");
        Harness::new(app)
    }

    /// Every request the mock model received, in order.
    pub fn mock_log(&self) -> Vec<Value> {
        read_lines(&self.path("mock.log"))
    }

    /// Every debug-tool execution.
    pub fn debug_log(&self) -> Vec<Value> {
        read_lines(&self.path("debug.log"))
    }
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// JSON lines of a file (missing file = none).
pub fn read_lines(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("log line is JSON"))
        .collect()
}

/// A task carrying a mock script.
pub fn scripted(task: &str, steps: Value) -> String {
    format!("{task}\n#mock {steps}")
}

/// A client of a running service.
pub struct Harness {
    pub app: Option<RunningApp>,
    pub base: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
}

impl Harness {
    pub fn new(app: RunningApp) -> Self {
        let base = app.url();
        Self {
            app: Some(app),
            base,
            http: reqwest::Client::new(),
            token: None,
        }
    }

    /// A client of a server started elsewhere (the real binary).
    pub fn remote(base: &str) -> Self {
        Self {
            app: None,
            base: base.to_string(),
            http: reqwest::Client::new(),
            token: None,
        }
    }

    pub fn core(&self) -> &std::sync::Arc<agentq::core::Core> {
        &self.app.as_ref().expect("in-process app").core
    }

    pub fn with_token(&self, token: &str) -> Self {
        Self {
            app: None,
            base: self.base.clone(),
            http: self.http.clone(),
            token: Some(token.to_string()),
        }
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self
            .auth(self.http.get(format!("{}{path}", self.base)))
            .send()
            .await
            .expect("GET");
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .auth(self.http.post(format!("{}{path}", self.base)).json(&body))
            .send()
            .await
            .expect("POST");
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn patch(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .auth(self.http.patch(format!("{}{path}", self.base)).json(&body))
            .send()
            .await
            .expect("PATCH");
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let r = self
            .auth(self.http.delete(format!("{}{path}", self.base)))
            .send()
            .await
            .expect("DELETE");
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let r = self
            .auth(
                self.http
                    .post(format!("{}{path}", self.base))
                    .header("content-type", "application/json")
                    .body(body),
            )
            .send()
            .await
            .expect("POST");
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Submits and returns the created agent (asserting 201).
    pub async fn submit(&self, body: Value) -> Value {
        let (s, v) = self.post("/v1/agents", body).await;
        assert_eq!(s, StatusCode::CREATED, "submit failed: {v}");
        v
    }

    pub async fn submit_task(&self, task: &str) -> Value {
        self.submit(json!({"task": task})).await
    }

    /// Long-polls until the agent settles (panics after `max`).
    pub async fn wait_settled(&self, id: &str, max: Duration) -> Value {
        let start = std::time::Instant::now();
        loop {
            let (s, v) = self.get(&format!("/v1/agents/{id}/wait?timeout_s=5")).await;
            assert_eq!(s, StatusCode::OK, "wait failed: {v}");
            let st = v["status"].as_str().unwrap_or("");
            if matches!(st, "done" | "failed" | "cancelled" | "timed_out") {
                return v;
            }
            assert!(
                start.elapsed() < max,
                "agent {id} did not settle in {max:?}: {v}"
            );
        }
    }

    pub async fn wait(&self, id: &str) -> Value {
        self.wait_settled(id, Duration::from_secs(60)).await
    }

    /// Polls (bounded) until `f(agent)` holds.
    pub async fn wait_for(&self, id: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..3000 {
            let (_, v) = self.get(&format!("/v1/agents/{id}")).await;
            if f(&v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("agent {id}: {what} never happened");
    }

    pub async fn messages(&self, id: &str) -> Vec<Value> {
        let (s, v) = self.get(&format!("/v1/agents/{id}/messages")).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v["messages"].as_array().cloned().unwrap_or_default()
    }

    pub async fn shutdown(mut self) {
        if let Some(app) = self.app.take() {
            app.shutdown().await;
        }
    }
}

/// The real binary as a child process (crash tests).
pub struct Binary {
    pub child: std::process::Child,
    pub url: String,
    // Kept open so the child's stdout never breaks.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Binary {
    /// Starts `agentq serve --config <file>` and waits for its listening line.
    pub fn start(config: &Path, stderr: &Path) -> Self {
        use std::io::BufRead;
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stderr)
            .expect("stderr file");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agentq"))
            .args(["serve", "--config"])
            .arg(config)
            .env("AGENTQ_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("spawn agentq");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        let mut reader = std::io::BufReader::new(stdout);
        reader
            .read_line(&mut line)
            .expect("read the listening line");
        let url = line
            .trim()
            .strip_prefix("agentq listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}; see {}", stderr.display()))
            .to_string();
        Self {
            child,
            url,
            _stdout: reader,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL and reap.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
