-- The ledger counts ticks (10^-10 of a currency unit) instead of
-- micro-units, so a short request's cost is no longer rounded by a large
-- fraction of itself: every stored amount and price is multiplied by
-- 10,000, exactly. Electricity prices stay micro-units per kWh (their
-- column says so).
--
-- First a guard: a value too large to carry (past i64 / 10,000, about
-- 9.2 * 10^14 micro-units) stops the migration before anything changes,
-- rather than overflowing (SQLite would turn it into a lossy REAL).
CREATE TABLE money_unit_guard (
    v BIGINT NOT NULL,
    CONSTRAINT amount_too_large_to_carry_into_ticks
        CHECK (v BETWEEN -922337203685477 AND 922337203685477)
);
INSERT INTO money_unit_guard (v)
    SELECT balance FROM accounts UNION ALL SELECT held FROM accounts
    UNION ALL SELECT credit_limit FROM accounts
    UNION ALL SELECT amount FROM entries
    UNION ALL SELECT amount FROM holds UNION ALL SELECT spent FROM holds
    UNION ALL SELECT price_input FROM holds UNION ALL SELECT price_cached FROM holds
    UNION ALL SELECT price_output FROM holds
    UNION ALL SELECT cost FROM usage_records UNION ALL SELECT provider_amount FROM usage_records
    UNION ALL SELECT fee FROM usage_records
    UNION ALL SELECT budget FROM api_keys WHERE budget IS NOT NULL
    UNION ALL SELECT spent FROM api_keys UNION ALL SELECT held FROM api_keys
    UNION ALL SELECT price FROM orders UNION ALL SELECT price FROM trades
    UNION ALL SELECT input_price FROM price_history UNION ALL SELECT cached_price FROM price_history
    UNION ALL SELECT output_price FROM price_history
    UNION ALL SELECT depreciation_per_hour FROM providers
    UNION ALL SELECT network_per_hour FROM providers;
DROP TABLE money_unit_guard;

UPDATE accounts SET balance = balance * 10000, held = held * 10000,
    credit_limit = credit_limit * 10000;
UPDATE entries SET amount = amount * 10000;
UPDATE holds SET amount = amount * 10000, spent = spent * 10000,
    price_input = price_input * 10000, price_cached = price_cached * 10000,
    price_output = price_output * 10000;
UPDATE usage_records SET cost = cost * 10000, provider_amount = provider_amount * 10000,
    fee = fee * 10000;
UPDATE api_keys SET budget = budget * 10000, spent = spent * 10000, held = held * 10000;
UPDATE orders SET price = price * 10000;
UPDATE trades SET price = price * 10000;
UPDATE price_history SET input_price = input_price * 10000,
    cached_price = cached_price * 10000, output_price = output_price * 10000;
UPDATE providers SET depreciation_per_hour = depreciation_per_hour * 10000,
    network_per_hour = network_per_hour * 10000;
