-- 0002: the governance read side: approval requests, kill switches, metrics and run budgets
-- (DESIGN sections 6 and 11).
--
-- Only indexes and views over tool_calls and tool_call_events: applying an event writes
-- nothing new, and a rebuild (toolledger replay) gives the views back by construction.
-- projections/sqlite.py defines the same views for the embedded mode. The three fact views
-- below read the JSON payloads (PostgreSQL dialect); the views between the BEGIN and END
-- markers are the one text for both databases: projections/governance.py reads them from
-- here for SQLite (PORTABLE_VIEWS_SQL, the clock now() becoming the dialect's).

-- Approval and switch events are a small part of the audit trail: partial indexes find them.
CREATE INDEX tool_call_events_by_approval
    ON tool_call_events (((payload_json::jsonb) ->> 'approval_id'), tenant_id, seq)
    WHERE event_type IN ('ApprovalRequested', 'ApprovalGranted', 'ApprovalDenied',
                         'ApprovalConsumed');
CREATE INDEX tool_call_events_governance
    ON tool_call_events (event_type, tenant_id, seq)
    WHERE event_type IN ('ApprovalRequested', 'ApprovalGranted', 'ApprovalDenied',
                         'ApprovalConsumed', 'ToolDisabled', 'ToolEnabled');
-- (run budgets use tool_call_events_by_run (tenant_id, run_id, seq) from 0001)

-- The approval events with their fields (args digest and principal from the envelope).
CREATE VIEW approval_events AS
SELECT e.seq, e.tenant_id, e.tool_name, e.call_id, e.call_key, e.idempotency_key, e.run_id,
       e.event_type, e.occurred_at,
       j.p ->> 'approval_id' AS approval_id,
       j.p #>> '{envelope,args_digest}' AS args_digest,
       j.p #>> '{envelope,principal}' AS principal,
       j.p ->> 'arguments_redacted_json' AS arguments_json,
       j.p ->> 'impact_json' AS impact_json,
       (j.p ->> 'expires_at')::timestamptz AS expires_at,
       j.p ->> 'approver' AS approver,
       j.p ->> 'reason' AS reason
  FROM tool_call_events e
 CROSS JOIN LATERAL (SELECT e.payload_json::jsonb AS p) j
 WHERE e.event_type IN ('ApprovalRequested', 'ApprovalGranted', 'ApprovalDenied',
                        'ApprovalConsumed');

-- Every switch change once: a switch is recorded in every log partition (same intent id).
CREATE VIEW switch_changes AS
SELECT tenant_id, tool, enabled, scope, actor, reason, changed_at, intent_id
  FROM (SELECT e.tenant_id, e.tool_name AS tool, e.event_type = 'ToolEnabled' AS enabled,
               j.p ->> 'scope' AS scope, j.p ->> 'actor' AS actor, j.p ->> 'reason' AS reason,
               e.occurred_at AS changed_at, e.intent_id,
               row_number() OVER (PARTITION BY e.tenant_id, e.tool_name, e.intent_id
                                  ORDER BY e.seq) AS n
          FROM tool_call_events e
         CROSS JOIN LATERAL (SELECT e.payload_json::jsonb AS p) j
         WHERE e.event_type IN ('ToolDisabled', 'ToolEnabled')) s
 WHERE n = 1;

-- The call events (everything but switches) with the fields the metrics and budgets need.
CREATE VIEW call_event_facts AS
SELECT e.seq, e.tenant_id, e.tool_name, e.run_id, e.intent_id, e.event_type,
       j.p #>> '{error,code}' AS error_code,
       j.p ->> 'disposition' AS disposition,
       j.p ->> 'fingerprint' AS fingerprint
  FROM tool_call_events e
 CROSS JOIN LATERAL (SELECT e.payload_json::jsonb AS p) j
 WHERE e.event_type NOT IN ('ToolDisabled', 'ToolEnabled');

-- BEGIN portable views (read by projections/governance.py: keep now() the only clock)
-- One row per approval request. The first ApprovalRequested of an approval id (log order)
-- defines the request, the latest grant, denial or consumption its state, a grant replaces
-- the expiry with the token's. status: the state, or 'expired' once a pending or approved
-- (not consumed) request's expires_at has come by the database's clock. The read side's
-- queries compute status for the caller's own "now" from state and expires_at instead.
CREATE VIEW approvals AS
SELECT a.*,
       CASE WHEN a.state IN ('pending', 'approved') AND a.expires_at <= now()
            THEN 'expired' ELSE a.state END AS status
  FROM (SELECT r.tenant_id, r.approval_id, r.call_key, r.call_id, r.tool_name AS tool,
               r.idempotency_key, r.args_digest, r.run_id, r.arguments_json, r.impact_json,
               r.principal AS requested_by, r.occurred_at AS requested_at,
               CASE s.event_type WHEN 'ApprovalGranted' THEN 'approved'
                                 WHEN 'ApprovalDenied' THEN 'denied'
                                 WHEN 'ApprovalConsumed' THEN 'consumed'
                                 ELSE 'pending' END AS state,
               coalesce(g.expires_at, r.expires_at) AS expires_at,
               CASE d.event_type WHEN 'ApprovalGranted' THEN 'granted'
                                 WHEN 'ApprovalDenied' THEN 'denied' END AS decision,
               d.approver, d.occurred_at AS decided_at, d.reason,
               c.occurred_at AS consumed_at
          FROM (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                             ORDER BY seq) AS n
                  FROM approval_events WHERE event_type = 'ApprovalRequested') r
          LEFT JOIN (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                                  ORDER BY seq DESC) AS n
                       FROM approval_events WHERE event_type <> 'ApprovalRequested') s
                 ON s.tenant_id = r.tenant_id AND s.approval_id = r.approval_id AND s.n = 1
          LEFT JOIN (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                                  ORDER BY seq DESC) AS n
                       FROM approval_events WHERE event_type = 'ApprovalGranted') g
                 ON g.tenant_id = r.tenant_id AND g.approval_id = r.approval_id AND g.n = 1
          LEFT JOIN (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                                  ORDER BY seq DESC) AS n
                       FROM approval_events
                      WHERE event_type IN ('ApprovalGranted', 'ApprovalDenied')) d
                 ON d.tenant_id = r.tenant_id AND d.approval_id = r.approval_id AND d.n = 1
          LEFT JOIN (SELECT *, row_number() OVER (PARTITION BY tenant_id, approval_id
                                                  ORDER BY seq DESC) AS n
                       FROM approval_events WHERE event_type = 'ApprovalConsumed') c
                 ON c.tenant_id = r.tenant_id AND c.approval_id = r.approval_id AND c.n = 1
         WHERE r.n = 1) a;

