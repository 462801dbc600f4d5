-- 0005: the group log is the outbox of the groups topic (issue 12). A row is published to
-- `<prefix>groups` (keyed and partitioned by group id) by projections.group_relay, then marked;
-- rows from before this migration are unpublished, so the first relay publishes them too.
ALTER TABLE group_log ADD COLUMN IF NOT EXISTS published boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS group_log_unpublished ON group_log (seq) WHERE NOT published;
