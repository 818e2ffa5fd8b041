-- MJS, bulk: a worker reports that attempts began running at start_time_ms.
-- in_jobs: [{"batch_id", "job_id", "attempt_id", "start_time_ms"}]. Sets the
-- attempt's start (and the billing rollup origin) once; a repeat, a late
-- call after MJC, or an unknown attempt changes nothing. The job's state is
-- not touched: SJ already made it Running.
DROP PROCEDURE IF EXISTS mark_jobs_started;
DELIMITER $$
CREATE PROCEDURE mark_jobs_started(IN in_epoch BIGINT, IN in_instance_name VARCHAR(100), IN in_jobs JSON)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_n INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_jobs IS NULL OR JSON_TYPE(in_jobs) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'jobs must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  UPDATE attempts a
    JOIN JSON_TABLE(in_jobs, '$[*]' COLUMNS (batch_id BIGINT PATH '$.batch_id', job_id INT PATH '$.job_id',
                                              attempt_id VARCHAR(40) PATH '$.attempt_id',
                                              start_time_ms BIGINT PATH '$.start_time_ms')) jt
      ON a.batch_id = jt.batch_id AND a.job_id = jt.job_id AND a.attempt_id = jt.attempt_id
    SET a.rollup_time_ms = COALESCE(a.rollup_time_ms, jt.start_time_ms),
        a.start_time_ms = COALESCE(a.start_time_ms, jt.start_time_ms)
    WHERE a.instance_name = in_instance_name AND a.start_time_ms IS NULL AND a.end_time_ms IS NULL
      AND jt.start_time_ms IS NOT NULL;
  SET v_n = ROW_COUNT();
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_started;
END $$
DELIMITER ;
