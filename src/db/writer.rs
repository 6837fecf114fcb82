//! Group commit. One task owns the only writable connection. Callers send
//! writes; the task takes everything queued (up to a cap), runs it in one
//! `BEGIN IMMEDIATE … COMMIT`, and only then answers each caller and applies
//! the side effects (events, wake-ups, cancels). No caller ever hears "done"
//! for a write that is not committed.
//!
//! A round trip to SQLite's connection thread costs far more than the SQL
//! of one step, and preparing a statement costs about as much again, so the
//! writer minimises both. Three kinds of write:
//! - **rows** (`Db::insert_row`): one row of a hot-path insert (an assistant
//!   answer, a tool result, a job). All rows of one kind in a batch become
//!   ONE multi-row statement, cached per row count: one round trip records
//!   the steps of many agents.
//! - **statements** (`Db::exec`): a fixed script of one or more statements,
//!   run as one cached command; a multi-statement script runs inside a
//!   savepoint so it is all-or-nothing.
//! - **closures** (`Db::write`): arbitrary logic over the connection, inside
//!   a savepoint when they share the transaction.
//!
//! Writes in one batch come from different callers that each wait for their
//! own write, so they are independent: the writer may run them grouped by
//! kind (rows, then statements, then closures) — any order is a valid
//! serialisation of concurrent requests.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use futures::StreamExt;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::{Arguments, Either, Executor, Row};
use tokio::sync::{mpsc, oneshot, Mutex};

use super::{DbError, DbResult};
use crate::clock::Clock;
use crate::signals::{Effects, Signals};

/// The most writes committed in one transaction. Large enough to amortise
/// the commit, small enough that a batch never holds the lock for long.
const MAX_BATCH: usize = 1024;

/// The most rows in one multi-row statement (one cached statement per count).
const MAX_ROWS: usize = 32;

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

/// One bound argument.
#[derive(Debug, Clone)]
pub enum Arg {
    Int(i64),
    Real(f64),
    Text(String),
    Null,
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::Int(v as i64)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Self {
        Arg::Real(v)
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(v)
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(v.to_string())
    }
}
impl<T: Into<Arg>> From<Option<T>> for Arg {
    fn from(v: Option<T>) -> Self {
        v.map(Into::into).unwrap_or(Arg::Null)
    }
}

fn bind_all(args: &mut SqliteArguments<'_>, list: &[Arg]) -> Result<(), sqlx::Error> {
    for a in list {
        let r = match a {
            Arg::Int(v) => args.add(*v),
            Arg::Real(v) => args.add(*v),
            Arg::Text(v) => args.add(v.clone()),
            Arg::Null => args.add(Option::<i64>::None),
        };
        r.map_err(sqlx::Error::Encode)?;
    }
    Ok(())
}

/// A fixed script (anonymous `?` parameters bound in order across its
/// statements) and what to do after it commits.
#[derive(Debug, Clone)]
pub struct Stmt {
    pub sql: &'static str,
    pub args: Vec<Arg>,
    /// Wake the worker dispatcher when the script changed rows (enqueues).
    pub wakes_workers: bool,
}

impl Stmt {
    pub fn new(sql: &'static str) -> Self {
        Self {
            sql,
            args: Vec::new(),
            wakes_workers: false,
        }
    }

    /// Appends an argument.
    pub fn arg(mut self, a: impl Into<Arg>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Marks the script as one that enqueues jobs.
    pub fn waking(mut self) -> Self {
        self.wakes_workers = true;
        self
    }
}

/// What one statement of a script produced.
#[derive(Default)]
pub struct StmtOutput {
    pub rows: Vec<SqliteRow>,
    pub rows_affected: u64,
}

/// The kinds of row the writer merges into multi-row statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// An assistant answer (usage is added by the `messages_assistant_usage`
    /// trigger); guarded by the agent's run token.
    Assistant,
    /// A tool result, at most one per call; guarded by the run token.
    ToolResult,
    /// A job (dedupe keys and the one-live-turn rule may ignore it).
    Job,
}

impl RowKind {
    /// Arguments per row.
    fn arity(self) -> usize {
        match self {
            RowKind::Assistant => 9,
            RowKind::ToolResult => 7,
            RowKind::Job => 8,
        }
    }

