-- The most completion tokens a request may be billed for (the sum of its
-- choices' `max_tokens`), so the audit can check that no usage record
-- bills past it. NULL where no limit applies (a cache hit replays a
-- stored answer; a market bid) and on holds placed before this column.
ALTER TABLE holds ADD COLUMN max_completion BIGINT;
