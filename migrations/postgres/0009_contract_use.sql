-- What each contract (a fill: capacity bought) has left to cover, shared
-- by replicas on PostgreSQL: a token bucket in milli-tokens, refilled at
-- the contract's rate (tokens per second = milli-tokens per millisecond)
-- up to ten seconds of it, as of `at_ms`. Taken from in one conditional
-- UPDATE, so two replicas never cover more than the capacity bought. On
-- SQLite (one node) the bucket is kept in memory and this stays empty.
CREATE TABLE contract_use (
    trade_id TEXT PRIMARY KEY,
    level    BIGINT NOT NULL CHECK (level >= 0),
    at_ms    BIGINT NOT NULL
);
