-- A job's worst-case cost in micro-USD (migration 0013): its cores and its
-- memory in whole MiB, rounded up, at the reservation rates (the view
-- reservation_rates: the dearest active products, read once by the caller),
-- for in_reserve_ms (job_reserve_ms), rounded up to the micro-dollar.
-- The one place this rule is written: schedule_jobs reserves it before an
-- attempt of a project with a spending limit starts, cancel_unaffordable_jobs
-- cancels a job it can never fit, and read_ready_heads hands it to the
-- planner (services/policy/planner.py), which computes no price of its own;
-- estimate_job_prices prices a batch with it before it is submitted.
-- NULL when in_reserve_ms is NULL.
-- A function, not a procedure, so that set-based statements can call it
-- per row; DETERMINISTIC NO SQL (it reads nothing), so MariaDB may fold it.
DROP FUNCTION IF EXISTS job_worst_case_micro_usd;
DELIMITER $$
CREATE FUNCTION job_worst_case_micro_usd(in_cores_mcpu INT, in_memory_bytes BIGINT, in_reserve_ms BIGINT,
                                         in_cpu_rate_usd DOUBLE, in_memory_rate_usd DOUBLE) RETURNS BIGINT
  DETERMINISTIC NO SQL
  RETURN CEIL((in_cores_mcpu * in_cpu_rate_usd + ((in_memory_bytes + 1048575) DIV 1048576) * in_memory_rate_usd)
              * in_reserve_ms * 1000000) $$
DELIMITER ;
