-- Worker tokens: a provider's workers authenticate at the gateway
-- (`GET /v1/providers/connect`) with one. Only the SHA-256 of the secret
-- is stored, as for API keys; `prefix` tells tokens apart in listings. A
-- provider may have several tokens, and several workers may share one.
CREATE TABLE worker_tokens (
    id          TEXT PRIMARY KEY,
    account_id  TEXT NOT NULL REFERENCES accounts (id),
    name        TEXT NOT NULL,
    prefix      TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);
CREATE INDEX worker_tokens_account ON worker_tokens (account_id);
