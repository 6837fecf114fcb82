//! Handles, the one delivery path, the auto-wake budget, agent messaging,
//! todo lists, compaction and cache-friendly requests (SPEC §3, §5-§7).

use std::collections::HashMap;
use std::time::Duration;

use agentq::creation::{self, NewAgentRequest};
use agentq::delivery::{self, Delivery, Message};
use agentq::types::Origin;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::common::{scripted, Env, Harness};

const CHATTY: &str = "tools = [\"send_to_agent\", \"read_agent\", \"echo\", \"sleep\", \"todo_write\", \"todo_read\"]\n\
                      system_prompt = \"chatty\"\n[permissions]\nsend_to_agent = true\nread_agent = true\n";

async fn create_with_id(
    h: &Harness,
    user: &str,
    id: &str,
    task: &str,
    definition: Option<&str>,
) -> Value {
    let mut req = NewAgentRequest::top_level(user, task);
    req.id = Some(id.to_string());
    req.definition = definition.map(str::to_string);
    let created = creation::create(h.core(), req).await.expect("created");
    assert_eq!(created.agent.id, id);
    let (s, v) = h.get(&format!("/v1/agents/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

/// Between compactions, every request of a conversation is the previous
/// one plus messages at the end. Checked over every conversation the mock
/// saw (keyed by system prompt and first user message).
pub fn assert_prefix_extending(env: &Env) {
    let mut last: HashMap<String, Vec<Value>> = HashMap::new();
    let stubs = |m: &[Value]| {
        m.iter()
            .filter(|x| {
                x["content"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("[compacted: "))
            })
            .count()
    };
    for req in env.mock_log() {
        let msgs = req["messages"].as_array().unwrap().clone();
        let key = format!(
            "{}\u{0}{}",
            msgs[0]["content"],
            msgs.get(1)
                .map(|m| m["content"].to_string())
                .unwrap_or_default()
        );
        if let Some(prev) = last.get(&key) {
            let compacted_now = stubs(&msgs) > stubs(prev);
            if !compacted_now {
                assert!(
                    msgs.len() >= prev.len() && msgs[..prev.len()] == prev[..],
                    "request is not the previous one plus new messages:\nprevious: {prev:#?}\nnow: {msgs:#?}"
                );
            }
        }
        last.insert(key, msgs);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_are_shortest_unique_prefixes_and_resolve_safely() {
    let env = Env::new().await;
    let h = env.start("").await;
    let a = create_with_id(
        &h,
        "local",
        "abcdef1a-0000-4000-8000-000000000001",
        "a",
        None,
    )
    .await;
    assert_eq!(a["handle"], "abcd", "alone, four characters suffice");
    let b = create_with_id(
        &h,
        "local",
        "abcdef2b-0000-4000-8000-000000000002",
        "b",
        None,
    )
    .await;
    let (_, a) = h
        .get(&format!("/v1/agents/{}", a["id"].as_str().unwrap()))
        .await;
    assert_eq!(a["handle"], "abcdef1");
    assert_eq!(b["handle"], "abcdef2");

    let (s, v) = h.get("/v1/agents/abcd").await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "ambiguous_handle");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("abcdef1") && msg.contains("abcdef2"), "{msg}");
    assert!(msg.contains("one more character"), "{msg}");

    let (s, v) = h.get("/v1/agents/ABCDEF1").await;
    assert_eq!(s, StatusCode::OK, "uppercase resolves: {v}");
    assert_eq!(v["id"], a["id"]);
    for bad in ["abc%25", "abcd_", "abcd'", "ab%27--", "zzzzzz", "abc"] {
        let (s, v) = h.get(&format!("/v1/agents/{bad}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let (s, v) = h.get("/v1/agents/0123").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("abcdef1"),
        "lists open handles: {v}"
    );

    // Closing one frees its prefix: the other shrinks back to 4 characters.
    let (s, _) = h
        .post(
            &format!("/v1/agents/{}/close", b["id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = h
        .get(&format!("/v1/agents/{}", a["id"].as_str().unwrap()))
        .await;
    assert_eq!(v["handle"], "abcd");
    let (s, v) = h.get("/v1/agents/abcd").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["id"], a["id"]);
    // A closed agent is still reachable by its full UUID.
    let (s, _) = h
        .get(&format!("/v1/agents/{}", b["id"].as_str().unwrap()))
        .await;
    assert_eq!(s, StatusCode::OK);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_wake_idle_agents_and_queue_for_running_ones() {
    let env = Env::new().await;
    env.add_definition("chatty", CHATTY);
    let h = env.start("").await;
    // B: idle after its first turn.
    let b = h.submit(json!({"task": "b idle", "agent": "chatty"})).await;
    let bid = b["id"].as_str().unwrap().to_string();
    h.wait(&bid).await;
    let a = h
        .submit(
            json!({"agent": "chatty", "task": scripted("a sends", json!([
                {"call": [{"name": "send_to_agent", "args": {"agent": bid, "message": "hi B"}}]},
                {"say": "a done"}
            ]))}),
        )
        .await;
    let aid = a["id"].as_str().unwrap().to_string();
    h.wait(&aid).await;
    let a_msgs = h.messages(&aid).await;
    let delivered = a_msgs.iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        delivered.starts_with("Delivered to ") && delivered.ends_with("(done → started)"),
        "{delivered}"
    );
    let b_after = h
        .wait_for(&bid, "b answered", |v| {
            v["result"].as_str().unwrap_or("").contains("hi B")
        })
        .await;
    let a_handle = a["handle"].as_str().unwrap();
    assert_eq!(
        b_after["result"].as_str().unwrap(),
        format!("ok: [message from agent {a_handle}]\n\nhi B")
    );
    let b_msgs = h.messages(&bid).await;
    let from_a: Vec<&Value> = b_msgs.iter().filter(|m| m["origin"] == "agent").collect();
    assert_eq!(from_a.len(), 1);
    assert_eq!(from_a[0]["sender"], aid.as_str());

    // C runs a long step; a message sent meanwhile is read at its next step
    // boundary, after the tool result and before the next model call.
    let c = h
        .submit(json!({"agent": "chatty", "task": scripted("c busy", json!([
            {"call": [{"name": "sleep", "args": {"ms": 800}}]},
            {"say": "c done"}
        ]))}))
        .await;
    let cid = c["id"].as_str().unwrap().to_string();
    h.wait_for(&cid, "c running", |v| v["status"] == "running")
        .await;
    let d = h
        .submit(json!({"agent": "chatty", "task": scripted("d sends", json!([
            {"call": [{"name": "send_to_agent", "args": {"agent": cid, "message": "while you work"}}]},
            {"say": "d done"}
        ]))}))
        .await;
    h.wait(d["id"].as_str().unwrap()).await;
    let d_result = h.messages(d["id"].as_str().unwrap()).await;
    let text = d_result.iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.ends_with("(running → queued)"), "{text}");
    let c_done = h.wait(&cid).await;
    assert_eq!(c_done["result"], "c done");
    let roles: Vec<(String, Value)> = h
        .messages(&cid)
        .await
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_string(), m["origin"].clone()))
        .collect();
    assert_eq!(
        roles,
        [
            ("system".to_string(), Value::Null),
            ("user".into(), json!("human")),
            ("assistant".into(), Value::Null),
            ("tool".into(), Value::Null),
            ("user".into(), json!("agent")),
            ("assistant".into(), Value::Null),
        ]
    );
    assert_prefix_extending(&env);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auto_wake_budget_holds_and_a_human_refills_it() {
    let env = Env::new().await;
    env.add_definition("chatty", CHATTY);
    let h = env.start("").await;
    let core = h.core().clone();
    let t = h.submit(json!({"task": "target", "agent": "chatty"})).await;
    let tid = t["id"].as_str().unwrap().to_string();
    h.wait(&tid).await;
    let mut outcomes = Vec::new();
    for i in 0..10 {
        let d = delivery::deliver(
            &core,
            Message {
                target: tid.clone(),
                content: format!("agent note {i}"),
                origin: Origin::Agent,
                sender: None,
                interrupt: false,
            },
        )
        .await
        .unwrap();
        outcomes.push(d.delivery);
        // The target finishes its turn before the next send.
        h.wait(&tid).await;
    }
    assert_eq!(&outcomes[..6], [Delivery::Started; 6]);
    assert_eq!(&outcomes[6..], [Delivery::Suppressed; 4]);
    let events = agentq::db::events::for_agent(core.db.reader(), &tid, Some("wake_suppressed"))
        .await
        .unwrap();
    assert_eq!(events.len(), 4);
    let (_, v) = h.get(&format!("/v1/agents/{tid}")).await;
    assert_eq!(v["auto_wake_budget"], 0);

    // An agent sending now is told its message is held.
    let s = h
        .submit(json!({"agent": "chatty", "task": scripted("sender", json!([
            {"call": [{"name": "send_to_agent", "args": {"agent": tid, "message": "one more"}}]},
            {"say": "sent"}
        ]))}))
        .await;
    h.wait(s["id"].as_str().unwrap()).await;
    let held = h.messages(s["id"].as_str().unwrap()).await;
    let held = held.iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    let th = v["handle"].as_str().unwrap();
    assert_eq!(
        held,
        format!(
            "HELD — target {th} is out of auto-wake budget; your message is queued and will be read when a \
             human next writes to it. Do not resend."
        )
    );

    // A human message refills the budget and the target reads everything held.
    let (s, v) = h
        .post(
            &format!("/v1/agents/{tid}/messages"),
            json!({"content": "human here"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delivery"], "started");
    h.wait(&tid).await;
    let (_, v) = h.get(&format!("/v1/agents/{tid}")).await;
    assert_eq!(v["auto_wake_budget"], 6, "refilled");
    let msgs = h.messages(&tid).await;
    for i in 0..10 {
        let n = msgs
            .iter()
            .filter(|m| m["content"] == format!("agent note {i}"))
            .count();
        assert_eq!(n, 1, "note {i} appears exactly once");
    }
    let n = msgs
        .iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .unwrap_or("")
                .ends_with("\n\none more")
        })
        .count();
    assert_eq!(n, 1);
    assert_eq!(
        msgs.iter().filter(|m| m["content"] == "human here").count(),
        1
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_pong_stops_by_itself_within_the_budget() {
    let env = Env::new().await;
    env.add_definition("chatty", CHATTY);
    let h = env.start("").await;
    let a_id = "aaaa0000-0000-4000-8000-00000000000a";
    let b_id = "bbbb0000-0000-4000-8000-00000000000b";
    let pingpong = |other: &str| {
        let mut steps = Vec::new();
        for _ in 0..20 {
            steps.push(json!({"call": [{"name": "send_to_agent", "args": {"agent": other, "message": "ping"}}]}));
            steps.push(json!({"say": "sent"}));
        }
        Value::Array(steps)
    };
    create_with_id(
        &h,
        "local",
        b_id,
        &scripted("player B", pingpong(a_id)),
        Some("chatty"),
    )
    .await;
    h.wait(b_id).await;
    create_with_id(
        &h,
        "local",
        a_id,
        &scripted("player A", pingpong(b_id)),
        Some("chatty"),
    )
    .await;
    // Bounded: each side can be woken by the other at most 6 times.
    let core = h.core().clone();
    for _ in 0..3000 {
        let (_, a) = h.get(&format!("/v1/agents/{a_id}")).await;
        let (_, b) = h.get(&format!("/v1/agents/{b_id}")).await;
        let held = agentq::db::events::for_agent(core.db.reader(), a_id, Some("wake_suppressed"))
            .await
            .unwrap()
            .len()
            + agentq::db::events::for_agent(core.db.reader(), b_id, Some("wake_suppressed"))
                .await
                .unwrap()
                .len();
        if a["status"] == "done" && b["status"] == "done" && held > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, a) = h.get(&format!("/v1/agents/{a_id}")).await;
    let (_, b) = h.get(&format!("/v1/agents/{b_id}")).await;
    assert_eq!(
        (a["status"].as_str(), b["status"].as_str()),
        (Some("done"), Some("done"))
    );
    let wakes = |id: &str| {
        let core = core.clone();
        let id = id.to_string();
        async move {
            agentq::db::events::for_agent(core.db.reader(), &id, Some("message_queued"))
                .await
                .unwrap()
                .iter()
                .filter(|e| {
                    e.data_json()["origin"] == "agent" && e.data_json()["delivery"] == "started"
                })
                .count()
        }
    };
    assert!(wakes(a_id).await <= 6 && wakes(b_id).await <= 6);
    assert!(a["usage"]["turns"].as_i64().unwrap() <= 2 * 7 + 2, "{a}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messaging_needs_permissions_and_stays_within_the_user() {
    let env = Env::new().await;
    env.add_definition("chatty", CHATTY);
    let sha = |s: &str| hex::encode(Sha256::digest(s.as_bytes()));
    let h = env
        .start(&format!(
            "[[users]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\n[[users]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n",
            sha("alice-token"),
            sha("bob-token")
        ))
        .await;
    let alice = h.with_token("alice-token");
    let bob = h.with_token("bob-token");
    // The default definition lists the tools but grants no permission.
    let plain = alice.submit(json!({"task": "plain"})).await;
    let tools: Vec<&str> = plain["effective_tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(
        !tools.contains(&"send_to_agent") && !tools.contains(&"read_agent"),
        "{tools:?}"
    );
    alice.wait(plain["id"].as_str().unwrap()).await;
    for req in env.mock_log() {
        let offered: Vec<&str> = req["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert!(!offered.contains(&"send_to_agent"));
    }
    // Bob's agent cannot be reached from Alice's, by id or handle.
    let bobs = bob
        .submit(json!({"task": "bob's", "agent": "chatty"}))
        .await;
    let bid = bobs["id"].as_str().unwrap().to_string();
    bob.wait(&bid).await;
    let reach = alice
        .submit(json!({"agent": "chatty", "task": scripted("reach", json!([
            {"call": [
                {"name": "send_to_agent", "args": {"agent": bid, "message": "psst"}},
                {"name": "read_agent", "args": {"agent": &bid[..6]}}
            ]},
            {"say": "tried"}
        ]))}))
        .await;
    let rid = reach["id"].as_str().unwrap().to_string();
    alice.wait(&rid).await;
    let results: Vec<String> = alice
        .messages(&rid)
        .await
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert!(
        results.iter().all(|r| r.starts_with("no agent matches")),
        "{results:?}"
    );
    let bob_msgs = bob.messages(&bid).await;
    assert!(bob_msgs
        .iter()
        .all(|m| m["content"] != "psst" && !m["content"].as_str().unwrap().contains("psst")));
    // read_agent within the user works.
    let reader = alice
        .submit(json!({"agent": "chatty", "task": scripted("reader", json!([
            {"call": [{"name": "read_agent", "args": {"agent": plain["id"]}}]},
            {"say": "read"}
        ]))}))
        .await;
    alice.wait(reader["id"].as_str().unwrap()).await;
    let read = alice.messages(reader["id"].as_str().unwrap()).await;
    let read = read.iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        read,
        format!(
            "<agent_response handle={} status=done>ok: plain</agent_response>",
            plain["handle"].as_str().unwrap()
        )
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn todo_lists_write_merge_nudge_and_survive_a_restart() {
    let env = Env::new().await;
    env.add_definition("chatty", CHATTY);
    let h = env.start("").await;
    let echo = json!({"call": [{"name": "echo", "args": {"text": "x"}}]});
    let mut steps = vec![
        json!({"call": [{"name": "todo_write", "args": {"todos": [
            {"content": "plan"},
            {"content": "build", "status": "in_progress", "priority": "high"},
            {"id": "t3", "content": "ship", "status": "someday", "priority": "whenever"}
        ]}}]}),
        json!({"call": [{"name": "todo_write", "args": {"merge": true, "todos": [
            {"id": "1", "status": "completed"},
            {"content": "celebrate", "priority": "low"}
        ]}}]}),
        json!({"call": [{"name": "todo_read", "args": {}}]}),
    ];
    // 10 more calls: the 11th since the update (todo_read is the 1st) is nudged.
    for _ in 0..10 {
        steps.push(echo.clone());
    }
    steps.push(json!({"call": [{"name": "no_such_tool", "args": {}}]}));
    steps.push(json!({"say": "kept the list"}));
    let a = h
        .submit(json!({"agent": "chatty", "task": scripted("todo agent", Value::Array(steps))}))
        .await;
    let id = a["id"].as_str().unwrap().to_string();
    let done = h.wait(&id).await;
    assert_eq!(done["result"], "kept the list", "{done}");
    let results: Vec<String> = h
        .messages(&id)
        .await
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    let first: Value = serde_json::from_str(&results[0]).unwrap();
    assert_eq!(
        first["todos"],
        json!([
            {"id": "1", "content": "plan", "status": "pending", "priority": "medium"},
            {"id": "2", "content": "build", "status": "in_progress", "priority": "high"},
            {"id": "t3", "content": "ship", "status": "pending", "priority": "medium"}
        ])
    );
    let merged: Value = serde_json::from_str(&results[1]).unwrap();
    assert_eq!(merged["todos"][0]["status"], "completed");
    // New items without an id get the next number.
    assert_eq!(
        merged["todos"][3],
        json!({"id": "3", "content": "celebrate", "status": "pending", "priority": "low"})
    );
    assert_eq!(
        (merged["completed"].as_i64(), merged["remaining"].as_i64()),
        (Some(1), Some(3))
    );
    let read: Value = serde_json::from_str(&results[2]).unwrap();
    assert_eq!(read["todos"], merged["todos"]);
    assert_eq!(read["tool_calls_since_update"], 0);
    let nudge = "[10+ tool calls since your last todo update — consider todo_read]";
    for (i, r) in results.iter().enumerate().skip(3).take(9) {
        assert!(!r.contains(nudge), "result {i} is not nudged yet");
    }
    assert_eq!(
        results[12],
        format!("x\n{nudge}"),
        "the 11th call since the update is nudged once"
    );
    let last = results.last().unwrap();
    assert!(
        last.ends_with("\n[this error may affect your plan — consider todo_read]"),
        "{last}"
    );
    let events = agentq::db::events::for_agent(h.core().db.reader(), &id, Some("todo_updated"))
        .await
        .unwrap();
    assert_eq!(events.len(), 2);
    let (s, todos) = h.get(&format!("/v1/agents/{id}/todos")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(todos["todos"], merged["todos"]);
    // An empty replace clears the list (through a new turn).
    let (s, _) = h
        .post(
            &format!("/v1/agents/{id}/messages"),
            json!({"content": "clear please"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    h.wait(&id).await;
    h.shutdown().await;

    // The list survives a restart.
    let h = env.start("").await;
    let (_, again) = h.get(&format!("/v1/agents/{id}/todos")).await;
    assert_eq!(again["todos"], merged["todos"]);
    assert_prefix_extending(&env);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_context_is_compacted_and_the_turn_goes_on() {
    let env = Env::new().await;
    env.add_definition("chatty", CHATTY);
    let h = env
        .start("[models.primary]\ncontext_window = 600\ncompact_at = 0.5\nkeep_recent = 2\n")
        .await;
    let big = "y".repeat(400);
    let mut steps = vec![
        json!({"call": [{"name": "todo_write", "args": {"todos": [{"content": "stay on track"}]}}]}),
    ];
    for _ in 0..8 {
        steps.push(json!({"call": [{"name": "echo", "args": {"text": big}}]}));
    }
    steps.push(json!({"say": "made it"}));
    let a = h
        .submit(json!({"agent": "chatty", "task": scripted("compact me", Value::Array(steps))}))
        .await;
    let id = a["id"].as_str().unwrap().to_string();
    let done = h.wait(&id).await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["result"], "made it");
    let log = env.mock_log();
    let compacted: Vec<&Value> = log
        .iter()
        .filter(|r| {
            r["messages"].as_array().unwrap().iter().any(|m| {
                m["content"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("[compacted: `echo` returned 400 characters")
            })
        })
        .collect();
    assert!(!compacted.is_empty(), "some request carries stubs");
    let last = log.last().unwrap()["messages"].as_array().unwrap();
    let notes: Vec<&Value> = last
        .iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .unwrap_or("")
                .starts_with("[Context compacted:")
        })
        .collect();
    assert_eq!(notes.len(), 1, "the todo list is re-injected once");
    assert!(notes[0]["content"]
        .as_str()
        .unwrap()
        .contains("stay on track"));
    // The most recent exchanges are intact.
    let tail: Vec<&str> = last
        .iter()
        .rev()
        .take(4)
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(
        tail.iter().any(|c| *c == big),
        "recent results are not stubbed"
    );
    // The raw rows are untouched.
    let raw = h.messages(&id).await;
    assert_eq!(
        raw.iter().filter(|m| m["content"] == big.as_str()).count(),
        8
    );
    let events = agentq::db::events::for_agent(h.core().db.reader(), &id, Some("compacted"))
        .await
        .unwrap();
    assert!(!events.is_empty());
    assert_prefix_extending(&env);
    h.shutdown().await;
}
