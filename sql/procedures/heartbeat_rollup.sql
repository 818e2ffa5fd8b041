-- A worker's heartbeat: marks the instance alive and advances the billing
-- rollup of its running attempts. in_attempts:
-- [{"batch_id", "job_id", "attempt_id", "rollup_time_ms"}]. Rollups only move
-- forward and stop at an attempt's end, so late or repeated heartbeats never
-- bill twice. The attempts trigger turns the advance into usage.
DROP PROCEDURE IF EXISTS heartbeat_rollup;
DELIMITER $$
CREATE PROCEDURE heartbeat_rollup(IN in_epoch BIGINT, IN in_instance_name VARCHAR(100),
                                  IN in_attempts JSON, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_state VARCHAR(20);
  DECLARE v_n INT;
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_attempts IS NULL OR JSON_TYPE(in_attempts) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'attempts must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  SELECT state INTO v_state FROM instances WHERE name = in_instance_name;
  IF v_state IS NULL OR v_state <> 'active' THEN
    ROLLBACK;
    SELECT IF(v_state IS NULL, 1, 2) AS rc,
           CONCAT('instance ', in_instance_name, IF(v_state IS NULL, ' does not exist', ' is not active')) AS message;
    LEAVE proc;
  END IF;
  -- Attempts first (lock order: attempts before instances).
  UPDATE attempts a
    JOIN JSON_TABLE(in_attempts, '$[*]' COLUMNS (batch_id BIGINT PATH '$.batch_id', job_id INT PATH '$.job_id',
                                                  attempt_id VARCHAR(40) PATH '$.attempt_id',
                                                  rollup_time_ms BIGINT PATH '$.rollup_time_ms')) jt
      ON a.batch_id = jt.batch_id AND a.job_id = jt.job_id AND a.attempt_id = jt.attempt_id
    SET a.rollup_time_ms = jt.rollup_time_ms
    WHERE a.instance_name = in_instance_name AND a.start_time_ms IS NOT NULL AND a.end_time_ms IS NULL
      AND jt.rollup_time_ms > COALESCE(a.rollup_time_ms, a.start_time_ms);
  SET v_n = ROW_COUNT();
  UPDATE instances SET last_heartbeat_ms = GREATEST(COALESCE(last_heartbeat_ms, 0), in_now_ms)
    WHERE name = in_instance_name;
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_rolled_up;
END $$
DELIMITER ;
