//! The OpenAI chat-completions protocol: the reqwest client and the wire
//! (de)serialisation shared with the mock server. Requests are shaped for the
//! strictest common servers: `tool_choice: "auto"` whenever tools are sent,
//! and `content: ""` (never null) on assistant messages with tool calls.

use std::time::Duration;

use serde_json::{json, Value};

use super::types::{ChatMessage, ChatRequest, FinishReason, ModelReply, ToolCall, ToolSpec, Usage};
use super::{ModelError, Provider};
use crate::types::MsgRole;

/// A provider speaking the OpenAI protocol (OpenAI, vLLM, Ollama, llama.cpp …).
pub struct OpenAiProvider {
    http: reqwest::Client,
    url: String,
    api_key: Option<String>,
}

impl OpenAiProvider {
    pub fn new(http: reqwest::Client, base_url: &str, api_key: Option<String>) -> Self {
        Self {
            http,
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            api_key,
        }
    }
}

#[async_trait::async_trait]
impl Provider for OpenAiProvider {
    async fn complete(&self, req: ChatRequest<'_>) -> Result<ModelReply, ModelError> {
        let body = request_body(&req);
        let mut rb = self.http.post(&self.url).json(&body);
        if let Some(k) = &self.api_key {
            rb = rb.bearer_auth(k);
        }
        let resp = rb.send().await.map_err(transport_error)?;
        let status = resp.status();
        if !status.is_success() {
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_retry_after);
            let text = resp.text().await.unwrap_or_default();
            return Err(ModelError::Status {
                status: status.as_u16(),
                retry_after,
                body: truncate(&text, 300),
            });
        }
        let bytes = resp.bytes().await.map_err(transport_error)?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ModelError::Protocol(format!("response is not JSON: {e}")))?;
        parse_response(&v)
    }
}

fn transport_error(e: reqwest::Error) -> ModelError {
    if e.is_timeout() {
        ModelError::Timeout(0.0)
    } else {
        ModelError::Connect(e.to_string())
    }
}

/// `Retry-After` as delta-seconds (HTTP dates are treated as "soon").
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(s) = v.parse::<f64>() {
        if s.is_finite() && s >= 0.0 {
            return Some(Duration::from_secs_f64(s.min(300.0)));
        }
    }
    chrono::DateTime::parse_from_rfc2822(v).ok().map(|t| {
        let ms = (t.timestamp_millis() - chrono::Utc::now().timestamp_millis()).clamp(0, 300_000);
        Duration::from_millis(ms as u64)
    })
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Messages in wire form.
pub fn wire_messages(messages: &[ChatMessage]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| match m.role {
            MsgRole::Assistant if !m.tool_calls.is_empty() => json!({
                "role": "assistant",
                "content": m.content,
                "tool_calls": m.tool_calls.iter().map(|c| json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })).collect::<Vec<_>>(),
            }),
            MsgRole::Tool => json!({
                "role": "tool",
                "tool_call_id": m.tool_call_id.clone().unwrap_or_default(),
                "content": m.content,
            }),
            role => json!({"role": role.as_str(), "content": m.content}),
        })
        .collect()
}

/// Tools in wire form.
pub fn wire_tools(tools: &[ToolSpec]) -> Vec<Value> {
    tools
        .iter()
        .map(|t| {
            json!({
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            })
        })
        .collect()
}

/// The whole request body.
pub fn request_body(req: &ChatRequest<'_>) -> Value {
    let mut body = json!({
        "model": req.model,
        "messages": wire_messages(req.messages),
    });
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(wire_tools(req.tools));
        body["tool_choice"] = json!("auto");
    }
    body
}

/// Reads a chat-completions response, smoothing over server quirks: missing
/// tool-call ids are synthesised, object arguments are re-serialised, null
/// content is empty.
pub fn parse_response(v: &Value) -> Result<ModelReply, ModelError> {
    let choice = v
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or_else(|| ModelError::Protocol("no choices in the response".into()))?;
    let msg = choice
        .get("message")
        .ok_or_else(|| ModelError::Protocol("choice has no message".into()))?;
    let content = msg
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut tool_calls = Vec::new();
    if let Some(calls) = msg.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            let f = c.get("function").unwrap_or(&Value::Null);
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => "{}".to_string(),
                Some(other) => other.to_string(),
            };
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .unwrap_or_else(synth_call_id);
            tool_calls.push(ToolCall {
                id,
                name,
                arguments,
            });
        }
    }
    let finish_reason = match choice.get("finish_reason").and_then(Value::as_str) {
        Some("stop") => FinishReason::Stop,
        Some("tool_calls") | Some("function_call") => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        _ => FinishReason::Other,
    };
    let usage = v
        .get("usage")
        .map(|u| Usage {
            tokens_in: u.get("prompt_tokens").and_then(Value::as_i64).unwrap_or(0),
            tokens_out: u
                .get("completion_tokens")
                .and_then(Value::as_i64)
                .unwrap_or(0),
        })
        .unwrap_or_default();
    Ok(ModelReply {
        content,
        tool_calls,
        usage,
        finish_reason,
    })
}

