-- Each provider's standing as the fleet measured it: attempts its workers
-- delivered and lost, seconds it had a worker connected, and when it was
-- first seen. Replicas add their own counts (`+ excluded.*`), so the
-- totals are the whole fleet's. Reputation and uptime follow from them
-- (`fleet::standing`); admins no longer set them.
CREATE TABLE provider_standing (
    provider_id TEXT PRIMARY KEY REFERENCES accounts (id),
    jobs_ok     BIGINT NOT NULL DEFAULT 0 CHECK (jobs_ok >= 0),
    jobs_lost   BIGINT NOT NULL DEFAULT 0 CHECK (jobs_lost >= 0),
    connected_s BIGINT NOT NULL DEFAULT 0 CHECK (connected_s >= 0),
    first_seen  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
