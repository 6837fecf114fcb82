//! `Core`: the wired-up shared state every service, handler and tool uses —
//! config, database, signals, models, tools, definitions, users, clock — and
//! the two-stage stop tokens.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::{Config, ConfigError};
use crate::db::Db;
use crate::definitions::Definitions;
use crate::model::ModelRouter;
use crate::signals::Signals;
use crate::tools::debug::DebugLog;
use crate::tools::Catalog;

/// Two-stage shutdown: `soft` stops claiming and ends turns at the next step
/// boundary; `hard` (after the grace period) aborts in-flight steps.
#[derive(Clone, Default)]
pub struct Stop {
    pub soft: CancellationToken,
    pub hard: CancellationToken,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub admin: bool,
}

/// The single user of a server without `[[users]]` (loopback only).
pub const LOCAL_USER: &str = "local";

struct UserKey {
    user: User,
    token_sha256: [u8; 32],
}

/// Bearer-token authentication against `[[users]]`.
pub struct Auth {
    keys: Vec<UserKey>,
}

impl Auth {
    /// Reads tokens from the environment or the configured hashes.
    pub fn from_config(cfg: &Config) -> Result<Self, ConfigError> {
        let mut keys = Vec::new();
        for (i, u) in cfg.users.iter().enumerate() {
            let hash: [u8; 32] = match (&u.token_env, &u.token_sha256) {
                (Some(var), _) => {
                    let token = std::env::var(var).map_err(|_| {
                        ConfigError::new(
                            &cfg.source,
                            format!("users[{i}].token_env"),
                            format!("environment variable `{var}` is not set"),
                        )
                    })?;
                    if token.is_empty() {
                        return Err(ConfigError::new(
                            &cfg.source,
                            format!("users[{i}].token_env"),
                            format!("environment variable `{var}` is empty"),
                        ));
                    }
                    Sha256::digest(token.as_bytes()).into()
                }
                (None, Some(hex_hash)) => {
                    let bytes = hex::decode(hex_hash).map_err(|e| {
                        ConfigError::new(
                            &cfg.source,
                            format!("users[{i}].token_sha256"),
                            e.to_string(),
                        )
                    })?;
                    bytes.try_into().map_err(|_| {
                        ConfigError::new(
                            &cfg.source,
                            format!("users[{i}].token_sha256"),
                            "must be 32 bytes",
                        )
                    })?
                }
                (None, None) => {
                    return Err(ConfigError::new(
                        &cfg.source,
                        format!("users[{i}]"),
                        "needs a token",
                    ))
                }
            };
            keys.push(UserKey {
                user: User {
                    name: u.name.clone(),
                    admin: u.admin,
                },
                token_sha256: hash,
            });
        }
        Ok(Self { keys })
    }

    /// No users configured: single-user, loopback-only mode.
    pub fn single_user(&self) -> bool {
        self.keys.is_empty()
    }

    /// The user a bearer token belongs to. Compares hashes in constant time.
    pub fn authenticate(&self, token: Option<&str>) -> Option<User> {
        if self.single_user() {
            return Some(User {
                name: LOCAL_USER.into(),
                admin: true,
            });
        }
        let presented: [u8; 32] = Sha256::digest(token?.as_bytes()).into();
        self.keys
            .iter()
            .find(|k| {
                k.token_sha256
                    .iter()
                    .zip(presented.iter())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
            })
            .map(|k| k.user.clone())
    }

    /// Every configured user.
    pub fn users(&self) -> Vec<User> {
        if self.single_user() {
            return vec![User {
                name: LOCAL_USER.into(),
                admin: true,
            }];
        }
        self.keys.iter().map(|k| k.user.clone()).collect()
    }
}

/// The shared state.
pub struct Core {
    pub cfg: Config,
    pub db: Db,
    pub signals: Arc<Signals>,
    pub models: ModelRouter,
    pub catalog: Catalog,
    pub definitions: Definitions,
    pub clock: Clock,
    pub auth: Auth,
    /// This node's name (`[server] node`).
    pub node: String,
    /// This process's lease owner id.
    pub owner: String,
    pub stop: Stop,
    pub debug_log: Option<DebugLog>,
    /// Client for webhooks.
    pub http: reqwest::Client,
    /// `[webhooks] secret_env`'s value, if set.
    pub webhook_secret: Option<String>,
    /// Per-step orchestration time, recorded when a benchmark asks for it.
    pub step_timings: Option<StepTimings>,
}

/// Samples of the time each step spends outside the model and the tools
/// (recording, scheduling, context building), in microseconds.
#[derive(Debug, Default)]
pub struct StepTimings {
    samples: std::sync::Mutex<Vec<u32>>,
}

impl StepTimings {
    pub fn record(&self, d: std::time::Duration) {
        let us = d.as_micros().min(u32::MAX as u128) as u32;
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(us);
    }

    /// The samples so far (microseconds), sorted.
    pub fn sorted(&self) -> Vec<u32> {
        let mut v = self
            .samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        v.sort_unstable();
        v
    }
}

impl Core {
    /// Milliseconds since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }
}
