//! Group commit. One task owns the only writable connection. Callers send
//! write closures; the task takes everything queued (up to a cap), runs it in
//! one `BEGIN IMMEDIATE` transaction with a savepoint per closure (a failing
//! closure rolls back only its own rows), commits once, and only then answers
//! each caller and applies the side effects (events, wake-ups, cancels). No
//! caller ever hears "done" for a write that is not committed.

use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::sqlite::SqliteConnection;
use sqlx::Executor;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::{DbError, DbResult};
use crate::clock::Clock;
use crate::signals::{Effects, Signals};

/// The most closures committed in one transaction. Large enough to amortise
/// the commit, small enough that a batch never holds the lock for long.
const MAX_BATCH: usize = 512;

/// What a write closure sees: the connection (inside the transaction), the
/// batch's `now`, and the effects to apply after commit.
pub struct WriteCtx {
    pub conn: SqliteConnection,
    /// Milliseconds since the epoch, taken when the batch began.
    pub now: i64,
    pub effects: Effects,
}

/// The future a write closure returns.
pub type WriteFuture<'c, T> = BoxFuture<'c, DbResult<T>>;

type Reply = Box<dyn FnOnce(Option<DbError>) + Send>;
type Op = Box<dyn for<'c> FnOnce(&'c mut WriteCtx) -> BoxFuture<'c, (bool, Reply)> + Send>;

#[derive(Clone)]
pub(super) struct Writer {
    tx: mpsc::Sender<Op>,
    task: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Writer {
    pub(super) fn start(conn: SqliteConnection, clock: Clock, signals: Arc<Signals>) -> Self {
        let (tx, rx) = mpsc::channel::<Op>(8192);
        let ctx = WriteCtx {
            conn,
            now: 0,
            effects: Effects::default(),
        };
        let task = tokio::spawn(run(ctx, rx, clock, signals));
        Self {
            tx,
            task: Arc::new(Mutex::new(Some(task))),
        }
    }

    pub(super) async fn write<T, F>(&self, f: F) -> DbResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut WriteCtx) -> WriteFuture<'c, T> + Send + 'static,
    {
        let (done_tx, done_rx) = oneshot::channel::<DbResult<T>>();
        let op: Op = Box::new(move |ctx: &mut WriteCtx| {
            Box::pin(async move {
                let r = f(ctx).await;
                let ok = r.is_ok();
                let reply: Reply = Box::new(move |commit_err: Option<DbError>| {
                    let _ = done_tx.send(match commit_err {
                        None => r,
                        Some(e) => Err(e),
                    });
                });
                (ok, reply)
            })
        });
        self.tx.send(op).await.map_err(|_| DbError::WriterGone)?;
        // A dropped reply means the closure was never run: its batch's
        // transaction broke before reaching it, or the writer stopped.
        done_rx.await.map_err(|_| {
            DbError::Commit(
                "the write was not run: its transaction failed or the writer stopped".into(),
            )
        })?
    }

    /// Closes the channel, lets the task drain it, waits for the task.
    pub(super) async fn stop(&self) {
        let task = self.task.lock().await.take();
        if let Some(task) = task {
            // Dropping our sender is not enough (clones exist); the task
            // ends when every sender is gone, so instead close from inside:
            // send a no-op barrier and abort after it answered.
            let _ = self
                .write(|_ctx: &mut WriteCtx| -> WriteFuture<'_, ()> { Box::pin(async { Ok(()) }) })
                .await;
            task.abort();
            let _ = task.await;
        }
    }
}

async fn exec(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), sqlx::Error> {
    conn.execute(sql).await.map(|_| ())
}

async fn run(mut ctx: WriteCtx, mut rx: mpsc::Receiver<Op>, clock: Clock, signals: Arc<Signals>) {
    let mut batch: Vec<Op> = Vec::with_capacity(MAX_BATCH);
    let mut replies: Vec<Reply> = Vec::with_capacity(MAX_BATCH);
    loop {
        if rx.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        ctx.now = clock.now_ms();
        ctx.effects = Effects::default();
        if let Err(e) = exec(&mut ctx.conn, "BEGIN IMMEDIATE").await {
            let msg = e.to_string();
            tracing::error!(error = %msg, "cannot begin a write transaction");
            // Dropping the closures unrun answers their callers with an error.
            batch.clear();
            continue;
        }
        let multi = batch.len() > 1;
        let mut any_ok = false;
        let mut broken: Option<String> = None;
        for op in batch.drain(..) {
            if broken.is_some() {
                drop(op);
                continue;
            }
            if multi {
                if let Err(e) = exec(&mut ctx.conn, "SAVEPOINT w").await {
                    broken = Some(e.to_string());
                    drop(op);
                    continue;
                }
            }
            let mark = ctx.effects.mark();
            let (ok, reply) = op(&mut ctx).await;
            replies.push(reply);
            if ok {
                any_ok = true;
            } else {
                ctx.effects.truncate(mark);
                if multi {
                    if let Err(e) = exec(&mut ctx.conn, "ROLLBACK TO w").await {
                        broken = Some(e.to_string());
                    }
                }
            }
            if multi && broken.is_none() {
                if let Err(e) = exec(&mut ctx.conn, "RELEASE w").await {
                    broken = Some(e.to_string());
                }
            }
        }
        let outcome = if broken.is_some() || !any_ok {
            let _ = exec(&mut ctx.conn, "ROLLBACK").await;
            broken.map(DbError::Commit)
        } else {
            match exec(&mut ctx.conn, "COMMIT").await {
                Ok(()) => None,
                Err(e) => {
                    let _ = exec(&mut ctx.conn, "ROLLBACK").await;
                    Some(DbError::Commit(e.to_string()))
                }
            }
        };
        match outcome {
            None => {
                signals.apply(std::mem::take(&mut ctx.effects));
                for reply in replies.drain(..) {
                    reply(None);
                }
            }
            Some(e) => {
                tracing::error!(error = %e, "write transaction failed; every write in it reports the error");
                let msg = e.to_string();
                for reply in replies.drain(..) {
                    reply(Some(DbError::Commit(msg.clone())));
                }
            }
        }
    }
}
