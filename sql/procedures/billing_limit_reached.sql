-- Whether a billing project whose spend is in_spend_usd has reached its
-- limit in_limit_usd (NULL: no limit, never): compared in whole
-- micro-dollars, each rounded to the nearest, as the API shows them
-- (spend_micro_usd, limit_micro_usd) and as the refusals print them. Spend
-- is a sum of DOUBLE products (usage x rate) and the limit a DOUBLE of
-- micro-dollars / 1e6, so compared as they are a spend that reads as equal
-- to the limit could be a hair below it and still take new work (issue 36);
-- at the limit means refused, as above it.
-- The one place this rule is written: billing_limit_check (create_batch,
-- create_update, rerun_failed_jobs) and cancel_batches_over_limit call it;
-- the planner's wait (services/policy/planner.py: limit_reached) is its
-- copy, and tests/db/test_budgets.py checks that the two agree.
-- A function, so that set-based statements can call it per row;
-- DETERMINISTIC NO SQL (it reads nothing).
DROP FUNCTION IF EXISTS billing_limit_reached;
DELIMITER $$
CREATE FUNCTION billing_limit_reached(in_spend_usd DOUBLE, in_limit_usd DOUBLE) RETURNS BOOLEAN
  DETERMINISTIC NO SQL
  RETURN in_limit_usd IS NOT NULL AND ROUND(in_spend_usd * 1000000) >= ROUND(in_limit_usd * 1000000) $$
DELIMITER ;
