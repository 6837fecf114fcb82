//! Crash tests: the real binary, SIGKILLed mid-flight and restarted on the
//! same database.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{read_lines, repo, scripted, Binary, Env, Harness};

fn write_config(env: &Env, overrides: &str) -> std::path::PathBuf {
    let p = env.path("agentq.toml");
    std::fs::write(&p, env.config_text(overrides)).unwrap();
    p
}

async fn recorded_tool_results(db: &std::path::Path) -> HashSet<String> {
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT tool_call_id FROM messages WHERE role = 'tool'")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    conn.close().await.unwrap();
    ids.into_iter().collect()
}

/// Polls (bounded) until `f` holds.
async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..6000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} never happened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_serves_the_default_config_and_submit_waits() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_agentq");
    let mut child = std::process::Command::new(bin)
        .arg("serve")
        .current_dir(repo())
        .env("AGENTQ_DATABASE_PATH", dir.path().join("q.db"))
        .env("AGENTQ_SERVER_BIND", "127.0.0.1:0")
        .env("AGENTQ_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("agentq listening on ")
        .unwrap()
        .to_string();
    let submit = tokio::process::Command::new(bin)
        .args(["submit", "hello", "--wait"])
        .env("AGENTQ_URL", &url)
        .output()
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(submit.status.success(), "{submit:?}");
    assert_eq!(String::from_utf8_lossy(&submit.stdout), "ok: hello\n");

    // Exit code 2 when the server is unreachable.
    let down = tokio::process::Command::new(bin)
        .args(["submit", "hello", "--wait"])
        .env("AGENTQ_URL", &url)
        .output()
        .await
        .unwrap();
    assert_eq!(down.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_flight_loses_nothing_and_reruns_nothing_recorded() {
    let env = Env::new().await;
    let cfg = write_config(&env, "");
    let first = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&first.url);
    let mut ids = Vec::new();
    for i in 0..200 {
        let steps: Vec<Value> = (0..4)
            .map(|k| json!({"call": [{"name": "echo", "args": {"text": format!("{i}-{k}")}}], "delay_ms": 5 + (i % 7) * 3}))
            .chain([json!({"say": format!("agent {i} done"), "delay_ms": 5})])
            .collect();
        let a = h
            .submit_task(&scripted(&format!("crash agent {i}"), json!(steps)))
            .await;
        ids.push(a["id"].as_str().unwrap().to_string());
    }
    until("half of the model calls", || env.mock_log().len() >= 500).await;
    let first_pid = first.pid();
    first.kill();
    let before = recorded_tool_results(&env.path("agentq.db")).await;
    assert!(
        !before.is_empty() && before.len() < 800,
        "killed mid-flight: {} results",
        before.len()
    );

    let second = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&second.url);
    for id in &ids {
        let a = h.wait_settled(id, Duration::from_secs(120)).await;
        assert_eq!(a["status"], "done", "{a}");
        let msgs = h.messages(id).await;
        let calls: Vec<String> = msgs
            .iter()
            .filter(|m| m["role"] == "assistant")
            .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(calls.len(), 4, "{id}");
        let mut results: HashMap<String, usize> = HashMap::new();
        for m in msgs.iter().filter(|m| m["role"] == "tool") {
            *results
                .entry(m["tool_call_id"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        for c in &calls {
            assert_eq!(
                results.get(c),
                Some(&1),
                "call {c} of {id} must have exactly one result"
            );
        }
        assert_eq!(results.len(), 4);
    }
    let log = read_lines(&env.path("debug.log"));
    let second_pid = second.pid() as u64;
    let rerun: Vec<&Value> = log
        .iter()
        .filter(|l| l["pid"].as_u64() == Some(second_pid))
        .filter(|l| before.contains(l["tool_call_id"].as_str().unwrap()))
        .collect();
    assert!(
        rerun.is_empty(),
        "recorded steps ran again after the restart: {rerun:?}"
    );
    assert!(log
        .iter()
        .any(|l| l["pid"].as_u64() == Some(first_pid as u64)));
    second.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_crashes_the_process_every_time_is_quarantined() {
    let env = Env::new().await;
    let cfg = write_config(&env, "[workers]\nmax_resumes = 3\n");
    let steps = json!([{"call": [{"name": "sleep", "args": {"ms": 600000}}]}, {"say": "never"}]);
    let mut id = String::new();
    for run in 1..=3usize {
        let b = Binary::start(&cfg, &env.path("stderr.log"));
        if run == 1 {
            let a = Harness::remote(&b.url)
                .submit_task(&scripted("poisoned", steps.clone()))
                .await;
            id = a["id"].as_str().unwrap().to_string();
        }
        let pid = b.pid() as u64;
        until("the sleep started", || {
            env.debug_log()
                .iter()
                .any(|l| l["pid"].as_u64() == Some(pid))
        })
        .await;
        b.kill();
    }
    let b = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&b.url);
    let a = h.wait(&id).await;
    assert_eq!(a["status"], "failed", "{a}");
    assert_eq!(a["stop_reason"], "quarantined");
    assert!(a["error"].as_str().unwrap().contains("quarantined"), "{a}");
    assert_eq!(
        env.debug_log().len(),
        3,
        "the poisoned step never ran a fourth time"
    );
    // The service is healthy and serves new work.
    let ok = h.submit_task("after the quarantine").await;
    assert_eq!(h.wait(ok["id"].as_str().unwrap()).await["status"], "done");
    b.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_running_step_and_releases_the_turn() {
    let env = Env::new().await;
    let cfg = write_config(&env, "[workers]\nshutdown_grace_s = 20.0\n");
    let steps = json!([
        {"call": [{"name": "sleep", "args": {"ms": 500}}]},
        {"call": [{"name": "echo", "args": {"text": "after restart"}}]},
        {"say": "done"}
    ]);
    let first = Binary::start(&cfg, &env.path("stderr.log"));
    let a = Harness::remote(&first.url)
        .submit_task(&scripted("graceful", steps))
        .await;
    let id = a["id"].as_str().unwrap().to_string();
    let pid = first.pid();
    until("the sleep started", || {
        env.debug_log()
            .iter()
            .any(|l| l["pid"].as_u64() == Some(pid as u64))
    })
    .await;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut first = first;
    let exit = first.child.wait().unwrap();
    assert!(exit.success(), "graceful exit: {exit:?}");

    let second = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&second.url);
    let done = h.wait(&id).await;
    assert_eq!(done["status"], "done", "{done}");
    let log = env.debug_log();
    let sleeps = log.iter().filter(|l| l["tool"] == "sleep").count();
    assert_eq!(
        sleeps, 1,
        "the running step finished before exit and was not redone"
    );
    assert!(log
        .iter()
        .any(|l| l["tool"] == "echo" && l["pid"].as_u64() == Some(second.pid() as u64)));
    second.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_survive_a_kill_and_arrive_exactly_once() {
    let env = Env::new().await;
    let cfg = write_config(&env, "");
    let sleeper = |name: &str, says: &str| {
        scripted(
            name,
            json!([{"call": [{"name": "sleep", "args": {"ms": 1000}}]}, {"say": says}]),
        )
    };
    let fg = sleeper("fg child", "F done");
    let bg = sleeper("bg child", "B done");
    let first = Binary::start(&cfg, &env.path("stderr.log"));
    let parent = Harness::remote(&first.url)
        .submit_task(&scripted(
            "kill parent",
            json!([
                {"call": [
                    {"name": "spawn_agent", "args": {"task": bg, "background": true}},
                    {"name": "spawn_agent", "args": {"task": fg}}
                ]},
                {"say": "after the children"}
            ]),
        ))
        .await;
    let id = parent["id"].as_str().unwrap().to_string();
    let pid = first.pid() as u64;
    until("both children sleeping", || {
        env.debug_log()
            .iter()
            .filter(|l| l["pid"].as_u64() == Some(pid) && l["tool"] == "sleep")
            .count()
            == 2
    })
    .await;
    first.kill();

    let second = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&second.url);
    // A child's completion is written with its settle, so once both children
    // are done every completion exists; then the parent settles.
    let (_, tree) = h.get(&format!("/v1/agents/{id}/tree")).await;
    for c in tree["children"].as_array().unwrap() {
        let c = h.wait(c["id"].as_str().unwrap()).await;
        assert_eq!(c["status"], "done", "{c}");
    }
    let parent = h.wait(&id).await;
    assert_eq!(parent["status"], "done", "{parent}");
    let msgs = h.messages(&id).await;
    let summary: Vec<(Value, Value)> = msgs
        .iter()
        .map(|m| (m["role"].clone(), m["content"].clone()))
        .collect();
    let fg_results: Vec<&Value> = msgs
        .iter()
        .filter(|m| {
            m["role"] == "tool"
                && m["content"]
                    .as_str()
                    .unwrap()
                    .starts_with("[Sub-agent completed")
        })
        .collect();
    assert_eq!(
        fg_results.len(),
        1,
        "the foreground result arrived once: {summary:#?}"
    );
    assert!(fg_results[0]["content"]
        .as_str()
        .unwrap()
        .ends_with("F done"));
    let bg_messages: Vec<&Value> = msgs.iter().filter(|m| m["origin"] == "child").collect();
    assert_eq!(
        bg_messages.len(),
        1,
        "the background completion arrived once: {summary:#?}"
    );
    assert!(bg_messages[0]["content"]
        .as_str()
        .unwrap()
        .ends_with("B done"));
    assert!(
        msgs.iter().any(|m| m["content"] == "after the children"),
        "{summary:#?}"
    );
    second.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_messages_survive_kills_and_are_read_exactly_once() {
    let env = Env::new().await;
    let cfg = write_config(&env, "");
    let steps = json!([{"call": [{"name": "sleep", "args": {"ms": 1500}}]}, {"say": "slept"}]);
    let first = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&first.url);
    let a = h.submit_task(&scripted("inbox keeper", steps)).await;
    let id = a["id"].as_str().unwrap().to_string();
    let pid = first.pid() as u64;
    until("the sleep started", || {
        env.debug_log()
            .iter()
            .any(|l| l["pid"].as_u64() == Some(pid))
    })
    .await;
    // Five messages land in the inbox of the running agent.
    for i in 0..5 {
        let (s, v) = h
            .post(
                &format!("/v1/agents/{id}/messages"),
                json!({"content": format!("while busy {i}")}),
            )
            .await;
        assert_eq!(
            (s.as_u16(), v["delivery"].as_str()),
            (200, Some("queued")),
            "{v}"
        );
    }
    first.kill();

    // After the restart the turn resumes and reads them; three more arrive
    // and the process is killed again while they are being consumed.
    let second = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&second.url);
    h.wait(&id).await;
    for i in 0..3 {
        h.post(
            &format!("/v1/agents/{id}/messages"),
            json!({"content": format!("later {i}")}),
        )
        .await;
    }
    second.kill();
    let third = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&third.url);
    let mut msgs = Vec::new();
    for _ in 0..3000 {
        let (_, a) = h.get(&format!("/v1/agents/{id}")).await;
        msgs = h.messages(&id).await;
        let seen = (0..3).all(|i| msgs.iter().any(|m| m["content"] == format!("later {i}")));
        if a["status"] == "done" && seen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for text in (0..5)
        .map(|i| format!("while busy {i}"))
        .chain((0..3).map(|i| format!("later {i}")))
    {
        let n = msgs
            .iter()
            .filter(|m| m["content"] == text.as_str())
            .count();
        assert_eq!(n, 1, "`{text}` appears exactly once");
    }
    third.kill();
}

/// A crash between recording the final answer and settling the agent
/// leaves a running agent whose conversation already ends in that answer.
/// The resumed turn must settle with it, not ask the model again. The state
/// is made by hand (a real kill would have to land in that gap by luck):
/// a finished agent's rows are put back to what the crash leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_final_answer_settles_after_a_crash_without_a_new_model_call() {
    let env = Env::new().await;
    let cfg = write_config(&env, "");
    let first = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&first.url);
    let a = h
        .submit_task(&scripted("gap agent", json!([{"say": "final words"}])))
        .await;
    let id = a["id"].as_str().unwrap().to_string();
    let done = h.wait_settled(&id, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "done", "{done}");
    first.kill();
    let requests_before = env.mock_log().len();
    {
        use sqlx::Connection;
        let url = format!("sqlite://{}", env.path("agentq.db").display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        for sql in [
            "UPDATE agents SET status = 'running', result = NULL, stop_reason = NULL,
                    finished_at = NULL WHERE id = ?1",
            "UPDATE user_stats SET active_agents = active_agents + 1
              WHERE user_name = (SELECT user_name FROM agents WHERE id = ?1)",
            "UPDATE jobs SET state = 'running', lease_owner = 'gone', lease_expires_at = 0,
                    finished_at = NULL WHERE agent_id = ?1 AND kind = 'turn'",
        ] {
            let r = sqlx::query(sql).bind(&id).execute(&mut conn).await.unwrap();
            assert_eq!(r.rows_affected(), 1, "{sql}");
        }
        conn.close().await.unwrap();
    }

    let second = Binary::start(&cfg, &env.path("stderr.log"));
    let h = Harness::remote(&second.url);
    let after = h.wait_settled(&id, Duration::from_secs(30)).await;
    assert_eq!(after["status"], "done", "{after}");
    assert_eq!(after["result"], "final words", "{after}");
    assert_eq!(
        env.mock_log().len(),
        requests_before,
        "the model was asked again"
    );
    let answers = h
        .messages(&id)
        .await
        .into_iter()
        .filter(|m| m["role"] == "assistant")
        .count();
    assert_eq!(answers, 1);
    drop(second);
}
