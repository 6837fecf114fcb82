//! The scripted mock model (SPEC §11). Its answer is decided from the
//! request alone: the script is the JSON array after `#mock ` in the first
//! user message that has one, and the step index is the number of assistant
//! messages in the request. Only the `fail` counters are remembered, per
//! conversation. The same brain serves `kind = "mock"` in-process and
//! `agentq mock-llm` over HTTP.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::openai::synth_call_id;
use super::types::{ChatMessage, ChatRequest, FinishReason, ModelReply, ToolCall, Usage};
use super::{ModelError, Provider};
use crate::types::MsgRole;

/// How the mock fails a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MockFailure {
    /// Answer with this HTTP status (429 carries `Retry-After: 1`).
    Status(u16),
    /// Never answer.
    Timeout,
}

/// What the mock does with one request.
#[derive(Debug, Clone)]
pub struct MockPlan {
    pub delay: Duration,
    pub outcome: Result<ModelReply, MockFailure>,
}

/// The script interpreter with its per-conversation failure counters and a
/// cache of parsed scripts (parsing the script on every request would make
/// the mock, not the runtime, the cost that benchmarks measure).
#[derive(Default)]
pub struct MockBrain {
    fails: Mutex<HashMap<u64, u64>>,
    scripts: Mutex<HashMap<u64, Arc<Vec<Value>>>>,
}

/// Parsed scripts kept at most (the cache is cleared when it grows past it).
const SCRIPT_CACHE: usize = 100_000;

/// The `#mock` script of a conversation, if any.
pub fn find_script(messages: &[ChatMessage]) -> Option<Vec<Value>> {
    for m in messages.iter().filter(|m| m.role == MsgRole::User) {
        let Some(pos) = m
            .content
            .match_indices("#mock ")
            .map(|(i, _)| i)
            .find(|&i| i == 0 || m.content.as_bytes()[i - 1] == b'\n')
        else {
            continue;
        };
        let rest = &m.content[pos + "#mock ".len()..];
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        if let Some(Ok(Value::Array(steps))) = stream.next() {
            return Some(steps);
        }
    }
    None
}

/// A conversation is identified by its system prompt and first user
/// message (where the script lives); the counter is per step.
fn conversation_key(messages: &[ChatMessage], step: usize) -> u64 {
    let mut h = DefaultHasher::new();
    step.hash(&mut h);
    for role in [MsgRole::System, MsgRole::User] {
        if let Some(m) = messages.iter().find(|m| m.role == role) {
            m.content.hash(&mut h);
        }
    }
    h.finish()
}

fn default_reply(messages: &[ChatMessage]) -> String {
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m.role == MsgRole::User)
        .map(|m| m.content.as_str())
        .unwrap_or("");
    if last_user.starts_with("HEARTBEAT") {
        "HEARTBEAT_OK".to_string()
    } else {
        format!("ok: {}", last_user.chars().take(200).collect::<String>())
    }
}

/// Agent ids announced in the request's tool results (`ID: <uuid>`), in
/// order: what `"$spawned_ids"` in a scripted call's arguments becomes.
fn spawned_ids(messages: &[ChatMessage]) -> Vec<Value> {
    let mut ids = Vec::new();
    for m in messages.iter().filter(|m| m.role == MsgRole::Tool) {
        let mut rest = m.content.as_str();
        while let Some(pos) = rest.find("ID: ") {
            let cand = rest[pos + 4..].chars().take(36).collect::<String>();
            if uuid::Uuid::parse_str(&cand).is_ok() {
                ids.push(Value::String(cand));
            }
            rest = &rest[pos + 4..];
        }
    }
    ids
}

