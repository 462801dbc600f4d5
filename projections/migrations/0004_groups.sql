-- 0004: call groups (issue 12). group_log holds the orchestrator's events in order per group
-- (the source of the group's state); group_meta says who submitted it and whether it has
-- finished; tool_call_groups and tool_call_group_steps are its read model, written with each
-- event in the same transaction.
CREATE TABLE IF NOT EXISTS group_log (
    seq bigserial PRIMARY KEY,
    group_id text NOT NULL,
    event_json text NOT NULL
);
CREATE INDEX IF NOT EXISTS group_log_by_group ON group_log (group_id, seq);
CREATE TABLE IF NOT EXISTS group_meta (
    group_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    principal text NOT NULL,
    scopes_json text NOT NULL,
    group_key text NOT NULL,
    created_at timestamptz NOT NULL,
    finished boolean NOT NULL DEFAULT false
);
CREATE INDEX IF NOT EXISTS group_meta_unfinished ON group_meta (group_id) WHERE NOT finished;
CREATE TABLE IF NOT EXISTS tool_call_groups (
    group_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    idempotency_key text NOT NULL,
    run_id text NOT NULL,
    status text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    view_json text NOT NULL
);
CREATE INDEX IF NOT EXISTS tool_call_groups_by_run ON tool_call_groups (tenant_id, run_id);
CREATE TABLE IF NOT EXISTS tool_call_group_steps (
    group_id text NOT NULL,
    step_id text NOT NULL,
    position integer NOT NULL,
    tool text NOT NULL,
    status text NOT NULL,
    call_id text,
    compensation_status text,
    compensation_call_id text,
    PRIMARY KEY (group_id, step_id)
);
CREATE INDEX IF NOT EXISTS tool_call_group_steps_by_call ON tool_call_group_steps (call_id);