    /// A row that inserts nothing (its guard fails): pads a chunk up to a
    /// cached statement size.
    fn padding(self) -> Vec<Arg> {
        let mut v = vec![Arg::Null; self.arity()];
        v[0] = Arg::Text(String::new());
        v
    }

    /// Statements in the script before the one that lists inserted rows.
    const IDS_AT: usize = 1;

    /// The script for `n` rows. No `RETURNING` (SQLite buffers returned rows
    /// in an ephemeral table): rows inserted by one statement get
    /// consecutive rowids, so the statement after the insert lists them by
    /// a primary-key range.
    fn script(self, n: usize) -> String {
        let one = format!("({})", vec!["?"; self.arity()].join(","));
        let values = vec![one.as_str(); n].join(",");
        let inserted =
            "WHERE id BETWEEN last_insert_rowid() - changes() + 1 AND last_insert_rowid()";
        match self {
            // agent_id, content, tool_calls, model, tokens_in, tokens_out, cost, now, run_token;
            // then per row: tokens_in, tokens_out, cost, agent_id, run_token.
            // The answers and their usage on the agents, guarded by the run
            // token, in one command.
            RowKind::Assistant => {
                let mut sql = format!(
                    "INSERT INTO messages (agent_id, role, content, tool_calls, model, tokens_in, tokens_out, cost_usd, created_at)
                     SELECT v.column1, 'assistant', v.column2, v.column3, v.column4, v.column5, v.column6, v.column7, v.column8
                       FROM (VALUES {values}) AS v
                      WHERE EXISTS (SELECT 1 FROM agents a
                                     WHERE a.id = v.column1 AND a.run_token = v.column9 AND a.status = 'running');
                     SELECT id, agent_id, '' FROM messages {inserted}"
                );
                for _ in 0..n {
                    sql.push_str(
                        ";\nUPDATE agents SET turns = turns + 1, turn_calls = turn_calls + 1,
                                tokens_in = tokens_in + ?, tokens_out = tokens_out + ?, cost_usd = cost_usd + ?
                          WHERE id = ? AND run_token = ? AND status = 'running'",
                    );
                }
                sql
            }
            // agent_id, content, call_id, tool_name, is_error, now, run_token
            RowKind::ToolResult => format!(
                "INSERT OR IGNORE INTO messages (agent_id, role, content, tool_call_id, tool_name, is_error, created_at)
                 SELECT v.column1, 'tool', v.column2, v.column3, v.column4, v.column5, v.column6
                   FROM (VALUES {values}) AS v
                  WHERE EXISTS (SELECT 1 FROM agents a
                                 WHERE a.id = v.column1 AND a.run_token = v.column7 AND a.status = 'running');
                 SELECT id, agent_id, tool_call_id FROM messages {inserted}"
            ),
            // kind, agent_id, payload, priority, run_at, max_attempts, dedupe_key, now
            RowKind::Job => format!(
                "INSERT OR IGNORE INTO jobs
                     (kind, agent_id, payload, state, priority, run_at, max_attempts, dedupe_key, created_at)
                 SELECT v.column1, v.column2, v.column3, 'queued', v.column4, v.column5, v.column6, v.column7, v.column8
                   FROM (VALUES {values}) AS v
                  WHERE v.column1 <> ''"
            ),
        }
    }

    /// The script's arguments for these rows (padded to the bucket size).
    fn script_args(self, rows: &[&[Arg]], size: usize) -> Vec<Arg> {
        let padding = self.padding();
        let mut padded: Vec<&[Arg]> = rows.to_vec();
        padded.resize(size, &padding);
        let mut args: Vec<Arg> = Vec::with_capacity(size * (self.arity() + 5));
        for r in &padded {
            args.extend(r.iter().cloned());
        }
        if self == RowKind::Assistant {
            for r in &padded {
                // tokens_in, tokens_out, cost, agent_id, run_token
                args.extend([
                    r[4].clone(),
                    r[5].clone(),
                    r[6].clone(),
                    r[0].clone(),
                    r[8].clone(),
                ]);
            }
        }
        args
    }

