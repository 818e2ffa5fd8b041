-- Deletes a billing project (DeleteBillingProject): closed -> deleted, once
-- none of its batches runs. Deleting again changes nothing. The row stays
-- (its name stays taken, its spend records stay); its secrets go: no job
-- of the project can run any more to need them. Closed projects get no new
-- batch, so the check cannot be invalidated by create_batch, which
-- share-locks the project row this locks first.
-- rc 1: no such project; rc 2: the project is not closed, or has running
-- batches (the first five named).
DROP PROCEDURE IF EXISTS delete_billing_project;
DELIMITER $$
CREATE PROCEDURE delete_billing_project(IN in_name VARCHAR(100))
proc: BEGIN
  DECLARE v_state VARCHAR(20);
  DECLARE v_running TEXT;
  DECLARE v_n_running INT;
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
    COMMIT;
    SELECT 0 AS rc, 'already deleted' AS message;
    LEAVE proc;
  END IF;
  IF v_state <> 'closed' THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('billing project ', in_name, ' is ', v_state, ': close it before deleting it') AS message;
    LEAVE proc;
  END IF;
  SELECT GROUP_CONCAT(r.batch_id ORDER BY r.batch_id SEPARATOR ', '), COUNT(*) INTO v_running, v_n_running
    FROM (SELECT batch_id FROM batches WHERE billing_project = in_name AND state = 'running'
          ORDER BY batch_id LIMIT 5) r;
  IF v_n_running > 0 THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('billing project ', in_name, ' has running batches (', v_running,
                           IF(v_n_running = 5, ', …', ''), ')') AS message;
    LEAVE proc;
  END IF;
  UPDATE billing_projects SET state = 'deleted' WHERE name = in_name;
  DELETE FROM secrets WHERE billing_project = in_name;
  COMMIT;
  SELECT 0 AS rc, 'deleted' AS message;
END $$
DELIMITER ;
