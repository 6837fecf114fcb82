-- 0010: schedules (cron briefs and heartbeats) and their fires.

CREATE TABLE schedules (
    id             TEXT PRIMARY KEY,             -- UUID
    user_name      TEXT NOT NULL,
    name           TEXT NOT NULL,
    cron           TEXT NOT NULL,                -- 5 or 6 fields
    timezone       TEXT,                         -- IANA name; NULL = UTC
    kind           TEXT NOT NULL CHECK (kind = 'brief' OR kind = 'heartbeat'),
    agent          TEXT,                         -- brief: definition slug
    task           TEXT,                         -- brief: the task; heartbeat: prompt override
    target         TEXT,                         -- heartbeat: the agent id
    notify         TEXT,                         -- brief: JSON {webhook_url}
    enabled        INTEGER NOT NULL DEFAULT 1,
    overlap        TEXT NOT NULL DEFAULT 'skip' CHECK (overlap = 'skip' OR overlap = 'queue'),
    last_fired_at  INTEGER,
    next_fire_at   INTEGER,
    last_agent_id  TEXT,                         -- created (brief) or woken (heartbeat) by the last fire
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL
);
CREATE INDEX schedules_by_user ON schedules(user_name, created_at);
CREATE INDEX schedules_due ON schedules(next_fire_at) WHERE enabled = 1;

-- One row per scheduled occurrence that was handled. The unique key is the
-- dedupe key: an occurrence is never fired twice, also across crashes.
CREATE TABLE schedule_fires (
    id           INTEGER PRIMARY KEY,
    schedule_id  TEXT NOT NULL,
    fire_at      INTEGER NOT NULL,               -- the occurrence (ms)
    outcome      TEXT NOT NULL CHECK (
                   outcome = 'fired' OR outcome = 'skipped' OR outcome = 'missed' OR outcome = 'failed'),
    agent_id     TEXT,
    detail       TEXT,
    created_at   INTEGER NOT NULL,
    UNIQUE (schedule_id, fire_at)
);
CREATE INDEX schedule_fires_recent ON schedule_fires(schedule_id, fire_at DESC);
