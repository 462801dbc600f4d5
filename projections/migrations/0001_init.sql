-- toolledger projections, version 0001: current call state, audit trail, consumer positions,
-- dead letters and the support-staff search view (DESIGN section 6).
--
-- Applied by projections.postgres.migrate() in one transaction, under an advisory lock, and
-- recorded in schema_migrations. Never edit an applied migration: add 0002_*.sql instead.
--
-- Times are timestamptz. The *_json columns are text, not jsonb: they hold exactly the bytes
-- the events carried (jsonb would reorder keys and normalise numbers); views cast where needed.

-- One row per call key: the fold of its outcome events (processors.ledger.evolve).
CREATE TABLE tool_calls (
    call_id            text        PRIMARY KEY,
    call_key           text        NOT NULL UNIQUE,
    tenant_id          text        NOT NULL,
    tool_name          text        NOT NULL,
    tool_version       text        NOT NULL,
    idempotency_key    text        NOT NULL,
    args_digest        text        NOT NULL,
    status             text        NOT NULL CHECK (status IN (
                           'PENDING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL', 'UNKNOWN')),
    result_json        text,
    error_json         text,
    attempts           integer     NOT NULL,
    rounds             integer     NOT NULL,
    reconcile_attempts integer     NOT NULL,
    run_id             text,
    step_id            text,
    first_intent_id    text        NOT NULL,
    last_intent_id     text        NOT NULL,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    last_event_id      text        NOT NULL,
    state_json         text        NOT NULL,
    CONSTRAINT tool_calls_key_unique UNIQUE (tenant_id, tool_name, idempotency_key)
);
-- support staff: "what happened in this run?", "what is stuck for this tenant?"
CREATE INDEX tool_calls_by_run ON tool_calls (tenant_id, run_id);
CREATE INDEX tool_calls_by_status ON tool_calls (tenant_id, status, updated_at);

-- The append-only audit trail: one row per outcome event, applied once (event_id is unique).
CREATE TABLE tool_call_events (
    seq             bigserial   PRIMARY KEY,
    event_id        text        NOT NULL UNIQUE,
    log_partition   integer     NOT NULL,
    log_offset      bigint      NOT NULL,
    call_id         text        NOT NULL,
    call_key        text        NOT NULL,
    tenant_id       text        NOT NULL,
    tool_name       text        NOT NULL,
    idempotency_key text        NOT NULL,
    intent_id       text        NOT NULL,
    run_id          text,
    event_type      text        NOT NULL,
    occurred_at     timestamptz NOT NULL,
    payload_json    text        NOT NULL
);
CREATE INDEX tool_call_events_by_call ON tool_call_events (call_id, seq);
CREATE INDEX tool_call_events_by_key
    ON tool_call_events (tenant_id, tool_name, idempotency_key, seq);
CREATE INDEX tool_call_events_by_run ON tool_call_events (tenant_id, run_id, seq);
CREATE INDEX tool_call_events_by_intent ON tool_call_events (intent_id);

-- Where each consumer is in each log partition: the next offset to apply. Written in the same
-- transaction as the rows those offsets produced.
CREATE TABLE projector_positions (
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);

-- Records that could not be processed: intents the executor dead-lettered (topic, partition,
-- offset: where the intent was) and outcome records the projector could not decode (where that
-- record was). Same columns as the embedded log's table; "offset" must be quoted in SQL.
CREATE TABLE dead_letters (
    id          bigserial   PRIMARY KEY,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    reason      text        NOT NULL,
    payload     bytea       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dead_letters_position_unique UNIQUE (topic, partition, "offset")
);

-- Support-staff search: one row per call, with what a human wants to see first. Search it by
-- (tenant_id, tool_name, idempotency_key), by (tenant_id, run_id) or by call_id: all indexed.
CREATE VIEW call_search AS
SELECT c.call_id,
       c.tenant_id,
       c.tool_name,
       c.tool_version,
       c.idempotency_key,
       c.run_id,
       c.step_id,
       c.status,
       c.attempts,
       c.rounds,
       c.reconcile_attempts,
       c.error_json::jsonb ->> 'code'    AS error_code,
       c.error_json::jsonb ->> 'message' AS error_message,
       c.first_intent_id,
       c.last_intent_id,
       c.created_at,
       c.updated_at,
       c.updated_at - c.created_at       AS elapsed,
       (SELECT count(*) FROM tool_call_events e WHERE e.call_id = c.call_id) AS event_count
  FROM tool_calls c;

-- The audit trail of one call in log order, for the same searches.
CREATE VIEW call_timeline AS
SELECT e.call_id,
       e.tenant_id,
       e.tool_name,
       e.idempotency_key,
       e.run_id,
       e.seq,
       e.event_type,
       e.occurred_at,
       e.intent_id,
       e.event_id,
       e.log_partition,
       e.log_offset,
       e.payload_json
  FROM tool_call_events e;
