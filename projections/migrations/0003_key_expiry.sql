-- 0003: key retention (issue 10). A finished call's key expires after its retention; the
-- row keeps the call for support staff and says when its key expired. A new call with the
-- key overwrites the row (and clears expired_at); the audit trail keeps both histories.
ALTER TABLE tool_calls ADD COLUMN IF NOT EXISTS expired_at timestamptz;
