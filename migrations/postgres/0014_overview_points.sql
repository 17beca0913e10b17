-- The console overview's history (one sample every ten seconds), kept so
-- a restart does not lose the last hour. Pruned past a day.
CREATE TABLE overview_points (
    t      BIGINT PRIMARY KEY,   -- Unix milliseconds
    sample TEXT NOT NULL         -- the sample, JSON
);
