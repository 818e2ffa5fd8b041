-- The instance is gone (dead worker, preemption, idle shutdown): its running
-- and creating jobs go back to Ready and will run again under a new attempt;
-- their attempts end now. Billing does not run to now: an attempt is billed
-- for what its worker reported (heartbeat rollups, a completion's end time),
-- so it keeps the rollup it had. The time since, during which no worker
-- vouched for it (a dead worker, a control plane that was down or had no
-- leader, a whole system stopped and started again), is not billed.
-- Idempotent: deactivating an inactive instance changes nothing.
DROP PROCEDURE IF EXISTS deactivate_instance;
DELIMITER $$
CREATE PROCEDURE deactivate_instance(IN in_epoch BIGINT, IN in_name VARCHAR(100), IN in_reason VARCHAR(255),
                                     IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_locked INT;
  DECLARE v_state VARCHAR(20);
  DECLARE v_n INT;
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  -- Jobs first (lock order: jobs before attempts and instances). The
  -- attempts are only read here: the subquery takes no locks.
  SELECT COUNT(*) INTO v_locked
    FROM jobs j
    WHERE (j.batch_id, j.job_id) IN (SELECT a.batch_id, a.job_id FROM attempts a
                                     WHERE a.instance_name = in_name AND a.end_time_ms IS NULL)
      AND j.state IN ('Running', 'Creating')
    FOR UPDATE;
  SELECT state INTO v_state FROM instances WHERE name = in_name FOR UPDATE;
  IF v_missing THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no instance ', in_name) AS message;
    LEAVE proc;
  END IF;
  UPDATE jobs j
    JOIN attempts a ON a.batch_id = j.batch_id AND a.job_id = j.job_id AND a.attempt_id = j.attempt_id
    SET j.state = 'Ready'
    WHERE a.instance_name = in_name AND a.end_time_ms IS NULL AND j.state IN ('Running', 'Creating');
  SET v_n = ROW_COUNT();
  UPDATE attempts
    SET end_time_ms = GREATEST(in_now_ms, COALESCE(rollup_time_ms, start_time_ms, 0)),
        reason = 'instance deactivated'
    WHERE instance_name = in_name AND end_time_ms IS NULL;
  IF v_state IN ('pending', 'active') THEN
    UPDATE instances
      SET state = 'inactive', free_cores_mcpu = cores_mcpu, time_deactivated_ms = in_now_ms,
          deactivation_reason = in_reason
      WHERE name = in_name;
  END IF;
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_rescheduled;
END $$
DELIMITER ;
