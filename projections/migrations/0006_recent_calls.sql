-- 0006: the console's recent calls (CallQueries.recent, issue 32): a tenant's calls newest
-- first, paged by (created_at, call_id). Without this index each page sorts all of the
-- tenant's calls; with it a page reads its 51 rows (scanned backwards).
CREATE INDEX IF NOT EXISTS tool_calls_recent ON tool_calls (tenant_id, created_at, call_id COLLATE "C");
