-- The scheduler cancels Ready jobs that can never run under their billing
-- project's limit (migration 0015). in_jobs: [{"batch_id", "job_id"}], the
-- planner's never_fit. Each is checked again here, with its project's row
-- locked: a Ready job of an open project with a limit whose worst-case
-- cost (job_worst_case_micro_usd, what schedule_jobs would reserve) is more
-- than the limit less the project's spend. Those become Cancelled through
-- complete_jobs_core (their children are released as for any cancelled
-- parent), with jobs.end_reason saying why; the others are left alone (the
-- limit was raised, the job ran).
-- Returns the status row with n_cancelled.
DROP PROCEDURE IF EXISTS cancel_unaffordable_jobs;
DELIMITER $$
CREATE PROCEDURE cancel_unaffordable_jobs(IN in_epoch BIGINT, IN in_jobs JSON, IN in_now_ms BIGINT,
                                          IN in_max_children INT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_locked INT;
  DECLARE v_cpu_rate DOUBLE;
  DECLARE v_memory_rate DOUBLE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    SET @corral_bulk_job_changes = NULL, @corral_bulk_usage = NULL;
    ROLLBACK;
    RESIGNAL;
  END;
  IF in_jobs IS NULL OR JSON_TYPE(in_jobs) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'jobs must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  CALL create_completion_tables();
  DROP TEMPORARY TABLE IF EXISTS tmp_unaffordable;
  CREATE TEMPORARY TABLE tmp_unaffordable (
    batch_id BIGINT NOT NULL,
    job_id INT NOT NULL,
    billing_project VARCHAR(100) NULL,
    reserve_micro_usd BIGINT NULL,
    PRIMARY KEY (batch_id, job_id)
  );
  INSERT INTO tmp_unaffordable (batch_id, job_id)
    SELECT jt.batch_id, jt.job_id
    FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (batch_id BIGINT PATH '$.batch_id', job_id INT PATH '$.job_id')) jt
    WHERE jt.batch_id IS NOT NULL AND jt.job_id IS NOT NULL
  ON DUPLICATE KEY UPDATE batch_id = tmp_unaffordable.batch_id;

  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  -- Lock order: jobs, then the projects (as schedule_jobs).
  SELECT COUNT(*) INTO v_locked
    FROM tmp_unaffordable t JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    FOR UPDATE;
  SELECT cpu_rate_usd, memory_rate_usd INTO v_cpu_rate, v_memory_rate FROM reservation_rates;
  -- The worst case schedule_jobs would reserve (and read_ready_heads gave the planner).
  UPDATE tmp_unaffordable t
    JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id AND j.state = 'Ready'
    JOIN batches b ON b.batch_id = t.batch_id
    JOIN billing_projects p ON p.name = b.billing_project AND p.limit_usd IS NOT NULL AND p.state = 'open'
    SET t.billing_project = p.name,
        t.reserve_micro_usd = job_worst_case_micro_usd(j.cores_mcpu, j.memory_bytes,
                                                       job_reserve_ms(j.timeout_ms, p.max_job_duration_ms),
                                                       v_cpu_rate, v_memory_rate);
  SELECT COUNT(*) INTO v_locked FROM billing_projects
    WHERE name IN (SELECT billing_project FROM tmp_unaffordable) FOR UPDATE;
  INSERT INTO tmp_job_completions (batch_id, job_id, new_state)
    SELECT t.batch_id, t.job_id, 'Cancelled'
    FROM tmp_unaffordable t JOIN billing_projects p ON p.name = t.billing_project
    WHERE t.reserve_micro_usd > p.limit_usd * 1000000
          - COALESCE((SELECT SUM(x.`usage` * r.rate_usd) FROM aggregated_billing_project_resources x
                      JOIN resources r ON r.resource_id = x.resource_id WHERE x.billing_project = p.name), 0) * 1000000
    ORDER BY t.batch_id, t.job_id;
  IF ROW_COUNT() > 0 THEN
    UPDATE jobs j
      JOIN tmp_job_completions c ON c.batch_id = j.batch_id AND c.job_id = j.job_id
      JOIN tmp_unaffordable t ON t.batch_id = j.batch_id AND t.job_id = j.job_id
      JOIN billing_projects p ON p.name = t.billing_project
      SET j.end_reason = CONCAT('cancelled: it can never run under the limit of billing project ', p.name,
                                ': it may cost up to $', FORMAT(t.reserve_micro_usd / 1000000, 6),
                                ' (its cores and memory for its timeout, or the project''s longest job) and the $',
                                FORMAT(p.limit_usd, 6), ' limit leaves less after the project''s spend');
    CALL complete_jobs_core(in_now_ms, in_max_children);
  END IF;
  COMMIT;
  CALL check_completions(in_now_ms);
  SELECT 0 AS rc, 'ok' AS message,
         (SELECT COUNT(*) FROM tmp_job_completions WHERE outcome = 'completed') AS n_cancelled;
  DROP TEMPORARY TABLE IF EXISTS tmp_unaffordable;
END $$
DELIMITER ;
