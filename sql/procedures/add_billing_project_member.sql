-- Adds a member to a billing project (AddMember). Idempotent. The project
-- row is locked first (the lock order), so the change and the state it
-- checks are one: create_batch share-locks the same row.
-- rc 1: no such project (message) or the member is not a user of corral
-- (`username`, the usernames view of migration 0020); rc 2: the project is
-- deleted.
DROP PROCEDURE IF EXISTS add_billing_project_member;
DELIMITER $$
CREATE PROCEDURE add_billing_project_member(IN in_name VARCHAR(100), IN in_user VARCHAR(100))
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
  IF NOT EXISTS (SELECT 1 FROM usernames WHERE username = in_user) THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no user ', in_user) AS message, in_user AS username;
    LEAVE proc;
  END IF;
  INSERT INTO billing_project_members (billing_project, user) VALUES (in_name, in_user)
    ON DUPLICATE KEY UPDATE user = user;
  COMMIT;
  SELECT 0 AS rc, 'added' AS message;
END $$
DELIMITER ;
