-- 0005: no triggers on `messages`. With a trigger on the target table SQLite
-- materialises every INSERT … SELECT into a temporary table first, which was
-- the largest single cost of recording a step. Usage accounting moves into
-- the statements that record answers (src/db/writer.rs, RowKind::Assistant):
-- the same command inserts the answers and adds their usage to the agents
-- and their cost to every ancestor, so it stays one atomic unit.

DROP TRIGGER messages_assistant_usage;
DROP TRIGGER messages_assistant_cost_rollup;
