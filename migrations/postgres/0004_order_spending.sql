-- A spot-market bid's hold records what its fills have cost so far, so a
-- key's spending can be checked against its usage records plus its trades.
ALTER TABLE holds ADD COLUMN spent BIGINT NOT NULL DEFAULT 0;
