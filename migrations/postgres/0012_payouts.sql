-- Payouts: a provider moves final earnings out of the ledger. Each payout
-- is a journal transaction of kind `payout` from the provider's account to
-- `payouts`, the counterpart of money owed to providers outside the
-- ledger (as `deposits` is of money brought in), so the journal still
-- sums to zero and every payout stays on record.
INSERT INTO accounts (id, kind, name, unlimited, created_at) VALUES
    ('payouts', 'system', 'Payouts (owed to providers outside the ledger)', 1, 0);