    /// The cached statement sizes: chunks are padded up to one of these.
    fn bucket(n: usize) -> usize {
        n.next_power_of_two().min(MAX_ROWS)
    }

    /// The script for `n` rows, `n` a bucket size (built once per size).
    fn sql(self, n: usize) -> &'static str {
        static CACHE: OnceLock<HashMap<(RowKind, usize), String>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| {
            let mut m = HashMap::new();
            for kind in [RowKind::Assistant, RowKind::ToolResult, RowKind::Job] {
                let mut n = 1;
                while n <= MAX_ROWS {
                    m.insert((kind, n), kind.script(n));
                    n *= 2;
                }
            }
            m
        });
        cache.get(&(self, n)).map(String::as_str).unwrap_or("")
    }
}

/// One row to insert: its arguments (in the kind's order) and the key its
/// `RETURNING` row is matched by (agent id, plus the call id of a result).
#[derive(Debug, Clone)]
pub struct RowReq {
    pub kind: RowKind,
    pub args: Vec<Arg>,
    pub key: (String, String),
}

type Reply = Box<dyn FnOnce(Option<DbError>) + Send>;
type RowReply = oneshot::Sender<DbResult<Option<i64>>>;
type StopHandle = (oneshot::Sender<()>, std::thread::JoinHandle<()>);
type Closure = Box<dyn for<'c> FnOnce(&'c mut WriteCtx) -> BoxFuture<'c, (bool, Reply)> + Send>;

enum Op {
    Closure(Closure),
    Stmt(Stmt, oneshot::Sender<DbResult<Vec<StmtOutput>>>),
    Row(RowReq, oneshot::Sender<DbResult<Option<i64>>>),
}

/// A finished write waiting for the commit.
enum Done {
    Closure(Reply),
    Stmt(
        oneshot::Sender<DbResult<Vec<StmtOutput>>>,
        DbResult<Vec<StmtOutput>>,
    ),
    Row(
        oneshot::Sender<DbResult<Option<i64>>>,
        DbResult<Option<i64>>,
    ),
}

#[derive(Clone)]
pub(super) struct Writer {
    tx: mpsc::Sender<Op>,
    stop: Arc<Mutex<Option<StopHandle>>>,
    pub(super) stats: Arc<WriterStats>,
}

fn not_run() -> DbError {
    DbError::Commit("the write was not run: its transaction failed or the writer stopped".into())
}

