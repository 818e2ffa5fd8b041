-- MJC, bulk: the driver records final states reported by a worker (or by the
-- canceller for running jobs it stopped). in_jobs is a JSON array of
--   {"batch_id", "job_id", "attempt_id", "state": "Success"|"Failed"|"Error"|"Cancelled",
--    "exit_code", "start_time_ms", "end_time_ms", "reason",
--    "error_message", "cpu_time_ms", "peak_memory_bytes", "instance_name"}
-- for attempts on the row's instance_name, or in_instance_name where a row
-- names none (the driver records the completions of all its workers'
-- sessions in one call); exit_code, error_message, cpu_time_ms and
-- peak_memory_bytes are also recorded on the attempt (once). Idempotent and
-- order-tolerant: a repeat is 'already_complete', MJC before MJS records the
-- start time, MJC after a cancel leaves the job Cancelled and only closes the
-- attempt. A job appears at most once per call.
-- At most in_max_children children of the completed jobs are released in
-- this transaction; the rest are queued for the driver's releaser
-- (complete_jobs_core).
-- An attempt's end may make a new attempt instead (outcome 'retried':
-- decide_retries, the job's RetryPolicy).
-- Returns one row per job (batch_id, job_id, outcome, inst_coll, cores_mcpu,
-- and user: for a job whose attempt left Running or Creating now, 'completed'
-- or 'retried', its user, NULL otherwise; what the scheduler's reused
-- fair-share read takes off the user's running cores), then the status row
-- (n_completed, n_retried, n_queued: parents whose children wait in the
-- queue, and n_ready_children: children this call made Ready).
DROP PROCEDURE IF EXISTS mark_jobs_complete;
DELIMITER $$
CREATE PROCEDURE mark_jobs_complete(IN in_epoch BIGINT, IN in_instance_name VARCHAR(100),
                                    IN in_jobs JSON, IN in_now_ms BIGINT, IN in_max_children INT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_n INT;
  DECLARE v_n_distinct INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    -- complete_jobs_core sets these around its bulk statements; a pooled
    -- connection must not carry them into its next call.
    SET @corral_bulk_job_changes = NULL, @corral_bulk_usage = NULL;
    ROLLBACK;
    RESIGNAL;
  END;

  IF in_jobs IS NULL OR JSON_TYPE(in_jobs) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'jobs must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  IF in_max_children IS NULL OR in_max_children < 0 THEN
    SELECT 3 AS rc, 'max_children must not be negative' AS message;
    LEAVE proc;
  END IF;
  CALL create_completion_tables();
  SELECT COUNT(*), COUNT(DISTINCT jt.batch_id, jt.job_id) INTO v_n, v_n_distinct
    FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (batch_id BIGINT PATH '$.batch_id',
                                              job_id INT PATH '$.job_id')) jt;
  IF v_n <> v_n_distinct THEN
    SELECT 3 AS rc, 'a job appears twice in one call' AS message;
    LEAVE proc;
  END IF;
  INSERT INTO tmp_job_completions
      (batch_id, job_id, attempt_id, instance_name, new_state, exit_code, start_time_ms, end_time_ms, reason,
       error_message, cpu_time_ms, peak_memory_bytes, may_retry)
    SELECT jt.batch_id, jt.job_id, jt.attempt_id, COALESCE(jt.instance_name, in_instance_name), jt.state,
           jt.exit_code,
           jt.start_time_ms, GREATEST(COALESCE(jt.end_time_ms, in_now_ms), COALESCE(jt.start_time_ms, 0)), jt.reason,
           jt.error_message, jt.cpu_time_ms, jt.peak_memory_bytes, jt.attempt_id IS NOT NULL
    FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (
      batch_id BIGINT PATH '$.batch_id',
      job_id INT PATH '$.job_id',
      attempt_id VARCHAR(40) PATH '$.attempt_id',
      instance_name VARCHAR(100) PATH '$.instance_name',
      state VARCHAR(20) PATH '$.state',
      exit_code INT PATH '$.exit_code',
      start_time_ms BIGINT PATH '$.start_time_ms',
      end_time_ms BIGINT PATH '$.end_time_ms',
      reason VARCHAR(64) PATH '$.reason',
      error_message TEXT PATH '$.error_message',
      cpu_time_ms BIGINT PATH '$.cpu_time_ms',
      peak_memory_bytes BIGINT PATH '$.peak_memory_bytes')) jt;
  IF EXISTS (SELECT 1 FROM tmp_job_completions WHERE batch_id IS NULL OR job_id IS NULL OR new_state IS NULL) THEN
    SELECT 3 AS rc, 'every job needs batch_id, job_id and state' AS message;
    LEAVE proc;
  END IF;

  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  CALL complete_jobs_core(in_now_ms, in_max_children);
  COMMIT;

  CALL check_completions(in_now_ms);
  SELECT t.batch_id, t.job_id, t.outcome, j.user, t.inst_coll, t.cores_mcpu
    FROM tmp_job_completions t
    LEFT JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
      AND t.outcome IN ('completed', 'retried') AND t.old_state IN ('Running', 'Creating')
    ORDER BY t.batch_id, t.job_id;
  SELECT 0 AS rc, 'ok' AS message,
         (SELECT COUNT(*) FROM tmp_job_completions WHERE outcome = 'completed') AS n_completed,
         (SELECT COUNT(*) FROM tmp_job_completions WHERE outcome = 'retried') AS n_retried,
         (SELECT COUNT(*) FROM tmp_releases WHERE to_child_id IS NOT NULL) AS n_queued,
         (SELECT COUNT(*) FROM tmp_children WHERE becomes_ready) AS n_ready_children;
END $$
DELIMITER ;
