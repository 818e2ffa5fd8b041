-- Takes back a batch that the call creating it could not finish because a
-- later step was refused (SubmitBatch, CreateBatch: someone else changed
-- something between their procedures, such as closing the project or
-- taking the last open-job quota), so that a refused submission leaves
-- nothing behind: the batch is cancelled (its reserved ids stop counting
-- against the open-job limits, job_limits_check), deleted (hidden from
-- every read, as delete_batch) and its idempotency token released, so a
-- retry of the call starts afresh, as if the refused one had written
-- nothing. Only a batch no update of which was ever committed (state
-- 'open'): once one is, a call with the same token succeeded and the
-- batch is that call's answer (rc 2). Discarding again is a no-op.
DROP PROCEDURE IF EXISTS discard_batch;
DELIMITER $$
CREATE PROCEDURE discard_batch(IN in_batch_id BIGINT, IN in_user VARCHAR(100), IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_state VARCHAR(20);
  DECLARE v_deleted BOOLEAN;
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  START TRANSACTION;
  -- The batch row first, exclusively, as commit_update takes it: a commit
  -- and a discard of one batch happen one after the other.
  SELECT state, deleted INTO v_state, v_deleted FROM batches WHERE batch_id = in_batch_id FOR UPDATE;
  IF v_missing THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no batch ', in_batch_id) AS message;
    LEAVE proc;
  END IF;
  IF v_deleted THEN
    COMMIT;
    SELECT 0 AS rc, 'already deleted' AS message;
    LEAVE proc;
  END IF;
  IF v_state <> 'open' THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('batch ', in_batch_id, ' has a committed update: it is kept') AS message;
    LEAVE proc;
  END IF;
  INSERT INTO job_groups_cancelled (batch_id, job_group_id, cancelled_by, reason, time_cancelled_ms)
    VALUES (in_batch_id, 0, in_user, 'its submission was refused', in_now_ms)
  ON DUPLICATE KEY UPDATE batch_id = job_groups_cancelled.batch_id;
  UPDATE batches SET deleted = TRUE, idempotency_token = NULL WHERE batch_id = in_batch_id;
  COMMIT;
  SELECT 0 AS rc, 'discarded' AS message;
END $$
DELIMITER ;
