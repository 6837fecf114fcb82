//! The HTTP API: bad input, auth and per-user scoping, idempotency,
//! listings and messages.

use reqwest::StatusCode;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::common::{scripted, Env, Harness};

fn sha(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_4xx_answers() {
    let env = Env::new().await;
    let h = env.start("[server]\nmax_body_bytes = 4096\n").await;

    let (s, v) = h.post_raw("/v1/agents", b"{\"task\": ".to_vec()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "bad_request");

    let (s, v) = h.post("/v1/agents", json!({})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("task"),
        "{v}"
    );

    let (s, v) = h.post("/v1/agents", json!({"task": "   "})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["error"]["message"].as_str().unwrap().starts_with("task:"),
        "{v}"
    );

    let (s, v) = h.post("/v1/agents", json!({"task": 42})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("task"),
        "{v}"
    );

    let big = json!({"task": "x".repeat(10_000)});
    let (s, v) = h.post("/v1/agents", big).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["error"]["code"], "payload_too_large");

    let (s, v) = h
        .get("/v1/agents/00000000-0000-4000-8000-000000000000")
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, _) = h.get("/v1/agents/zz%25z").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    let (s, v) = h
        .post("/v1/agents", json!({"task": "t", "agent": "nope"}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown definition `nope`"),
        "{v}"
    );

    let (s, v) = h
        .post("/v1/agents", json!({"task": "t", "max_turns": 0}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("max_turns"),
        "{v}"
    );

    let (s, v) = h
        .post("/v1/agents", json!({"task": "t", "tools": ["nope"]}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["error"]["message"].as_str().unwrap().starts_with("tools"),
        "{v}"
    );

    let (s, v) = h
        .post("/v1/agents", json!({"task": "t", "surprise": 1}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("surprise"),
        "{v}"
    );

    let (s, v) = h
        .post(
            "/v1/agents",
            json!({"task": "t", "notify": {"webhook_url": "ftp://x"}}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("notify.webhook_url"),
        "{v}"
    );

    let (s, v) = h.get("/v1/agents?status=sleeping").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("status"),
        "{v}"
    );

    let a = h.submit_task("fine").await;
    let id = a["id"].as_str().unwrap();
    let (s, v) = h
        .post(&format!("/v1/agents/{id}/messages"), json!({"content": ""}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (s, _) = h
        .post(
            &format!("/v1/agents/{id}/messages"),
            json!({"content": "x", "mode": "shout"}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);

    // Nothing above produced a 500 or lost the good agent.
    let done = h.wait(id).await;
    assert_eq!(done["result"], "ok: fine");
    let (s, list) = h.get("/v1/agents").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_scope_every_read_and_write_to_their_user() {
    let env = Env::new().await;
    let users = format!(
        "[[users]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\nadmin = true\n\
         [[users]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n",
        sha("alice-token"),
        sha("bob-token")
    );
    let h = env.start(&users).await;
    let alice = h.with_token("alice-token");
    let bob = h.with_token("bob-token");
    let nobody = h.with_token("wrong");

    let (s, v) = h.post("/v1/agents", json!({"task": "no token"})).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    let (s, _) = nobody.get("/v1/agents").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    let a = alice.submit_task("alice's").await;
    let id = a["id"].as_str().unwrap();
    assert_eq!(a["user"], "alice");
    alice.wait(id).await;
    let (s, _) = bob.get(&format!("/v1/agents/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = bob.get(&format!("/v1/agents/{}", &id[..6])).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "handles do not reach other users' agents"
    );
    let (s, _) = bob
        .post(
            &format!("/v1/agents/{id}/messages"),
            json!({"content": "hi"}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = bob
        .post(&format!("/v1/agents/{id}/cancel"), json!({}))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, list) = bob.get("/v1/agents").await;
    assert_eq!(list["agents"].as_array().unwrap().len(), 0);
    let (_, list) = alice.get("/v1/agents").await;
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);
    h.shutdown().await;
}

#[test]
fn single_user_mode_refuses_non_loopback_binds() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let env = Env::new().await;
        let err = agentq::App::start(env.config("[server]\nbind = \"0.0.0.0:0\"\n"))
            .await
            .err()
            .expect("must refuse");
        assert!(err.to_string().contains("loopback"), "{err}");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_returns_the_same_agent() {
    let env = Env::new().await;
    let h = env.start("").await;
    let send = || async {
        h.http
            .post(format!("{}/v1/agents", h.base))
            .header("Idempotency-Key", "order-42")
            .json(&json!({"task": "once"}))
            .send()
            .await
            .unwrap()
    };
    let r1 = send().await;
    assert_eq!(r1.status(), StatusCode::CREATED);
    let a1: serde_json::Value = r1.json().await.unwrap();
    let r2 = send().await;
    assert_eq!(r2.status(), StatusCode::OK);
    let a2: serde_json::Value = r2.json().await.unwrap();
    assert_eq!(a1["id"], a2["id"]);
    let (_, list) = h.get("/v1/agents").await;
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_is_newest_first_with_filters_and_pages() {
    let env = Env::new().await;
    let h = env.start("").await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let a = h.submit_task(&format!("task {i}")).await;
        ids.push(a["id"].as_str().unwrap().to_string());
        h.wait(&ids[i]).await;
    }
    let failing = h
        .submit_task(&scripted("fails", json!([{"fail": 400, "times": 1}])))
        .await;
    h.wait(failing["id"].as_str().unwrap()).await;

    let (_, v) = h.get("/v1/agents?limit=2").await;
    let page: Vec<&str> = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(page, [failing["id"].as_str().unwrap(), ids[4].as_str()]);
    let next = v["next_before"].as_str().unwrap();
    let (_, v) = h.get(&format!("/v1/agents?limit=2&before={next}")).await;
    let page: Vec<&str> = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(page, [ids[3].as_str(), ids[2].as_str()]);
    let (_, v) = h.get("/v1/agents?status=failed").await;
    assert_eq!(v["agents"].as_array().unwrap().len(), 1);
    let (_, v) = h.get("/v1/agents?status=done&level=1").await;
    assert_eq!(v["agents"].as_array().unwrap().len(), 5);
    // Handles are shown and resolve.
    let handle = v["agents"][0]["handle"].as_str().unwrap().to_string();
    assert!(handle.len() >= 4);
    let (s, one) = h
        .get(&format!("/v1/agents/{}", handle.to_uppercase()))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(one["handle"], handle);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_to_an_idle_agent_starts_a_turn_and_close_refuses_more() {
    let env = Env::new().await;
    let h = env.start("").await;
    let a = h.submit_task("first").await;
    let id = a["id"].as_str().unwrap();
    assert_eq!(h.wait(id).await["result"], "ok: first");
    let (s, v) = h
        .post(
            &format!("/v1/agents/{id}/messages"),
            json!({"content": "second"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["delivery"], "started");
    let done = h.wait(id).await;
    assert_eq!(done["result"], "ok: second");
    let msgs = h.messages(id).await;
    assert_eq!(msgs.len(), 5);
    assert_eq!(msgs[3]["origin"], "human");
    let (s, v) = h.post(&format!("/v1/agents/{id}/close"), json!({})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["closed"], true);
    let (s, v) = h
        .post(
            &format!("/v1/agents/{id}/messages"),
            json!({"content": "third"}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness() {
    let env = Env::new().await;
    let h = env.start("").await;
    let (s, v) = h.get("/healthz").await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (s, v) = h.get("/readyz").await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ready")));
    let (s, v) = h.get("/v1/nothing").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], "not_found");
    let _ = Harness::remote(&h.base);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_agent_limit_refuses_until_one_finishes() {
    let env = Env::new().await;
    let h = env.start("[agents]\nmax_active_agents_per_user = 2").await;
    let slow = scripted("slow", json!([{"say": "late", "delay_ms": 30000}]));
    let a = h.submit_task(&slow).await;
    h.submit_task(&slow).await;
    let (status, body) = h.post("/v1/agents", json!({"task": "third"})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("too many active agents") && message.contains("(2/2)"),
        "{body}"
    );
    // Cancelling one frees its place.
    let id = a["id"].as_str().unwrap();
    let (status, _) = h.post(&format!("/v1/agents/{id}/cancel"), json!({})).await;
    assert!(status.is_success());
    let (status, body) = h.post("/v1/agents", json!({"task": "fourth"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    h.shutdown().await;
}