-- The latest state of each (tenant_id, tool) switch ('*': every tenant, every tool): the
-- highest (changed_at, intent_id), the order the executor itself uses.
CREATE VIEW tool_switches AS
SELECT tenant_id, tool, enabled, scope, actor, reason, changed_at, intent_id
  FROM (SELECT *, row_number() OVER (PARTITION BY tenant_id, tool
                                     ORDER BY changed_at DESC, intent_id DESC) AS n
          FROM switch_changes) s
 WHERE n = 1;

-- Counts per (tenant, tool), see schemas.calls.ToolStats:
--   calls, succeeded, failed_final, failed_retryable, unknown, pending: tool_calls rows
--   calls_in_runs: calls with a run id, runs: distinct run ids among them
--   intents: calls answered, each once: distinct intent ids of ToolCall* + ApprovalRequested
--   validation_failures: ToolCallRejected VALIDATION_FAILED
--   duplicates: ToolCallReplayed + ToolCallRejected IDEMPOTENCY_KEY_IN_USE
--   retry_limit_refusals: ToolCallFailed or ToolCallRejected RETRY_LIMIT_EXCEEDED
--   approvals_pending (status, by the database's clock), approvals_granted/_denied (decision)
CREATE VIEW tool_metric_counts AS
SELECT k.tenant_id, k.tool_name,
       coalesce(c.calls, 0) AS calls,
       coalesce(c.succeeded, 0) AS succeeded,
       coalesce(c.failed_final, 0) AS failed_final,
       coalesce(c.failed_retryable, 0) AS failed_retryable,
       coalesce(c.unknown, 0) AS unknown,
       coalesce(c.pending, 0) AS pending,
       coalesce(e.intents, 0) AS intents,
       coalesce(e.validation_failures, 0) AS validation_failures,
       coalesce(e.duplicates, 0) AS duplicates,
       coalesce(e.retry_limit_refusals, 0) AS retry_limit_refusals,
       coalesce(c.calls_in_runs, 0) AS calls_in_runs,
       coalesce(c.runs, 0) AS runs,
       coalesce(a.approvals_pending, 0) AS approvals_pending,
       coalesce(a.approvals_granted, 0) AS approvals_granted,
       coalesce(a.approvals_denied, 0) AS approvals_denied
  FROM (SELECT tenant_id, tool_name FROM tool_calls
        UNION SELECT tenant_id, tool_name FROM call_event_facts) k
  LEFT JOIN (SELECT tenant_id, tool_name,
                    count(*) AS calls,
                    count(*) FILTER (WHERE status = 'SUCCEEDED') AS succeeded,
                    count(*) FILTER (WHERE status = 'FAILED_FINAL') AS failed_final,
                    count(*) FILTER (WHERE status = 'FAILED_RETRYABLE') AS failed_retryable,
                    count(*) FILTER (WHERE status = 'UNKNOWN') AS unknown,
                    count(*) FILTER (WHERE status = 'PENDING') AS pending,
                    count(run_id) AS calls_in_runs,
                    count(DISTINCT run_id) AS runs
               FROM tool_calls GROUP BY tenant_id, tool_name) c
         ON c.tenant_id = k.tenant_id AND c.tool_name = k.tool_name
  LEFT JOIN (SELECT tenant_id, tool_name,
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
                    count(*) FILTER (WHERE event_type IN ('ToolCallFailed', 'ToolCallRejected')
                                       AND error_code = 'RETRY_LIMIT_EXCEEDED')
                      AS retry_limit_refusals
               FROM call_event_facts GROUP BY tenant_id, tool_name) e
         ON e.tenant_id = k.tenant_id AND e.tool_name = k.tool_name
  LEFT JOIN (SELECT tenant_id, tool AS tool_name,
                    count(*) FILTER (WHERE status = 'pending') AS approvals_pending,
                    count(*) FILTER (WHERE decision = 'granted') AS approvals_granted,
                    count(*) FILTER (WHERE decision = 'denied') AS approvals_denied
               FROM approvals GROUP BY tenant_id, tool) a
         ON a.tenant_id = k.tenant_id AND a.tool_name = k.tool_name;

-- The same counts per tenant: sums over its tools, but runs counted once per tenant.
CREATE VIEW tenant_metric_counts AS
SELECT t.tenant_id,
       CAST(sum(t.calls) AS BIGINT) AS calls,
       CAST(sum(t.succeeded) AS BIGINT) AS succeeded,
       CAST(sum(t.failed_final) AS BIGINT) AS failed_final,
       CAST(sum(t.failed_retryable) AS BIGINT) AS failed_retryable,
       CAST(sum(t.unknown) AS BIGINT) AS unknown,
       CAST(sum(t.pending) AS BIGINT) AS pending,
       CAST(sum(t.intents) AS BIGINT) AS intents,
       CAST(sum(t.validation_failures) AS BIGINT) AS validation_failures,
       CAST(sum(t.duplicates) AS BIGINT) AS duplicates,
       CAST(sum(t.retry_limit_refusals) AS BIGINT) AS retry_limit_refusals,
       CAST(sum(t.calls_in_runs) AS BIGINT) AS calls_in_runs,
       coalesce(max(r.runs), 0) AS runs,
       CAST(sum(t.approvals_pending) AS BIGINT) AS approvals_pending,
       CAST(sum(t.approvals_granted) AS BIGINT) AS approvals_granted,
       CAST(sum(t.approvals_denied) AS BIGINT) AS approvals_denied
  FROM tool_metric_counts t
  LEFT JOIN (SELECT tenant_id, count(DISTINCT run_id) AS runs
               FROM tool_calls GROUP BY tenant_id) r ON r.tenant_id = t.tenant_id
 GROUP BY t.tenant_id;

-- The counts and the rates (NULL when the denominator is 0):
--   success_rate = succeeded / (calls - pending), that is of the finished calls
--   validation_failure_rate = validation_failures / intents
--   duplicate_rate = duplicates / intents
--   human_rejection_rate = approvals_denied / (approvals_granted + approvals_denied)
--   calls_per_run = calls_in_runs / runs
CREATE VIEW tool_metrics AS
SELECT m.*,
       CAST(succeeded AS DOUBLE PRECISION) / NULLIF(calls - pending, 0) AS success_rate,
       CAST(validation_failures AS DOUBLE PRECISION) / NULLIF(intents, 0)
         AS validation_failure_rate,
       CAST(duplicates AS DOUBLE PRECISION) / NULLIF(intents, 0) AS duplicate_rate,
       CAST(approvals_denied AS DOUBLE PRECISION)
         / NULLIF(approvals_granted + approvals_denied, 0) AS human_rejection_rate,
       CAST(calls_in_runs AS DOUBLE PRECISION) / NULLIF(runs, 0) AS calls_per_run
  FROM tool_metric_counts m;

CREATE VIEW tenant_metrics AS
SELECT m.*,
       CAST(succeeded AS DOUBLE PRECISION) / NULLIF(calls - pending, 0) AS success_rate,
       CAST(validation_failures AS DOUBLE PRECISION) / NULLIF(intents, 0)
         AS validation_failure_rate,
       CAST(duplicates AS DOUBLE PRECISION) / NULLIF(intents, 0) AS duplicate_rate,
       CAST(approvals_denied AS DOUBLE PRECISION)
         / NULLIF(approvals_granted + approvals_denied, 0) AS human_rejection_rate,
       CAST(calls_in_runs AS DOUBLE PRECISION) / NULLIF(runs, 0) AS calls_per_run
  FROM tenant_metric_counts m;
-- END portable views
