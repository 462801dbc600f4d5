-- 0008: the read model for auditors and analysts (issue 31; docs/data-dictionary.md).
--
-- * The audit order is the log's: tool_call_events.seq is no longer a counter of the order in
--   which a projector happened to insert (a rebuild gave every row another seq) but a function
--   of where the event is in the outcomes log: seq = log_offset * 1048576 + log_partition.
--   Within a partition (every event of a call key, of an approval request) it is the log
--   order; across partitions it interleaves them by offset. The same live and after any
--   number of rebuilds (toolledger replay).
-- * JSON columns are jsonb (payload_json, result_json, error_json, state_json, view_json):
--   no cast needed to read into them. jsonb cannot hold U+0000: an escaped NUL (\u0000) in a
--   JSON text is stored as U+FFFD, as the text columns store a NUL.
-- * duration_ms (double precision, milliseconds): of the handler run an event reports
--   (ToolCallSucceeded, ToolCallFailed, ToolCallJobStarted), and on tool_calls of the call's
--   latest finished run (NULL while a run is under way).
-- * Read-only calls have a tool_calls row each: its call_id is derived from the intent id
--   (schemas.keys.call_id_for), its idempotency_key is '' and its call_key the tool's shared
--   unkeyed key, so the uniqueness of call keys holds for keyed calls only.
-- * tool_metrics_daily: the metrics per day (UTC), tenant and tool.
--
-- The fact views of 0002 read the columns changed here. They are first redefined over
-- placeholders of the same types (CREATE OR REPLACE keeps the portable views that depend on
-- them), the columns change, then the fact views are redefined over the new columns.

CREATE OR REPLACE VIEW approval_events AS
SELECT NULL::bigint AS seq, NULL::text AS tenant_id, NULL::text AS tool_name,
       NULL::text AS call_id, NULL::text AS call_key, NULL::text AS idempotency_key,
       NULL::text AS run_id, NULL::text AS event_type, NULL::timestamptz AS occurred_at,
       NULL::text AS approval_id, NULL::text AS args_digest, NULL::text AS principal,
       NULL::text AS arguments_json, NULL::text AS impact_json,
       NULL::timestamptz AS expires_at, NULL::text AS approver, NULL::text AS reason
 WHERE false;
CREATE OR REPLACE VIEW switch_changes AS
SELECT NULL::text AS tenant_id, NULL::text AS tool, NULL::boolean AS enabled,
       NULL::text AS scope, NULL::text AS actor, NULL::text AS reason,
       NULL::timestamptz AS changed_at, NULL::text AS intent_id
 WHERE false;
CREATE OR REPLACE VIEW call_event_facts AS
SELECT NULL::bigint AS seq, NULL::text AS tenant_id, NULL::text AS tool_name,
       NULL::text AS run_id, NULL::text AS intent_id, NULL::text AS event_type,
       NULL::text AS error_code, NULL::text AS disposition, NULL::text AS fingerprint
 WHERE false;
DROP VIEW call_search;
DROP VIEW call_timeline;

