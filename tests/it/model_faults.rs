//! Model faults through the HTTP mock: retries, Retry-After, timeouts,
//! fallback, total failure — and the service keeps serving.

use chrono::DateTime;
use serde_json::{json, Value};

use crate::common::{scripted, Env};

fn requests_for(env: &Env, marker: &str) -> Vec<Value> {
    env.mock_log()
        .into_iter()
        .filter(|l| {
            l["messages"][1]["content"]
                .as_str()
                .unwrap_or("")
                .contains(marker)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_is_retried() {
    let env = Env::new().await;
    let h = env.start("").await;
    let steps = json!([{"fail": 500, "times": 1, "then": {"say": "recovered"}}]);
    let a = h.submit_task(&scripted("m500", steps)).await;
    let done = h.wait(a["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["result"], "recovered");
    assert_eq!(requests_for(&env, "m500").len(), 2);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_waits_for_retry_after() {
    let env = Env::new().await;
    let h = env.start("").await;
    let steps = json!([{"fail": 429, "times": 1, "then": {"say": "after the pause"}}]);
    let a = h.submit_task(&scripted("m429", steps)).await;
    let done = h.wait(a["id"].as_str().unwrap()).await;
    assert_eq!(done["result"], "after the pause", "{done}");
    let reqs = requests_for(&env, "m429");
    assert_eq!(reqs.len(), 2);
    let t = |v: &Value| DateTime::parse_from_rfc3339(v["at"].as_str().unwrap()).unwrap();
    let gap = t(&reqs[1]) - t(&reqs[0]);
    // The mock sends `Retry-After: 1`; the backoff alone would be ~20 ms.
    assert!(
        gap.num_milliseconds() >= 950,
        "retried after {gap} despite Retry-After: 1"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_is_retried() {
    let env = Env::new().await;
    let h = env.start("[providers.mock]\ntimeout_s = 0.5\n").await;
    let steps = json!([{"fail": "timeout", "times": 1, "then": {"say": "in time"}}]);
    let a = h.submit_task(&scripted("mtimeout", steps)).await;
    let done = h.wait(a["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["result"], "in time");
    assert_eq!(requests_for(&env, "mtimeout").len(), 2);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_primary_falls_back_to_the_backup() {
    let env = Env::new().await;
    let h = env
        .start("[roles]\ndefault = [\"primary\", \"backup\"]\n")
        .await;
    let steps = json!([
        {"fail": 500, "times": 99, "only_model": "primary"},
        {"say": "from backup"}
    ]);
    let a = h.submit_task(&scripted("mfallback", steps)).await;
    let done = h.wait(a["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["result"], "from backup");
    let models: Vec<String> = requests_for(&env, "mfallback")
        .iter()
        .map(|r| r["model"].as_str().unwrap().to_string())
        .collect();
    // One try plus two retries on the primary, then the backup.
    assert_eq!(models, ["primary", "primary", "primary", "backup"]);
    let msgs = h.messages(a["id"].as_str().unwrap()).await;
    assert_eq!(msgs.last().unwrap()["model"], "backup");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_model_fails_the_agent_fails_naming_them() {
    let env = Env::new().await;
    let h = env
        .start("[roles]\ndefault = [\"primary\", \"backup\"]\n")
        .await;
    // Six failures: one try and two retries on each model.
    let steps = json!([{"fail": 500, "times": 6, "then": {"say": "second wind"}}]);
    let a = h.submit_task(&scripted("mdown", steps)).await;
    let done = h.wait(a["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["stop_reason"], "error");
    let err = done["error"].as_str().unwrap();
    assert!(err.contains("primary") && err.contains("backup"), "{err}");
    assert!(err.contains("HTTP 500"), "names the last error: {err}");
    assert_eq!(requests_for(&env, "mdown").len(), 6);
    // The service keeps serving.
    let (s, _) = h.get("/healthz").await;
    assert_eq!(s, 200);
    let ok = h.submit_task("still alive").await;
    let ok = h.wait(ok["id"].as_str().unwrap()).await;
    assert_eq!(ok["result"], "ok: still alive");
    // A failed agent wakes again on a human message.
    let id = a["id"].as_str().unwrap();
    let (s, v) = h
        .post(
            &format!("/v1/agents/{id}/messages"),
            json!({"content": "try again"}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(v["delivery"], "started");
    let again = h.wait(id).await;
    assert_eq!(again["status"], "done", "{again}");
    assert_eq!(again["result"], "second wind");
    h.shutdown().await;
}
