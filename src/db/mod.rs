//! The only place SQL lives. `Db` owns one writer connection behind a
//! group-commit task (every write goes through it, so SQLite never reports
//! "database is locked") and a pool of read-only connections. One file per
//! table family holds that family's queries as named functions.

pub mod agents;
pub mod approvals;
pub mod bench;
mod checkpoint;
pub mod events;
pub mod inbox;
pub mod jobs;
pub mod messages;
pub mod schedules;
pub mod steps;
pub mod todos;
pub mod waits;
pub mod writer;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};

use crate::clock::Clock;
use crate::config::{DatabaseConfig, Synchronous};
use crate::signals::Signals;

pub use writer::{Arg, RowKind, RowReq, Stmt, StmtOutput, WriteCtx, WriteFuture};

/// Errors of the storage layer. `Stale` means a guarded write found the row
/// no longer in the state the caller held (cancelled agent, lost lease).
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{what} `{id}` not found")]
    NotFound { what: &'static str, id: String },
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Limit(String),
    #[error("stale write: {0}")]
    Stale(String),
    #[error("commit failed: {0}")]
    Commit(String),
    #[error("the database writer has stopped")]
    WriterGone,
    #[error("corrupt row: {0}")]
    Corrupt(String),
}

impl DbError {
    /// Worth retrying the same write later (the database was busy or the
    /// commit failed); logic errors are not.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Sqlx(_) | Self::Commit(_))
    }
}

pub type DbResult<T> = Result<T, DbError>;

/// The embedded migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Handle to the database: cheap to clone.
#[derive(Clone)]
pub struct Db {
    writer: writer::Writer,
    checkpointer: Arc<checkpoint::Checkpointer>,
    read: SqlitePool,
    pub clock: Clock,
}

fn connect_options(path: &Path, sync: Synchronous) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(match sync {
            Synchronous::Normal => SqliteSynchronous::Normal,
            Synchronous::Full => SqliteSynchronous::Full,
        })
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(false)
        .statement_cache_capacity(512)
        .pragma("cache_size", "-32000")
        .pragma("temp_store", "memory")
        .pragma("wal_autocheckpoint", checkpoint::AUTOCHECKPOINT_PAGES)
        .disable_statement_logging()
}

/// Opens the file (creating it and its directory), applies migrations.
async fn open_writer_conn(cfg: &DatabaseConfig) -> DbResult<SqliteConnection> {
    if let Some(dir) = cfg.path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(|e| {
                DbError::Invalid(format!(
                    "cannot create the database directory {}: {e}",
                    dir.display()
                ))
            })?;
        }
    }
    let mut conn = connect_options(&cfg.path, cfg.synchronous)
        .create_if_missing(true)
        .connect()
        .await?;
    MIGRATOR.run_direct(&mut conn).await?;
    Ok(conn)
}

impl Db {
    /// Opens the database, runs migrations, starts the writer task.
    pub async fn open(cfg: &DatabaseConfig, clock: Clock, signals: Arc<Signals>) -> DbResult<Self> {
        let conn = open_writer_conn(cfg).await?;
        let read = SqlitePoolOptions::new()
            .max_connections(cfg.read_connections.max(1))
            .min_connections(1)
            .connect_with(connect_options(&cfg.path, cfg.synchronous).read_only(true))
            .await?;
        let writer = writer::Writer::start(conn, clock.clone(), signals);
        let checkpointer = Arc::new(checkpoint::Checkpointer::start(cfg).await?);
        Ok(Self {
            writer,
            checkpointer,
            read,
            clock,
        })
    }

    /// What the writer has done so far (benchmark breakdowns).
    pub fn writer_stats(&self) -> &writer::WriterStats {
        &self.writer.stats
    }

    /// Applies migrations without starting anything (`agentq migrate`).
    pub async fn migrate_only(cfg: &DatabaseConfig) -> DbResult<usize> {
        let conn = open_writer_conn(cfg).await?;
        let n = MIGRATOR.iter().count();
        conn.close().await?;
        Ok(n)
    }

    /// Runs `f` inside the group-committed write transaction and returns its
    /// result only after COMMIT (or its error after the rollback).
    pub async fn write<T, F>(&self, f: F) -> DbResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut WriteCtx) -> WriteFuture<'c, T> + Send + 'static,
    {
        self.writer.write(f).await
    }

    /// Runs a fixed script (one or more statements, all or nothing) in the
    /// group-committed transaction as one cached command; answers after
    /// COMMIT with one output per statement.
    pub async fn exec(&self, stmt: Stmt) -> DbResult<Vec<StmtOutput>> {
        self.writer.exec(stmt).await
    }

    /// Inserts one row of a hot-path kind, merged with other callers' rows of
    /// the same kind into one statement; answers after COMMIT with the new
    /// id (None when the row was guarded out or ignored).
    pub async fn insert_row(&self, row: RowReq) -> DbResult<Option<i64>> {
        self.writer.insert_row(row).await
    }

    /// The read-only pool.
    pub fn reader(&self) -> &SqlitePool {
        &self.read
    }

    /// Readiness: the database answers and every embedded migration is applied.
    pub async fn ready(&self) -> DbResult<()> {
        let applied: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success = 1")
                .fetch_one(&self.read)
                .await?;
        let expected = MIGRATOR.iter().count() as i64;
        if applied < expected {
            return Err(DbError::Invalid(format!(
                "{applied} of {expected} migrations applied"
            )));
        }
        Ok(())
    }

    /// Stops the writer after it drained what was queued, and closes the pool.
    pub async fn close(&self) {
        self.writer.stop().await;
        self.checkpointer.stop().await;
        self.read.close().await;
    }
}
