-- Completion callbacks, step 2: what one POST of a claimed outbox row came
-- to. in_outcome:
--   'sent'      a 2xx: callback_sent_ms = now, never sent again;
--   'retry'     it failed (in_error says how); try again at in_next_attempt_ms;
--   'given_up'  it failed and the time allowed for retries is over.
-- Every outcome counts one attempt. Idempotent: a row that is no longer
-- pending (sent, given up) keeps what it has, with message 'already settled'.
DROP PROCEDURE IF EXISTS record_batch_callback;
DELIMITER $$
CREATE PROCEDURE record_batch_callback(IN in_epoch BIGINT, IN in_batch_id BIGINT, IN in_n_jobs INT,
                                       IN in_outcome VARCHAR(16), IN in_error VARCHAR(1024),
                                       IN in_next_attempt_ms BIGINT, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_state VARCHAR(16);
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_outcome IS NULL OR in_outcome NOT IN ('sent', 'retry', 'given_up') THEN
    SELECT 3 AS rc, 'outcome must be sent, retry or given_up' AS message;
    LEAVE proc;
  END IF;
  IF in_outcome = 'retry' AND in_next_attempt_ms IS NULL THEN
    SELECT 3 AS rc, 'a retry needs next_attempt_ms' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  SELECT callback_state INTO v_state FROM batch_completions
    WHERE batch_id = in_batch_id AND n_jobs = in_n_jobs FOR UPDATE;
  IF v_missing THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no completion of batch ', in_batch_id, ' with ', in_n_jobs, ' jobs') AS message;
    LEAVE proc;
  END IF;
  IF v_state <> 'pending' THEN
    COMMIT;
    SELECT 0 AS rc, 'already settled' AS message, v_state AS callback_state;
    LEAVE proc;
  END IF;
  UPDATE batch_completions
    SET callback_attempts = callback_attempts + 1,
        callback_state = IF(in_outcome = 'retry', 'pending', in_outcome),
        callback_sent_ms = IF(in_outcome = 'sent', in_now_ms, callback_sent_ms),
        callback_given_up_ms = IF(in_outcome = 'given_up', in_now_ms, callback_given_up_ms),
        callback_next_attempt_ms = IF(in_outcome = 'retry', in_next_attempt_ms, callback_next_attempt_ms),
        callback_error = IF(in_outcome = 'sent', callback_error, LEFT(in_error, 1024))
    WHERE batch_id = in_batch_id AND n_jobs = in_n_jobs;
  COMMIT;
  SELECT 0 AS rc, 'recorded' AS message, IF(in_outcome = 'retry', 'pending', in_outcome) AS callback_state;
END $$
DELIMITER ;
