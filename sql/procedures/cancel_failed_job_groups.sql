-- Cancel after N failures, the driver's re-check: every running group with a
-- cancel_after_n_failures threshold (group 0's is the batch's) whose failed
-- and errored jobs reached it gets its one job_groups_cancelled row,
-- cancelled_by 'corral', up to in_limit groups per call.
-- MJC (complete_jobs_core) does the same for the groups of the failures it
-- records, but it reads the tokenized counters inside its own transaction:
-- two failures committed concurrently can each see the count one short of
-- the threshold. This call reads the committed counts, so it catches what
-- they missed. Idempotent: a cancelled group is not taken again, and one
-- cancelled meanwhile (by its owner or by MJC) keeps its first who and why.
-- Returns the status row with n_cancelled.
DROP PROCEDURE IF EXISTS cancel_failed_job_groups;
DELIMITER $$
CREATE PROCEDURE cancel_failed_job_groups(IN in_epoch BIGINT, IN in_limit INT, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_n INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_limit IS NULL OR in_limit < 1 THEN
    SELECT 3 AS rc, 'limit must be at least 1' AS message;
    LEAVE proc;
  END IF;
  DROP TEMPORARY TABLE IF EXISTS tmp_failed_groups;
  CREATE TEMPORARY TABLE tmp_failed_groups (
    batch_id BIGINT NOT NULL,
    job_group_id INT NOT NULL,
    threshold INT NOT NULL,
    PRIMARY KEY (batch_id, job_group_id)
  );
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  INSERT INTO tmp_failed_groups (batch_id, job_group_id, threshold)
    SELECT g.batch_id, g.job_group_id, g.cancel_after_n_failures
    FROM job_groups g
    WHERE g.state = 'running' AND g.cancel_after_n_failures IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_groups_cancelled c
                      WHERE c.batch_id = g.batch_id AND c.job_group_id = g.job_group_id)
      AND (SELECT COALESCE(SUM(s.n_failed + s.n_errored), 0)
           FROM job_groups_n_jobs_in_complete_states s
           WHERE s.batch_id = g.batch_id AND s.job_group_id = g.job_group_id) >= g.cancel_after_n_failures
    ORDER BY g.batch_id, g.job_group_id
    LIMIT in_limit;
  -- The same words as MJC's, so a reader cannot tell (and need not care)
  -- which of the two noticed first.
  INSERT INTO job_groups_cancelled (batch_id, job_group_id, cancelled_by, reason, time_cancelled_ms)
    SELECT batch_id, job_group_id, 'corral', CONCAT('cancel_after_n_failures: ', threshold, ' jobs failed'), in_now_ms
    FROM tmp_failed_groups
    ORDER BY batch_id, job_group_id
  ON DUPLICATE KEY UPDATE batch_id = job_groups_cancelled.batch_id;
  SELECT COUNT(*) INTO v_n FROM tmp_failed_groups;
  COMMIT;
  DROP TEMPORARY TABLE IF EXISTS tmp_failed_groups;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_cancelled;
END $$
DELIMITER ;
