-- The driver's completion re-check. Completion is decided after COMMIT
-- (check_completions), so a process that dies between its COMMIT and that
-- check leaves a finished group running, and a batch whose root group
-- completed may miss its own flip (check_completions flips batches in a
-- second transaction). This finds up to in_limit of each from the committed
-- tokenized counters and runs check_completions on them, which decides
-- under the row locks exactly as after a commit: re-checking a group that
-- is not finished, or that another caller completes first, changes nothing.
-- Groups of open batches and of uncommitted updates are never candidates
-- (their n_jobs is 0 until the commit).
-- Returns the status row with n_checked (candidates), n_complete (of those,
-- groups complete now) and n_batches_complete (their batches complete now).
DROP PROCEDURE IF EXISTS recheck_completions;
DELIMITER $$
CREATE PROCEDURE recheck_completions(IN in_epoch BIGINT, IN in_limit INT, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_checked INT;
  DECLARE v_complete INT;
  DECLARE v_batches INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_limit IS NULL OR in_limit < 1 THEN
    SELECT 3 AS rc, 'limit must be at least 1' AS message;
    LEAVE proc;
  END IF;
  CALL create_completion_tables();
  DROP TEMPORARY TABLE IF EXISTS tmp_recheck;
  CREATE TEMPORARY TABLE tmp_recheck (
    batch_id BIGINT NOT NULL,
    job_group_id INT NOT NULL,
    PRIMARY KEY (batch_id, job_group_id)
  );
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  INSERT INTO tmp_recheck (batch_id, job_group_id)
    SELECT g.batch_id, g.job_group_id
    FROM job_groups g
    JOIN batches b ON b.batch_id = g.batch_id AND b.state <> 'open'
    LEFT JOIN batch_updates u ON u.batch_id = g.batch_id AND u.update_id = g.update_id
    WHERE g.state = 'running' AND (g.update_id IS NULL OR u.committed)
      AND g.n_jobs = (SELECT COALESCE(SUM(s.n_completed), 0)
                      FROM job_groups_n_jobs_in_complete_states s
                      WHERE s.batch_id = g.batch_id AND s.job_group_id = g.job_group_id)
    ORDER BY g.batch_id, g.job_group_id
    LIMIT in_limit;
  INSERT INTO tmp_recheck (batch_id, job_group_id)
    SELECT b.batch_id, 0
    FROM batches b
    JOIN job_groups g ON g.batch_id = b.batch_id AND g.job_group_id = 0
    WHERE b.state = 'running' AND g.state = 'complete'
    ORDER BY b.batch_id
    LIMIT in_limit
  ON DUPLICATE KEY UPDATE batch_id = tmp_recheck.batch_id;
  COMMIT;

  INSERT INTO tmp_groups_to_check (batch_id, job_group_id)
    SELECT batch_id, job_group_id FROM tmp_recheck;
  CALL check_completions(in_now_ms);
  SELECT COUNT(*) INTO v_checked FROM tmp_recheck;
  SELECT COUNT(*) INTO v_complete
    FROM tmp_recheck r JOIN job_groups g ON g.batch_id = r.batch_id AND g.job_group_id = r.job_group_id
    WHERE g.state = 'complete';
  SELECT COUNT(DISTINCT r.batch_id) INTO v_batches
    FROM tmp_recheck r JOIN batches b ON b.batch_id = r.batch_id
    WHERE b.state = 'complete';
  DROP TEMPORARY TABLE IF EXISTS tmp_recheck;
  SELECT 0 AS rc, 'ok' AS message, v_checked AS n_checked, v_complete AS n_complete,
         v_batches AS n_batches_complete;
END $$
DELIMITER ;
