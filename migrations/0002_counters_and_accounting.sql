-- 0002: keep hot-path writes to one statement each.
--
-- * Usage accounting is a trigger on assistant messages: recording a model
--   answer (one INSERT) also adds its tokens and cost to the agent and its
--   cost to every ancestor's subtree spend, atomically.
-- * Active-agent counts (per user, per parent) are maintained by triggers so
--   the concurrency limits are O(1) lookups instead of scans.

-- Ancestor ids (parent first, root last) as a JSON array.
ALTER TABLE agents ADD COLUMN ancestors TEXT NOT NULL DEFAULT '[]';
UPDATE agents SET ancestors = CASE
    WHEN parent_id IS NULL THEN '[]'
    WHEN parent_id = root_id THEN json_array(parent_id)
    ELSE json_array(parent_id, root_id) END;

-- Unfinished (queued, running, waiting) children of this agent.
ALTER TABLE agents ADD COLUMN active_children INTEGER NOT NULL DEFAULT 0;
UPDATE agents SET active_children = (
    SELECT COUNT(*) FROM agents c
     WHERE c.parent_id = agents.id AND c.status IN ('queued','running','waiting'));

-- Unfinished agents per user.
CREATE TABLE user_stats (
    user_name      TEXT PRIMARY KEY,
    active_agents  INTEGER NOT NULL DEFAULT 0
);
INSERT INTO user_stats (user_name, active_agents)
    SELECT user_name, COUNT(*) FROM agents
     WHERE status IN ('queued','running','waiting') GROUP BY user_name;

CREATE TRIGGER agents_count_insert AFTER INSERT ON agents
WHEN NEW.status IN ('queued','running','waiting')
BEGIN
    INSERT OR IGNORE INTO user_stats (user_name, active_agents) VALUES (NEW.user_name, 0);
    UPDATE user_stats SET active_agents = active_agents + 1 WHERE user_name = NEW.user_name;
    UPDATE agents SET active_children = active_children + 1 WHERE id = NEW.parent_id;
END;

CREATE TRIGGER agents_count_status AFTER UPDATE OF status ON agents
WHEN (OLD.status IN ('queued','running','waiting')) <> (NEW.status IN ('queued','running','waiting'))
BEGIN
    UPDATE user_stats
       SET active_agents = active_agents
           + (CASE WHEN NEW.status IN ('queued','running','waiting') THEN 1 ELSE -1 END)
     WHERE user_name = NEW.user_name;
    UPDATE agents
       SET active_children = active_children
           + (CASE WHEN NEW.status IN ('queued','running','waiting') THEN 1 ELSE -1 END)
     WHERE id = NEW.parent_id;
END;

CREATE TRIGGER agents_count_delete AFTER DELETE ON agents
WHEN OLD.status IN ('queued','running','waiting')
BEGIN
    UPDATE user_stats SET active_agents = active_agents - 1 WHERE user_name = OLD.user_name;
    UPDATE agents SET active_children = active_children - 1 WHERE id = OLD.parent_id;
END;

-- Recording an assistant answer accounts for it.
CREATE TRIGGER messages_assistant_usage AFTER INSERT ON messages
WHEN NEW.role = 'assistant'
BEGIN
    UPDATE agents
       SET turns = turns + 1,
           turn_calls = turn_calls + 1,
           tokens_in = tokens_in + COALESCE(NEW.tokens_in, 0),
           tokens_out = tokens_out + COALESCE(NEW.tokens_out, 0),
           cost_usd = cost_usd + COALESCE(NEW.cost_usd, 0),
           subtree_cost_usd = subtree_cost_usd + COALESCE(NEW.cost_usd, 0)
     WHERE id = NEW.agent_id;
    UPDATE agents
       SET subtree_cost_usd = subtree_cost_usd + NEW.cost_usd
     WHERE NEW.cost_usd > 0
       AND id IN (SELECT value FROM json_each(
                    (SELECT ancestors FROM agents WHERE id = NEW.agent_id)));
END;
