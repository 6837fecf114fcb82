-- 0008: what a suspended agent waits on, besides foreground children (whose
-- results are written straight into the parent's conversation).

-- wait_for_agent calls that have not returned yet. The waiting agent holds
-- no worker: a child settling (or the deadline passing) writes the call's
-- result and requeues the agent.
CREATE TABLE waits (
    id            INTEGER PRIMARY KEY,
    agent_id      TEXT NOT NULL,                 -- the waiting agent
    tool_call_id  TEXT NOT NULL,
    child_ids     TEXT NOT NULL,                 -- JSON array of agent ids
    mode          TEXT NOT NULL CHECK (mode = 'all' OR mode = 'any'),
    timeout_s     REAL NOT NULL,
    deadline_at   INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    resolved_at   INTEGER,
    UNIQUE (agent_id, tool_call_id)
);
CREATE INDEX waits_open_by_agent ON waits(agent_id) WHERE resolved_at IS NULL;
CREATE INDEX waits_open_deadline ON waits(deadline_at) WHERE resolved_at IS NULL;

-- Tool calls that need a human's yes or no before they run.
CREATE TABLE approvals (
    id            TEXT PRIMARY KEY,              -- UUID
    agent_id      TEXT NOT NULL,
    user_name     TEXT NOT NULL,
    tool_call_id  TEXT NOT NULL,
    tool          TEXT NOT NULL,
    arguments     TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status = 'pending' OR status = 'approved' OR status = 'denied'),
    reason        TEXT,
    decided_by    TEXT,
    created_at    INTEGER NOT NULL,
    decided_at    INTEGER,
    UNIQUE (agent_id, tool_call_id)
);
CREATE INDEX approvals_pending ON approvals(user_name, created_at) WHERE status = 'pending';

-- Tools a spawn asked for that the parent lacked (reported with the result).
ALTER TABLE agents ADD COLUMN dropped_tools TEXT;
