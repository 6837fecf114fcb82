//! The `agentq` binary: parses the command line and calls into the library.

use std::process::ExitCode;

use clap::Parser;

use agentq::cli::{self, Cli, Command};
use agentq::{App, Config};

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENTQ_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Benchmarks print figures on stdout; only warnings go to stderr.
fn init_bench_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENTQ_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn serve(config: std::path::PathBuf) -> anyhow::Result<()> {
    let cfg = Config::load(&config)?;
    let app = App::start(cfg).await?;
    // One machine-readable line for scripts and tests that bind port 0.
    println!("agentq listening on {}", app.url());
    shutdown_signal().await;
    tracing::info!("shutting down");
    app.shutdown().await;
    Ok(())
}

async fn real_main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config } => {
            init_tracing();
            match serve(config).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("agentq: {e:#}");
                    cli::EXIT_USAGE
                }
            }
        }
        Command::Migrate { config } => {
            let r = async {
                let cfg = Config::load(&config)?;
                let n = agentq::db::Db::migrate_only(&cfg.database).await?;
                println!("{}: {n} migrations applied", cfg.database.path.display());
                anyhow::Ok(())
            }
            .await;
            match r {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("agentq: {e:#}");
                    cli::EXIT_USAGE
                }
            }
        }
        Command::MockLlm { bind, log } => {
            init_tracing();
            match agentq::model::mock_server::spawn(bind, log).await {
                Ok(server) => {
                    println!("mock model listening on {}", server.base_url());
                    shutdown_signal().await;
                    server.shutdown.cancel();
                    let _ = server.task.await;
                    0
                }
                Err(e) => {
                    eprintln!("agentq: cannot serve the mock model on {bind}: {e}");
                    cli::EXIT_USAGE
                }
            }
        }
        Command::Bench {
            workload,
            json,
            runs,
            one_run,
        } => {
            init_bench_tracing();
            if one_run {
                agentq::bench::one_run(workload).await
            } else {
                agentq::bench::main(workload, runs, json).await
            }
        }
        other => cli::run_client(other).await,
    }
}

fn main() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentq: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = rt.block_on(real_main());
    ExitCode::from(code.clamp(0, 255) as u8)
}
