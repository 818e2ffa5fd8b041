-- Creates an open billing project with its first members
-- (CreateBillingProject). in_members: a JSON array of usernames, each of a
-- user of corral (the `usernames` view, migration 0020), checked in the
-- transaction that adds them, so a member list never names someone who
-- does not exist. in_limit_usd NULL: no limit.
-- rc 1: a member is not a user (`username`: the first, by name);
-- rc 3: members is not an array of names; rc 5: the name is taken (a
-- deleted project keeps its name).
DROP PROCEDURE IF EXISTS create_billing_project;
DELIMITER $$
CREATE PROCEDURE create_billing_project(IN in_name VARCHAR(100), IN in_members JSON, IN in_limit_usd DOUBLE,
                                        IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_unknown VARCHAR(100);
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  -- 1062 (duplicate key): a project of that name exists, in any state.
  DECLARE EXIT HANDLER FOR 1062
  BEGIN
    ROLLBACK;
    SELECT 5 AS rc, CONCAT('billing project ', in_name, ' exists') AS message;
  END;

  IF in_members IS NULL OR JSON_TYPE(in_members) <> 'ARRAY'
     OR EXISTS (SELECT 1 FROM JSON_TABLE(in_members, '$[*]' COLUMNS (username VARCHAR(100) PATH '$')) jt
                WHERE jt.username IS NULL) THEN
    SELECT 3 AS rc, 'members must be a JSON array of usernames' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  SELECT MIN(jt.username) INTO v_unknown
    FROM JSON_TABLE(in_members, '$[*]' COLUMNS (username VARCHAR(100) PATH '$')) jt
    WHERE NOT EXISTS (SELECT 1 FROM usernames u WHERE u.username = jt.username);
  IF v_unknown IS NOT NULL THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no user ', v_unknown) AS message, v_unknown AS username;
    LEAVE proc;
  END IF;
  INSERT INTO billing_projects (name, limit_usd, time_created_ms) VALUES (in_name, in_limit_usd, in_now_ms);
  INSERT INTO billing_project_members (billing_project, user)
    SELECT DISTINCT in_name, jt.username
    FROM JSON_TABLE(in_members, '$[*]' COLUMNS (username VARCHAR(100) PATH '$')) jt;
  COMMIT;
  SELECT 0 AS rc, 'created' AS message;
END $$
DELIMITER ;
