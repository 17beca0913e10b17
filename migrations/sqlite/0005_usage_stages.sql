-- Which executor (or provider worker) ran each request's prefill and its
-- decode: fixed on the hold when the request is placed, copied onto its
-- usage record when it settles. Empty for rows from before this migration
-- and for cache hits and market trades.
ALTER TABLE holds ADD COLUMN prefill_by TEXT NOT NULL DEFAULT '';
ALTER TABLE holds ADD COLUMN decode_by TEXT NOT NULL DEFAULT '';
ALTER TABLE usage_records ADD COLUMN prefill_by TEXT NOT NULL DEFAULT '';
ALTER TABLE usage_records ADD COLUMN decode_by TEXT NOT NULL DEFAULT '';
