-- 0007: CHECK constraints and partial-index predicates as plain comparisons.
--
-- SQLite evaluates `col IN ('a', 'b', …)` by building an ephemeral table,
-- once per statement that writes the column: every message insert paid for
-- the `role` and `origin` checks, every status change for the `status`
-- check and the partial indexes. `col = 'a' OR col = 'b' …` costs nothing
-- extra. SQLite cannot alter a constraint, so the four tables are rebuilt
-- (same columns, same order) and their indexes recreated.

-- agents ---------------------------------------------------------------
CREATE TABLE agents_v7 (
    id               TEXT PRIMARY KEY,
    user_name        TEXT NOT NULL,
    level            INTEGER NOT NULL CHECK (level >= 1),
    parent_id        TEXT,
    root_id          TEXT NOT NULL,
    parent_call_id   TEXT,
    background       INTEGER NOT NULL DEFAULT 0,
    definition       TEXT NOT NULL,
    role             TEXT NOT NULL,
    task             TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (
                       status = 'queued' OR status = 'running' OR status = 'waiting' OR
                       status = 'done' OR status = 'failed' OR status = 'cancelled' OR
                       status = 'timed_out'),
    result           TEXT,
    error            TEXT,
    stop_reason      TEXT CHECK (stop_reason IS NULL OR
                       stop_reason = 'done' OR stop_reason = 'turn_limit' OR
                       stop_reason = 'cost_limit' OR stop_reason = 'deadline' OR
                       stop_reason = 'cancelled' OR stop_reason = 'error' OR
                       stop_reason = 'quarantined'),
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    turns            INTEGER NOT NULL DEFAULT 0,
    tokens_in        INTEGER NOT NULL DEFAULT 0,
    tokens_out       INTEGER NOT NULL DEFAULT 0,
    cost_usd         REAL NOT NULL DEFAULT 0,
    subtree_cost_usd REAL NOT NULL DEFAULT 0,     -- no longer maintained (0006)
    max_turns        INTEGER NOT NULL,
    max_cost_usd     REAL,
    timeout_s        REAL,
    deadline_at      INTEGER,
    budgeted         INTEGER NOT NULL DEFAULT 0,
    auto_wake_budget INTEGER NOT NULL,
    effective_tools  TEXT NOT NULL,
    notify           TEXT,
    closed           INTEGER NOT NULL DEFAULT 0,
    metadata         TEXT NOT NULL DEFAULT '{}',
    idempotency_key  TEXT,
    turn_calls       INTEGER NOT NULL DEFAULT 0,
    run_token        INTEGER NOT NULL DEFAULT 0,
    resume_msg_id    INTEGER,
    resume_count     INTEGER NOT NULL DEFAULT 0,
    ancestors        TEXT NOT NULL DEFAULT '[]',
    active_children  INTEGER NOT NULL DEFAULT 0
);
INSERT INTO agents_v7 SELECT * FROM agents;
DROP TABLE agents;
ALTER TABLE agents_v7 RENAME TO agents;
CREATE INDEX agents_user_created ON agents(user_name, created_at DESC, id DESC);
CREATE INDEX agents_parent ON agents(parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX agents_open_by_id ON agents(user_name, id) WHERE closed = 0;
CREATE UNIQUE INDEX agents_idempotency ON agents(user_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX agents_spawn_call ON agents(parent_id, parent_call_id)
    WHERE parent_call_id IS NOT NULL;
-- Deadlines of agents that may still run (settled agents have finished_at).
CREATE INDEX agents_active_deadline ON agents(deadline_at)
    WHERE deadline_at IS NOT NULL AND finished_at IS NULL;
CREATE INDEX agents_by_root ON agents(root_id);

-- messages -------------------------------------------------------------
CREATE TABLE messages_v7 (
    id            INTEGER PRIMARY KEY,
    agent_id      TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (
                    role = 'system' OR role = 'user' OR role = 'assistant' OR role = 'tool'),
    content       TEXT NOT NULL,
    tool_calls    TEXT,
    tool_call_id  TEXT,
    tool_name     TEXT,
    is_error      INTEGER NOT NULL DEFAULT 0,
    origin        TEXT CHECK (origin IS NULL OR
                    origin = 'human' OR origin = 'agent' OR origin = 'child' OR
                    origin = 'system' OR origin = 'cron' OR origin = 'heartbeat'),
    sender        TEXT,
    model         TEXT,
    tokens_in     INTEGER,
    tokens_out    INTEGER,
    cost_usd      REAL,
    hidden        INTEGER NOT NULL DEFAULT 0,
    created_at    INTEGER NOT NULL
);
INSERT INTO messages_v7 SELECT * FROM messages;
DROP TABLE messages;
ALTER TABLE messages_v7 RENAME TO messages;
CREATE INDEX messages_by_agent ON messages(agent_id, id);
CREATE UNIQUE INDEX messages_one_result ON messages(agent_id, tool_call_id)
    WHERE role = 'tool';

-- inbox ----------------------------------------------------------------
CREATE TABLE inbox_v7 (
    id          INTEGER PRIMARY KEY,
    agent_id    TEXT NOT NULL,
    content     TEXT NOT NULL,
    origin      TEXT NOT NULL CHECK (
                  origin = 'human' OR origin = 'agent' OR origin = 'child' OR
                  origin = 'system' OR origin = 'cron' OR origin = 'heartbeat'),
    sender      TEXT,
    created_at  INTEGER NOT NULL
);
INSERT INTO inbox_v7 SELECT * FROM inbox;
DROP TABLE inbox;
ALTER TABLE inbox_v7 RENAME TO inbox;
CREATE INDEX inbox_by_agent ON inbox(agent_id, id);

-- jobs -----------------------------------------------------------------
CREATE TABLE jobs_v7 (
    id                INTEGER PRIMARY KEY,
    kind              TEXT NOT NULL CHECK (
                        kind = 'turn' OR kind = 'notify' OR kind = 'command' OR kind = 'noop'),
    agent_id          TEXT,
    payload           TEXT NOT NULL DEFAULT '{}',
    state             TEXT NOT NULL CHECK (
                        state = 'queued' OR state = 'running' OR state = 'completed' OR
                        state = 'failed' OR state = 'cancelled'),
    priority          INTEGER NOT NULL DEFAULT 0,
    run_at            INTEGER NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL,
    lease_node        TEXT,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    dedupe_key        TEXT UNIQUE,
    last_error        TEXT,
    created_at        INTEGER NOT NULL,
    finished_at       INTEGER
);
INSERT INTO jobs_v7 SELECT * FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v7 RENAME TO jobs;
CREATE INDEX jobs_ready ON jobs(priority DESC, run_at, id) WHERE state = 'queued';
CREATE INDEX jobs_leased ON jobs(lease_owner, lease_expires_at) WHERE state = 'running';
-- Finished jobs are the only ones with finished_at.
CREATE INDEX jobs_finished ON jobs(finished_at) WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX jobs_one_live_turn ON jobs(agent_id)
    WHERE kind = 'turn' AND finished_at IS NULL;
