//! The command line: `serve`, `migrate`, `mock-llm`, and client commands
//! that talk to a running server at `AGENTQ_URL` with `AGENTQ_TOKEN`.
//! Exit codes: 0 ok, 1 the agent failed, 2 usage or connection errors.

pub mod client;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use client::{Client, ClientError};

/// Exit code: the agent failed (or was cancelled / timed out).
pub const EXIT_AGENT_FAILED: i32 = 1;
/// Exit code: usage or connection error.
pub const EXIT_USAGE: i32 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "agentq",
    version,
    about = "A durable job-queue runtime for LLM agents"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Where client commands find the server.
#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// The agentq server.
    #[arg(
        long,
        env = "AGENTQ_URL",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    pub url: String,
    /// Bearer token (needed when the server has [[users]]).
    #[arg(long, env = "AGENTQ_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service.
    Serve {
        /// The config file.
        #[arg(long, env = "AGENTQ_CONFIG", default_value = "config/agentq.toml")]
        config: PathBuf,
    },
    /// Apply database migrations and exit.
    Migrate {
        #[arg(long, env = "AGENTQ_CONFIG", default_value = "config/agentq.toml")]
        config: PathBuf,
    },
    /// Serve the scripted mock model over HTTP (OpenAI protocol).
    MockLlm {
        #[arg(long, default_value = "127.0.0.1:8089")]
        bind: SocketAddr,
        /// Append one JSON line per request to this file.
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Run a benchmark workload (see BENCH.md).
    Bench {
        /// The workload of BENCH.md to run.
        #[arg(value_enum)]
        workload: crate::bench::Workload,
        /// Also print one JSON object with every figure, the settings and
        /// the machine.
        #[arg(long)]
        json: bool,
        /// Runs per workload; figures are the median, with the spread.
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// Internal: one run in this process, the report as JSON.
        #[arg(long, hide = true)]
        one_run: bool,
    },
    /// Submit a task to a new agent.
    Submit(SubmitArgs),
    /// List agents, newest first.
    Ls {
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show one agent.
    Show {
        /// UUID or handle.
        agent: String,
        /// Also print the conversation.
        #[arg(long)]
        messages: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Send a message to an agent (as a human).
    Send {
        agent: String,
        message: String,
        /// Abort the running model call and restart the step with this message.
        #[arg(long)]
        interrupt: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cancel an agent and its whole subtree.
    Cancel {
        agent: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Close an agent: it accepts no more messages.
    Close {
        agent: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show an agent's todo list.
    Todo {
        agent: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show an agent and all its sub-agents.
    Tree {
        agent: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cron briefs and heartbeats.
    Schedule {
        #[command(subcommand)]
        action: ScheduleAction,
        #[command(flatten)]
        remote: Remote,
    },
    /// List pending tool approvals, or approve / deny one.
    Approvals {
        #[command(subcommand)]
        action: Option<ApprovalAction>,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Create a schedule.
    Add {
        /// 5 fields (minute first) or 6 (seconds first).
        #[arg(long)]
        cron: String,
        /// brief (a fresh agent per fire) or heartbeat (a message to `--target`).
        #[arg(long, default_value = "brief")]
        kind: String,
        /// The brief's task, or the heartbeat prompt.
        #[arg(long)]
        task: Option<String>,
        /// Definition slug of a brief's agents.
        #[arg(long)]
        agent: Option<String>,
        /// The heartbeat's agent (id or handle).
        #[arg(long)]
        target: Option<String>,
        /// IANA timezone of the cron expression.
        #[arg(long)]
        tz: Option<String>,
        #[arg(long)]
        name: Option<String>,
        /// skip (default) or queue.
        #[arg(long)]
        overlap: Option<String>,
    },
    /// List schedules.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Delete a schedule.
    Rm { id: String },
    /// Fire a schedule once now.
    Run { id: String },
}

#[derive(Debug, Subcommand)]
pub enum ApprovalAction {
    /// List pending approvals (the default).
    Ls,
    /// Let the tool call run.
    Approve {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Refuse the tool call (the agent is told why).
    Deny {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The task (the agent's first user message).
    pub task: String,
    /// Definition slug.
    #[arg(long)]
    pub agent: Option<String>,
    #[arg(long)]
    pub role: Option<String>,
    #[arg(long)]
    pub max_turns: Option<i64>,
    #[arg(long)]
    pub max_cost_usd: Option<f64>,
    #[arg(long)]
    pub timeout_s: Option<f64>,
    /// Wait for the agent to finish and print its result.
    #[arg(long)]
    pub wait: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: Remote,
}

/// Runs a client command; returns the exit code.
pub async fn run_client(cmd: Command) -> i32 {
    let r = match cmd {
        Command::Submit(a) => submit(a).await,
        Command::Ls {
            status,
            limit,
            json,
            remote,
        } => ls(&remote, status, limit, json).await,
        Command::Show {
            agent,
            messages,
            json,
            remote,
        } => show(&remote, &agent, messages, json).await,
        Command::Send {
            agent,
            message,
            interrupt,
            remote,
        } => send(&remote, &agent, &message, interrupt).await,
        Command::Cancel { agent, remote } => cancel(&remote, &agent).await,
        Command::Close { agent, remote } => close(&remote, &agent).await,
        Command::Tree {
            agent,
            json,
            remote,
        } => tree(&remote, &agent, json).await,
        Command::Todo {
            agent,
            json,
            remote,
        } => todo(&remote, &agent, json).await,
        Command::Schedule { action, remote } => schedule(&remote, action).await,
        Command::Approvals { action, remote } => {
            approvals(&remote, action.unwrap_or(ApprovalAction::Ls)).await
        }
        Command::Serve { .. }
        | Command::Migrate { .. }
        | Command::MockLlm { .. }
        | Command::Bench { .. } => {
            eprintln!("agentq: not a client command");
            return EXIT_USAGE;
        }
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentq: {e}");
            EXIT_USAGE
        }
    }
}

fn client(r: &Remote) -> Client {
    Client::new(&r.url, r.token.clone())
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        format!("{}…", flat.chars().take(max - 1).collect::<String>())
    }
}

fn settled(status: &str) -> bool {
    matches!(status, "done" | "failed" | "cancelled" | "timed_out")
}

fn exit_for(agent: &Value) -> i32 {
    if s(agent, "status") == "done" {
        0
    } else {
        EXIT_AGENT_FAILED
    }
}

async fn submit(a: SubmitArgs) -> Result<i32, ClientError> {
    let c = client(&a.remote);
    let mut body = json!({"task": a.task});
    for (k, v) in [
        ("agent", a.agent.map(Value::from)),
        ("role", a.role.map(Value::from)),
        ("max_turns", a.max_turns.map(Value::from)),
        ("max_cost_usd", a.max_cost_usd.map(Value::from)),
        ("timeout_s", a.timeout_s.map(Value::from)),
    ] {
        if let Some(v) = v {
            body[k] = v;
        }
    }
    let agent = c.post("/v1/agents", &body).await?;
    let id = s(&agent, "id").to_string();
    if !a.wait {
        if a.json {
            println!("{agent:#}");
        } else {
            println!("{} {}", s(&agent, "handle"), id);
        }
        return Ok(0);
    }
    eprintln!("submitted {} ({id}); waiting…", s(&agent, "handle"));
    let mut last_status = String::new();
    let done = loop {
        let now = c.get(&format!("/v1/agents/{id}/wait?timeout_s=30")).await?;
        let status = s(&now, "status").to_string();
        if settled(&status) {
            break now;
        }
        if status != last_status {
            eprintln!(
                "  {} is {status} ({} model calls so far)",
                s(&now, "handle"),
                now.pointer("/usage/turns")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
            );
            last_status = status;
        }
    };
    if a.json {
        println!("{done:#}");
    } else if s(&done, "status") == "done" {
        println!("{}", s(&done, "result"));
    } else {
        eprintln!(
            "agent {} {}: {}",
            s(&done, "handle"),
            s(&done, "status"),
            s(&done, "error")
        );
    }
    Ok(exit_for(&done))
}

async fn ls(
    r: &Remote,
    status: Option<String>,
    limit: u32,
    json: bool,
) -> Result<i32, ClientError> {
    let mut path = format!("/v1/agents?limit={limit}");
    if let Some(st) = status {
        path.push_str(&format!("&status={st}"));
    }
    let v = c_get(r, &path).await?;
    if json {
        println!("{v:#}");
        return Ok(0);
    }
    let agents = v
        .get("agents")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    println!(
        "{:<10} {:<10} {:>3} {:<12} {:<20} TASK",
        "HANDLE", "STATUS", "LVL", "DEFINITION", "CREATED"
    );
    for a in agents {
        println!(
            "{:<10} {:<10} {:>3} {:<12} {:<20} {}",
            s(&a, "handle"),
            s(&a, "status"),
            a.get("level").and_then(Value::as_i64).unwrap_or(0),
            s(&a, "definition"),
            &s(&a, "created_at").chars().take(19).collect::<String>(),
            one_line(s(&a, "task"), 60)
        );
    }
    Ok(0)
}

async fn c_get(r: &Remote, path: &str) -> Result<Value, ClientError> {
    client(r).get(path).await
}

async fn show(
    r: &Remote,
    agent: &str,
    with_messages: bool,
    json: bool,
) -> Result<i32, ClientError> {
    let c = client(r);
    let a = c.get(&format!("/v1/agents/{agent}")).await?;
    let msgs = if with_messages {
        Some(
            c.get(&format!("/v1/agents/{}/messages", s(&a, "id")))
                .await?,
        )
    } else {
        None
    };
    if json {
        let mut out = a.clone();
        if let Some(m) = msgs {
            out["messages"] = m["messages"].clone();
        }
        println!("{out:#}");
        return Ok(0);
    }
    println!("agent     {} ({})", s(&a, "handle"), s(&a, "id"));
    println!("status    {}", s(&a, "status"));
    println!(
        "level     {}  definition {}  role {}",
        a["level"],
        s(&a, "definition"),
        s(&a, "role")
    );
    if let Some(p) = a.get("parent_id").and_then(Value::as_str) {
        println!("parent    {p}");
    }
    println!(
        "usage     {} model calls · {} tokens in · {} out · ${:.4}",
        a["usage"]["turns"],
        a["usage"]["tokens_in"],
        a["usage"]["tokens_out"],
        a["usage"]["cost_usd"].as_f64().unwrap_or(0.0)
    );
    println!("task      {}", one_line(s(&a, "task"), 100));
    if let Some(e) = a.get("error").and_then(Value::as_str) {
        println!("error     {e}");
    }
    if let Some(res) = a.get("result").and_then(Value::as_str) {
        println!("result\n{res}");
    }
    if let Some(m) = msgs {
        println!("\nconversation");
        for msg in m["messages"].as_array().cloned().unwrap_or_default() {
            let role = s(&msg, "role");
            let mut line = format!("  [{}] {role}", msg["id"]);
            if let Some(o) = msg.get("origin").and_then(Value::as_str) {
                line.push_str(&format!(" ({o})"));
            }
            if let Some(calls) = msg.get("tool_calls").and_then(Value::as_array) {
                let names: Vec<&str> = calls.iter().map(|c| s(c, "name")).collect();
                line.push_str(&format!(" calls {}", names.join(", ")));
            }
            println!("{line}: {}", one_line(s(&msg, "content"), 120));
        }
    }
    Ok(exit_for(&a).min(0))
}

async fn send(r: &Remote, agent: &str, message: &str, interrupt: bool) -> Result<i32, ClientError> {
    let mode = if interrupt { "interrupt" } else { "queue" };
    let v = client(r)
        .post(
            &format!("/v1/agents/{agent}/messages"),
            &json!({"content": message, "mode": mode}),
        )
        .await?;
    println!("{}", s(&v, "delivery"));
    Ok(0)
}

async fn cancel(r: &Remote, agent: &str) -> Result<i32, ClientError> {
    let v = client(r)
        .post(&format!("/v1/agents/{agent}/cancel"), &json!({}))
        .await?;
    println!("{} {}", s(&v, "handle"), s(&v, "status"));
    Ok(0)
}

async fn close(r: &Remote, agent: &str) -> Result<i32, ClientError> {
    let v = client(r)
        .post(&format!("/v1/agents/{agent}/close"), &json!({}))
        .await?;
    println!("{} closed", s(&v, "handle"));
    Ok(0)
}

fn print_tree(node: &Value, depth: usize) {
    println!(
        "{}{} {} L{} {} ${:.4} — {}",
        "  ".repeat(depth),
        s(node, "handle"),
        s(node, "status"),
        node["level"],
        s(node, "definition"),
        node["usage"]["subtree_cost_usd"].as_f64().unwrap_or(0.0),
        one_line(s(node, "task"), 60)
    );
    for c in node["children"].as_array().cloned().unwrap_or_default() {
        print_tree(&c, depth + 1);
    }
}

async fn tree(r: &Remote, agent: &str, json: bool) -> Result<i32, ClientError> {
    let v = client(r).get(&format!("/v1/agents/{agent}/tree")).await?;
    if json {
        println!("{v:#}");
    } else {
        print_tree(&v, 0);
    }
    Ok(0)
}

async fn approvals(r: &Remote, action: ApprovalAction) -> Result<i32, ClientError> {
    let c = client(r);
    let (id, decision, reason) = match action {
        ApprovalAction::Ls => {
            let v = c.get("/v1/approvals").await?;
            let list = v["approvals"].as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                println!("no pending approvals");
            }
            for a in list {
                println!(
                    "{}  agent {}  {} {}",
                    s(&a, "id"),
                    &s(&a, "agent_id").chars().take(8).collect::<String>(),
                    s(&a, "tool"),
                    one_line(&a["arguments"].to_string(), 80)
                );
            }
            return Ok(0);
        }
        ApprovalAction::Approve { id, reason } => (id, "approve", reason),
        ApprovalAction::Deny { id, reason } => (id, "deny", reason),
    };
    let v = c
        .post(
            &format!("/v1/approvals/{id}"),
            &json!({"decision": decision, "reason": reason}),
        )
        .await?;
    println!("{} {}", s(&v, "id"), s(&v, "status"));
    Ok(0)
}

async fn todo(r: &Remote, agent: &str, json: bool) -> Result<i32, ClientError> {
    let v = client(r).get(&format!("/v1/agents/{agent}/todos")).await?;
    if json {
        println!("{v:#}");
        return Ok(0);
    }
    let items = v["todos"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        println!("(empty todo list)");
    }
    for t in items {
        let mark = match s(&t, "status") {
            "completed" => "[x]",
            "in_progress" => "[~]",
            "cancelled" => "[-]",
            _ => "[ ]",
        };
        println!(
            "{mark} {:>4} {:<6} {}",
            s(&t, "id"),
            s(&t, "priority"),
            s(&t, "content")
        );
    }
    println!("{} completed, {} remaining", v["completed"], v["remaining"]);
    Ok(0)
}

async fn schedule(r: &Remote, action: ScheduleAction) -> Result<i32, ClientError> {
    let c = client(r);
    match action {
        ScheduleAction::Add {
            cron,
            kind,
            task,
            agent,
            target,
            tz,
            name,
            overlap,
        } => {
            let mut body = json!({"cron": cron, "kind": kind});
            for (k, v) in [
                ("task", task),
                ("agent", agent),
                ("target", target),
                ("timezone", tz),
                ("name", name),
                ("overlap", overlap),
            ] {
                if let Some(v) = v {
                    body[k] = Value::String(v);
                }
            }
            let v = c.post("/v1/schedules", &body).await?;
            println!("{} next fire {}", s(&v, "id"), s(&v, "next_fire_at"));
        }
        ScheduleAction::Ls { json } => {
            let v = c.get("/v1/schedules").await?;
            if json {
                println!("{v:#}");
                return Ok(0);
            }
            println!(
                "{:<36} {:<9} {:<7} {:<18} {:<24} NAME",
                "ID", "KIND", "ENABLED", "CRON", "NEXT"
            );
            for sch in v["schedules"].as_array().cloned().unwrap_or_default() {
                println!(
                    "{:<36} {:<9} {:<7} {:<18} {:<24} {}",
                    s(&sch, "id"),
                    s(&sch, "kind"),
                    sch["enabled"],
                    s(&sch, "cron"),
                    s(&sch, "next_fire_at"),
                    s(&sch, "name")
                );
            }
        }
        ScheduleAction::Rm { id } => {
            let v = c.delete(&format!("/v1/schedules/{id}")).await?;
            println!("{} deleted", s(&v, "id"));
        }
        ScheduleAction::Run { id } => {
            let v = c
                .post(&format!("/v1/schedules/{id}/run"), &json!({}))
                .await?;
            println!("{} {}", s(&v, "outcome"), s(&v, "agent_id"));
        }
    }
    Ok(0)
}
