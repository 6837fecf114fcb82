//! Typed configuration (SPEC §8): parsed once from `agentq.toml`, overridden
//! by `AGENTQ_<SECTION>_<KEY>` environment variables, then validated. Every
//! error names the file, the key and the problem.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A configuration problem: which file, which key, what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {key}: {problem}")]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub problem: String,
}

impl ConfigError {
    pub fn new(
        file: impl Into<String>,
        key: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        Self {
            file: file.into(),
            key: key.into(),
            problem: problem.into(),
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub database: DatabaseConfig,
    pub workers: WorkersConfig,
    pub agents: AgentsConfig,
    pub scheduler: SchedulerConfig,
    pub heartbeat: HeartbeatConfig,
    pub tools: ToolsConfig,
    pub providers: BTreeMap<String, ProviderConfig>,
    pub models: BTreeMap<String, ModelConfig>,
    pub roles: BTreeMap<String, Vec<String>>,
    pub users: Vec<UserConfig>,
    pub webhooks: WebhooksConfig,
    /// The file this was read from (for error messages).
    #[serde(skip)]
    pub source: String,
}

impl Default for Config {
    fn default() -> Self {
        let mut providers = BTreeMap::new();
        providers.insert("mock".to_string(), ProviderConfig::mock());
        let mut models = BTreeMap::new();
        models.insert(
            "mock".to_string(),
            ModelConfig {
                provider: "mock".into(),
                model: "mock".into(),
                ..ModelConfig::default()
            },
        );
        let mut roles = BTreeMap::new();
        roles.insert("default".to_string(), vec!["mock".to_string()]);
        Self {
            server: ServerConfig::default(),
            database: DatabaseConfig::default(),
            workers: WorkersConfig::default(),
            agents: AgentsConfig::default(),
            scheduler: SchedulerConfig::default(),
            heartbeat: HeartbeatConfig::default(),
            tools: ToolsConfig::default(),
            providers,
            models,
            roles,
            users: Vec::new(),
            webhooks: WebhooksConfig::default(),
            source: "<built-in defaults>".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub bind: String,
    pub max_body_bytes: usize,
    /// Names this node in job leases; the rescuer returns this node's
    /// previous instance's jobs at start-up at once.
    pub node: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:7070".into(),
            max_body_bytes: 1024 * 1024,
            node: "local".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Synchronous {
    Normal,
    Full,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    pub path: PathBuf,
    pub synchronous: Synchronous,
    /// Read connections (the writer is always one connection).
    pub read_connections: u32,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("data/agentq.db"),
            synchronous: Synchronous::Normal,
            read_connections: 4,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersConfig {
    pub concurrency: usize,
    pub lease_s: f64,
    pub heartbeat_s: f64,
    pub max_attempts: i64,
    pub max_resumes: i64,
    /// Fallback poll interval for rows written by others and future `run_at`.
    pub poll_ms: u64,
    /// Graceful shutdown: how long running steps may take to finish.
    pub shutdown_grace_s: f64,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        Self {
            concurrency: 64,
            lease_s: 60.0,
            heartbeat_s: 20.0,
            max_attempts: 5,
            max_resumes: 3,
            poll_ms: 1000,
            shutdown_grace_s: 10.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentsConfig {
    pub definitions_dir: PathBuf,
    pub max_level: i64,
    pub max_children_per_agent: i64,
    pub max_active_agents_per_user: i64,
    pub max_auto_wakes: i64,
    pub default_max_turns: i64,
    /// Default deadline of sub-agents (level ≥ 2); level-1 agents get a
    /// deadline only when the request or the definition sets `timeout_s`.
    pub default_timeout_s: f64,
    pub retention_h: f64,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        Self {
            definitions_dir: PathBuf::from("config/agents"),
            max_level: 3,
            max_children_per_agent: 5,
            max_active_agents_per_user: 1000,
            max_auto_wakes: 6,
            default_max_turns: 40,
            default_timeout_s: 300.0,
            retention_h: 24.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    pub catch_up_s: i64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self { catch_up_s: 3600 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeartbeatConfig {
    pub prompt: String,
    pub ok_token: String,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            prompt: "HEARTBEAT: check on your work. If nothing needs attention, answer exactly HEARTBEAT_OK.".into(),
            ok_token: "HEARTBEAT_OK".into(),
        }
    }
}

/// Whether a tool call needs a human's approval before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Suspend the agent until a human approves or denies.
    Ask,
    /// Run without asking.
    Never,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    /// Enables the debug tools `echo` and `sleep`.
    pub debug: bool,
    /// A path: debug tools append one JSON line per execution.
    pub debug_log: String,
    pub manifests_dir: PathBuf,
    /// Per tool: `"ask"` or `"never"`. `agent_cancel` asks by default.
    pub approval: BTreeMap<String, ApprovalPolicy>,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        Self {
            debug: false,
            debug_log: String::new(),
            manifests_dir: PathBuf::from("config/tools"),
            approval: BTreeMap::from([("agent_cancel".to_string(), ApprovalPolicy::Ask)]),
        }
    }
}

impl ToolsConfig {
    /// Whether calls of `tool` wait for a human's approval.
    pub fn needs_approval(&self, tool: &str) -> bool {
        self.approval.get(tool) == Some(&ApprovalPolicy::Ask)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Openai,
    Mock,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    pub base_url: String,
    pub api_key_env: Option<String>,
    pub max_concurrent: usize,
    pub timeout_s: f64,
    /// Retries of one model before the chain moves to the next.
    pub max_retries: u32,
    /// First backoff step; doubles per retry, with full jitter.
    pub retry_base_ms: u64,
}

impl ProviderConfig {
    fn mock() -> Self {
        Self {
            kind: ProviderKind::Mock,
            ..Self::default()
        }
    }
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            kind: ProviderKind::Openai,
            base_url: String::new(),
            api_key_env: None,
            max_concurrent: 8,
            timeout_s: 120.0,
            max_retries: 2,
            retry_base_ms: 250,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    pub provider: String,
    pub model: String,
    pub context_window: u64,
    pub price_in_per_mtok: f64,
    pub price_out_per_mtok: f64,
    /// Compact when a request's estimated tokens exceed this share of the window.
    pub compact_at: f64,
    /// Exchanges at the end of the context that compaction never touches.
    pub keep_recent: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            provider: String::new(),
            model: String::new(),
            context_window: 32768,
            price_in_per_mtok: 0.0,
            price_out_per_mtok: 0.0,
            compact_at: 0.8,
            keep_recent: 4,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default)]
    pub token_sha256: Option<String>,
    #[serde(default)]
    pub admin: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    pub secret_env: Option<String>,
    pub url: String,
    pub max_attempts: Option<i64>,
}

/// Sections whose scalar keys may be overridden from the environment.
const ENV_SECTIONS: &[&str] = &[
    "server",
    "database",
    "workers",
    "agents",
    "scheduler",
    "heartbeat",
    "tools",
    "webhooks",
];

impl Config {
    /// Reads, overrides from the process environment, and validates.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(&file, "-", format!("cannot read the file: {e}")))?;
        Self::parse(&text, &file, std::env::vars())
    }

    /// Parses `text` (named `file` in errors), applies overrides from `env`,
    /// validates.
    pub fn parse(
        text: &str,
        file: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut value: toml::Table = text
            .parse::<toml::Table>()
            .map_err(|e| ConfigError::new(file, "-", format!("not valid TOML: {e}")))?;
        apply_env_overrides(&mut value, env);
        let de = toml::Value::Table(value);
        let mut cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::new(file, key, e.into_inner().to_string())
        })?;
        cfg.source = file.to_string();
        cfg.validate()?;
        Ok(cfg)
    }

    fn err(&self, key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::new(&self.source, key, problem)
    }

    /// Cross-field checks that serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server.bind.parse::<SocketAddr>().map_err(|e| {
            self.err(
                "server.bind",
                format!("`{}` is not host:port ({e})", self.server.bind),
            )
        })?;
        if self.server.max_body_bytes < 1024 {
            return Err(self.err("server.max_body_bytes", "must be at least 1024"));
        }
        if self.workers.concurrency == 0 {
            return Err(self.err("workers.concurrency", "must be at least 1"));
        }
        if self.workers.lease_s <= 0.0 || self.workers.heartbeat_s <= 0.0 {
            return Err(self.err(
                "workers.lease_s",
                "lease_s and heartbeat_s must be positive",
            ));
        }
        if self.workers.heartbeat_s >= self.workers.lease_s {
            return Err(self.err(
                "workers.heartbeat_s",
                format!(
                    "must be shorter than workers.lease_s ({}), or leases expire between heartbeats",
                    self.workers.lease_s
                ),
            ));
        }
        if self.workers.max_attempts < 1 {
            return Err(self.err("workers.max_attempts", "must be at least 1"));
        }
        if self.workers.max_resumes < 1 {
            return Err(self.err("workers.max_resumes", "must be at least 1"));
        }
        if !(1..=9).contains(&self.agents.max_level) {
            return Err(self.err("agents.max_level", "must be between 1 and 9"));
        }
        for (key, v) in [
            (
                "agents.max_children_per_agent",
                self.agents.max_children_per_agent,
            ),
            (
                "agents.max_active_agents_per_user",
                self.agents.max_active_agents_per_user,
            ),
            ("agents.default_max_turns", self.agents.default_max_turns),
        ] {
            if v < 1 {
                return Err(self.err(key, "must be at least 1"));
            }
        }
        if self.agents.max_auto_wakes < 0 {
            return Err(self.err("agents.max_auto_wakes", "must not be negative"));
        }
        if self.agents.default_timeout_s <= 0.0 {
            return Err(self.err("agents.default_timeout_s", "must be positive"));
        }
        for (name, p) in &self.providers {
            let key = format!("providers.{name}");
            if p.kind == ProviderKind::Openai {
                if p.base_url.is_empty() {
                    return Err(
                        self.err(format!("{key}.base_url"), "required for kind = \"openai\"")
                    );
                }
                if !(p.base_url.starts_with("http://") || p.base_url.starts_with("https://")) {
                    return Err(self.err(
                        format!("{key}.base_url"),
                        format!("`{}` must start with http:// or https://", p.base_url),
                    ));
                }
            }
            if p.max_concurrent == 0 {
                return Err(self.err(format!("{key}.max_concurrent"), "must be at least 1"));
            }
            if p.timeout_s <= 0.0 {
                return Err(self.err(format!("{key}.timeout_s"), "must be positive"));
            }
        }
        for (name, m) in &self.models {
            let key = format!("models.{name}");
            if !self.providers.contains_key(&m.provider) {
                return Err(self.err(
                    format!("{key}.provider"),
                    format!(
                        "unknown provider `{}` (configured: {})",
                        m.provider,
                        join_keys(self.providers.keys())
                    ),
                ));
            }
            if m.model.is_empty() {
                return Err(self.err(
                    format!("{key}.model"),
                    "required: the model name the server knows",
                ));
            }
            if m.context_window < 256 {
                return Err(self.err(format!("{key}.context_window"), "must be at least 256"));
            }
            if !(m.compact_at > 0.0 && m.compact_at <= 1.0) {
                return Err(self.err(format!("{key}.compact_at"), "must be in (0, 1]"));
            }
        }
        if !self.roles.contains_key("default") {
            return Err(self.err(
                "roles.default",
                "missing: the role of a definition that names none must exist",
            ));
        }
        for (role, chain) in &self.roles {
            if chain.is_empty() {
                return Err(self.err(format!("roles.{role}"), "the model chain is empty"));
            }
            for m in chain {
                if !self.models.contains_key(m) {
                    return Err(self.err(
                        format!("roles.{role}"),
                        format!(
                            "unknown model `{m}` (configured: {})",
                            join_keys(self.models.keys())
                        ),
                    ));
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (i, u) in self.users.iter().enumerate() {
            let key = format!("users[{i}]");
            if u.name.trim().is_empty() {
                return Err(self.err(format!("{key}.name"), "must not be empty"));
            }
            if !seen.insert(u.name.clone()) {
                return Err(self.err(
                    format!("{key}.name"),
                    format!("duplicate user `{}`", u.name),
                ));
            }
            match (&u.token_env, &u.token_sha256) {
                (None, None) => {
                    return Err(self.err(key, "needs token_env or token_sha256"));
                }
                (Some(_), Some(_)) => {
                    return Err(self.err(key, "set token_env or token_sha256, not both"));
                }
                (None, Some(h)) => {
                    if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(
                            self.err(format!("{key}.token_sha256"), "must be 64 hex characters")
                        );
                    }
                }
                (Some(_), None) => {}
            }
        }
        Ok(())
    }

    /// The bind address (validated at load).
    pub fn bind_addr(&self) -> SocketAddr {
        self.server
            .bind
            .parse()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 7070)))
    }
}

