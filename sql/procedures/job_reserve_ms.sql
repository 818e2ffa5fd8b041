-- How long a job's attempt is reserved for (migration 0013): its timeout,
-- or its billing project's max_job_duration_ms when it has none, plus the
-- time a worker may take to kill it past that and report its end. The one
-- place this rule is written: schedule_jobs records it on the attempt
-- (attempts.reserved_ms, where billing stops), and job_worst_case_micro_usd
-- prices it.
-- A function, not a procedure, so that set-based statements can call it
-- per row; DETERMINISTIC NO SQL (it reads nothing), so MariaDB may fold it.
DROP FUNCTION IF EXISTS job_reserve_ms;
DELIMITER $$
CREATE FUNCTION job_reserve_ms(in_timeout_ms BIGINT, in_max_job_duration_ms BIGINT) RETURNS BIGINT
  DETERMINISTIC NO SQL
BEGIN
  -- A worker's kill grace (10 s) and the time to report the attempt's end.
  DECLARE KILL_ALLOWANCE_MS BIGINT DEFAULT 15000;
  RETURN COALESCE(in_timeout_ms, in_max_job_duration_ms) + KILL_ALLOWANCE_MS;
END $$
DELIMITER ;
