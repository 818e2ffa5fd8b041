-- Hides a batch from every read (DeleteBatch). The frontend cancels a
-- batch that is not complete with cancel_job_group first, so its jobs
-- drain and the cancellation is recorded like any other; this marks the
-- row. create_update and commit_update refuse a deleted batch, so nothing
-- joins it afterwards. Deleting again is a no-op; the rows stay until the
-- cleanup loop removes them.
DROP PROCEDURE IF EXISTS delete_batch;
DELIMITER $$
CREATE PROCEDURE delete_batch(IN in_batch_id BIGINT)
proc: BEGIN
  DECLARE v_deleted BOOLEAN;
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  START TRANSACTION;
  SELECT deleted INTO v_deleted FROM batches WHERE batch_id = in_batch_id FOR UPDATE;
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
  UPDATE batches SET deleted = TRUE WHERE batch_id = in_batch_id;
  COMMIT;
  SELECT 0 AS rc, 'deleted' AS message;
END $$
DELIMITER ;
