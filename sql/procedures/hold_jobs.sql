-- Holds a job group and its subtree (group 0: the whole batch), or one job
-- (in_job_id not NULL; in_job_group_id is then ignored): its Ready jobs stay
-- Ready but are not scheduled until release_jobs (migration 0029). One
-- INSERT, whatever the number of jobs. A job that has started keeps running;
-- a hold reaches only its later attempts. The first hold's who and when are
-- kept; holding again is a no-op ('already held'). A job already final has
-- nothing to hold: 'complete', nothing recorded. A group may be held before
-- its jobs exist (a later update's jobs are held too).
-- At most in_max_held_jobs jobs of a batch are held one by one (rc 7): more
-- are held as a group, which is one row.
DROP PROCEDURE IF EXISTS hold_jobs;
DELIMITER $$
CREATE PROCEDURE hold_jobs(IN in_batch_id BIGINT, IN in_job_group_id INT, IN in_job_id INT,
                           IN in_user VARCHAR(100), IN in_now_ms BIGINT, IN in_max_held_jobs INT)
proc: BEGIN
  DECLARE v_update_id INT;
  DECLARE v_state VARCHAR(20);
  DECLARE v_already BOOLEAN;
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_user IS NULL OR in_user = '' THEN
    SELECT 3 AS rc, 'a hold records who held' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  IF in_job_id IS NOT NULL THEN
    SELECT state INTO v_state FROM jobs WHERE batch_id = in_batch_id AND job_id = in_job_id FOR UPDATE;
    IF v_missing THEN
      ROLLBACK;
      SELECT 1 AS rc, CONCAT('no job ', in_job_id, ' in batch ', in_batch_id) AS message;
      LEAVE proc;
    END IF;
    SET v_already = EXISTS (SELECT 1 FROM jobs_held WHERE batch_id = in_batch_id AND job_id = in_job_id);
    IF NOT v_already AND v_state IN ('Success', 'Failed', 'Error', 'Cancelled') THEN
      COMMIT;
      SELECT 0 AS rc, 'complete' AS message;
      LEAVE proc;
    END IF;
    IF NOT v_already AND in_max_held_jobs IS NOT NULL
       AND (SELECT COUNT(*) FROM jobs_held WHERE batch_id = in_batch_id) >= in_max_held_jobs THEN
      ROLLBACK;
      SELECT 7 AS rc, CONCAT('batch ', in_batch_id, ' already has ', in_max_held_jobs,
                             ' jobs held one by one, the most it may; hold their job group instead') AS message;
      LEAVE proc;
    END IF;
    INSERT INTO jobs_held (batch_id, job_id, held_by, time_held_ms)
      VALUES (in_batch_id, in_job_id, in_user, in_now_ms)
    ON DUPLICATE KEY UPDATE batch_id = jobs_held.batch_id;
    COMMIT;
    SELECT 0 AS rc, IF(v_already, 'already held', 'held') AS message;
    LEAVE proc;
  END IF;
  SELECT update_id INTO v_update_id FROM job_groups
    WHERE batch_id = in_batch_id AND job_group_id = in_job_group_id;
  IF v_missing OR (v_update_id IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM batch_updates WHERE batch_id = in_batch_id AND update_id = v_update_id AND committed)) THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no job group ', in_job_group_id, ' in batch ', in_batch_id) AS message;
    LEAVE proc;
  END IF;
  SET v_already = EXISTS (SELECT 1 FROM job_groups_held
                          WHERE batch_id = in_batch_id AND job_group_id = in_job_group_id);
  INSERT INTO job_groups_held (batch_id, job_group_id, held_by, time_held_ms)
    VALUES (in_batch_id, in_job_group_id, in_user, in_now_ms)
  ON DUPLICATE KEY UPDATE batch_id = job_groups_held.batch_id;
  COMMIT;
  SELECT 0 AS rc, IF(v_already, 'already held', 'held') AS message;
END $$
DELIMITER ;
