-- The instance is gone (dead worker, preemption, idle shutdown): the attempts
-- of its running and creating jobs end now with in_end_reason ('worker_lost'
-- or 'preempted'), and through complete_jobs_core, as any attempt's end:
-- decide_retries gives each job a new attempt (Ready again) while it has
-- attempts left, without counting a failure; a job on its last attempt ends
-- in Error, saying so. Billing does not run to now: an attempt is billed for
-- what its worker reported (heartbeat rollups, a completion's end time), so
-- it keeps the rollup it had. The time since, during which no worker vouched
-- for it (a dead worker, a control plane that was down or had no leader, a
-- whole system stopped and started again), is not billed.
-- Idempotent: deactivating an inactive instance changes nothing.
DROP PROCEDURE IF EXISTS deactivate_instance;
DELIMITER $$
CREATE PROCEDURE deactivate_instance(IN in_epoch BIGINT, IN in_name VARCHAR(100), IN in_reason VARCHAR(255),
                                     IN in_end_reason VARCHAR(64), IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_state VARCHAR(20);
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    SET @corral_bulk_job_changes = NULL, @corral_bulk_usage = NULL;
    ROLLBACK;
    RESIGNAL;
  END;
  IF in_end_reason IS NULL OR in_end_reason NOT IN ('worker_lost', 'preempted') THEN
    SELECT 3 AS rc, 'the end reason is worker_lost or preempted' AS message;
    LEAVE proc;
  END IF;
  CALL create_completion_tables();
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  -- The instance's row is locked first, before any plain read: schedule_jobs
  -- locks it (FOR UPDATE) to place attempts on it, so from here on none can be
  -- placed, and every one placed before is committed and seen by the reads
  -- below (the transaction's snapshot is taken at its first plain read, after
  -- this lock). Read without the lock, a job scheduled onto the instance
  -- between this procedure's snapshot and its end had its attempt ended by the
  -- UPDATE below but was never completed: it stayed Running for ever (seen when
  -- a cloud reclaimed a machine while the scheduler placed a job on it). This
  -- takes the instance before the jobs, against complete_jobs_core's order
  -- (jobs, attempts, instances): a scheduler or MJC holding a job of this
  -- instance and waiting for it may deadlock with this procedure, and InnoDB's
  -- victim is retried whole (services/db/database.py, 1213).
  SELECT state INTO v_state FROM instances WHERE name = in_name FOR UPDATE;
  IF v_missing THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no instance ', in_name) AS message;
    LEAVE proc;
  END IF;
  INSERT INTO tmp_job_completions (batch_id, job_id, attempt_id, instance_name, new_state, end_time_ms, reason,
                                   error_message, may_retry, bill_to_end)
    SELECT a.batch_id, a.job_id, a.attempt_id, in_name, 'Error', in_now_ms, in_end_reason,
           CONCAT(IF(in_end_reason = 'preempted', 'its machine was preempted', 'its worker was lost'),
                  ' (', in_name, ': ', in_reason, ')'), TRUE, FALSE
    FROM attempts a
    JOIN jobs j ON j.batch_id = a.batch_id AND j.job_id = a.job_id AND j.attempt_id = a.attempt_id
    WHERE a.instance_name = in_name AND a.end_time_ms IS NULL AND j.state IN ('Running', 'Creating');
  IF ROW_COUNT() > 0 THEN
    CALL complete_jobs_core(in_now_ms, 0);
  END IF;
  -- Attempts no job runs under any more end too (nothing to bill).
  UPDATE attempts
    SET end_time_ms = GREATEST(in_now_ms, COALESCE(rollup_time_ms, start_time_ms, 0)), reason = in_end_reason
    WHERE instance_name = in_name AND end_time_ms IS NULL;
  SELECT state INTO v_state FROM instances WHERE name = in_name FOR UPDATE;
  IF v_state IN ('pending', 'active') THEN
    UPDATE instances
      SET state = 'inactive', free_cores_mcpu = cores_mcpu, used_memory_bytes = 0, used_storage_bytes = 0,
          time_deactivated_ms = in_now_ms,
          deactivation_reason = in_reason
      WHERE name = in_name;
  END IF;
  COMMIT;
  CALL check_completions(in_now_ms);
  SELECT 0 AS rc, 'ok' AS message,
         (SELECT COUNT(*) FROM tmp_job_completions WHERE outcome = 'retried') AS n_rescheduled,
         (SELECT COUNT(*) FROM tmp_job_completions WHERE outcome = 'completed') AS n_ended;
END $$
DELIMITER ;
