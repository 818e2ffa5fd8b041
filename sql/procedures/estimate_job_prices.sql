-- What jobs not submitted yet would cost (EstimateBatch, issue 41): in_jobs
-- is [{"n": count, "c": cores_mcpu, "m": memory_bytes, "t": timeout_ms,
-- "e": expected_ms}, ...], each row that many identical jobs as insert_jobs
-- would store them ("t" and "e" left out when NULL). Returns in the status
-- row, in micro-USD:
-- - worst_micro_usd: the sum of what schedule_jobs reserves before an
--   attempt of each starts (job_worst_case_micro_usd for job_reserve_ms,
--   with in_billing_project's max_job_duration_ms, at reservation_rates);
-- - expected_micro_usd: the sum of the same price for "e" (the job name's
--   history, read by the frontend), else its timeout, else the project's
--   max_job_duration_ms, without the kill allowance.
-- A procedure so that the services, which execute procedures alone
-- (services/db/accounts.py), price with the one rule. Reads only, takes no
-- lock, writes nothing.
DROP PROCEDURE IF EXISTS estimate_job_prices;
DELIMITER $$
CREATE PROCEDURE estimate_job_prices(IN in_billing_project VARCHAR(100), IN in_jobs JSON)
proc: BEGIN
  DECLARE v_max_job_duration_ms BIGINT;
  DECLARE v_cpu_rate DOUBLE;
  DECLARE v_memory_rate DOUBLE;

  IF in_jobs IS NULL OR JSON_TYPE(in_jobs) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'jobs must be a JSON array of {n, c, m, t, e}' AS message;
    LEAVE proc;
  END IF;
  SELECT max_job_duration_ms INTO v_max_job_duration_ms FROM billing_projects WHERE name = in_billing_project;
  IF v_max_job_duration_ms IS NULL THEN
    SELECT 1 AS rc, CONCAT('no billing project ', in_billing_project) AS message;
    LEAVE proc;
  END IF;
  SELECT cpu_rate_usd, memory_rate_usd INTO v_cpu_rate, v_memory_rate FROM reservation_rates;
  SELECT 0 AS rc,
         COALESCE(SUM(t.n * job_worst_case_micro_usd(t.c, t.m, job_reserve_ms(t.t, v_max_job_duration_ms),
                                                     v_cpu_rate, v_memory_rate)), 0) AS worst_micro_usd,
         COALESCE(SUM(t.n * job_worst_case_micro_usd(t.c, t.m, COALESCE(t.e, t.t, v_max_job_duration_ms),
                                                     v_cpu_rate, v_memory_rate)), 0) AS expected_micro_usd
  FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (n BIGINT PATH '$.n', c INT PATH '$.c', m BIGINT PATH '$.m',
                                           t BIGINT PATH '$.t', e BIGINT PATH '$.e')) t;
END $$
DELIMITER ;
