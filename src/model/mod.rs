//! Model access: providers (OpenAI protocol over reqwest, the in-process
//! mock), the per-role fallback chain with retries, backoff and
//! `Retry-After`, per-provider concurrency limits, and usage → cost.

pub mod mock;
pub mod mock_server;
pub mod openai;
pub mod types;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ModelConfig, ProviderConfig, ProviderKind};
use types::{ChatMessage, ChatRequest, ModelReply, ToolSpec, Usage};

/// One failed model request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    #[error("connect error: {0}")]
    Connect(String),
    #[error("timed out after {0}s")]
    Timeout(f64),
    #[error("HTTP {status}: {body}")]
    Status {
        status: u16,
        retry_after: Option<Duration>,
        body: String,
    },
    #[error("bad response: {0}")]
    Protocol(String),
    #[error("cancelled")]
    Cancelled,
}

impl ModelError {
    /// The one place that decides what is worth retrying (and, after the
    /// retries, falling back from): connection problems, timeouts, 5xx, 429
    /// and unreadable answers.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect(_) | Self::Timeout(_) | Self::Protocol(_) => true,
            Self::Status { status, .. } => *status == 429 || *status >= 500,
            Self::Cancelled => false,
        }
    }
}

/// Why a whole chain failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ChainError {
    #[error("unknown role `{0}`")]
    UnknownRole(String),
    #[error("model `{model}` failed: {error}")]
    Fatal { model: String, error: ModelError },
    #[error("all models failed for role `{role}`: {tried}; last error: {last}")]
    AllFailed {
        role: String,
        tried: String,
        last: ModelError,
    },
    #[error("cancelled")]
    Cancelled,
}

/// A provider's transport.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// One request; no retries here.
    async fn complete(&self, req: ChatRequest<'_>) -> Result<ModelReply, ModelError>;
}

struct ProviderSlot {
    name: String,
    cfg: ProviderConfig,
    transport: Arc<dyn Provider>,
    permits: Arc<Semaphore>,
}

struct ModelSlot {
    key: String,
    cfg: ModelConfig,
    provider: Arc<ProviderSlot>,
}

/// A successful answer and what it cost.
#[derive(Debug, Clone)]
pub struct Answer {
    pub reply: ModelReply,
    /// The config key of the model that answered.
    pub model: String,
    pub cost_usd: f64,
}

/// Resolves roles to model chains and runs requests through them.
pub struct ModelRouter {
    models: BTreeMap<String, Arc<ModelSlot>>,
    roles: BTreeMap<String, Vec<String>>,
}

