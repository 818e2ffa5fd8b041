-- Completion callbacks, step 1: take up to in_limit outbox rows that are due
-- (pending, callback_next_attempt_ms <= now) for sending, and lease them
-- until now + in_lease_ms, so no other driver (a new leader, a second call)
-- sends them meanwhile. Rows of batches without a callback_url are settled
-- as 'none' on the way. The lease must outlast one POST: a driver that dies
-- holding it delays the callback by the lease, never sends it twice unless
-- it died after the POST and before record_batch_callback.
-- Returns the claimed rows (batch_id, n_jobs, callback_attempts,
-- time_completed_ms, callback_url), then the status row with n_claimed.
DROP PROCEDURE IF EXISTS claim_batch_callbacks;
DELIMITER $$
CREATE PROCEDURE claim_batch_callbacks(IN in_epoch BIGINT, IN in_limit INT, IN in_lease_ms BIGINT,
                                       IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_locked INT;
  DECLARE v_n INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_limit IS NULL OR in_limit < 1 OR in_lease_ms IS NULL OR in_lease_ms < 1 THEN
    SELECT 3 AS rc, 'limit and lease must be at least 1' AS message;
    LEAVE proc;
  END IF;
  IF @@in_transaction = 0 AND @corral_scratch_callbacks <=> 'b42626495f01' THEN
    TRUNCATE TABLE tmp_callbacks;
  ELSE
    SET @corral_scratch_callbacks = NULL;
    DROP TEMPORARY TABLE IF EXISTS tmp_callbacks;
    CREATE TEMPORARY TABLE tmp_callbacks (
      batch_id BIGINT NOT NULL,
      n_jobs INT NOT NULL,
      has_url BOOLEAN NOT NULL,
      PRIMARY KEY (batch_id, n_jobs)
    );
    SET @corral_scratch_callbacks = 'b42626495f01';
  END IF;
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  -- (batches is only read, without locks: the lock order puts it before
  -- batch_completions, whose rows this call holds.)
  INSERT INTO tmp_callbacks (batch_id, n_jobs, has_url)
    SELECT c.batch_id, c.n_jobs, COALESCE(b.callback_url, '') <> ''
    FROM batch_completions c
    JOIN batches b ON b.batch_id = c.batch_id
    WHERE c.callback_state = 'pending' AND c.callback_next_attempt_ms <= in_now_ms
    ORDER BY c.callback_next_attempt_ms, c.batch_id, c.n_jobs
    LIMIT in_limit;
  -- Lock, then drop what another caller claimed or settled since the read
  -- above (a read after the lock sees the latest committed rows).
  SELECT COUNT(*) INTO v_locked
    FROM tmp_callbacks t
    JOIN batch_completions c ON c.batch_id = t.batch_id AND c.n_jobs = t.n_jobs
    FOR UPDATE;
  DELETE t FROM tmp_callbacks t
    JOIN batch_completions c ON c.batch_id = t.batch_id AND c.n_jobs = t.n_jobs
    WHERE NOT (c.callback_state = 'pending' AND c.callback_next_attempt_ms <= in_now_ms);
  UPDATE batch_completions c
    JOIN tmp_callbacks t ON t.batch_id = c.batch_id AND t.n_jobs = c.n_jobs
    SET c.callback_state = IF(t.has_url, c.callback_state, 'none'),
        c.callback_next_attempt_ms = IF(t.has_url, in_now_ms + in_lease_ms, c.callback_next_attempt_ms);
  DELETE FROM tmp_callbacks WHERE NOT has_url;
  SELECT COUNT(*) INTO v_n FROM tmp_callbacks;
  COMMIT;
  SELECT c.batch_id, c.n_jobs, c.callback_attempts, c.time_completed_ms, b.callback_url
    FROM tmp_callbacks t
    JOIN batch_completions c ON c.batch_id = t.batch_id AND c.n_jobs = t.n_jobs
    JOIN batches b ON b.batch_id = c.batch_id
    ORDER BY c.batch_id, c.n_jobs;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_claimed;
END $$
DELIMITER ;
