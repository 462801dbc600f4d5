-- 0009: keys scoped by principal (issue 33, item 6). Under the key scope "tenant+principal"
-- two principals of a tenant sending the same key to a tool make two calls: their call keys
-- differ (the principal is their fourth part), their tenant, tool and key do not. The call key
-- stays unique (tool_calls_keyed); the search by key keeps its index, no longer unique.
DROP INDEX tool_calls_key_unique;
CREATE INDEX tool_calls_by_key ON tool_calls (tenant_id, tool_name, idempotency_key)
    WHERE idempotency_key <> '';