fn join_keys<'a>(keys: impl Iterator<Item = &'a String>) -> String {
    let v: Vec<&str> = keys.map(String::as_str).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// `AGENTQ_WORKERS_MAX_ATTEMPTS=3` sets `[workers] max_attempts = 3`. Values
/// are read as integers, floats or booleans when they look like one.
fn apply_env_overrides(table: &mut toml::Table, env: impl IntoIterator<Item = (String, String)>) {
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("AGENTQ_") else {
            continue;
        };
        let rest = rest.to_ascii_lowercase();
        let Some(section) = ENV_SECTIONS
            .iter()
            .find(|s| rest.starts_with(&format!("{s}_")))
        else {
            continue;
        };
        let key = &rest[section.len() + 1..];
        if key.is_empty() {
            continue;
        }
        let value = if let Ok(i) = raw.parse::<i64>() {
            toml::Value::Integer(i)
        } else if let Ok(f) = raw.parse::<f64>() {
            toml::Value::Float(f)
        } else if let Ok(b) = raw.parse::<bool>() {
            toml::Value::Boolean(b)
        } else {
            toml::Value::String(raw)
        };
        let entry = table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(t) = entry {
            // Keep the declared type where a float key got an integer value.
            let value = match (t.get(key), value) {
                (Some(toml::Value::Float(_)), toml::Value::Integer(i)) => {
                    toml::Value::Float(i as f64)
                }
                (_, v) => v,
            };
            t.insert(key.to_string(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "test.toml", Vec::<(String, String)>::new())
    }

    #[test]
    fn empty_file_gives_the_offline_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.server.bind, "127.0.0.1:7070");
        assert_eq!(c.roles["default"], vec!["mock".to_string()]);
        assert_eq!(c.providers["mock"].kind, ProviderKind::Mock);
        assert_eq!(c.workers.max_resumes, 3);
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let e = parse("[workers]\nconcurency = 3\n").unwrap_err();
        assert_eq!(e.file, "test.toml");
        assert!(e.problem.contains("concurency"), "{e}");
    }

    #[test]
    fn wrong_type_names_the_key() {
        let e = parse("[workers]\nconcurrency = \"lots\"\n").unwrap_err();
        assert_eq!(e.key, "workers.concurrency");
    }

    #[test]
    fn role_with_unknown_model_is_rejected() {
        let e = parse("[roles]\ndefault = [\"nope\"]\n").unwrap_err();
        assert_eq!(e.key, "roles.default");
        assert!(e.problem.contains("unknown model `nope`"), "{e}");
    }

    #[test]
    fn openai_provider_needs_base_url() {
        let e = parse("[providers.x]\nkind = \"openai\"\n").unwrap_err();
        assert_eq!(e.key, "providers.x.base_url");
    }

    #[test]
    fn env_overrides_scalars() {
        let c = Config::parse(
            "[workers]\nlease_s = 30.0\n",
            "t.toml",
            vec![
                ("AGENTQ_WORKERS_CONCURRENCY".into(), "3".into()),
                ("AGENTQ_WORKERS_LEASE_S".into(), "40".into()),
                ("AGENTQ_TOOLS_DEBUG".into(), "true".into()),
                ("AGENTQ_URL".into(), "http://x".into()),
            ],
        )
        .unwrap();
        assert_eq!(c.workers.concurrency, 3);
        assert_eq!(c.workers.lease_s, 40.0);
        assert!(c.tools.debug);
    }

    #[test]
    fn users_need_a_token_source() {
        let e = parse("[[users]]\nname = \"a\"\n").unwrap_err();
        assert_eq!(e.key, "users[0]");
    }
}
