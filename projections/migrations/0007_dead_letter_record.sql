-- A dead letter keeps the record it holds whole, as Kafka Connect's dead letter queue does
-- (docs/consuming.md#dead-letters): beside its value (payload), its key and its headers.
-- headers: a JSON array of {"name", "value"} (UTF-8 text) or {"name", "base64"} (other bytes),
-- in the record's order. Rows recorded before this migration have neither ('[]', NULL).
ALTER TABLE dead_letters
    ADD COLUMN record_key bytea,
    ADD COLUMN headers    jsonb NOT NULL DEFAULT '[]'::jsonb;
