//! WAL checkpoints off the writer's path. SQLite's automatic checkpoint
//! runs inside the commit that crosses the threshold, so one unlucky
//! caller's write waits for pages to be copied and the database file to
//! be synced. Instead a connection of its own runs a passive checkpoint
//! every few hundred milliseconds (it never blocks the writer or readers);
//! the automatic one stays as a high backstop.

use std::time::Duration;

use sqlx::sqlite::SqliteConnection;
use sqlx::{ConnectOptions, Connection};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::DbResult;
use crate::config::DatabaseConfig;

/// How often the checkpointer runs.
const EVERY: Duration = Duration::from_millis(250);

/// WAL pages after which a commit checkpoints by itself (the backstop when
/// the checkpointer cannot keep up): about 64 MB.
pub(super) const AUTOCHECKPOINT_PAGES: &str = "16000";

pub(super) struct Checkpointer {
    stop: CancellationToken,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    pub(super) async fn start(cfg: &DatabaseConfig) -> DbResult<Self> {
        let conn = super::connect_options(&cfg.path, cfg.synchronous)
            .connect()
            .await?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(conn, stop.clone()));
        Ok(Self {
            stop,
            task: std::sync::Mutex::new(Some(task)),
        })
    }

    pub(super) async fn stop(&self) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

async fn run(mut conn: SqliteConnection, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(EVERY) => {}
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&mut conn)
            .await
        {
            tracing::warn!(error = %e, "WAL checkpoint failed; the next one retries");
        }
    }
    let _ = conn.close().await;
}
