//! The tool loop end to end: conversations, usage, limits, cancellation,
//! concurrency 1.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{scripted, Env};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_echoes_then_say_gives_exactly_that_conversation() {
    let env = Env::new().await;
    let h = env.start("").await;
    let steps = json!([
        {"call": [{"name": "echo", "args": {"text": "one"}}]},
        {"call": [{"name": "echo", "args": {"text": "two"}}]},
        {"call": [{"name": "echo", "args": {"text": "three"}}]},
        {"call": [{"name": "echo", "args": {"text": "four"}}]},
        {"say": "all four echoed"}
    ]);
    let a = h.submit_task(&scripted("echo four times", steps)).await;
    let id = a["id"].as_str().unwrap();
    let done = h.wait(id).await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["result"], "all four echoed");
    assert_eq!(done["usage"]["turns"], 5);
    assert!(done["usage"]["tokens_in"].as_i64().unwrap() > 0);
    assert!(done["usage"]["tokens_out"].as_i64().unwrap() > 0);
    assert!(done["usage"]["cost_usd"].as_f64().unwrap() > 0.0);
    assert!(done["finished_at"].is_string());

    let msgs = h.messages(id).await;
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
    assert_eq!(msgs[1]["origin"], "human");
    for (i, word) in ["one", "two", "three", "four"].iter().enumerate() {
        let call = &msgs[2 + 2 * i]["tool_calls"][0];
        let result = &msgs[3 + 2 * i];
        assert_eq!(call["name"], "echo");
        assert_eq!(
            result["tool_call_id"], call["id"],
            "tool-call ids must match"
        );
        assert_eq!(result["content"], *word);
        assert_eq!(result["is_error"], false);
        assert!(msgs[2 + 2 * i]["usage"]["tokens_in"].as_i64().unwrap() > 0);
    }
    assert_eq!(msgs[10]["content"], "all four echoed");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_calls_become_errors_the_model_can_act_on() {
    let env = Env::new().await;
    let h = env.start("").await;
    let steps = json!([
        {"call": [{"name": "no_such_tool", "args": {}}]},
        {"bad_args": "echo"},
        {"call": [{"name": "echo", "args": {"txt": "wrong field"}}]},
        {"say": "recovered"}
    ]);
    let a = h.submit_task(&scripted("bad calls", steps)).await;
    let id = a["id"].as_str().unwrap();
    let done = h.wait(id).await;
    assert_eq!(done["status"], "done", "{done}");
    let tools: Vec<Value> = h
        .messages(id)
        .await
        .into_iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tools.len(), 3);
    let unknown = tools[0]["content"].as_str().unwrap();
    assert!(unknown.contains("unknown tool `no_such_tool`"), "{unknown}");
    assert!(unknown.contains("echo"), "names the valid tools: {unknown}");
    assert!(tools[1]["content"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));
    assert!(
        tools[2]["content"].as_str().unwrap().contains("`text`"),
        "{}",
        tools[2]["content"]
    );
    assert!(tools.iter().all(|t| t["is_error"] == true));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_stops_the_turn_with_the_limit_named() {
    let env = Env::new().await;
    let h = env.start("").await;
    let echo = json!({"call": [{"name": "echo", "args": {"text": "x"}}]});
    let steps = json!([echo, echo, echo, echo, {"say": "never"}]);
    let a = h
        .submit(json!({"task": scripted("limited", steps), "max_turns": 2}))
        .await;
    let done = h.wait(a["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed");
    assert_eq!(done["stop_reason"], "turn_limit");
    assert!(
        done["error"].as_str().unwrap().contains("max_turns = 2"),
        "{done}"
    );
    assert_eq!(done["usage"]["turns"], 2);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_cost_stops_the_agent() {
    let env = Env::new().await;
    let h = env.start("").await;
    // Each call costs (1000·1 + 1000·2)/1e6 = $0.003.
    let step = json!({"call": [{"name": "echo", "args": {"text": "x"}}],
                      "usage": {"prompt_tokens": 1000, "completion_tokens": 1000}});
    let steps = json!([step, step, step, step, {"say": "never"}]);
    let a = h
        .submit(json!({"task": scripted("costly", steps), "max_cost_usd": 0.005}))
        .await;
    let done = h.wait(a["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["stop_reason"], "cost_limit");
    assert!(
        done["error"].as_str().unwrap().contains("cost limit"),
        "{done}"
    );
    assert_eq!(
        done["usage"]["turns"], 2,
        "stops once $0.006 ≥ $0.005 is spent"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_times_the_agent_out() {
    let env = Env::new().await;
    let h = env.start("").await;
    let steps = json!([{"call": [{"name": "sleep", "args": {"ms": 30000}}]}, {"say": "never"}]);
    let a = h
        .submit(json!({"task": scripted("slow", steps), "timeout_s": 0.5}))
        .await;
    let done = h.wait(a["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "timed_out", "{done}");
    assert_eq!(done["stop_reason"], "deadline");
    assert!(
        done["error"].as_str().unwrap().contains("deadline"),
        "{done}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_aborts_an_in_flight_model_call() {
    let env = Env::new().await;
    let h = env.start("[providers.mock]\ntimeout_s = 30.0\n").await;
    let steps = json!([{"say": "too late", "delay_ms": 10000}]);
    let a = h.submit_task(&scripted("slow model", steps)).await;
    let id = a["id"].as_str().unwrap().to_string();
    // The request is in flight once the mock has logged it.
    for _ in 0..2000 {
        if !env.mock_log().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(env.mock_log().len(), 1);
    let start = Instant::now();
    let (s, v) = h.post(&format!("/v1/agents/{id}/cancel"), json!({})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["status"], "cancelled");
    let done = h.wait(&id).await;
    // The model would answer after 10 s; the turn must not wait for it.
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "cancel waited for the model"
    );
    assert_eq!(done["status"], "cancelled");
    assert_eq!(
        done["usage"]["turns"], 0,
        "the aborted answer is never recorded"
    );
    // A cancelled agent accepts no more messages.
    let (s, _) = h
        .post(
            &format!("/v1/agents/{id}/messages"),
            json!({"content": "hello?"}),
        )
        .await;
    assert_eq!(s, 409);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_finishes_fifty_agents_one_turn_at_a_time() {
    let env = Env::new().await;
    let h = env.start("[workers]\nconcurrency = 1\n").await;
    let steps = json!([
        {"call": [{"name": "echo", "args": {"text": "a"}}]},
        {"call": [{"name": "echo", "args": {"text": "b"}}]},
        {"say": "fin"}
    ]);
    let mut ids = Vec::new();
    for i in 0..50 {
        let a = h
            .submit_task(&scripted(&format!("agent {i}"), steps.clone()))
            .await;
        ids.push(a["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        let done = h.wait(id).await;
        assert_eq!(done["status"], "done", "{done}");
        assert_eq!(done["usage"]["turns"], 3);
    }
    // With one slot, requests to the model never overlap: each request's
    // agent is the same as the previous one's until that agent finished.
    // Check the stronger property directly: per agent, the journal never has
    // two turn_started without an agent_finished in between.
    let core = h.core().clone();
    for id in &ids {
        let evs = agentq::db::events::for_agent(core.db.reader(), id, None)
            .await
            .unwrap();
        let mut open = 0;
        for e in evs {
            match e.kind.as_str() {
                "turn_started" => {
                    open += 1;
                    assert_eq!(open, 1, "two turns of {id} at once");
                }
                "agent_finished" => open -= 1,
                _ => {}
            }
        }
    }
    let mut per_agent: HashMap<String, usize> = HashMap::new();
    for line in env.mock_log() {
        let task = line["messages"][1]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        *per_agent.entry(task).or_default() += 1;
    }
    assert_eq!(per_agent.len(), 50);
    assert!(per_agent.values().all(|n| *n == 3));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_restarts_the_model_call_with_the_new_message() {
    let env = Env::new().await;
    let h = env.start("[providers.mock]\ntimeout_s = 30.0\n").await;
    let steps = json!([{"say": "answered", "delay_ms": 1500}]);
    let a = h.submit_task(&scripted("interrupt me", steps)).await;
    let id = a["id"].as_str().unwrap().to_string();
    for _ in 0..2000 {
        if !env.mock_log().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (s, v) = h
        .post(
            &format!("/v1/agents/{id}/messages"),
            json!({"content": "also this", "mode": "interrupt"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["delivery"], "queued");
    let done = h.wait(&id).await;
    assert_eq!(done["status"], "done", "{done}");
    let log = env.mock_log();
    assert_eq!(
        log.len(),
        2,
        "the in-flight request was abandoned and asked again"
    );
    let second: Vec<&str> = log[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(second.last(), Some(&"also this"));
    let roles: Vec<String> = h
        .messages(&id)
        .await
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(roles, ["system", "user", "user", "assistant"]);
    assert_eq!(
        done["usage"]["turns"], 1,
        "only the answer that was recorded counts"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pruner_removes_old_jobs_and_finished_subagents_only() {
    let env = Env::new().await;
    let h = env.start("[agents]\nretention_h = 0.0\n").await;
    let a = h.submit_task("prune me").await;
    let id = a["id"].as_str().unwrap().to_string();
    h.wait(&id).await;
    let core = h.core().clone();
    let before = agentq::db::jobs::count_by_state(core.db.reader())
        .await
        .unwrap();
    assert!(
        before.iter().any(|(s, n)| s == "completed" && *n == 1),
        "{before:?}"
    );
    // Retention 0: everything finished before now is old.
    let stop = tokio_util::sync::CancellationToken::new();
    let n = agentq::services::prune_once(&core, &stop).await.unwrap();
    assert_eq!(n, 1, "the completed job goes");
    let after = agentq::db::jobs::count_by_state(core.db.reader())
        .await
        .unwrap();
    assert!(after.is_empty(), "{after:?}");
    // The level-1 agent stays.
    let (s, v) = h.get(&format!("/v1/agents/{id}")).await;
    assert_eq!(s, 200);
    assert_eq!(v["status"], "done");
    h.shutdown().await;
}
