-- Closes (in_open FALSE) or reopens (TRUE) a billing project
-- (CloseBillingProject, ReopenBillingProject). Idempotent. A closed project
-- takes no new batch (create_batch, which share-locks the row this locks
-- first); its running batches go on. rc 1: no such project; rc 2: the
-- project is deleted.
DROP PROCEDURE IF EXISTS set_billing_project_open;
DELIMITER $$
CREATE PROCEDURE set_billing_project_open(IN in_name VARCHAR(100), IN in_open BOOLEAN)
proc: BEGIN
  DECLARE v_state VARCHAR(20);
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_open IS NULL THEN
    SELECT 3 AS rc, 'open must be TRUE or FALSE' AS message;
    LEAVE proc;
  END IF;
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
  UPDATE billing_projects SET state = IF(in_open, 'open', 'closed') WHERE name = in_name;
  COMMIT;
  SELECT 0 AS rc, IF(in_open, 'open', 'closed') AS message;
END $$
DELIMITER ;
