//! Sub-agents (SPEC §4): trees, narrowing, foreground and background
//! completion, budgets, timeouts, cancel, limits, webhooks, approvals.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::common::{scripted, Env, Harness};

fn spawn(task: &str, extra: Value) -> Value {
    let mut args = json!({"task": task});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            args[k] = v;
        }
    }
    json!({"name": "spawn_agent", "args": args})
}

/// Requests whose first user message contains `marker`.
fn requests_of(env: &Env, marker: &str) -> Vec<Value> {
    env.mock_log()
        .into_iter()
        .filter(|l| {
            l["messages"]
                .as_array()
                .and_then(|m| m.iter().find(|x| x["role"] == "user"))
                .and_then(|m| m["content"].as_str())
                .is_some_and(|c| c.starts_with(marker))
        })
        .collect()
}

fn tools_offered(req: &Value) -> Vec<String> {
    req["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

async fn three_level_tree(h: &Harness, env: &Env) {
    let gc_a = scripted("grandchild A", json!([{"say": "gc A result"}]));
    let gc_b = scripted("grandchild B", json!([{"say": "gc B result"}]));
    let child_a = scripted(
        "child A",
        json!([{"call": [spawn(&gc_a, json!({}))]}, {"say": "child A result"}]),
    );
    let child_b = scripted(
        "child B",
        json!([{"call": [spawn(&gc_b, json!({}))]}, {"say": "child B result"}]),
    );
    let root = h
        .submit_task(&scripted(
            "root",
            json!([
                {"call": [
                    spawn(&child_a, json!({"tools": ["spawn_agent", "wait_for_agent", "echo"]})),
                    spawn(&child_b, json!({"deny_tools": ["sleep", "agent_cancel"]}))
                ]},
                {"say": "root final"}
            ]),
        ))
        .await;
    let id = root["id"].as_str().unwrap();
    let done = h.wait(id).await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["result"], "root final");

    // The root's last request carries both results, each with its header.
    let last = requests_of(env, "root").pop().unwrap();
    let results: Vec<&str> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(results.len(), 2);
    assert!(
        results[0].starts_with("[Sub-agent completed · "),
        "{}",
        results[0]
    );
    assert!(results[0].ends_with("\n\nchild A result"), "{}", results[0]);
    assert!(results[1].ends_with("\n\nchild B result"), "{}", results[1]);

    // The tree API returns the exact nesting.
    let (s, tree) = h.get(&format!("/v1/agents/{id}/tree")).await;
    assert_eq!(s, 200);
    assert_eq!(tree["level"], 1);
    let children = tree["children"].as_array().unwrap();
    assert_eq!(children.len(), 2);
    for c in children {
        assert_eq!(c["level"], 2);
        assert_eq!(c["parent_id"], tree["id"]);
        let gcs = c["children"].as_array().unwrap();
        assert_eq!(gcs.len(), 1);
        assert_eq!(gcs[0]["level"], 3);
        assert_eq!(gcs[0]["root_id"], tree["id"]);
        assert!(gcs[0]["children"].as_array().unwrap().is_empty());
    }

    // Tools: the intersection, stored and offered; none to spawn at level 3.
    let root_tools = strings(&tree["effective_tools"]);
    let a = children
        .iter()
        .find(|c| c["task"].as_str().unwrap().starts_with("child A"))
        .unwrap();
    let b = children
        .iter()
        .find(|c| c["task"].as_str().unwrap().starts_with("child B"))
        .unwrap();
    assert_eq!(
        strings(&a["effective_tools"]),
        ["spawn_agent", "wait_for_agent", "echo"]
    );
    let expected_b: Vec<String> = root_tools
        .iter()
        .filter(|t| *t != "sleep" && *t != "agent_cancel")
        .cloned()
        .collect();
    assert_eq!(strings(&b["effective_tools"]), expected_b);
    for (node, marker) in [(a, "child A"), (b, "child B")] {
        for req in requests_of(env, marker) {
            assert_eq!(
                tools_offered(&req),
                strings(&node["effective_tools"]),
                "{marker}"
            );
        }
    }
    for (node, marker) in [(a, "grandchild A"), (b, "grandchild B")] {
        let gc = &node["children"][0];
        let stored = strings(&gc["effective_tools"]);
        assert!(!stored.contains(&"spawn_agent".to_string()), "{stored:?}");
        assert!(
            !stored.contains(&"wait_for_agent".to_string()),
            "{stored:?}"
        );
        let reqs = requests_of(env, marker);
        assert!(!reqs.is_empty());
        for req in reqs {
            assert_eq!(tools_offered(&req), stored);
        }
        // A child never has a tool its parent lacks.
        let parent_tools = strings(&node["effective_tools"]);
        assert!(stored.iter().all(|t| parent_tools.contains(t)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_level_tree_completes_with_narrowed_tools() {
    let env = Env::new().await;
    let h = env.start("").await;
    three_level_tree(&h, &env).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tree_completes_with_a_single_worker() {
    let env = Env::new().await;
    let h = env.start("[workers]\nconcurrency = 1\n").await;
    three_level_tree(&h, &env).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_child_reports_back_and_wakes_the_parent() {
    let env = Env::new().await;
    let h = env.start("").await;
    let child = scripted("bg child", json!([{"say": "bg result", "delay_ms": 300}]));
    let parent = h
        .submit_task(&scripted(
            "bg parent",
            json!([
                {"call": [spawn(&child, json!({"background": true}))]},
                {"say": "first turn over"},
                {"say": "got the child's result"}
            ]),
        ))
        .await;
    let id = parent["id"].as_str().unwrap().to_string();
    let done = h
        .wait_for(&id, "the second answer", |a| {
            a["result"] == "got the child's result"
        })
        .await;
    assert_eq!(done["status"], "done");
    let msgs = h.messages(&id).await;
    let spawn_result = msgs.iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        spawn_result.starts_with("Sub-agent spawned in background. ID: "),
        "{spawn_result}"
    );
    assert!(spawn_result.ends_with("You will be notified when it completes."));
    let from_child: Vec<&Value> = msgs.iter().filter(|m| m["origin"] == "child").collect();
    assert_eq!(from_child.len(), 1, "exactly one completion message");
    let text = from_child[0]["content"].as_str().unwrap();
    assert!(text.starts_with("[Sub-agent "), "{text}");
    assert!(text.contains(" completed · "), "{text}");
    assert!(text.ends_with("\n\nbg result"), "{text}");
    // The first turn ended before the child did.
    let assistants: Vec<&str> = msgs
        .iter()
        .filter(|m| m["role"] == "assistant")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        assistants[1..],
        ["first turn over", "got the child's result"]
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_cannot_be_escaped_and_dropped_tools_are_named() {
    let env = Env::new().await;
    env.add_definition(
        "narrow",
        "tools = [\"spawn_agent\", \"echo\"]\nsystem_prompt = \"narrow\"\n",
    );
    let h = env.start("").await;
    let child = scripted("narrow child", json!([{"say": "child ok"}]));
    let parent = h
        .submit(json!({
            "agent": "narrow",
            "task": scripted("narrow parent", json!([
                {"call": [spawn(&child, json!({"agent": "default", "tools": ["echo", "sleep", "agent_list"]}))]},
                {"say": "parent ok"}
            ]))
        }))
        .await;
    let id = parent["id"].as_str().unwrap();
    assert_eq!(strings(&parent["effective_tools"]), ["spawn_agent", "echo"]);
    let done = h.wait(id).await;
    assert_eq!(done["status"], "done", "{done}");
    let msgs = h.messages(id).await;
    let result = msgs.iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        result.contains("requested tools not granted (the parent lacks them): sleep, agent_list"),
        "{result}"
    );
    let (_, tree) = h.get(&format!("/v1/agents/{id}/tree")).await;
    let child_row = &tree["children"][0];
    assert_eq!(strings(&child_row["effective_tools"]), ["echo"]);
    for req in requests_of(&env, "narrow child") {
        assert_eq!(tools_offered(&req), ["echo"]);
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_flow_down_and_a_spent_tree_stops_at_the_root() {
    let env = Env::new().await;
    let h = env.start("").await;
    // Each answer costs (5000·1 + 5000·2)/1e6 = $0.015.
    let costly = json!({"call": [{"name": "echo", "args": {"text": "$"}}],
                        "usage": {"prompt_tokens": 5000, "completion_tokens": 5000}});
    let gc = scripted("spender", json!([costly, costly, costly, {"say": "never"}]));
    let child = scripted(
        "middle",
        json!([{"call": [spawn(&gc, json!({"max_cost_usd": 5.0}))]}, {"say": "middle never"}]),
    );
    let root = h
        .submit(json!({
            "task": scripted("budget root", json!([
                {"call": [spawn(&child, json!({"max_cost_usd": 10.0}))]},
                {"say": "root never"}
            ])),
            "max_cost_usd": 0.02
        }))
        .await;
    let id = root["id"].as_str().unwrap();
    let done = h.wait(id).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["stop_reason"], "cost_limit");
    assert!(
        done["error"].as_str().unwrap().contains("cost limit"),
        "{done}"
    );
    let (_, tree) = h.get(&format!("/v1/agents/{id}/tree")).await;
    let middle = &tree["children"][0];
    let spender = &middle["children"][0];
    // Asked for $10 and $5; capped by what the root had left ($0.02).
    assert!(
        middle["limits"]["max_cost_usd"].as_f64().unwrap() <= 0.02 + 1e-9,
        "{middle}"
    );
    assert!(
        spender["limits"]["max_cost_usd"].as_f64().unwrap() <= 0.02 + 1e-9,
        "{spender}"
    );
    assert_eq!(spender["stop_reason"], "cost_limit");
    // The spend counts against every ancestor: the tree spent at most one
    // answer past the root's budget.
    let spent = tree["usage"]["subtree_cost_usd"].as_f64().unwrap();
    assert!((0.02..=0.02 + 0.015 + 1e-9).contains(&spent), "{spent}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreground_child_past_its_timeout_is_stopped_and_reported() {
    let env = Env::new().await;
    let h = env.start("").await;
    let slow = scripted(
        "slow child",
        json!([{"call": [{"name": "sleep", "args": {"ms": 30000}}]}]),
    );
    let parent = h
        .submit_task(&scripted(
            "timeout parent",
            json!([{"call": [spawn(&slow, json!({"timeout_s": 1}))]}, {"say": "moved on"}]),
        ))
        .await;
    let id = parent["id"].as_str().unwrap();
    let done = h.wait(id).await;
    assert_eq!(done["result"], "moved on", "{done}");
    let msgs = h.messages(id).await;
    let result = msgs.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["content"], "[Sub-agent timed out after 1s]");
    let (_, tree) = h.get(&format!("/v1/agents/{id}/tree")).await;
    assert_eq!(tree["children"][0]["status"], "timed_out");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_root_stops_running_and_queued_descendants() {
    let env = Env::new().await;
    // One slot: once the parent suspends, the slow background child takes
    // it (its model call stays in flight) and the foreground child queues.
    let h = env
        .start("[workers]\nconcurrency = 1\n[providers.mock]\ntimeout_s = 60.0\n")
        .await;
    let slow = scripted(
        "mid-call child",
        json!([{"say": "late", "delay_ms": 20000}]),
    );
    let queued = scripted("queued child", json!([{"say": "never runs"}]));
    let parent = h
        .submit_task(&scripted(
            "cancel root",
            json!([
                {"call": [spawn(&slow, json!({"background": true}))]},
                {"call": [spawn(&queued, json!({}))]},
                {"say": "never"}
            ]),
        ))
        .await;
    let id = parent["id"].as_str().unwrap().to_string();
    // Wait until the slow child's model call is in flight and the parent waits.
    h.wait_for(&id, "parent waiting", |a| a["status"] == "waiting")
        .await;
    for _ in 0..2000 {
        if !requests_of(&env, "mid-call child").is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (_, tree) = h.get(&format!("/v1/agents/{id}/tree")).await;
    let states: Vec<String> = tree["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap().to_string())
        .collect();
    assert!(states.contains(&"running".to_string()), "{states:?}");
    assert!(states.contains(&"queued".to_string()), "{states:?}");

    let (s, v) = h.post(&format!("/v1/agents/{id}/cancel"), json!({})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["status"], "cancelled");
    for c in tree["children"].as_array().unwrap() {
        let cid = c["id"].as_str().unwrap();
        let after = h.wait(cid).await;
        assert_eq!(after["status"], "cancelled", "{after}");
        assert_eq!(
            after["usage"]["turns"], 0,
            "nothing was recorded after the cancel"
        );
    }
    assert!(
        requests_of(&env, "queued child").is_empty(),
        "the queued child never ran"
    );
    // Nothing below can spawn or run afterwards: the parent's job is gone.
    let (_, tree) = h.get(&format!("/v1/agents/{id}/tree")).await;
    assert_eq!(tree["children"].as_array().unwrap().len(), 2);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sixth_child_is_refused_until_one_finishes() {
    let env = Env::new().await;
    let h = env.start("").await;
    // The children answer after a delay, so their completions wake the
    // parent after its first turn (arriving earlier, they would start the
    // next turn at once: the script goes on either way).
    let child = |i: usize| {
        scripted(
            &format!("limit child {i}"),
            json!([{"say": format!("c{i}"), "delay_ms": 1000}]),
        )
    };
    let six: Vec<Value> = (0..6)
        .map(|i| spawn(&child(i), json!({"background": true})))
        .collect();
    let parent = h
        .submit_task(&scripted(
            "limit parent",
            json!([
                {"call": six},
                {"say": "waiting for a child"},
                {"call": [spawn(&child(6), json!({"background": true}))]},
                {"say": "spawned again"}
            ]),
        ))
        .await;
    let id = parent["id"].as_str().unwrap().to_string();
    // Later completions wake the parent again and move its `result` on, so
    // look for the answer in the conversation.
    let mut msgs = Vec::new();
    for _ in 0..3000 {
        msgs = h.messages(&id).await;
        if msgs.iter().any(|m| m["content"] == "spawned again") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        msgs.iter().any(|m| m["content"] == "spawned again"),
        "{:#?}",
        msgs.iter()
            .map(|m| (m["role"].clone(), m["origin"].clone(), m["content"].clone()))
            .collect::<Vec<_>>()
    );
    let tools: Vec<String> = msgs
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    for t in &tools[..5] {
        assert!(t.starts_with("Sub-agent spawned in background."), "{t}");
    }
    assert_eq!(
        tools[5],
        "Cannot spawn sub-agent: concurrency limit reached (5/5 active). Wait for one to finish or cancel one."
    );
    assert!(
        tools[6].starts_with("Sub-agent spawned in background."),
        "{}",
        tools[6]
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_retried_until_accepted_and_signed() {
    use axum::routing::post;
    let env = Env::new().await;
    let calls = Arc::new(AtomicUsize::new(0));
    // (body, signature header) of each accepted delivery.
    type Received = Arc<Mutex<Vec<(String, Option<String>)>>>;
    let bodies: Received = Arc::default();
    let (c2, b2) = (calls.clone(), bodies.clone());
    let app = axum::Router::new().route(
        "/hook",
        post(move |headers: axum::http::HeaderMap, body: String| {
            let (calls, bodies) = (c2.clone(), b2.clone());
            async move {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                if n < 2 {
                    return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
                }
                let sig = headers
                    .get("x-agentq-signature")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                bodies.lock().unwrap().push((body, sig));
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let var = format!("AGENTQ_TEST_SECRET_{}", std::process::id());
    std::env::set_var(&var, "s3cret");
    let h = env
        .start(&format!("[webhooks]\nsecret_env = \"{var}\"\n"))
        .await;
    let a = h
        .submit(json!({"task": "notify me", "notify": {"webhook_url": hook}}))
        .await;
    let id = a["id"].as_str().unwrap().to_string();
    h.wait(&id).await;
    for _ in 0..3000 {
        if !bodies.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let got = bodies.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "exactly one accepted delivery");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "two failures, then success"
    );
    let (body, sig) = &got[0];
    assert_eq!(
        sig.as_deref(),
        Some(agentq::notify::sign(b"s3cret", body.as_bytes()).as_str())
    );
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["agent"]["id"], id.as_str());
    assert_eq!(v["agent"]["status"], "done");
    assert_eq!(v["agent"]["result_preview"], "ok: notify me");
    assert!(v["agent"]["usage"]["turns"].as_i64().unwrap() >= 1);
    let jobs = agentq::db::jobs::count_by_state(h.core().db.reader())
        .await
        .unwrap();
    assert!(
        jobs.contains(&("completed".to_string(), 2)),
        "turn + notify: {jobs:?}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_cancel_waits_for_a_human_and_obeys_the_decision() {
    let env = Env::new().await;
    let h = env.start("").await;
    let child = scripted("victim", json!([{"say": "slow", "delay_ms": 20000}]));
    let spawner = h
        .submit_task(&scripted(
            "canceller",
            json!([
                {"call": [spawn(&child, json!({"background": true}))]},
                {"call": [{"name": "agent_list", "args": {}}]},
                {"say": "listed"}
            ]),
        ))
        .await;
    let sid = spawner["id"].as_str().unwrap().to_string();
    h.wait_for(&sid, "listed", |a| a["result"] == "listed")
        .await;
    let (_, tree) = h.get(&format!("/v1/agents/{sid}/tree")).await;
    let victim = tree["children"][0]["id"].as_str().unwrap().to_string();

    // A second agent asks to cancel the victim, twice: denied, then approved.
    let ask = |text: &str| json!({"call": [{"name": "agent_cancel", "args": {"agent": victim}}], "content": text});
    let asker = h
        .submit_task(&scripted(
            "asker",
            json!([ask("first"), ask("second"), {"say": "finished"}]),
        ))
        .await;
    let aid = asker["id"].as_str().unwrap().to_string();
    for decision in ["deny", "approve"] {
        let pending = loop {
            let (_, v) = h.get("/v1/approvals").await;
            let list = v["approvals"].as_array().unwrap().clone();
            if let Some(p) = list.into_iter().find(|p| p["agent_id"] == aid.as_str()) {
                break p;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        assert_eq!(pending["tool"], "agent_cancel");
        h.wait_for(&aid, "waiting on approval", |a| a["status"] == "waiting")
            .await;
        let (s, v) = h
            .post(
                &format!("/v1/approvals/{}", pending["id"].as_str().unwrap()),
                json!({"decision": decision, "reason": "not now"}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        // Deciding twice is a conflict.
        let (s, _) = h
            .post(
                &format!("/v1/approvals/{}", pending["id"].as_str().unwrap()),
                json!({"decision": decision}),
            )
            .await;
        assert_eq!(s, 409);
    }
    let done = h.wait(&aid).await;
    assert_eq!(done["result"], "finished", "{done}");
    let results: Vec<String> = h
        .messages(&aid)
        .await
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(results[0], "denied by user: not now");
    assert!(results[1].starts_with("Cancelled "), "{}", results[1]);
    assert_eq!(h.wait(&victim).await["status"], "cancelled");
    h.shutdown().await;
}
