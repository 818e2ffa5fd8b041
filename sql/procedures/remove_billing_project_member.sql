-- Removes a member from a billing project (RemoveMember). Idempotent; the
-- member's running batches go on. The project row is locked first (the
-- lock order). rc 1: no such project; rc 2: the project is deleted.
DROP PROCEDURE IF EXISTS remove_billing_project_member;
DELIMITER $$
CREATE PROCEDURE remove_billing_project_member(IN in_name VARCHAR(100), IN in_user VARCHAR(100))
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
  DELETE FROM billing_project_members WHERE billing_project = in_name AND user = in_user;
  COMMIT;
  SELECT 0 AS rc, 'removed' AS message;
END $$
DELIMITER ;