-- what jsonb refuses: an escaped NUL (not preceded by an escaping backslash) becomes U+FFFD
CREATE FUNCTION pg_temp.to_jsonb_text(value text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    RETURN regexp_replace(value, '(?<!\\)((?:\\\\)*)\\u0000', '\1\\ufffd', 'g')::jsonb;

-- the audit trail: seq from the log position, JSON as jsonb, the run's duration
ALTER TABLE tool_call_events DROP COLUMN seq;  -- with its primary key and the indexes on it
ALTER TABLE tool_call_events
    ALTER COLUMN payload_json TYPE jsonb USING pg_temp.to_jsonb_text(payload_json),
    ADD COLUMN duration_ms double precision,
    ADD CONSTRAINT tool_call_events_log_position
        CHECK (log_partition >= 0 AND log_partition < 1048576 AND log_offset >= 0),
    ADD COLUMN seq bigint GENERATED ALWAYS AS (log_offset * 1048576 + log_partition) STORED;
UPDATE tool_call_events SET duration_ms = (payload_json ->> 'duration_ms')::double precision
 WHERE payload_json ? 'duration_ms';
ALTER TABLE tool_call_events ADD PRIMARY KEY (seq);
CREATE INDEX tool_call_events_by_call ON tool_call_events (call_id, seq);
CREATE INDEX tool_call_events_by_key
    ON tool_call_events (tenant_id, tool_name, idempotency_key, seq);
CREATE INDEX tool_call_events_by_run ON tool_call_events (tenant_id, run_id, seq);
CREATE INDEX tool_call_events_by_approval
    ON tool_call_events ((payload_json ->> 'approval_id'), tenant_id, seq)
    WHERE event_type IN ('ApprovalRequested', 'ApprovalGranted', 'ApprovalDenied',
                         'ApprovalConsumed');
CREATE INDEX tool_call_events_governance
    ON tool_call_events (event_type, tenant_id, seq)
    WHERE event_type IN ('ApprovalRequested', 'ApprovalGranted', 'ApprovalDenied',
                         'ApprovalConsumed', 'ToolDisabled', 'ToolEnabled');
CREATE INDEX tool_call_events_by_time ON tool_call_events (occurred_at);

-- the calls: JSON as jsonb, the latest run's duration, read-only calls beside keyed ones
ALTER TABLE tool_calls
    ALTER COLUMN result_json TYPE jsonb USING pg_temp.to_jsonb_text(result_json),
    ALTER COLUMN error_json TYPE jsonb USING pg_temp.to_jsonb_text(error_json),
    ALTER COLUMN state_json TYPE jsonb USING pg_temp.to_jsonb_text(state_json),
    ADD COLUMN duration_ms double precision,
    DROP CONSTRAINT tool_calls_key_unique,
    DROP CONSTRAINT tool_calls_call_key_key;
-- the latest run's, as projections.rows.latest_durations folds it: NULL after a Started
UPDATE tool_calls c SET duration_ms = (
    SELECT e.duration_ms FROM tool_call_events e
     WHERE e.call_id = c.call_id
       AND (e.duration_ms IS NOT NULL OR e.event_type = 'ToolCallStarted')
     ORDER BY e.seq DESC LIMIT 1
);
CREATE UNIQUE INDEX tool_calls_keyed ON tool_calls (call_key) WHERE idempotency_key <> '';
CREATE UNIQUE INDEX tool_calls_key_unique ON tool_calls (tenant_id, tool_name, idempotency_key)
    WHERE idempotency_key <> '';
CREATE INDEX tool_calls_by_time ON tool_calls (created_at);

ALTER TABLE tool_call_groups ALTER COLUMN view_json TYPE jsonb USING view_json::jsonb;

-- the fact views of 0002 again, over the new columns (same columns, same types)
CREATE OR REPLACE VIEW approval_events AS
SELECT e.seq, e.tenant_id, e.tool_name, e.call_id, e.call_key, e.idempotency_key, e.run_id,
       e.event_type, e.occurred_at,
       e.payload_json ->> 'approval_id' AS approval_id,
       e.payload_json #>> '{envelope,args_digest}' AS args_digest,
       e.payload_json #>> '{envelope,principal}' AS principal,
       e.payload_json ->> 'arguments_redacted_json' AS arguments_json,
       e.payload_json ->> 'impact_json' AS impact_json,
       (e.payload_json ->> 'expires_at')::timestamptz AS expires_at,
       e.payload_json ->> 'approver' AS approver,
       e.payload_json ->> 'reason' AS reason
  FROM tool_call_events e
 WHERE e.event_type IN ('ApprovalRequested', 'ApprovalGranted', 'ApprovalDenied',
                        'ApprovalConsumed');
CREATE OR REPLACE VIEW switch_changes AS
SELECT tenant_id, tool, enabled, scope, actor, reason, changed_at, intent_id
  FROM (SELECT e.tenant_id, e.tool_name AS tool, e.event_type = 'ToolEnabled' AS enabled,
               e.payload_json ->> 'scope' AS scope, e.payload_json ->> 'actor' AS actor,
               e.payload_json ->> 'reason' AS reason, e.occurred_at AS changed_at, e.intent_id,
               row_number() OVER (PARTITION BY e.tenant_id, e.tool_name, e.intent_id
                                  ORDER BY e.seq) AS n
          FROM tool_call_events e
         WHERE e.event_type IN ('ToolDisabled', 'ToolEnabled')) s
 WHERE n = 1;
CREATE OR REPLACE VIEW call_event_facts AS
SELECT e.seq, e.tenant_id, e.tool_name, e.run_id, e.intent_id, e.event_type,
       e.payload_json #>> '{error,code}' AS error_code,
       e.payload_json ->> 'disposition' AS disposition,
       e.payload_json ->> 'fingerprint' AS fingerprint
  FROM tool_call_events e
 WHERE e.event_type NOT IN ('ToolDisabled', 'ToolEnabled');

-- 0001's support-staff views, with the duration
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
       c.error_json ->> 'code'    AS error_code,
       c.error_json ->> 'message' AS error_message,
       c.first_intent_id,
       c.last_intent_id,
       c.created_at,
       c.updated_at,
       c.updated_at - c.created_at AS elapsed,
       c.duration_ms,
       (SELECT count(*) FROM tool_call_events e WHERE e.call_id = c.call_id) AS event_count
  FROM tool_calls c;
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
       e.duration_ms,
       e.payload_json
  FROM tool_call_events e;

-- The day facts (PostgreSQL's dialect: the day of a time in UTC) under tool_metrics_daily.
-- call_day_facts: every call row on the day it was created. event_day_facts: every call event
-- (switches left out) on the day it occurred, with its error code and run duration.
CREATE VIEW call_day_facts AS
SELECT c.tenant_id, c.tool_name, CAST(c.created_at AT TIME ZONE 'UTC' AS date) AS day,
       c.status, c.run_id
  FROM tool_calls c;
CREATE VIEW event_day_facts AS
SELECT e.tenant_id, e.tool_name, CAST(e.occurred_at AT TIME ZONE 'UTC' AS date) AS day,
       e.intent_id, e.event_type, e.payload_json #>> '{error,code}' AS error_code,
       e.duration_ms
  FROM tool_call_events e
 WHERE e.event_type NOT IN ('ToolDisabled', 'ToolEnabled');

-- BEGIN portable daily views (read by projections/governance.py: no clock, no dialect)
-- The metrics per day (UTC), tenant and tool (docs/data-dictionary.md#tool_metrics_daily):
--   calls, succeeded, failed_final, failed_retryable, unknown, pending, calls_in_runs, runs:
--     the call rows created that day (status: their status now)
--   intents, validation_failures, duplicates: as in tool_metric_counts, of that day's events
--   approvals_granted, approvals_denied: the decisions made that day
--   p50_duration_ms, p95_duration_ms: nearest-rank percentiles of the handler runs that day
--     (every ToolCallSucceeded, ToolCallFailed and ToolCallJobStarted with a duration)
--   rates: as in tool_metrics (NULL when the denominator is 0), human_rejection_rate of the
--     decisions made that day
CREATE VIEW tool_metrics_daily AS
SELECT k.day, k.tenant_id, k.tool_name,
       coalesce(c.calls, 0) AS calls,
       coalesce(c.succeeded, 0) AS succeeded,
       coalesce(c.failed_final, 0) AS failed_final,
       coalesce(c.failed_retryable, 0) AS failed_retryable,
       coalesce(c.unknown, 0) AS unknown,
       coalesce(c.pending, 0) AS pending,
       coalesce(e.intents, 0) AS intents,
       coalesce(e.validation_failures, 0) AS validation_failures,
       coalesce(e.duplicates, 0) AS duplicates,
       coalesce(e.approvals_granted, 0) AS approvals_granted,
       coalesce(e.approvals_denied, 0) AS approvals_denied,
       coalesce(c.calls_in_runs, 0) AS calls_in_runs,
       coalesce(c.runs, 0) AS runs,
       CAST(c.succeeded AS DOUBLE PRECISION) / NULLIF(c.calls - c.pending, 0) AS success_rate,
       CAST(e.validation_failures AS DOUBLE PRECISION) / NULLIF(e.intents, 0)
         AS validation_failure_rate,
       CAST(e.duplicates AS DOUBLE PRECISION) / NULLIF(e.intents, 0) AS duplicate_rate,
       CAST(e.approvals_denied AS DOUBLE PRECISION)
         / NULLIF(e.approvals_granted + e.approvals_denied, 0) AS human_rejection_rate,
       CAST(c.calls_in_runs AS DOUBLE PRECISION) / NULLIF(c.runs, 0) AS calls_per_run,
       d.p50_duration_ms,
       d.p95_duration_ms
  FROM (SELECT day, tenant_id, tool_name FROM call_day_facts
        UNION SELECT day, tenant_id, tool_name FROM event_day_facts) k
  LEFT JOIN (SELECT day, tenant_id, tool_name,
                    count(*) AS calls,
                    count(*) FILTER (WHERE status = 'SUCCEEDED') AS succeeded,
                    count(*) FILTER (WHERE status = 'FAILED_FINAL') AS failed_final,
                    count(*) FILTER (WHERE status = 'FAILED_RETRYABLE') AS failed_retryable,
                    count(*) FILTER (WHERE status = 'UNKNOWN') AS unknown,
                    count(*) FILTER (WHERE status = 'PENDING') AS pending,
                    count(run_id) AS calls_in_runs,
                    count(DISTINCT run_id) AS runs
               FROM call_day_facts GROUP BY day, tenant_id, tool_name) c
         ON c.day = k.day AND c.tenant_id = k.tenant_id AND c.tool_name = k.tool_name
  LEFT JOIN (SELECT day, tenant_id, tool_name,
                    count(DISTINCT CASE WHEN event_type LIKE 'ToolCall%'
                                          OR event_type = 'ApprovalRequested'
                                        THEN intent_id END) AS intents,
                    count(*) FILTER (WHERE event_type = 'ToolCallRejected'
                                       AND error_code = 'VALIDATION_FAILED')
                      AS validation_failures,
                    count(*) FILTER (WHERE event_type = 'ToolCallReplayed'
                                        OR (event_type = 'ToolCallRejected'
                                            AND error_code = 'IDEMPOTENCY_KEY_IN_USE'))
                      AS duplicates,
                    count(*) FILTER (WHERE event_type = 'ApprovalGranted') AS approvals_granted,
                    count(*) FILTER (WHERE event_type = 'ApprovalDenied') AS approvals_denied
               FROM event_day_facts GROUP BY day, tenant_id, tool_name) e
         ON e.day = k.day AND e.tenant_id = k.tenant_id AND e.tool_name = k.tool_name
  LEFT JOIN (SELECT day, tenant_id, tool_name,
                    min(CASE WHEN n * 100 >= 50 * total THEN duration_ms END)
                      AS p50_duration_ms,
                    min(CASE WHEN n * 100 >= 95 * total THEN duration_ms END)
                      AS p95_duration_ms
               FROM (SELECT day, tenant_id, tool_name, duration_ms,
                            row_number() OVER (PARTITION BY day, tenant_id, tool_name
                                               ORDER BY duration_ms) AS n,
                            count(*) OVER (PARTITION BY day, tenant_id, tool_name) AS total
                       FROM event_day_facts WHERE duration_ms IS NOT NULL) r
              GROUP BY day, tenant_id, tool_name) d
         ON d.day = k.day AND d.tenant_id = k.tenant_id AND d.tool_name = k.tool_name;
-- END portable daily views
