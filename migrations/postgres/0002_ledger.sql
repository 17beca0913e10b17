-- The ledger: accounts, a double-entry journal, holds on users' funds while
-- requests run, one usage record per request, server instances (so holds
-- of a crashed process can be found), and per-key budgets. Money is BIGINT
-- micro-units everywhere.

CREATE TABLE accounts (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,                -- user | provider | treasury | system
    name         TEXT NOT NULL,
    balance      BIGINT NOT NULL DEFAULT 0,    -- sum of the account's journal entries
    held         BIGINT NOT NULL DEFAULT 0,    -- sum of its open holds
    credit_limit BIGINT NOT NULL DEFAULT 0,    -- balance - held may go down to -credit_limit
    unlimited    BIGINT NOT NULL DEFAULT 0,    -- 1: never refused (open mode, system accounts)
    created_at   BIGINT NOT NULL
);

-- Money enters through `deposits` (top-ups), fees go to `treasury`, the
-- local engine is the house provider, `user:local` is open mode's user.
INSERT INTO accounts (id, kind, name, unlimited, created_at) VALUES
    ('deposits', 'system', 'Deposits (counterpart of top-ups)', 1, 0),
    ('treasury', 'treasury', 'Protocol treasury', 1, 0),
    ('provider:house', 'provider', 'House provider (local engine)', 0, 0),
    ('user:local', 'user', 'Local user (open mode)', 1, 0);

CREATE TABLE journal (
    id         TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,                  -- topup | usage | penalty
    ref        TEXT UNIQUE,                    -- request id of a usage transaction
    memo       TEXT NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL
);

CREATE TABLE entries (
    tx_id      TEXT NOT NULL REFERENCES journal (id),
    account_id TEXT NOT NULL REFERENCES accounts (id),
    amount     BIGINT NOT NULL,
    PRIMARY KEY (tx_id, account_id)
);
CREATE INDEX entries_account ON entries (account_id);

CREATE TABLE instances (
    id           TEXT PRIMARY KEY,
    started_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);

CREATE TABLE holds (
    request_id   TEXT PRIMARY KEY,
    account_id   TEXT NOT NULL REFERENCES accounts (id),
    key_id       TEXT,
    model        TEXT NOT NULL,
    provider_id  TEXT NOT NULL REFERENCES accounts (id),
    amount       BIGINT NOT NULL,
    price_input  BIGINT NOT NULL,              -- micro-units per million tokens
    price_cached BIGINT NOT NULL,
    price_output BIGINT NOT NULL,
    fee_bps      BIGINT NOT NULL,
    payout_bps   BIGINT NOT NULL,              -- provider reward multiplier, 10000 = 1x
    instance_id  TEXT NOT NULL,
    state        TEXT NOT NULL,                -- open | settled | released
    -- What the request had used at its last checkpoint (recovery settles
    -- an orphaned hold from these).
    used_prompt     BIGINT NOT NULL DEFAULT 0,
    used_cached     BIGINT NOT NULL DEFAULT 0,
    used_completion BIGINT NOT NULL DEFAULT 0,
    created_at   BIGINT NOT NULL,
    closed_at    BIGINT
);
CREATE INDEX holds_state ON holds (state, instance_id);

CREATE TABLE usage_records (
    request_id        TEXT PRIMARY KEY,
    account_id        TEXT NOT NULL,
    key_id            TEXT,
    model             TEXT NOT NULL,
    provider_id       TEXT NOT NULL,
    prompt_tokens     BIGINT NOT NULL,
    cached_tokens     BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    cost              BIGINT NOT NULL,
    provider_amount   BIGINT NOT NULL,
    fee               BIGINT NOT NULL,
    outcome           TEXT NOT NULL,           -- finished | cut | failed
    created_at        BIGINT NOT NULL
);
CREATE INDEX usage_account ON usage_records (account_id, created_at);

-- Keys belong to user accounts (existing keys get one each) and may have
-- a budget: spent + held never exceeds it.
ALTER TABLE api_keys ADD COLUMN account_id TEXT;
ALTER TABLE api_keys ADD COLUMN budget BIGINT;
ALTER TABLE api_keys ADD COLUMN spent BIGINT NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN held BIGINT NOT NULL DEFAULT 0;
INSERT INTO accounts (id, kind, name, created_at)
    SELECT 'user:' || id, 'user', name, created_at FROM api_keys;
UPDATE api_keys SET account_id = 'user:' || id;