impl Writer {
    pub(super) fn start(conn: SqliteConnection, clock: Clock, signals: Arc<Signals>) -> Self {
        let (tx, rx) = mpsc::channel::<Op>(65536);
        let ctx = WriteCtx {
            conn,
            now: 0,
            effects: Effects::default(),
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let stats = Arc::new(WriterStats::default());
        let counters = Arc::clone(&stats);
        // The writer gets its own thread and runtime: it must run the moment
        // SQLite answers, not wait for a worker thread busy with turns.
        let thread = std::thread::Builder::new()
            .name("agentq-writer".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the writer's runtime");
                        return;
                    }
                };
                rt.block_on(async move {
                    tokio::select! {
                        _ = run(ctx, rx, clock, signals, counters) => {}
                        _ = stop_rx => {}
                    }
                });
            })
            .ok();
        Self {
            tx,
            stop: Arc::new(Mutex::new(thread.map(|t| (stop_tx, t)))),
            stats,
        }
    }

    pub(super) async fn write<T, F>(&self, f: F) -> DbResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut WriteCtx) -> WriteFuture<'c, T> + Send + 'static,
    {
        let (done_tx, done_rx) = oneshot::channel::<DbResult<T>>();
        let op: Closure = Box::new(move |ctx: &mut WriteCtx| {
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
        self.tx
            .send(Op::Closure(op))
            .await
            .map_err(|_| DbError::WriterGone)?;
        done_rx.await.map_err(|_| not_run())?
    }

    pub(super) async fn exec(&self, stmt: Stmt) -> DbResult<Vec<StmtOutput>> {
        let (done_tx, done_rx) = oneshot::channel();
        self.tx
            .send(Op::Stmt(stmt, done_tx))
            .await
            .map_err(|_| DbError::WriterGone)?;
        done_rx.await.map_err(|_| not_run())?
    }

    pub(super) async fn insert_row(&self, row: RowReq) -> DbResult<Option<i64>> {
        let (done_tx, done_rx) = oneshot::channel();
        self.tx
            .send(Op::Row(row, done_tx))
            .await
            .map_err(|_| DbError::WriterGone)?;
        done_rx.await.map_err(|_| not_run())?
    }

    /// Lets the writer finish what was queued before this call, then stops
    /// its thread (closing the connection).
    pub(super) async fn stop(&self) {
        let handle = self.stop.lock().await.take();
        if let Some((stop_tx, thread)) = handle {
            let _ = self
                .write(|_ctx: &mut WriteCtx| -> WriteFuture<'_, ()> { Box::pin(async { Ok(()) }) })
                .await;
            let _ = stop_tx.send(());
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// Counters of the writer's work, read by benchmarks for their breakdown.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Transactions committed (or rolled back).
    pub batches: AtomicU64,
    /// Callers' writes inside them.
    pub writes: AtomicU64,
    /// Time the writer spent running transactions, in microseconds.
    pub busy_us: AtomicU64,
}

/// Transaction control (`BEGIN`, `COMMIT`, savepoints): through the
/// statement cache, since a raw string would be prepared on every call.
async fn exec_raw(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), sqlx::Error> {
    sqlx::query(sql).execute(conn).await.map(|_| ())
}

/// Runs a script as one cached command; one output per statement. On error
/// the statements before the failing one have run (their outputs are in the
/// error's first half).
async fn run_script(
    conn: &mut SqliteConnection,
    sql: &str,
    list: &[Arg],
) -> Result<Vec<StmtOutput>, (Vec<StmtOutput>, sqlx::Error)> {
    let mut args = SqliteArguments::default();
    if let Err(e) = bind_all(&mut args, list) {
        return Err((Vec::new(), e));
    }
    // sqlx-sqlite runs every statement of a query string in turn, binding
    // anonymous parameters across them in order, and reports each
    // statement's rows followed by its result (sqlx 0.8 behaviour, pinned in
    // Cargo.lock; sqlx#3108 discusses its future).
    let query = sqlx::query_with(sql, args);
    let mut stream = Executor::fetch_many(&mut *conn, query);
    let mut outputs = Vec::new();
    let mut current = StmtOutput::default();
    while let Some(item) = stream.next().await {
        match item {
            Ok(Either::Right(row)) => current.rows.push(row),
            Ok(Either::Left(done)) => {
                current.rows_affected = done.rows_affected();
                outputs.push(std::mem::take(&mut current));
            }
            Err(e) => return Err((outputs, e)),
        }
    }
    Ok(outputs)
}

/// Transaction control folded into a command, so that BEGIN and COMMIT
/// cost no round trips of their own.
#[derive(Debug, Clone, Copy, Default)]
struct Fold {
    begin: bool,
    commit: bool,
}

/// How a folded command went.
enum Folded {
    /// Every statement ran (outputs without the BEGIN/COMMIT entries).
    Ok(Vec<StmtOutput>),
    /// BEGIN itself failed: nothing ran.
    BeginFailed(sqlx::Error),
    /// A statement of the script failed; the transaction is open and
    /// COMMIT has not run.
    StmtFailed(sqlx::Error),
    /// COMMIT failed; the batch is lost.
    CommitFailed(sqlx::Error),
}

async fn run_folded(conn: &mut SqliteConnection, sql: &str, list: &[Arg], fold: Fold) -> Folded {
    let text;
    let sql = if fold.begin || fold.commit {
        text = format!(
            "{}{sql};{}",
            if fold.begin { "BEGIN IMMEDIATE;\n" } else { "" },
            if fold.commit { "\nCOMMIT;" } else { "" }
        );
        text.as_str()
    } else {
        sql
    };
    match run_script(conn, sql, list).await {
        Ok(mut outputs) => {
            if fold.commit {
                outputs.pop();
            }
            if fold.begin && !outputs.is_empty() {
                outputs.remove(0);
            }
            Folded::Ok(outputs)
        }
        Err((mut outputs, e)) => {
            if fold.begin {
                if outputs.is_empty() {
                    return Folded::BeginFailed(e);
                }
                outputs.remove(0);
            }
            let statements =
                sql_statements(sql) - usize::from(fold.begin) - usize::from(fold.commit);
            if fold.commit && outputs.len() >= statements {
                Folded::CommitFailed(e)
            } else {
                Folded::StmtFailed(e)
            }
        }
    }
}

/// Statements in a script (our scripts never put `;` inside literals).
fn sql_statements(sql: &str) -> usize {
    sql.split(';').filter(|p| !p.trim().is_empty()).count()
}

/// Runs a script inside a write closure (one round trip). The closure's
/// savepoint makes a failure roll back the whole script.
pub async fn run_stmts(ctx: &mut WriteCtx, stmt: &Stmt) -> DbResult<Vec<StmtOutput>> {
    let outputs = run_script(&mut ctx.conn, stmt.sql, &stmt.args)
        .await
        .map_err(|(_, e)| DbError::Sqlx(e))?;
    if stmt.wakes_workers && outputs.iter().any(|o| o.rows_affected > 0) {
        ctx.effects.job_ready = true;
    }
    Ok(outputs)
}

/// Where a unit of the batch stands in its transaction.
struct Txn {
    began: bool,
}

/// Outcome of one unit: its result, or the failure of the whole batch.
type Unit<T> = Result<T, DbError>;

/// Runs a script that callers share a transaction with: a multi-statement
/// script is wrapped in a savepoint so it commits all or nothing.
async fn run_stmt_unit(
    ctx: &mut WriteCtx,
    txn: &mut Txn,
    stmt: &Stmt,
    commit: bool,
) -> Unit<DbResult<Vec<StmtOutput>>> {
    let body = stmt.sql.trim_end().trim_end_matches(';');
    let multi = body.contains(';');
    let text;
    let sql = if multi {
        text = format!("SAVEPOINT s;\n{body};\nRELEASE s");
        text.as_str()
    } else {
        body
    };
    let fold = Fold {
        begin: !txn.began,
        commit,
    };
    match run_folded(&mut ctx.conn, sql, &stmt.args, fold).await {
        Folded::Ok(mut outputs) => {
            txn.began = true;
            if multi {
                outputs.pop();
                if !outputs.is_empty() {
                    outputs.remove(0);
                }
            }
            if stmt.wakes_workers && outputs.iter().any(|o| o.rows_affected > 0) {
                ctx.effects.job_ready = true;
            }
            Ok(Ok(outputs))
        }
        Folded::BeginFailed(e) | Folded::CommitFailed(e) => Err(DbError::Commit(e.to_string())),
        Folded::StmtFailed(e) => {
            txn.began = true;
            if multi {
                exec_raw(&mut ctx.conn, "ROLLBACK TO s")
                    .await
                    .map_err(commit_err)?;
                exec_raw(&mut ctx.conn, "RELEASE s")
                    .await
                    .map_err(commit_err)?;
            }
            if commit {
                exec_raw(&mut ctx.conn, "COMMIT")
                    .await
                    .map_err(commit_err)?;
            }
            Ok(Err(DbError::Sqlx(e)))
        }
    }
}

fn commit_err(e: sqlx::Error) -> DbError {
    DbError::Commit(e.to_string())
}

/// Inserts one chunk of rows of one kind as one statement; one result per
/// request (the new id, or None when guarded out or ignored).
async fn run_rows_unit(
    ctx: &mut WriteCtx,
    txn: &mut Txn,
    kind: RowKind,
    chunk: &[RowReq],
    commit: bool,
) -> Unit<Vec<DbResult<Option<i64>>>> {
    let size = RowKind::bucket(chunk.len());
    let rows: Vec<&[Arg]> = chunk.iter().map(|r| r.args.as_slice()).collect();
    let args = kind.script_args(&rows, size);
    let fold = Fold {
        begin: !txn.began,
        commit,
    };
    match run_folded(&mut ctx.conn, kind.sql(size), &args, fold).await {
        Folded::Ok(outputs) => {
            txn.began = true;
            Ok(match_rows(ctx, kind, chunk, &outputs))
        }
        Folded::BeginFailed(e) | Folded::CommitFailed(e) => Err(DbError::Commit(e.to_string())),
        Folded::StmtFailed(e) if kind == RowKind::Assistant => {
            // A script of several statements may have half-run: the batch
            // cannot commit it; every caller in it gets the error.
            Err(DbError::Commit(format!("{kind:?} rows failed: {e}")))
        }
        Folded::StmtFailed(e) => {
            txn.began = true;
            let mut results = Vec::with_capacity(chunk.len());
            if chunk.len() == 1 {
                results.push(Err(DbError::Sqlx(e)));
            } else {
                // One bad row must not fail its neighbours: insert each
                // alone (a failed statement changes nothing).
                for r in chunk {
                    let mut one = Box::pin(run_rows_unit(
                        ctx,
                        txn,
                        kind,
                        std::slice::from_ref(r),
                        false,
                    ))
                    .await?;
                    results.push(one.pop().unwrap_or(Ok(None)));
                }
            }
            if commit {
                exec_raw(&mut ctx.conn, "COMMIT")
                    .await
                    .map_err(commit_err)?;
            }
            Ok(results)
        }
    }
}

fn match_rows(
    ctx: &mut WriteCtx,
    kind: RowKind,
    chunk: &[RowReq],
    outputs: &[StmtOutput],
) -> Vec<DbResult<Option<i64>>> {
    if kind == RowKind::Job {
        if outputs.first().is_some_and(|o| o.rows_affected > 0) {
            ctx.effects.job_ready = true;
        }
        // Jobs carry no key; callers only learn that it committed.
        return chunk.iter().map(|_| Ok(None)).collect();
    }
    let Some(out) = outputs.get(RowKind::IDS_AT) else {
        return chunk.iter().map(|_| Ok(None)).collect();
    };
    let mut ids: HashMap<(String, String), i64> = HashMap::with_capacity(out.rows.len());
    for row in &out.rows {
        let id: i64 = row.try_get(0).unwrap_or_default();
        let a: String = row.try_get(1).unwrap_or_default();
        let b: String = row.try_get(2).unwrap_or_default();
        ids.insert((a, b), id);
    }
    chunk.iter().map(|r| Ok(ids.get(&r.key).copied())).collect()
}

async fn run(
    mut ctx: WriteCtx,
    mut rx: mpsc::Receiver<Op>,
    clock: Clock,
    signals: Arc<Signals>,
    stats: Arc<WriterStats>,
) {
    let mut batch: Vec<Op> = Vec::with_capacity(MAX_BATCH);
    let mut done: Vec<Done> = Vec::with_capacity(MAX_BATCH);
    loop {
        if rx.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        stats.batches.fetch_add(1, Relaxed);
        stats.writes.fetch_add(batch.len() as u64, Relaxed);
        ctx.now = clock.now_ms();
        ctx.effects = Effects::default();
        let began = std::time::Instant::now();
        let failure = run_batch(&mut ctx, &mut batch, &mut done).await;
        stats
            .busy_us
            .fetch_add(began.elapsed().as_micros() as u64, Relaxed);
        match failure {
            None => {
                signals.apply(std::mem::take(&mut ctx.effects));
                for d in done.drain(..) {
                    match d {
                        Done::Closure(reply) => reply(None),
                        Done::Stmt(tx, r) => {
                            let _ = tx.send(r);
                        }
                        Done::Row(tx, r) => {
                            let _ = tx.send(r);
                        }
                    }
                }
            }
            Some(e) => {
                tracing::error!(error = %e, "write transaction failed; every write in it reports the error");
                let msg = e.to_string();
                for d in done.drain(..) {
                    match d {
                        Done::Closure(reply) => reply(Some(DbError::Commit(msg.clone()))),
                        Done::Stmt(tx, _) => {
                            let _ = tx.send(Err(DbError::Commit(msg.clone())));
                        }
                        Done::Row(tx, _) => {
                            let _ = tx.send(Err(DbError::Commit(msg.clone())));
                        }
                    }
                }
            }
        }
    }
}

/// Runs one batch in one transaction, BEGIN folded into its first command
/// and COMMIT into its last. Returns the transaction's error if it failed as
/// a whole (then nothing in it is committed).
async fn run_batch(
    ctx: &mut WriteCtx,
    batch: &mut Vec<Op>,
    done: &mut Vec<Done>,
) -> Option<DbError> {
    let mut rows: HashMap<RowKind, Vec<(RowReq, RowReply)>> = HashMap::new();
    let mut stmts: Vec<(Stmt, oneshot::Sender<DbResult<Vec<StmtOutput>>>)> = Vec::new();
    let mut closures: Vec<Closure> = Vec::new();
    for op in batch.drain(..) {
        match op {
            Op::Row(r, t) => rows.entry(r.kind).or_default().push((r, t)),
            Op::Stmt(s, t) => stmts.push((s, t)),
            Op::Closure(c) => closures.push(c),
        }
    }
    let mut chunks: Vec<(RowKind, Vec<(RowReq, RowReply)>)> = Vec::new();
    for kind in [RowKind::Assistant, RowKind::ToolResult, RowKind::Job] {
        if let Some(mut list) = rows.remove(&kind) {
            while !list.is_empty() {
                let rest = list.split_off(list.len().min(MAX_ROWS));
                chunks.push((kind, list));
                list = rest;
            }
        }
    }
    let lone_closure = chunks.is_empty() && stmts.is_empty() && closures.len() == 1;
    let mut units_left = chunks.len() + stmts.len();
    let commit_in_units = closures.is_empty();
    let mut txn = Txn { began: false };

    for (kind, list) in chunks {
        units_left -= 1;
        let commit = commit_in_units && units_left == 0;
        let (reqs, txs): (Vec<RowReq>, Vec<_>) = list.into_iter().unzip();
        match run_rows_unit(ctx, &mut txn, kind, &reqs, commit).await {
            Ok(results) => {
                for (t, r) in txs.into_iter().zip(results) {
                    done.push(Done::Row(t, r));
                }
            }
            Err(e) => return Some(abort(ctx, txn.began, e).await),
        }
    }
    for (s, t) in stmts {
        units_left -= 1;
        let commit = commit_in_units && units_left == 0;
        match run_stmt_unit(ctx, &mut txn, &s, commit).await {
            Ok(r) => done.push(Done::Stmt(t, r)),
            Err(e) => return Some(abort(ctx, txn.began, e).await),
        }
    }
    if commit_in_units {
        return None;
    }

    // Closures, each inside a savepoint unless it is alone.
    if !txn.began {
        if let Err(e) = exec_raw(&mut ctx.conn, "BEGIN IMMEDIATE").await {
            return Some(commit_err(e));
        }
    }
    for f in closures {
        if !lone_closure {
            if let Err(e) = exec_raw(&mut ctx.conn, "SAVEPOINT w").await {
                return Some(abort(ctx, true, commit_err(e)).await);
            }
        }
        let mark = ctx.effects.mark();
        let (ok, reply) = f(ctx).await;
        done.push(Done::Closure(reply));
        if !ok {
            ctx.effects.truncate(mark);
            let undo = if lone_closure {
                "ROLLBACK"
            } else {
                "ROLLBACK TO w"
            };
            if let Err(e) = exec_raw(&mut ctx.conn, undo).await {
                return Some(abort(ctx, true, commit_err(e)).await);
            }
            if lone_closure {
                return None;
            }
        }
        if !lone_closure {
            if let Err(e) = exec_raw(&mut ctx.conn, "RELEASE w").await {
                return Some(abort(ctx, true, commit_err(e)).await);
            }
        }
    }
    if let Err(e) = exec_raw(&mut ctx.conn, "COMMIT").await {
        return Some(abort(ctx, true, commit_err(e)).await);
    }
    None
}

/// Rolls back whatever a failed batch began. Always tried: a command that
/// failed after its folded BEGIN leaves a transaction open, and an open
/// transaction would fail every later batch ("no transaction" is harmless).
async fn abort(ctx: &mut WriteCtx, _began: bool, e: DbError) -> DbError {
    let _ = exec_raw(&mut ctx.conn, "ROLLBACK").await;
    e
}
