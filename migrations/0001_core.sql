-- 0001: the core of agentq: users, agents, their conversations and inboxes,
-- the durable job queue and the event journal.
--
-- Conventions: times are INTEGER milliseconds since the Unix epoch (UTC);
-- JSON values are TEXT; closed sets are TEXT guarded by CHECK constraints
-- with the same names the Rust enums serialise to (src/types.rs).

-- Users are configured in agentq.toml; this table records every name that
-- ever owned an agent so rows can be attributed after a config change.
CREATE TABLE users (
    name        TEXT PRIMARY KEY,
    admin       INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL
);

-- One row per agent: identity, lineage, limits, usage and lifecycle.
CREATE TABLE agents (
    id               TEXT PRIMARY KEY,          -- UUID v4, lowercase
    user_name        TEXT NOT NULL,
    level            INTEGER NOT NULL CHECK (level >= 1),
    parent_id        TEXT,                      -- NULL for level-1 agents
    root_id          TEXT NOT NULL,             -- the level-1 ancestor (itself at level 1)
    parent_call_id   TEXT,                      -- the parent's spawn tool-call id
    background       INTEGER NOT NULL DEFAULT 0,-- spawned in the background
    definition       TEXT NOT NULL,
    role             TEXT NOT NULL,
    task             TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN
                       ('queued','running','waiting','done','failed','cancelled','timed_out')),
    result           TEXT,
    error            TEXT,
    stop_reason      TEXT CHECK (stop_reason IS NULL OR stop_reason IN
                       ('done','turn_limit','cost_limit','deadline','cancelled','error','quarantined')),
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    turns            INTEGER NOT NULL DEFAULT 0,  -- model calls over the agent's life
    tokens_in        INTEGER NOT NULL DEFAULT 0,
    tokens_out       INTEGER NOT NULL DEFAULT 0,
    cost_usd         REAL NOT NULL DEFAULT 0,
    subtree_cost_usd REAL NOT NULL DEFAULT 0,     -- own spend plus every descendant's
    max_turns        INTEGER NOT NULL,            -- model calls within one turn
    max_cost_usd     REAL,
    timeout_s        REAL,
    deadline_at      INTEGER,
    budgeted         INTEGER NOT NULL DEFAULT 0,  -- it or an ancestor has max_cost_usd
    auto_wake_budget INTEGER NOT NULL,
    effective_tools  TEXT NOT NULL,               -- JSON array, frozen at creation
    notify           TEXT,                        -- JSON {webhook_url?}
    closed           INTEGER NOT NULL DEFAULT 0,
    metadata         TEXT NOT NULL DEFAULT '{}',
    idempotency_key  TEXT,
    -- Bookkeeping of the turn runner:
    turn_calls       INTEGER NOT NULL DEFAULT 0,  -- model calls in the current turn
    run_token        INTEGER NOT NULL DEFAULT 0,  -- bumped per turn run; step writes check it
    resume_msg_id    INTEGER,                     -- step (last message id) of the last crash resume
    resume_count     INTEGER NOT NULL DEFAULT 0   -- crashes in a row at that step
);
CREATE INDEX agents_user_created ON agents(user_name, created_at DESC, id DESC);
CREATE INDEX agents_parent ON agents(parent_id) WHERE parent_id IS NOT NULL;
-- Handles are derived from neighbours in id order among a user's open agents.
CREATE INDEX agents_open_by_id ON agents(user_name, id) WHERE closed = 0;
CREATE UNIQUE INDEX agents_idempotency ON agents(user_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- A spawn tool call creates at most one child, also when it is re-executed.
CREATE UNIQUE INDEX agents_spawn_call ON agents(parent_id, parent_call_id)
    WHERE parent_call_id IS NOT NULL;
CREATE INDEX agents_active_deadline ON agents(deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('queued','running','waiting');

-- The append-only conversation. The system prompt is the first row.
CREATE TABLE messages (
    id            INTEGER PRIMARY KEY,           -- append order
    agent_id      TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('system','user','assistant','tool')),
    content       TEXT NOT NULL,
    tool_calls    TEXT,                          -- assistant: JSON [{id,name,arguments}]
    tool_call_id  TEXT,                          -- tool: the call it answers
    tool_name     TEXT,
    is_error      INTEGER NOT NULL DEFAULT 0,    -- tool: the tool failed
    origin        TEXT CHECK (origin IS NULL OR origin IN
                    ('human','agent','child','system','cron','heartbeat')),
    sender        TEXT,
    model         TEXT,                          -- assistant: the model that answered
    tokens_in     INTEGER,
    tokens_out    INTEGER,
    cost_usd      REAL,
    hidden        INTEGER NOT NULL DEFAULT 0,    -- left out of the model's context
    created_at    INTEGER NOT NULL
);
CREATE INDEX messages_by_agent ON messages(agent_id, id);
-- Every tool call has at most one recorded result: the guard against running
-- a recorded step twice.
CREATE UNIQUE INDEX messages_one_result ON messages(agent_id, tool_call_id)
    WHERE role = 'tool';

-- Messages delivered but not yet appended to the conversation.
CREATE TABLE inbox (
    id          INTEGER PRIMARY KEY,
    agent_id    TEXT NOT NULL,
    content     TEXT NOT NULL,
    origin      TEXT NOT NULL CHECK (origin IN
                  ('human','agent','child','system','cron','heartbeat')),
    sender      TEXT,
    created_at  INTEGER NOT NULL
);
CREATE INDEX inbox_by_agent ON inbox(agent_id, id);

-- The durable queue.
CREATE TABLE jobs (
    id                INTEGER PRIMARY KEY,
    kind              TEXT NOT NULL CHECK (kind IN ('turn','notify','command','noop')),
    agent_id          TEXT,
    payload           TEXT NOT NULL DEFAULT '{}',
    state             TEXT NOT NULL CHECK (state IN
                        ('queued','running','completed','failed','cancelled')),
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
-- The claim query walks this index in order and stops at LIMIT.
CREATE INDEX jobs_ready ON jobs(priority DESC, run_at, id) WHERE state = 'queued';
CREATE INDEX jobs_leased ON jobs(lease_owner, lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_finished ON jobs(finished_at) WHERE state IN ('completed','failed','cancelled');
-- At most one live turn job per agent: two turns of one agent never run at once.
CREATE UNIQUE INDEX jobs_one_live_turn ON jobs(agent_id)
    WHERE kind = 'turn' AND state IN ('queued','running');

-- The journal of lifecycle events (steps are journalled by `messages`).
CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    agent_id    TEXT,
    kind        TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX events_by_agent ON events(agent_id, id);
