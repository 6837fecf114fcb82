-- 0006: no triggers on `agents` either. A table with triggers makes SQLite
-- open ephemeral tables for every INSERT … SELECT and every UPDATE of the
-- watched column, which costs more than the statements themselves. The
-- active-agent counters (user_stats.active_agents, agents.active_children)
-- are now maintained by the few statements that change an agent's
-- activeness, all in src/db/agents.rs: create (+1), settle (−1), wake (+1).
--
-- A tree's spend is summed on demand when a budget is checked (the index
-- below), instead of being rolled up into every ancestor on every answer;
-- `subtree_cost_usd` is no longer maintained.

DROP TRIGGER agents_count_insert;
DROP TRIGGER agents_count_settle;
DROP TRIGGER agents_count_wake;
DROP TRIGGER agents_count_delete;

CREATE INDEX agents_by_root ON agents(root_id);
