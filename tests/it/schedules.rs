//! The scheduler (SPEC §10): briefs, heartbeats, overlap, catch-up, dedupe.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::DateTime;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::common::{scripted, Binary, Env, Harness};

async fn schedule(h: &Harness, body: Value) -> Value {
    let (s, v) = h.post("/v1/schedules", body).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

async fn fires(h: &Harness, id: &str) -> Vec<Value> {
    let (s, v) = h.get(&format!("/v1/schedules/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v["fires"].as_array().cloned().unwrap_or_default()
}

/// Polls (bounded) until the schedule's fires satisfy `f`.
async fn until_fires(
    h: &Harness,
    id: &str,
    what: &str,
    f: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    for _ in 0..1000 {
        let list = fires(h, id).await;
        if f(&list) {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "schedule {id}: {what} never happened: {:#?}",
        fires(h, id).await
    );
}

fn count(list: &[Value], outcome: &str) -> usize {
    list.iter().filter(|f| f["outcome"] == outcome).count()
}

fn ms(t: &Value) -> i64 {
    DateTime::parse_from_rfc3339(t.as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

async fn agents_of(h: &Harness, schedule_id: &str) -> Vec<Value> {
    let (_, v) = h.get("/v1/agents?limit=500").await;
    v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["metadata"]["schedule_id"] == schedule_id)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brief_creates_one_agent_per_fire_and_can_be_paused_run_and_deleted() {
    let env = Env::new().await;
    let h = env.start("").await;
    let s = schedule(
        &h,
        json!({"name": "every second", "cron": "* * * * * *", "kind": "brief",
               "task": "scheduled brief", "agent": "research"}),
    )
    .await;
    let id = s["id"].as_str().unwrap().to_string();
    assert!(s["next_fire_at"].is_string());
    let list = until_fires(&h, &id, "two fires", |f| count(f, "fired") >= 2).await;
    let fired: Vec<&Value> = list.iter().filter(|f| f["outcome"] == "fired").collect();
    let mut at: Vec<i64> = fired.iter().map(|f| ms(&f["fire_at"])).collect();
    at.dedup();
    assert_eq!(at.len(), fired.len(), "distinct occurrences");
    for f in &fired {
        let aid = f["agent_id"].as_str().unwrap();
        let (_, a) = h.get(&format!("/v1/agents/{aid}")).await;
        assert_eq!(a["task"], "scheduled brief");
        assert_eq!(a["definition"], "research");
        assert_eq!(a["level"], 1);
        assert_eq!(a["metadata"]["schedule_id"], id.as_str());
        let msgs = h.messages(aid).await;
        assert_eq!(msgs[1]["origin"], "cron");
    }

    // Disabled: no next fire, and nothing fires.
    let (s, v) = h
        .patch(&format!("/v1/schedules/{id}"), json!({"enabled": false}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["next_fire_at"].is_null());
    let before = count(&fires(&h, &id).await, "fired");
    let quiet_until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < quiet_until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            count(&fires(&h, &id).await, "fired"),
            before,
            "a disabled schedule fired"
        );
    }

    // Run now fires once, disabled or not.
    let (s, v) = h.post(&format!("/v1/schedules/{id}/run"), json!({})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["outcome"], "fired");
    assert_eq!(count(&fires(&h, &id).await, "fired"), before + 1);
    assert_eq!(
        agents_of(&h, &id).await.len(),
        before + 1,
        "one agent per fire"
    );

    let (s, _) = h.delete(&format!("/v1/schedules/{id}")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = h.get(&format!("/v1/schedules/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_ok_turns_are_quiet_and_left_out_of_the_context() {
    use axum::routing::post;
    let env = Env::new().await;
    let hooks = Arc::new(AtomicUsize::new(0));
    let bodies = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (h2, b2) = (hooks.clone(), bodies.clone());
    let app = axum::Router::new().route(
        "/hook",
        post(move |body: String| {
            let (h, b) = (h2.clone(), b2.clone());
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                b.lock().unwrap().push(body);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let h = env.start("").await;
    let t = h
        .submit(json!({"task": "watched agent", "notify": {"webhook_url": hook}}))
        .await;
    let tid = t["id"].as_str().unwrap().to_string();
    h.wait(&tid).await;
    for _ in 0..500 {
        if hooks.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(hooks.load(Ordering::SeqCst), 1, "the first turn notifies");

    let hb = schedule(
        &h,
        json!({"cron": "* * * * * *", "kind": "heartbeat", "target": t["handle"]}),
    )
    .await;
    let hid = hb["id"].as_str().unwrap().to_string();
    until_fires(&h, &hid, "a heartbeat", |f| count(f, "fired") >= 1).await;
    // The heartbeat turn ends quietly: its exchange is hidden.
    let mut hidden = Vec::new();
    for _ in 0..500 {
        let msgs = h.messages(&tid).await;
        hidden = msgs.into_iter().filter(|m| m["hidden"] == true).collect();
        let (_, a) = h.get(&format!("/v1/agents/{tid}")).await;
        if hidden.len() >= 2 && a["status"] == "done" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(hidden.len() >= 2, "{hidden:#?}");
    assert!(hidden[0]["content"]
        .as_str()
        .unwrap()
        .starts_with("HEARTBEAT"));
    assert_eq!(hidden[0]["origin"], "heartbeat");
    assert_eq!(hidden[1]["content"], "HEARTBEAT_OK");
    let (s, _) = h
        .patch(&format!("/v1/schedules/{hid}"), json!({"enabled": false}))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, a) = h.get(&format!("/v1/agents/{tid}")).await;
    assert_eq!(
        a["result"], "ok: watched agent",
        "the quiet turn keeps the previous result"
    );

    // The next real request leaves the heartbeat exchange out.
    let (s, _) = h
        .post(
            &format!("/v1/agents/{tid}/messages"),
            json!({"content": "a real question"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    h.wait_for(&tid, "the answer", |a| a["result"] == "ok: a real question")
        .await;
    let last = env
        .mock_log()
        .into_iter()
        .rfind(|r| r["messages"][1]["content"] == "watched agent")
        .unwrap();
    let contents: Vec<&str> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert!(
        contents.iter().all(|c| !c.contains("HEARTBEAT")),
        "{contents:?}"
    );
    assert_eq!(contents.last(), Some(&"a real question"));
    for _ in 0..500 {
        if hooks.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        hooks.load(Ordering::SeqCst),
        2,
        "quiet heartbeats never notified"
    );
    let quiet_finishes =
        agentq::db::events::for_agent(h.core().db.reader(), &tid, Some("agent_finished"))
            .await
            .unwrap()
            .len();
    assert_eq!(quiet_finishes, 2, "no agent_finished for quiet turns");

    // A heartbeat answered otherwise is an ordinary turn and notifies.
    let loud = schedule(
        &h,
        json!({"cron": "* * * * * *", "kind": "heartbeat", "target": tid, "task": "status report please"}),
    )
    .await;
    let lid = loud["id"].as_str().unwrap().to_string();
    until_fires(&h, &lid, "a loud heartbeat", |f| count(f, "fired") >= 1).await;
    h.patch(&format!("/v1/schedules/{lid}"), json!({"enabled": false}))
        .await;
    h.wait_for(&tid, "the report", |a| {
        a["result"] == "ok: status report please"
    })
    .await;
    for _ in 0..500 {
        if hooks.load(Ordering::SeqCst) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        hooks.load(Ordering::SeqCst) >= 3,
        "a non-OK heartbeat notifies"
    );
    let last_body: Value = serde_json::from_str(bodies.lock().unwrap().last().unwrap()).unwrap();
    assert_eq!(
        last_body["agent"]["result_preview"],
        "ok: status report please"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_waits_for_the_running_agent_and_queue_does_not() {
    let env = Env::new().await;
    let h = env.start("").await;
    let slow = scripted(
        "slow brief",
        json!([{"call": [{"name": "sleep", "args": {"ms": 3000}}]}, {"say": "done"}]),
    );
    let skip = schedule(
        &h,
        json!({"cron": "* * * * * *", "kind": "brief", "task": slow, "overlap": "skip"}),
    )
    .await;
    let sid = skip["id"].as_str().unwrap().to_string();
    let list = until_fires(&h, &sid, "a skipped tick", |f| count(f, "skipped") >= 1).await;
    h.patch(&format!("/v1/schedules/{sid}"), json!({"enabled": false}))
        .await;
    assert_eq!(count(&list, "fired"), 1, "{list:#?}");
    let first = list.iter().find(|f| f["outcome"] == "fired").unwrap()["agent_id"].clone();
    assert!(list
        .iter()
        .filter(|f| f["outcome"] == "skipped")
        .all(|f| f["detail"].as_str().unwrap().contains("still")));
    assert_eq!(agents_of(&h, &sid).await.len(), 1);
    let (_, a) = h
        .get(&format!("/v1/agents/{}", first.as_str().unwrap()))
        .await;
    assert!(a["status"] == "running" || a["status"] == "queued", "{a}");

    let slow_q = scripted(
        "slow queued brief",
        json!([{"call": [{"name": "sleep", "args": {"ms": 3000}}]}, {"say": "done"}]),
    );
    let queue = schedule(
        &h,
        json!({"cron": "* * * * * *", "kind": "brief", "task": slow_q, "overlap": "queue"}),
    )
    .await;
    let qid = queue["id"].as_str().unwrap().to_string();
    let list = until_fires(&h, &qid, "two fires", |f| count(f, "fired") >= 2).await;
    h.patch(&format!("/v1/schedules/{qid}"), json!({"enabled": false}))
        .await;
    let ids: Vec<&str> = list
        .iter()
        .filter(|f| f["outcome"] == "fired")
        .map(|f| f["agent_id"].as_str().unwrap())
        .collect();
    let (_, a) = h.get(&format!("/v1/agents/{}", ids.last().unwrap())).await;
    assert_ne!(ids[0], ids[1]);
    assert_eq!(count(&list, "skipped"), 0);
    let (_, first_q) = h.get(&format!("/v1/agents/{}", ids.first().unwrap())).await;
    assert!(
        first_q["status"] != "done" || a["status"] != "done",
        "they overlapped"
    );
    h.shutdown().await;
}

async fn downtime(catch_up_s: i64) -> (Vec<Value>, i64, i64) {
    let env = Env::new().await;
    let cfg = format!("[scheduler]\ncatch_up_s = {catch_up_s}\n");
    let h = env.start(&cfg).await;
    // overlap = queue: an agent left unfinished at shutdown must not turn
    // the catch-up fire into a skip.
    let s = schedule(
        &h,
        json!({"cron": "* * * * * *", "kind": "brief", "task": "catch me", "overlap": "queue"}),
    )
    .await;
    let id = s["id"].as_str().unwrap().to_string();
    until_fires(&h, &id, "a first fire", |f| count(f, "fired") >= 1).await;
    h.shutdown().await;
    let stopped = chrono::Utc::now().timestamp_millis();
    // The service is down across three ticks.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let restarted = chrono::Utc::now().timestamp_millis();
    let h = env.start(&cfg).await;
    let list = until_fires(&h, &id, "a fire after the restart", |f| {
        f.iter().any(|x| ms(&x["fire_at"]) > restarted)
    })
    .await;
    h.patch(&format!("/v1/schedules/{id}"), json!({"enabled": false}))
        .await;
    h.shutdown().await;
    (list, stopped, restarted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_one_catch_up_fire_runs_within_catch_up_s() {
    let (list, stopped, restarted) = downtime(3600).await;
    let during: Vec<&Value> = list
        .iter()
        .filter(|f| (stopped..=restarted).contains(&ms(&f["fire_at"])))
        .collect();
    assert_eq!(
        during.len(),
        1,
        "one catch-up, not one per missed tick: {list:#?}"
    );
    assert_eq!(during[0]["outcome"], "fired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_a_fire_outside_catch_up_s_is_recorded_as_missed() {
    let (list, stopped, restarted) = downtime(0).await;
    let during: Vec<&Value> = list
        .iter()
        .filter(|f| (stopped..=restarted).contains(&ms(&f["fire_at"])))
        .collect();
    assert_eq!(during.len(), 1, "{list:#?}");
    assert_eq!(during[0]["outcome"], "missed");
    assert!(during[0]["agent_id"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_right_after_a_fire_never_doubles_it() {
    let env = Env::new().await;
    let cfg = env.path("agentq.toml");
    std::fs::write(&cfg, env.config_text("")).unwrap();
    let first = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&first.url);
    let s = schedule(
        &h,
        json!({"cron": "* * * * * *", "kind": "brief", "task": "kill me"}),
    )
    .await;
    let id = s["id"].as_str().unwrap().to_string();
    until_fires(&h, &id, "a fire", |f| count(f, "fired") >= 1).await;
    first.kill();
    let second = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&second.url);
    until_fires(&h, &id, "fires after the restart", |f| {
        count(f, "fired") >= 3
    })
    .await;
    h.patch(&format!("/v1/schedules/{id}"), json!({"enabled": false}))
        .await;
    let list = {
        let mut l = fires(&h, &id).await;
        l.sort_by_key(|f| ms(&f["fire_at"]));
        l
    };
    let mut at: Vec<i64> = list.iter().map(|f| ms(&f["fire_at"])).collect();
    let n = at.len();
    at.dedup();
    assert_eq!(at.len(), n, "no occurrence twice");
    let fired = count(&list, "fired");
    assert!(fired >= 3);
    assert_eq!(
        agents_of(&h, &id).await.len(),
        fired,
        "exactly one agent per fire"
    );
    second.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_get_clear_errors() {
    let env = Env::new().await;
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
    let cases = [
        (
            json!({"cron": "61 * * * *", "kind": "brief", "task": "x"}),
            "cron",
        ),
        (
            json!({"cron": "* * *", "kind": "brief", "task": "x"}),
            "cron",
        ),
        (
            json!({"cron": "* * * * *", "timezone": "Mars/Base", "kind": "brief", "task": "x"}),
            "timezone",
        ),
        (
            json!({"cron": "* * * * *", "kind": "brief", "task": "x", "agent": "nope"}),
            "agent",
        ),
        (json!({"cron": "* * * * *", "kind": "brief"}), "task"),
        (json!({"cron": "* * * * *", "kind": "heartbeat"}), "target"),
        (
            json!({"cron": "* * * * *", "kind": "heartbeat", "target": "00000000-0000-4000-8000-000000000000"}),
            "target",
        ),
        (
            json!({"cron": "* * * * *", "kind": "weekly", "task": "x"}),
            "kind",
        ),
        (
            json!({"cron": "* * * * *", "kind": "brief", "task": "x", "overlap": "maybe"}),
            "overlap",
        ),
    ];
    for (body, field) in cases {
        let (s, v) = alice.post("/v1/schedules", body.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().starts_with(field),
            "{body}: {v}"
        );
    }
    // Bob's agent is not a target Alice can name.
    let bobs = bob.submit(json!({"task": "bob's"})).await;
    let (s, v) = alice
        .post(
            "/v1/schedules",
            json!({"cron": "* * * * *", "kind": "heartbeat", "target": bobs["id"]}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    // Nor can Alice see or touch Bob's schedules.
    let mine = schedule(
        &bob,
        json!({"cron": "0 9 * * *", "kind": "brief", "task": "bob's brief"}),
    )
    .await;
    let (s, _) = alice
        .get(&format!("/v1/schedules/{}", mine["id"].as_str().unwrap()))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = alice
        .delete(&format!("/v1/schedules/{}", mine["id"].as_str().unwrap()))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, list) = alice.get("/v1/schedules").await;
    assert!(list["schedules"].as_array().unwrap().is_empty());
    h.shutdown().await;
}
