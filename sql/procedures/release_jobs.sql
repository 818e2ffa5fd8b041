-- Releases what hold_jobs held: the hold of a job group (group 0: the
-- batch) or of one job (in_job_id not NULL). Only that hold goes: a job
-- whose group is held too, or a group under a held ancestor, stays held
-- until that hold is released as well. Releasing what is not held is a
-- no-op ('not held'); an unknown group or job is rc 1.
DROP PROCEDURE IF EXISTS release_jobs;
DELIMITER $$
CREATE PROCEDURE release_jobs(IN in_batch_id BIGINT, IN in_job_group_id INT, IN in_job_id INT)
proc: BEGIN
  DECLARE v_found BOOLEAN;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  START TRANSACTION;
  IF in_job_id IS NOT NULL THEN
    IF NOT EXISTS (SELECT 1 FROM jobs WHERE batch_id = in_batch_id AND job_id = in_job_id) THEN
      ROLLBACK;
      SELECT 1 AS rc, CONCAT('no job ', in_job_id, ' in batch ', in_batch_id) AS message;
      LEAVE proc;
    END IF;
    SET v_found = EXISTS (SELECT 1 FROM jobs_held WHERE batch_id = in_batch_id AND job_id = in_job_id);
    DELETE FROM jobs_held WHERE batch_id = in_batch_id AND job_id = in_job_id;
  ELSE
    IF NOT EXISTS (SELECT 1 FROM job_groups WHERE batch_id = in_batch_id AND job_group_id = in_job_group_id) THEN
      ROLLBACK;
      SELECT 1 AS rc, CONCAT('no job group ', in_job_group_id, ' in batch ', in_batch_id) AS message;
      LEAVE proc;
    END IF;
    SET v_found = EXISTS (SELECT 1 FROM job_groups_held
                          WHERE batch_id = in_batch_id AND job_group_id = in_job_group_id);
    DELETE FROM job_groups_held WHERE batch_id = in_batch_id AND job_group_id = in_job_group_id;
  END IF;
  COMMIT;
  SELECT 0 AS rc, IF(v_found, 'released', 'not held') AS message;
END $$
DELIMITER ;