impl ModelRouter {
    /// Builds every provider of the config.
    pub fn from_config(cfg: &Config) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let mut providers = BTreeMap::new();
        for (name, p) in &cfg.providers {
            let transport: Arc<dyn Provider> = match p.kind {
                ProviderKind::Mock => Arc::new(mock::MockProvider::new()),
                ProviderKind::Openai => {
                    let key = match &p.api_key_env {
                        Some(var) => std::env::var(var).ok(),
                        None => None,
                    };
                    Arc::new(openai::OpenAiProvider::new(http.clone(), &p.base_url, key))
                }
            };
            providers.insert(
                name.clone(),
                Arc::new(ProviderSlot {
                    name: name.clone(),
                    cfg: p.clone(),
                    transport,
                    permits: Arc::new(Semaphore::new(p.max_concurrent)),
                }),
            );
        }
        let mut models = BTreeMap::new();
        for (key, m) in &cfg.models {
            let provider = providers
                .get(&m.provider)
                .ok_or_else(|| format!("model `{key}`: unknown provider `{}`", m.provider))?;
            models.insert(
                key.clone(),
                Arc::new(ModelSlot {
                    key: key.clone(),
                    cfg: m.clone(),
                    provider: Arc::clone(provider),
                }),
            );
        }
        Ok(Self {
            models,
            roles: cfg.roles.clone(),
        })
    }

    /// Whether `role` is configured.
    pub fn has_role(&self, role: &str) -> bool {
        self.roles.contains_key(role)
    }

    /// The configured role names.
    pub fn role_names(&self) -> Vec<String> {
        self.roles.keys().cloned().collect()
    }

    /// The first model of a role's chain (context window and compaction).
    pub fn primary(&self, role: &str) -> Option<&ModelConfig> {
        let key = self.roles.get(role)?.first()?;
        self.models.get(key).map(|m| &m.cfg)
    }

    /// Runs the request through the role's chain: each model is retried with
    /// exponential backoff and full jitter (or the server's `Retry-After`),
    /// then the chain moves on. Cancellation aborts at once.
    pub async fn complete(
        &self,
        role: &str,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        cancel: &CancellationToken,
    ) -> Result<Answer, ChainError> {
        let chain = self
            .roles
            .get(role)
            .ok_or_else(|| ChainError::UnknownRole(role.to_string()))?;
        let mut tried: Vec<String> = Vec::new();
        let mut last: Option<ModelError> = None;
        for key in chain {
            let Some(slot) = self.models.get(key) else {
                continue;
            };
            match self.try_model(slot, messages, tools, cancel).await {
                Ok(reply) => {
                    let cost = cost_usd(&slot.cfg, reply.usage);
                    return Ok(Answer {
                        reply,
                        model: slot.key.clone(),
                        cost_usd: cost,
                    });
                }
                Err(ModelError::Cancelled) => return Err(ChainError::Cancelled),
                Err(e) if !e.is_retryable() => {
                    return Err(ChainError::Fatal {
                        model: slot.key.clone(),
                        error: e,
                    })
                }
                Err(e) => {
                    tracing::warn!(model = %slot.key, provider = %slot.provider.name, error = %e,
                        "model failed after retries; trying the next in the chain");
                    tried.push(format!("{} ({e})", slot.key));
                    last = Some(e);
                }
            }
        }
        Err(ChainError::AllFailed {
            role: role.to_string(),
            tried: tried.join(", "),
            last: last.unwrap_or(ModelError::Connect("no model configured".into())),
        })
    }

    async fn try_model(
        &self,
        slot: &ModelSlot,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        cancel: &CancellationToken,
    ) -> Result<ModelReply, ModelError> {
        let p = &slot.provider;
        let req = ChatRequest {
            model: &slot.cfg.model,
            messages,
            tools,
        };
        let timeout = Duration::from_secs_f64(p.cfg.timeout_s);
        let mut attempt: u32 = 0;
        loop {
            let result = {
                let _permit = tokio::select! {
                    _ = cancel.cancelled() => return Err(ModelError::Cancelled),
                    p = Arc::clone(&p.permits).acquire_owned() =>
                        p.map_err(|_| ModelError::Connect("provider closed".into()))?,
                };
                tokio::select! {
                    _ = cancel.cancelled() => return Err(ModelError::Cancelled),
                    r = tokio::time::timeout(timeout, p.transport.complete(req)) =>
                        r.unwrap_or(Err(ModelError::Timeout(p.cfg.timeout_s))),
                }
            };
            match result {
                Ok(mut reply) => {
                    if reply.usage == Usage::default() {
                        reply.usage = estimate_usage(messages, &reply);
                    }
                    return Ok(reply);
                }
                Err(e) if e.is_retryable() && attempt < p.cfg.max_retries => {
                    let wait = match &e {
                        ModelError::Status {
                            retry_after: Some(d),
                            ..
                        } => *d,
                        _ => backoff(p.cfg.retry_base_ms, attempt),
                    };
                    tracing::debug!(model = %slot.key, attempt, error = %e, wait_ms = wait.as_millis() as u64,
                        "model request failed; retrying");
                    attempt += 1;
                    tokio::select! {
                        _ = cancel.cancelled() => return Err(ModelError::Cancelled),
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Exponential backoff with full jitter: uniform in [base·2^n / 2, base·2^n],
/// capped at 30 s.
pub fn backoff(base_ms: u64, attempt: u32) -> Duration {
    let cap = base_ms
        .saturating_mul(1u64 << attempt.min(16))
        .clamp(1, 30_000);
    let ms = rand::thread_rng().gen_range(cap / 2..=cap);
    Duration::from_millis(ms)
}

/// Price of one call.
pub fn cost_usd(m: &ModelConfig, u: Usage) -> f64 {
    (u.tokens_in as f64 * m.price_in_per_mtok + u.tokens_out as f64 * m.price_out_per_mtok) / 1e6
}

/// Usage estimated as chars / 4 when the server sends none.
pub fn estimate_usage(messages: &[ChatMessage], reply: &ModelReply) -> Usage {
    let out = ChatMessage {
        role: crate::types::MsgRole::Assistant,
        content: reply.content.clone(),
        tool_calls: reply.tool_calls.clone(),
        tool_call_id: None,
    };
    Usage {
        tokens_in: types::estimate_tokens(messages) as i64,
        tokens_out: out.estimated_tokens() as i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_errors_are_the_documented_ones() {
        let s = |status| ModelError::Status {
            status,
            retry_after: None,
            body: String::new(),
        };
        assert!(s(500).is_retryable());
        assert!(s(503).is_retryable());
        assert!(s(429).is_retryable());
        assert!(!s(400).is_retryable());
        assert!(!s(401).is_retryable());
        assert!(ModelError::Timeout(1.0).is_retryable());
        assert!(ModelError::Connect("x".into()).is_retryable());
        assert!(!ModelError::Cancelled.is_retryable());
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        for attempt in 0..20 {
            let d = backoff(100, attempt).as_millis() as u64;
            let cap = (100u64 << attempt.min(16)).min(30_000);
            assert!(d >= cap / 2 && d <= cap, "attempt {attempt}: {d}");
        }
    }

    #[test]
    fn cost_uses_both_prices() {
        let m = ModelConfig {
            price_in_per_mtok: 2.0,
            price_out_per_mtok: 10.0,
            ..ModelConfig::default()
        };
        let c = cost_usd(
            &m,
            Usage {
                tokens_in: 1_000_000,
                tokens_out: 100_000,
            },
        );
        assert!((c - 3.0).abs() < 1e-9);
    }
}
