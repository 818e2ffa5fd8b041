-- Sets a billing project's limit (SetLimit): in_limit_usd NULL removes it;
-- in_max_job_duration_ms, the timeout of a job without one while the
-- project has a limit (what its worst case is reserved for), NULL keeps
-- the project's. The billing-limit canceller and the budget reservations
-- read both. The project row is locked first (the lock order).
-- rc 1: no such project; rc 2: the project is deleted.
DROP PROCEDURE IF EXISTS set_billing_project_limit;
DELIMITER $$
CREATE PROCEDURE set_billing_project_limit(IN in_name VARCHAR(100), IN in_limit_usd DOUBLE,
                                           IN in_max_job_duration_ms BIGINT)
proc: BEGIN
  DECLARE v_state VARCHAR(20);
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  START TRANSACTION;
  SELECT state INTO v_state FROM billing_projects WHERE name = in_name FOR UPDATE;
  IF v_missing THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no billing project ', in_name) AS message;
    LEAVE proc;
  END IF;
  IF v_state = 'deleted' THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('billing project ', in_name, ' is deleted') AS message;
    LEAVE proc;
  END IF;
  UPDATE billing_projects
    SET limit_usd = in_limit_usd, max_job_duration_ms = COALESCE(in_max_job_duration_ms, max_job_duration_ms)
    WHERE name = in_name;
  COMMIT;
  SELECT 0 AS rc, 'set' AS message;
END $$
DELIMITER ;
