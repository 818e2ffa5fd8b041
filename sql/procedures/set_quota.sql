-- Sets the quota of a billing project (in_kind 'project') or a user
-- ('user') (SetQuota, administrators): each cap NULL for none, in_weight
-- the fair-share weight (1 the default). The quota is replaced whole; one
-- with no cap and weight 1 is the default and its row is deleted. Checked
-- here too (the frontend checks first): caps 1 or more (running cores at
-- least 1 mcpu, at most 1,000,000 cores; jobs at most 1e9), weight 1 to
-- 1000. rc 3: a value out of range; rc 1: no such billing project (a
-- deleted one neither) or user (the usernames view, migration 0020).
-- The message is 'set', 'cleared' (a row was deleted) or 'unchanged'
-- (the default asked for where none was set).
DROP PROCEDURE IF EXISTS set_quota;
DELIMITER $$
CREATE PROCEDURE set_quota(IN in_kind VARCHAR(10), IN in_name VARCHAR(100), IN in_max_running_cores_mcpu BIGINT,
                           IN in_max_running_jobs INT, IN in_max_ready_jobs BIGINT, IN in_weight INT,
                           IN in_user VARCHAR(100), IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_deleted INT DEFAULT 0;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_kind IS NULL OR in_kind NOT IN ('project', 'user') THEN
    SELECT 3 AS rc, 'kind must be project or user' AS message;
    LEAVE proc;
  END IF;
  IF in_name IS NULL OR in_name = '' OR in_user IS NULL OR in_user = '' OR in_now_ms IS NULL THEN
    SELECT 3 AS rc, 'say whose quota, who sets it and when' AS message;
    LEAVE proc;
  END IF;
  IF in_max_running_cores_mcpu IS NOT NULL AND NOT in_max_running_cores_mcpu BETWEEN 1 AND 1000000000 THEN
    SELECT 3 AS rc, 'max_running_cores_mcpu must be between 1 and 1000000000' AS message;
    LEAVE proc;
  END IF;
  IF in_max_running_jobs IS NOT NULL AND NOT in_max_running_jobs BETWEEN 1 AND 1000000000 THEN
    SELECT 3 AS rc, 'max_running_jobs must be between 1 and 1000000000' AS message;
    LEAVE proc;
  END IF;
  IF in_max_ready_jobs IS NOT NULL AND NOT in_max_ready_jobs BETWEEN 1 AND 1000000000 THEN
    SELECT 3 AS rc, 'max_ready_jobs must be between 1 and 1000000000' AS message;
    LEAVE proc;
  END IF;
  IF in_weight IS NULL OR NOT in_weight BETWEEN 1 AND 1000 THEN
    SELECT 3 AS rc, 'weight must be between 1 and 1000' AS message;
    LEAVE proc;
  END IF;
  IF in_kind = 'project' AND NOT EXISTS (SELECT 1 FROM billing_projects
                                         WHERE name = in_name AND state <> 'deleted') THEN
    SELECT 1 AS rc, CONCAT('no billing project ', in_name) AS message;
    LEAVE proc;
  END IF;
  IF in_kind = 'user' AND NOT EXISTS (SELECT 1 FROM usernames WHERE username = in_name) THEN
    SELECT 1 AS rc, CONCAT('no user ', in_name) AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  IF in_max_running_cores_mcpu IS NULL AND in_max_running_jobs IS NULL AND in_max_ready_jobs IS NULL
     AND in_weight = 1 THEN
    DELETE FROM quotas WHERE kind = in_kind AND name = in_name;
    SET v_deleted = ROW_COUNT();
    COMMIT;
    SELECT 0 AS rc, IF(v_deleted > 0, 'cleared', 'unchanged') AS message;
    LEAVE proc;
  END IF;
  INSERT INTO quotas (kind, name, max_running_cores_mcpu, max_running_jobs, max_ready_jobs, weight, set_by,
                      time_set_ms)
    VALUES (in_kind, in_name, in_max_running_cores_mcpu, in_max_running_jobs, in_max_ready_jobs, in_weight,
            in_user, in_now_ms)
    ON DUPLICATE KEY UPDATE max_running_cores_mcpu = VALUES(max_running_cores_mcpu),
      max_running_jobs = VALUES(max_running_jobs), max_ready_jobs = VALUES(max_ready_jobs),
      weight = VALUES(weight), set_by = VALUES(set_by), time_set_ms = VALUES(time_set_ms);
  COMMIT;
  SELECT 0 AS rc, 'set' AS message;
END $$
DELIMITER ;
