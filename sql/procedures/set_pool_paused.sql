-- Pauses (in_paused TRUE) or resumes (FALSE) a pool (PausePool,
-- ResumePool): a paused pool starts nothing new and gets no new machine
-- (migration 0030). The first pause's who and when are kept; pausing again
-- is 'already paused', resuming a pool that runs is 'not paused'. rc 1: no
-- such pool (the job-private collection is no pool).
DROP PROCEDURE IF EXISTS set_pool_paused;
DELIMITER $$
CREATE PROCEDURE set_pool_paused(IN in_name VARCHAR(100), IN in_paused BOOLEAN, IN in_user VARCHAR(100),
                                 IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_paused BOOLEAN;
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_paused IS NULL OR in_user IS NULL OR in_user = '' THEN
    SELECT 3 AS rc, 'say whether to pause, and who does' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  SELECT paused INTO v_paused FROM instance_collections WHERE name = in_name AND is_pool FOR UPDATE;
  IF v_missing THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no pool ', in_name) AS message;
    LEAVE proc;
  END IF;
  IF v_paused = in_paused THEN
    COMMIT;
    SELECT 0 AS rc, IF(in_paused, 'already paused', 'not paused') AS message;
    LEAVE proc;
  END IF;
  UPDATE instance_collections
    SET paused = in_paused, paused_by = IF(in_paused, in_user, NULL), time_paused_ms = IF(in_paused, in_now_ms, NULL)
    WHERE name = in_name;
  COMMIT;
  SELECT 0 AS rc, IF(in_paused, 'paused', 'resumed') AS message;
END $$
DELIMITER ;
