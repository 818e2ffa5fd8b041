-- A worker's heartbeat: marks the instance alive and advances the billing
-- rollup of its running attempts. in_attempts:
-- [{"batch_id", "job_id", "attempt_id", "rollup_time_ms", "cpu_time_ms",
-- "peak_memory_bytes"}] (an attempt listed twice advances to the later
-- time; the usage fields are optional). Rollups only move forward and stop at
-- an attempt's end, so late or repeated heartbeats never bill twice. The
-- advances are billed here, set-based (bill_attempt_usage), with the
-- attempts trigger told to skip them (@corral_bulk_usage). Billing is on
-- the reserved resources; the usage fields are the worker's last sample,
-- kept in attempts.cpu_time_ms/peak_memory_bytes for users to read while
-- the attempt runs (the completion overwrites them), and only where the
-- rollup moves (not past an attempt's reserved time).
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
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    SET @corral_bulk_usage = NULL;
    ROLLBACK;
    RESIGNAL;
  END;

  IF in_attempts IS NULL OR JSON_TYPE(in_attempts) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'attempts must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  CALL create_change_tables();
  -- Made once per connection, emptied by TRUNCATE (see create_completion_tables).
  IF @@in_transaction = 0 AND @corral_scratch_rollups <=> '4b57616b7ef9' THEN
    TRUNCATE TABLE tmp_rollups;
  ELSE
    SET @corral_scratch_rollups = NULL;
    DROP TEMPORARY TABLE IF EXISTS tmp_rollups;
    CREATE TEMPORARY TABLE tmp_rollups (
      batch_id BIGINT NOT NULL,
      job_id INT NOT NULL,
      attempt_id VARCHAR(40) NOT NULL,
      rollup_time_ms BIGINT NOT NULL,
      cpu_time_ms BIGINT NULL,
      peak_memory_bytes BIGINT NULL,
      PRIMARY KEY (batch_id, job_id, attempt_id)
    );
    SET @corral_scratch_rollups = '4b57616b7ef9';
  END IF;
  INSERT INTO tmp_rollups (batch_id, job_id, attempt_id, rollup_time_ms, cpu_time_ms, peak_memory_bytes)
    SELECT jt.batch_id, jt.job_id, jt.attempt_id, jt.rollup_time_ms, jt.cpu_time_ms, jt.peak_memory_bytes
    FROM JSON_TABLE(in_attempts, '$[*]' COLUMNS (batch_id BIGINT PATH '$.batch_id', job_id INT PATH '$.job_id',
                                                  attempt_id VARCHAR(40) PATH '$.attempt_id',
                                                  rollup_time_ms BIGINT PATH '$.rollup_time_ms',
                                                  cpu_time_ms BIGINT PATH '$.cpu_time_ms',
                                                  peak_memory_bytes BIGINT PATH '$.peak_memory_bytes')) jt
    WHERE jt.batch_id IS NOT NULL AND jt.job_id IS NOT NULL AND jt.attempt_id IS NOT NULL
      AND jt.rollup_time_ms IS NOT NULL
  -- Both usage counters only grow: the larger of two samples is the later.
  ON DUPLICATE KEY UPDATE rollup_time_ms = GREATEST(tmp_rollups.rollup_time_ms, VALUES(rollup_time_ms)),
    cpu_time_ms = COALESCE(GREATEST(tmp_rollups.cpu_time_ms, VALUES(cpu_time_ms)), tmp_rollups.cpu_time_ms,
                           VALUES(cpu_time_ms)),
    peak_memory_bytes = COALESCE(GREATEST(tmp_rollups.peak_memory_bytes, VALUES(peak_memory_bytes)),
                                 tmp_rollups.peak_memory_bytes, VALUES(peak_memory_bytes));

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
  -- Attempts first (lock order: attempts, instances, token rows): lock the
  -- open attempts of this instance that move forward, in key order, and
  -- note how far each moves. Through the primary key, from the listed
  -- attempts: reading attempts_instance instead locked every open attempt of
  -- the instance, and deadlocked with MJCs closing some of them.
  INSERT INTO tmp_attempt_usage (batch_id, job_id, attempt_id, delta_ms, rollup_time_ms)
    -- Never past what the attempt reserved (a budget's attempts: migration 0013).
    SELECT a.batch_id, a.job_id, a.attempt_id,
           LEAST(t.rollup_time_ms, COALESCE(a.start_time_ms + a.reserved_ms, t.rollup_time_ms))
             - COALESCE(a.rollup_time_ms, a.start_time_ms),
           LEAST(t.rollup_time_ms, COALESCE(a.start_time_ms + a.reserved_ms, t.rollup_time_ms))
    FROM tmp_rollups t
    STRAIGHT_JOIN attempts a FORCE INDEX (PRIMARY)
      ON a.batch_id = t.batch_id AND a.job_id = t.job_id AND a.attempt_id = t.attempt_id
    WHERE a.instance_name = in_instance_name AND a.start_time_ms IS NOT NULL AND a.end_time_ms IS NULL
      AND LEAST(t.rollup_time_ms, COALESCE(a.start_time_ms + a.reserved_ms, t.rollup_time_ms))
          > COALESCE(a.rollup_time_ms, a.start_time_ms)
    ORDER BY a.batch_id, a.job_id, a.attempt_id
    FOR UPDATE;
  SET v_n = ROW_COUNT();
  SET @corral_bulk_usage = TRUE;
  UPDATE tmp_attempt_usage u
    STRAIGHT_JOIN attempts a ON a.batch_id = u.batch_id AND a.job_id = u.job_id AND a.attempt_id = u.attempt_id
    STRAIGHT_JOIN tmp_rollups t ON t.batch_id = u.batch_id AND t.job_id = u.job_id AND t.attempt_id = u.attempt_id
    SET a.rollup_time_ms = u.rollup_time_ms,
        a.cpu_time_ms = COALESCE(t.cpu_time_ms, a.cpu_time_ms),
        a.peak_memory_bytes = COALESCE(t.peak_memory_bytes, a.peak_memory_bytes);
  SET @corral_bulk_usage = NULL;
  UPDATE instances SET last_heartbeat_ms = GREATEST(COALESCE(last_heartbeat_ms, 0), in_now_ms)
    WHERE name = in_instance_name;
  CALL bill_attempt_usage();
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_rolled_up;
END $$
DELIMITER ;
