-- 0003: the ancestor roll-up of an answer's cost gets its own trigger whose
-- WHEN clause (evaluated once per row) skips free answers entirely, instead
-- of an UPDATE whose WHERE re-checks the cost against every candidate row.

DROP TRIGGER messages_assistant_usage;

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
END;

CREATE TRIGGER messages_assistant_cost_rollup AFTER INSERT ON messages
WHEN NEW.role = 'assistant' AND NEW.cost_usd > 0
BEGIN
    UPDATE agents
       SET subtree_cost_usd = subtree_cost_usd + NEW.cost_usd
     WHERE id IN (SELECT value FROM json_each(
                    (SELECT ancestors FROM agents WHERE id = NEW.agent_id)));
END;
