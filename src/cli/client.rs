//! The HTTP client behind the CLI's client commands.

use std::time::Duration;

use serde_json::Value;

/// A failed client call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach agentq at {url}: {reason}")]
    Connection { url: String, reason: String },
    #[error("HTTP {status}: {message}")]
    Api { status: u16, message: String },
}

/// Talks to one agentq server.
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    pub fn new(base: &str, token: Option<String>) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3700))
                .build()
                .unwrap_or_default(),
            base: base.trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
        }
    }

    async fn send(&self, rb: reqwest::RequestBuilder) -> Result<Value, ClientError> {
        let rb = match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        };
        let resp = rb.send().await.map_err(|e| ClientError::Connection {
            url: self.base.clone(),
            reason: e.to_string(),
        })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| ClientError::Connection {
            url: self.base.clone(),
            reason: e.to_string(),
        })?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            Ok(body)
        } else {
            let message = body
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| body.to_string());
            Err(ClientError::Api {
                status: status.as_u16(),
                message,
            })
        }
    }

    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    pub async fn delete(&self, path: &str) -> Result<Value, ClientError> {
        self.send(self.http.delete(format!("{}{path}", self.base)))
            .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }
}