/// Replaces `"$spawned_ids"` string values (at any depth) by the ids.
fn substitute(v: &Value, messages: &[ChatMessage]) -> Value {
    match v {
        Value::String(s) if s == "$spawned_ids" => Value::Array(spawned_ids(messages)),
        Value::Array(a) => Value::Array(a.iter().map(|x| substitute(x, messages)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), substitute(x, messages)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn text_reply(content: String) -> ModelReply {
    ModelReply {
        content,
        tool_calls: Vec::new(),
        usage: Usage::default(),
        finish_reason: FinishReason::Stop,
    }
}

impl MockBrain {
    pub fn new() -> Self {
        Self::default()
    }

    /// The conversation's script, parsed once per distinct first user message.
    fn script(&self, messages: &[ChatMessage]) -> Arc<Vec<Value>> {
        let Some(first) = messages.iter().find(|m| m.role == MsgRole::User) else {
            return Arc::new(Vec::new());
        };
        let mut h = DefaultHasher::new();
        first.content.hash(&mut h);
        let key = h.finish();
        if let Some(s) = self
            .scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Arc::clone(s);
        }
        let parsed = Arc::new(find_script(messages).unwrap_or_default());
        let mut cache = self.scripts.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= SCRIPT_CACHE {
            cache.clear();
        }
        cache.insert(key, Arc::clone(&parsed));
        parsed
    }

    /// Decides the answer to one request.
    pub fn plan(&self, model: &str, messages: &[ChatMessage]) -> MockPlan {
        let script = self.script(messages);
        let mut index = messages
            .iter()
            .filter(|m| m.role == MsgRole::Assistant)
            .count();
        // A step restricted to another model answers as the next step would.
        while let Some(step) = script.get(index) {
            match step.get("only_model").and_then(Value::as_str) {
                Some(only) if only != model => index += 1,
                _ => break,
            }
        }
        let Some(step) = script.get(index) else {
            return MockPlan {
                delay: Duration::ZERO,
                outcome: Ok(with_usage(
                    text_reply(default_reply(messages)),
                    None,
                    messages,
                )),
            };
        };
        let delay =
            Duration::from_millis(step.get("delay_ms").and_then(Value::as_u64).unwrap_or(0));
        if let Some(fail) = step.get("fail") {
            let times = step.get("times").and_then(Value::as_u64).unwrap_or(1);
            let key = conversation_key(messages, index);
            let failing = {
                let mut fails = self.fails.lock().unwrap_or_else(|p| p.into_inner());
                let n = fails.entry(key).or_insert(0);
                if *n < times {
                    *n += 1;
                    true
                } else {
                    false
                }
            };
            if failing {
                let how = match fail {
                    Value::String(s) if s == "timeout" => MockFailure::Timeout,
                    Value::Number(n) => MockFailure::Status(n.as_u64().unwrap_or(500) as u16),
                    _ => MockFailure::Status(500),
                };
                return MockPlan {
                    delay,
                    outcome: Err(how),
                };
            }
            let then = step.get("then").cloned().unwrap_or(Value::Null);
            let extra =
                Duration::from_millis(then.get("delay_ms").and_then(Value::as_u64).unwrap_or(0));
            return MockPlan {
                delay: delay + extra,
                outcome: Ok(self.answer_step(&then, messages)),
            };
        }
        MockPlan {
            delay,
            outcome: Ok(self.answer_step(step, messages)),
        }
    }

    fn answer_step(&self, step: &Value, messages: &[ChatMessage]) -> ModelReply {
        let usage = step.get("usage");
        let reply = if let Some(text) = step.get("say") {
            text_reply(match text {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
        } else if let Some(calls) = step.get("call").and_then(Value::as_array) {
            let tool_calls = calls
                .iter()
                .map(|c| ToolCall {
                    id: synth_call_id(),
                    name: c
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    arguments: substitute(
                        c.get("args").unwrap_or(&Value::Object(Default::default())),
                        messages,
                    )
                    .to_string(),
                })
                .collect();
            ModelReply {
                content: step
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                tool_calls,
                usage: Usage::default(),
                finish_reason: FinishReason::ToolCalls,
            }
        } else if let Some(tool) = step.get("bad_args").and_then(Value::as_str) {
            ModelReply {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: synth_call_id(),
                    name: tool.to_string(),
                    arguments: "{\"unterminated\": ".to_string(),
                }],
                usage: Usage::default(),
                finish_reason: FinishReason::ToolCalls,
            }
        } else {
            text_reply(default_reply(messages))
        };
        with_usage(reply, usage, messages)
    }
}

fn with_usage(
    mut reply: ModelReply,
    usage: Option<&Value>,
    messages: &[ChatMessage],
) -> ModelReply {
    reply.usage = match usage {
        Some(u) => Usage {
            tokens_in: u
                .get("prompt_tokens")
                .or_else(|| u.get("tokens_in"))
                .and_then(Value::as_i64)
                .unwrap_or(0),
            tokens_out: u
                .get("completion_tokens")
                .or_else(|| u.get("tokens_out"))
                .and_then(Value::as_i64)
                .unwrap_or(0),
        },
        None => super::estimate_usage(messages, &reply),
    };
    reply
}

/// `kind = "mock"`: the brain in-process.
#[derive(Default)]
pub struct MockProvider {
    brain: MockBrain,
}

impl MockProvider {
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait::async_trait]
impl Provider for MockProvider {
    async fn complete(&self, req: ChatRequest<'_>) -> Result<ModelReply, ModelError> {
        let plan = self.brain.plan(req.model, req.messages);
        if !plan.delay.is_zero() {
            tokio::time::sleep(plan.delay).await;
        }
        match plan.outcome {
            Ok(reply) => Ok(reply),
            Err(MockFailure::Timeout) => std::future::pending().await,
            Err(MockFailure::Status(status)) => Err(ModelError::Status {
                status,
                retry_after: (status == 429).then(|| Duration::from_secs(1)),
                body: format!("mock failure {status}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(task: &str, assistants: usize) -> Vec<ChatMessage> {
        let mut v = vec![ChatMessage::system("sys"), ChatMessage::user(task)];
        for _ in 0..assistants {
            v.push(ChatMessage::plain(MsgRole::Assistant, "a"));
        }
        v
    }

    #[test]
    fn no_script_echoes_the_last_user_message() {
        let b = MockBrain::new();
        let r = b.plan("m", &conv("hello", 0)).outcome.unwrap();
        assert_eq!(r.content, "ok: hello");
        let r = b.plan("m", &conv("HEARTBEAT: check", 0)).outcome.unwrap();
        assert_eq!(r.content, "HEARTBEAT_OK");
    }

    #[test]
    fn steps_follow_the_assistant_count() {
        let task = "do it\n#mock [{\"call\":[{\"name\":\"echo\",\"args\":{\"text\":\"x\"}}]},{\"say\":\"fin\"}]";
        let b = MockBrain::new();
        let r0 = b.plan("m", &conv(task, 0)).outcome.unwrap();
        assert_eq!(r0.tool_calls.len(), 1);
        assert_eq!(r0.tool_calls[0].name, "echo");
        assert_eq!(r0.tool_calls[0].arguments, r#"{"text":"x"}"#);
        let r1 = b.plan("m", &conv(task, 1)).outcome.unwrap();
        assert_eq!(r1.content, "fin");
        let r2 = b.plan("m", &conv(task, 2)).outcome.unwrap();
        assert!(r2.content.starts_with("ok: do it"), "{}", r2.content);
    }

    #[test]
    fn fail_counts_per_conversation_then_answers() {
        let task = "#mock [{\"fail\":500,\"times\":2,\"then\":{\"say\":\"up\"}}]";
        let b = MockBrain::new();
        let c = conv(task, 0);
        assert_eq!(
            b.plan("m", &c).outcome.unwrap_err(),
            MockFailure::Status(500)
        );
        assert_eq!(
            b.plan("m", &c).outcome.unwrap_err(),
            MockFailure::Status(500)
        );
        assert_eq!(b.plan("m", &c).outcome.unwrap().content, "up");
        // Another conversation has its own counter.
        let other = conv(&format!("x\n{task}"), 0);
        assert!(b.plan("m", &other).outcome.is_err());
    }

    #[test]
    fn only_model_skips_to_the_next_step_for_other_models() {
        let task = "#mock [{\"fail\":500,\"times\":99,\"only_model\":\"a\"},{\"say\":\"from b\"}]";
        let b = MockBrain::new();
        assert!(b.plan("a", &conv(task, 0)).outcome.is_err());
        assert_eq!(
            b.plan("b", &conv(task, 0)).outcome.unwrap().content,
            "from b"
        );
    }

    #[test]
    fn bad_args_are_not_json() {
        let b = MockBrain::new();
        let r = b
            .plan("m", &conv("#mock [{\"bad_args\":\"echo\"}]", 0))
            .outcome
            .unwrap();
        assert!(serde_json::from_str::<Value>(&r.tool_calls[0].arguments).is_err());
    }

    #[test]
    fn usage_is_taken_from_the_step() {
        let b = MockBrain::new();
        let r = b
            .plan(
                "m",
                &conv("#mock [{\"say\":\"x\",\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}]", 0),
            )
            .outcome
            .unwrap();
        assert_eq!(
            r.usage,
            Usage {
                tokens_in: 7,
                tokens_out: 3
            }
        );
    }

    #[test]
    fn spawned_ids_are_substituted() {
        let mut c = conv("#mock [{\"call\":[{\"name\":\"x\"}]},{\"call\":[{\"name\":\"wait_for_agent\",\"args\":{\"ids\":\"$spawned_ids\"}}]}]", 1);
        c.push(ChatMessage {
            role: MsgRole::Tool,
            content: "Sub-agent spawned in background. ID: 3f2a0000-0000-4000-8000-000000000001 (handle 3f2a).".into(),
            tool_calls: vec![],
            tool_call_id: Some("c".into()),
        });
        let r = MockBrain::new().plan("m", &c).outcome.unwrap();
        assert_eq!(
            r.tool_calls[0].arguments,
            r#"{"ids":["3f2a0000-0000-4000-8000-000000000001"]}"#
        );
    }

    #[test]
    fn multi_line_script_is_read() {
        let task = "task\n#mock [\n {\"say\": \"a\"}\n]\n";
        assert_eq!(find_script(&conv(task, 0)).unwrap().len(), 1);
    }
}
