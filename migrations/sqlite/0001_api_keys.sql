-- API keys: only the SHA-256 of the secret is stored; `prefix` is the
-- secret's first characters, shown in listings to tell keys apart.
CREATE TABLE api_keys (
    id             TEXT PRIMARY KEY,
    name           TEXT NOT NULL,
    prefix         TEXT NOT NULL,
    secret_hash    TEXT NOT NULL UNIQUE,
    rpm_limit      BIGINT,
    tpm_limit      BIGINT,
    max_concurrent BIGINT,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    revoked_at     BIGINT
);
