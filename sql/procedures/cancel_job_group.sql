-- Cancels a job group and its subtree; group 0 is the whole batch. One
-- INSERT, whatever the number of jobs: the scheduler, autoscaler and fair
-- share see the cancellation through job_groups_cancelled at once, and the
-- canceller drains the jobs afterwards. The first cancellation's who, when
-- and why are kept; cancelling again is a no-op ('already cancelled').
-- Cancelling a finished group is a no-op too ('complete'), and records
-- nothing: every job of the group is final and no update of the batch is
-- open that could add more, so a cancellation would cancel nothing and
-- only make a finished batch read as cancelled (and refuse its later
-- updates). A group is finished when it is complete (check_completions)
-- and has jobs: an open update may still put jobs in it, so it is not
-- finished then, and neither is a group with no jobs in its subtree yet
-- (check_completions calls it complete at its commit), which waits for
-- its jobs: its cancellation is recorded, shows at once on it and its
-- subtree (job_groups_cancelled_self_or_ancestor), and refuses the jobs and
-- groups a later update would put in it (insert_jobs, insert_job_groups),
-- as for a group with jobs (issue 36).
DROP PROCEDURE IF EXISTS cancel_job_group;
DELIMITER $$
CREATE PROCEDURE cancel_job_group(IN in_batch_id BIGINT, IN in_job_group_id INT, IN in_user VARCHAR(100),
                                  IN in_reason VARCHAR(1024), IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_update_id INT;
  DECLARE v_state VARCHAR(20);
  DECLARE v_n_jobs INT;
  DECLARE v_already BOOLEAN;
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_user IS NULL OR in_user = '' THEN
    SELECT 3 AS rc, 'a cancellation records who cancelled' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  SELECT update_id, state, n_jobs INTO v_update_id, v_state, v_n_jobs FROM job_groups
    WHERE batch_id = in_batch_id AND job_group_id = in_job_group_id;
  IF v_missing OR (v_update_id IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM batch_updates WHERE batch_id = in_batch_id AND update_id = v_update_id AND committed)) THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no job group ', in_job_group_id, ' in batch ', in_batch_id) AS message;
    LEAVE proc;
  END IF;
  -- (ROW_COUNT() cannot tell: clients set CLIENT_FOUND_ROWS.)
  SET v_already = EXISTS (SELECT 1 FROM job_groups_cancelled
                          WHERE batch_id = in_batch_id AND job_group_id = in_job_group_id);
  IF NOT v_already AND v_state = 'complete' AND v_n_jobs > 0
     AND NOT EXISTS (SELECT 1 FROM batch_updates WHERE batch_id = in_batch_id AND NOT committed) THEN
    COMMIT;
    SELECT 0 AS rc, 'complete' AS message;
    LEAVE proc;
  END IF;
  INSERT INTO job_groups_cancelled (batch_id, job_group_id, cancelled_by, reason, time_cancelled_ms)
    VALUES (in_batch_id, in_job_group_id, in_user, COALESCE(in_reason, ''), in_now_ms)
  ON DUPLICATE KEY UPDATE batch_id = job_groups_cancelled.batch_id;
  COMMIT;
  SELECT 0 AS rc, IF(v_already, 'already cancelled', 'cancelled') AS message;
END $$
DELIMITER ;
