//! `agentq mock-llm`: the mock brain behind an OpenAI-compatible HTTP
//! endpoint, with an optional JSON-lines request log that tests read to see
//! what each agent was offered and sent.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::mock::{MockBrain, MockFailure};
use super::openai::{parse_wire_messages, response_body};

struct MockState {
    brain: MockBrain,
    log: Option<Mutex<std::fs::File>>,
}

/// A running mock server.
pub struct MockServer {
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl MockServer {
    /// The base URL for `[providers.X] base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

/// Binds `addr` (port 0 for an ephemeral port) and serves in the background.
pub async fn spawn(addr: SocketAddr, log: Option<PathBuf>) -> std::io::Result<MockServer> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let router = router(log)?;
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await;
    });
    Ok(MockServer {
        addr,
        shutdown,
        task,
    })
}

/// The mock's routes (`/v1/chat/completions` and `/chat/completions`).
pub fn router(log: Option<PathBuf>) -> std::io::Result<Router> {
    let log = match log {
        Some(p) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        )),
        None => None,
    };
    let state = Arc::new(MockState {
        brain: MockBrain::new(),
        log,
    });
    Ok(Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .with_state(state))
}

fn error(status: StatusCode, message: String) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": "mock_error"}})),
    )
        .into_response()
}

async fn chat(State(st): State<Arc<MockState>>, body: axum::body::Bytes) -> Response {
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")),
    };
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let raw_messages = req.get("messages").cloned().unwrap_or(Value::Null);
    let messages = match parse_wire_messages(&raw_messages) {
        Ok(m) => m,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if let Some(log) = &st.log {
        let tools: Vec<Value> = req
            .get("tools")
            .and_then(Value::as_array)
            .map(|t| {
                t.iter()
                    .filter_map(|x| x.pointer("/function/name").cloned())
                    .collect()
            })
            .unwrap_or_default();
        let line = json!({
            "at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "model": model,
            "messages": raw_messages,
            "tools": tools,
        });
        let mut text = line.to_string();
        text.push('\n');
        use std::io::Write;
        let mut f = log.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_all(text.as_bytes());
    }
    let plan = st.brain.plan(&model, &messages);
    if !plan.delay.is_zero() {
        tokio::time::sleep(plan.delay).await;
    }
    match plan.outcome {
        Ok(reply) => Json(response_body(&model, &reply)).into_response(),
        Err(MockFailure::Timeout) => {
            // Hold the request until the client gives up and disconnects.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            error(StatusCode::GATEWAY_TIMEOUT, "mock timeout".into())
        }
        Err(MockFailure::Status(code)) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut resp = error(status, format!("mock failure {code}"));
            if code == 429 {
                let mut h = HeaderMap::new();
                h.insert("retry-after", HeaderValue::from_static("1"));
                resp.headers_mut().extend(h);
            }
            resp
        }
    }
}
