-- 0009: todo lists and context compaction.

-- One agent's todo list, in order.
CREATE TABLE todos (
    agent_id    TEXT NOT NULL,
    item_id     TEXT NOT NULL,
    position    INTEGER NOT NULL,
    content     TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (
                  status = 'pending' OR status = 'in_progress' OR
                  status = 'completed' OR status = 'cancelled'),
    priority    TEXT NOT NULL CHECK (priority = 'high' OR priority = 'medium' OR priority = 'low'),
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (agent_id, item_id)
);
CREATE INDEX todos_in_order ON todos(agent_id, position);

-- The todo_write call last applied to an agent's list: re-executing that
-- call (after a crash, before its result was recorded) changes nothing.
CREATE TABLE todo_writes (
    agent_id      TEXT PRIMARY KEY,
    tool_call_id  TEXT NOT NULL,
    updated_at    INTEGER NOT NULL
);

-- Compaction: tool results up to this message are shown to the model as
-- stubs (the rows stay); the `compacted` event holds the injected note.
ALTER TABLE agents ADD COLUMN compact_upto INTEGER;
