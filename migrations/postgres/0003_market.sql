-- The market: electricity prices by region (admins update them), provider
-- cost profiles and standing (reputation, uptime), the order book's orders,
-- trades, and a history of posted prices. Prices are BIGINT micro-units per
-- million tokens; rates and multipliers are integers (bps, milli).

CREATE TABLE region_prices (
    region         TEXT PRIMARY KEY,
    micros_per_kwh BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL
);
INSERT INTO region_prices (region, micros_per_kwh, updated_at) VALUES
    ('us-east', 130000, 0),
    ('us-west', 180000, 0),
    ('eu-west', 250000, 0),
    ('eu-north', 90000, 0),
    ('asia-east', 150000, 0);

CREATE TABLE providers (
    account_id               TEXT PRIMARY KEY REFERENCES accounts (id),
    region                   TEXT NOT NULL,
    watts                    BIGINT NOT NULL,
    pue_milli                BIGINT NOT NULL,
    depreciation_per_hour    BIGINT NOT NULL,
    network_per_hour         BIGINT NOT NULL,
    prefill_tokens_per_hour  BIGINT NOT NULL,
    decode_tokens_per_hour   BIGINT NOT NULL,
    cached_bps               BIGINT NOT NULL,
    preemptible_discount_bps BIGINT NOT NULL,
    reputation_bps           BIGINT NOT NULL DEFAULT 10000,
    uptime_bps               BIGINT NOT NULL DEFAULT 10000,
    updated_at               BIGINT NOT NULL
);
-- The house provider: this machine's CPU share (65 W, PUE 1.2), with the
-- throughput measured in BENCHMARKS.md (about 900 prompt and 300
-- generated tokens per second under load).
INSERT INTO providers (account_id, region, watts, pue_milli, depreciation_per_hour,
    network_per_hour, prefill_tokens_per_hour, decode_tokens_per_hour, cached_bps,
    preemptible_discount_bps, updated_at)
VALUES ('provider:house', 'us-east', 65, 1200, 20000, 5000, 3240000, 1080000, 1000, 3000, 0);

CREATE TABLE orders (
    id            TEXT PRIMARY KEY,
    side          TEXT NOT NULL,             -- bid | ask
    instrument    TEXT NOT NULL,             -- a model or resource class
    account_id    TEXT NOT NULL REFERENCES accounts (id),
    price         BIGINT NOT NULL,           -- per million tokens
    quantity      BIGINT NOT NULL,           -- tokens per second
    remaining     BIGINT NOT NULL,
    priority      BIGINT NOT NULL DEFAULT 0,
    interruptible BIGINT NOT NULL DEFAULT 0,
    expires_at    BIGINT NOT NULL,
    state         TEXT NOT NULL,             -- open | filled | cancelled | expired
    created_at    BIGINT NOT NULL
);
CREATE INDEX orders_open ON orders (instrument, state);

CREATE TABLE trades (
    id         TEXT PRIMARY KEY,
    instrument TEXT NOT NULL,
    price      BIGINT NOT NULL,
    quantity   BIGINT NOT NULL,
    bid_id     TEXT NOT NULL,
    ask_id     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX trades_instrument ON trades (instrument, created_at);

CREATE TABLE price_history (
    instrument   TEXT NOT NULL,
    at           BIGINT NOT NULL,
    input_price  BIGINT NOT NULL,
    cached_price BIGINT NOT NULL,
    output_price BIGINT NOT NULL,
    PRIMARY KEY (instrument, at)
);
