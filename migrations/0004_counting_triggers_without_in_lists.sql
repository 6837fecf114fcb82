-- 0004: the active-agent counting triggers, rewritten without `IN (...)`
-- lists. Inside a trigger body SQLite rebuilds an ephemeral table for such a
-- list on every execution, which made each status change cost ~100 µs; plain
-- comparisons and constant deltas cost ~10 µs.

DROP TRIGGER agents_count_insert;
DROP TRIGGER agents_count_status;
DROP TRIGGER agents_count_delete;

CREATE TRIGGER agents_count_insert AFTER INSERT ON agents
WHEN NEW.status = 'queued' OR NEW.status = 'running' OR NEW.status = 'waiting'
BEGIN
    INSERT OR IGNORE INTO user_stats (user_name, active_agents) VALUES (NEW.user_name, 0);
    UPDATE user_stats SET active_agents = active_agents + 1 WHERE user_name = NEW.user_name;
    UPDATE agents SET active_children = active_children + 1 WHERE id = NEW.parent_id;
END;

-- An agent stops being active (settles).
CREATE TRIGGER agents_count_settle AFTER UPDATE OF status ON agents
WHEN (OLD.status = 'queued' OR OLD.status = 'running' OR OLD.status = 'waiting')
 AND NOT (NEW.status = 'queued' OR NEW.status = 'running' OR NEW.status = 'waiting')
BEGIN
    UPDATE user_stats SET active_agents = active_agents - 1 WHERE user_name = NEW.user_name;
    UPDATE agents SET active_children = active_children - 1 WHERE id = NEW.parent_id;
END;

-- A settled agent becomes active again (woken by a message).
CREATE TRIGGER agents_count_wake AFTER UPDATE OF status ON agents
WHEN NOT (OLD.status = 'queued' OR OLD.status = 'running' OR OLD.status = 'waiting')
 AND (NEW.status = 'queued' OR NEW.status = 'running' OR NEW.status = 'waiting')
BEGIN
    UPDATE user_stats SET active_agents = active_agents + 1 WHERE user_name = NEW.user_name;
    UPDATE agents SET active_children = active_children + 1 WHERE id = NEW.parent_id;
END;

CREATE TRIGGER agents_count_delete AFTER DELETE ON agents
WHEN OLD.status = 'queued' OR OLD.status = 'running' OR OLD.status = 'waiting'
BEGIN
    UPDATE user_stats SET active_agents = active_agents - 1 WHERE user_name = OLD.user_name;
    UPDATE agents SET active_children = active_children - 1 WHERE id = OLD.parent_id;
END;