/// A fresh tool-call id for servers that send none.
pub fn synth_call_id() -> String {
    format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24])
}

/// Reads wire messages back (the mock server's side).
pub fn parse_wire_messages(v: &Value) -> Result<Vec<ChatMessage>, String> {
    let arr = v
        .as_array()
        .ok_or_else(|| "`messages` must be an array".to_string())?;
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some("system") | Some("developer") => MsgRole::System,
            Some("user") => MsgRole::User,
            Some("assistant") => MsgRole::Assistant,
            Some("tool") => MsgRole::Tool,
            other => return Err(format!("messages[{i}].role: unsupported {other:?}")),
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        };
        let tool_calls = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| ToolCall {
                        id: c
                            .get("id")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .into(),
                        name: c
                            .pointer("/function/name")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .into(),
                        arguments: c
                            .pointer("/function/arguments")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .into(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ChatMessage {
            role,
            content,
            tool_calls,
            tool_call_id: m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .map(str::to_string),
        });
    }
    Ok(out)
}

/// A chat-completions response body (the mock server's side).
pub fn response_body(model: &str, reply: &ModelReply) -> Value {
    let mut message = json!({"role": "assistant", "content": reply.content});
    if !reply.tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(
            reply
                .tool_calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect(),
        );
    }
    let finish = if reply.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    json!({
        "id": format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        "object": "chat.completion",
        "created": chrono::Utc::now().timestamp(),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": reply.usage.tokens_in,
            "completion_tokens": reply.usage.tokens_out,
            "total_tokens": reply.usage.tokens_in + reply.usage.tokens_out,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assistant_with_tool_calls_sends_empty_content_not_null() {
        let m = ChatMessage {
            role: MsgRole::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "echo".into(),
                arguments: "{}".into(),
            }],
            tool_call_id: None,
        };
        let w = wire_messages(&[m]);
        assert_eq!(w[0]["content"], json!(""));
        assert_eq!(w[0]["tool_calls"][0]["function"]["name"], json!("echo"));
    }

    #[test]
    fn tool_choice_is_sent_with_tools() {
        let tools = vec![ToolSpec {
            name: "echo".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        }];
        let msgs = vec![ChatMessage::user("hi")];
        let b = request_body(&ChatRequest {
            model: "m",
            messages: &msgs,
            tools: &tools,
        });
        assert_eq!(b["tool_choice"], json!("auto"));
        let b = request_body(&ChatRequest {
            model: "m",
            messages: &msgs,
            tools: &[],
        });
        assert!(b.get("tool_choice").is_none());
    }

    #[test]
    fn quirks_are_smoothed() {
        let v = json!({
            "choices": [{"message": {"content": null, "tool_calls": [
                {"function": {"name": "echo", "arguments": {"text": "x"}}},
                {"id": "", "function": {"name": "sleep", "arguments": "{bad"}}
            ]}, "finish_reason": "length"}]
        });
        let r = parse_response(&v).unwrap();
        assert_eq!(r.content, "");
        assert_eq!(r.tool_calls.len(), 2);
        assert!(r.tool_calls[0].id.starts_with("call_"));
        assert!(r.tool_calls[1].id.starts_with("call_"));
        assert_eq!(r.tool_calls[0].arguments, r#"{"text":"x"}"#);
        assert_eq!(r.tool_calls[1].arguments, "{bad");
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(r.usage, Usage::default());
    }

    #[test]
    fn retry_after_seconds() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("junk"), None);
    }

    #[test]
    fn wire_round_trip() {
        let msgs = vec![
            ChatMessage::system("s"),
            ChatMessage::user("u"),
            ChatMessage {
                role: MsgRole::Assistant,
                content: "".into(),
                tool_calls: vec![ToolCall {
                    id: "a".into(),
                    name: "echo".into(),
                    arguments: "{}".into(),
                }],
                tool_call_id: None,
            },
            ChatMessage {
                role: MsgRole::Tool,
                content: "r".into(),
                tool_calls: vec![],
                tool_call_id: Some("a".into()),
            },
        ];
        let back = parse_wire_messages(&Value::Array(wire_messages(&msgs))).unwrap();
        assert_eq!(back, msgs);
    }
}
