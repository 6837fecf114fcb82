//! `agentq bench` workloads at a small scale: each must run end to end and
//! report every figure with nothing lost. Timing is never asserted here.

use agentq::bench::{self, Report};

fn assert_clean(r: &Report, figures: &[&str]) {
    assert!(r.failures.is_empty(), "{:?}: {:?}", r.workload, r.failures);
    for f in figures {
        let v = r
            .get(f)
            .unwrap_or_else(|| panic!("{:?} lacks {f}", r.workload));
        assert!(v.is_finite() && v >= 0.0, "{f} = {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w1_enqueues_and_drains_every_job() {
    let p = bench::w1::Params {
        jobs: 500,
        batch: 100,
        in_flight: 64,
        workers: 4,
        claim_batch: 16,
    };
    let r = bench::w1::run(&p).await.unwrap();
    assert_clean(
        &r,
        &["enqueue_single_per_s", "enqueue_batch_per_s", "drain_per_s"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w2_records_every_step_in_process_and_over_http() {
    let p = bench::w2::Params {
        agents: 12,
        workers: 4,
        echoes: 2,
    };
    let r = bench::w2::run(&p).await.unwrap();
    assert_clean(
        &r,
        &["turns_per_s", "http_turns_per_s", "p99_step_overhead_ms"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w3_parent_waits_for_every_child() {
    let p = bench::w3::Params {
        children: 8,
        echoes: 1,
    };
    let r = bench::w3::run(&p).await.unwrap();
    assert_clean(&r, &["fanout_wall_ms"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w4_kill_and_restart_loses_and_repeats_nothing() {
    let p = bench::w4::Params {
        agents: 40,
        workers: 8,
        echoes: 2,
        kill_at: 0.5,
        exe: env!("CARGO_BIN_EXE_agentq").into(),
    };
    let r = bench::w4::run(&p).await.unwrap();
    assert_clean(
        &r,
        &[
            "finished",
            "reexecuted_recorded_steps",
            "restart_to_done_ms",
        ],
    );
    assert_eq!(r.get("finished"), Some(40.0));
    assert_eq!(r.get("reexecuted_recorded_steps"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w5_runs_every_agent_while_the_api_is_polled() {
    let p = bench::w5::Params {
        agents: 200,
        echoes: 1,
        delay_ms: 200,
        poll_per_s: 100,
    };
    let r = bench::w5::run(&p).await.unwrap();
    assert_clean(&r, &["api_p99_ms", "makespan_s"]);
}

#[tokio::test]
async fn the_command_rejects_an_unknown_workload() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "w9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("w9") && err.contains("w1"), "{err}");
}
