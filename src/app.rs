//! Wiring: `App::start` builds the core from a config, rescues this node's
//! previous jobs, starts the worker pool and the background services, and
//! serves the HTTP API. `RunningApp::shutdown` stops everything gracefully.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::Config;
use crate::core::{Auth, Core, Stop};
use crate::db::{agents, jobs, Db, WriteCtx, WriteFuture};
use crate::definitions::Definitions;
use crate::model::ModelRouter;
use crate::services::{self, Services};
use crate::signals::Signals;
use crate::tools::debug::DebugLog;

/// Builder of a running service.
pub struct App;

/// A started service.
pub struct RunningApp {
    /// The bound HTTP address (useful with port 0).
    pub addr: SocketAddr,
    pub core: Arc<Core>,
    pool: JoinHandle<()>,
    services: Services,
    http_stop: CancellationToken,
    http: JoinHandle<()>,
}

impl App {
    /// Starts with the system clock, binding `[server] bind`.
    pub async fn start(cfg: Config) -> anyhow::Result<RunningApp> {
        Self::start_with(cfg, Clock::system()).await
    }

    /// Starts with a given clock.
    pub async fn start_with(cfg: Config, clock: Clock) -> anyhow::Result<RunningApp> {
        Self::start_opts(cfg, clock, false).await
    }

    /// Starts with a given clock, optionally recording step timings.
    pub async fn start_opts(
        cfg: Config,
        clock: Clock,
        step_timings: bool,
    ) -> anyhow::Result<RunningApp> {
        let core = build_core(cfg, clock, step_timings).await?;
        let addr = core.cfg.bind_addr();
        if core.auth.single_user() && !addr.ip().is_loopback() {
            bail!(
                "{}: server.bind: `{addr}` is not a loopback address; with no [[users]] configured \
                 agentq runs single-user and only binds loopback (add [[users]] to serve others)",
                core.cfg.source
            );
        }
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot bind {addr} (server.bind)"))?;
        let addr = listener.local_addr()?;

        let rescued = {
            let node = core.node.clone();
            let owner = core.owner.clone();
            core.db
                .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, u64> {
                    Box::pin(async move { jobs::rescue_node(ctx, &node, &owner).await })
                })
                .await?
        };
        if rescued > 0 {
            tracing::info!(
                jobs = rescued,
                "returned the previous instance's jobs to the queue"
            );
        }

        let mut svc = Services::new();
        svc.spawn("lease_heartbeat", &core, services::lease_heartbeat);
        svc.spawn("rescuer", &core, services::rescuer);
        svc.spawn("deadline_sweeper", &core, services::deadline_sweeper);
        svc.spawn("pruner", &core, services::pruner);
        svc.spawn("scheduler", &core, crate::scheduler::run);
        let pool = tokio::spawn(crate::worker::run_pool(Arc::clone(&core)));

        let router = crate::api::router(Arc::clone(&core));
        let http_stop = CancellationToken::new();
        let token = http_stop.clone();
        let http = tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(async move { token.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "HTTP server failed");
            }
        });
        tracing::info!(%addr, node = %core.node, "agentq is serving");
        Ok(RunningApp {
            addr,
            core,
            pool,
            services: svc,
            http_stop,
            http,
        })
    }
}

/// Loads definitions, models, users and the database into a `Core`.
pub async fn build_core(
    cfg: Config,
    clock: Clock,
    step_timings: bool,
) -> anyhow::Result<Arc<Core>> {
    let auth = Auth::from_config(&cfg)?;
    let catalog = crate::tools::builtin_catalog(&cfg);
    for tool in cfg.tools.approval.keys() {
        if !catalog.contains(tool) && !matches!(tool.as_str(), "echo" | "sleep") {
            return Err(crate::config::ConfigError::new(
                &cfg.source,
                format!("tools.approval.{tool}"),
                format!("unknown tool (known: {})", catalog.names().join(", ")),
            )
            .into());
        }
    }
    let definitions = Definitions::load(&cfg, &catalog)?;
    let models = ModelRouter::from_config(&cfg).map_err(anyhow::Error::msg)?;
    let signals = Arc::new(Signals::new());
    let db = Db::open(&cfg.database, clock.clone(), Arc::clone(&signals))
        .await
        .with_context(|| format!("cannot open the database {}", cfg.database.path.display()))?;
    let debug_log = match cfg.tools.debug_log.trim() {
        "" => None,
        p => Some(
            DebugLog::open(std::path::Path::new(p))
                .with_context(|| format!("{}: tools.debug_log: cannot open {p}", cfg.source))?,
        ),
    };
    let webhook_secret = cfg
        .webhooks
        .secret_env
        .as_ref()
        .and_then(|v| std::env::var(v).ok())
        .filter(|s| !s.is_empty());
    if cfg.webhooks.secret_env.is_some() && webhook_secret.is_none() {
        tracing::info!("webhooks.secret_env names an unset variable: webhooks go out unsigned");
    }
    let node = cfg.server.node.clone();
    let owner = format!("{node}:{}", uuid::Uuid::new_v4().simple());
    let core = Arc::new(Core {
        db,
        signals,
        models,
        catalog,
        definitions,
        clock,
        auth,
        node,
        owner,
        stop: Stop::default(),
        debug_log,
        http: reqwest::Client::new(),
        webhook_secret,
        step_timings: step_timings.then(crate::core::StepTimings::default),
        cfg,
    });
    for u in core.auth.users() {
        core.db
            .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
                Box::pin(async move {
                    agents::upsert_user(&mut ctx.conn, ctx.now, &u.name, u.admin).await
                })
            })
            .await?;
    }
    Ok(core)
}

impl RunningApp {
    /// The base URL of the API.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Graceful shutdown: stop claiming, let running steps finish within the
    /// grace period (then abort them and release their leases), stop the
    /// HTTP server and the services, close the database.
    pub async fn shutdown(self) {
        self.core.stop.soft.cancel();
        let _ = self.pool.await;
        self.http_stop.cancel();
        let _ = self.http.await;
        self.services.stop().await;
        self.core.db.close().await;
        tracing::info!("agentq stopped");
    }
}
