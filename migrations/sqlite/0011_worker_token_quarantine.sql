-- A sanction follows the token, not the connection: a token whose worker
-- failed a check is quarantined here, so every replica refuses it at the
-- handshake and closes its live sessions, and a restart does not forget
-- it. Only an admin clears it (`DELETE /admin/providers/tokens/{id}/quarantine`).
ALTER TABLE worker_tokens ADD COLUMN quarantined_at BIGINT;
ALTER TABLE worker_tokens ADD COLUMN quarantine_reason TEXT;
