-- The releaser (the leading driver's ChildReleaser loop): goes on with the
-- parents queued in job_child_releases by complete_jobs_core, in one
-- transaction that releases at most in_max_children children: up to
-- in_max_parents parents, the least recently served first, share the budget
-- evenly (at least one child each), each from its next_child_id on (see
-- release_children_lock). A parent whose children ran out leaves the
-- queue; the others go to its back with their new next_child_id. Children
-- left without pending parents become Ready (or stay Cancelled, if
-- cancel_pending_jobs took them), with the counters and events the jobs
-- trigger would have written, set-based (record_job_changes).
--
-- Idempotent: the queue row and the children move in one transaction, so a
-- repeat, a retry or a call from the next leader continues where the last
-- committed call stopped, and no edge is counted twice. Fenced by the
-- leader epoch. Lock order: leader_epoch (shared), the queue rows, the
-- children (ascending), token rows.
-- Returns the status row with n_children (released now), n_parents (served)
-- and n_finished (parents whose children are all released now).
DROP PROCEDURE IF EXISTS release_children;
DELIMITER $$
CREATE PROCEDURE release_children(IN in_epoch BIGINT, IN in_max_children INT, IN in_max_parents INT,
                                  IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_n_parents INT;
  DECLARE v_n_children INT DEFAULT 0;
  DECLARE v_n_finished INT DEFAULT 0;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    SET @corral_bulk_job_changes = NULL;
    ROLLBACK;
    RESIGNAL;
  END;

  IF in_max_children IS NULL OR in_max_children < 1 OR in_max_parents IS NULL OR in_max_parents < 1 THEN
    SELECT 3 AS rc, 'max_children and max_parents must be at least 1' AS message;
    LEAVE proc;
  END IF;
  CALL create_completion_tables();
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  INSERT INTO tmp_releases (batch_id, parent_id, parent_state, from_child_id)
    SELECT batch_id, parent_id, parent_state, next_child_id
    FROM job_child_releases FORCE INDEX (job_child_releases_turn)
    ORDER BY last_step_ms, batch_id, parent_id
    LIMIT in_max_parents
    FOR UPDATE;
  SET v_n_parents = ROW_COUNT();
  IF v_n_parents > 0 THEN
    CALL release_children_lock(GREATEST(1, in_max_children DIV v_n_parents), v_n_children);
    IF v_n_children > 0 THEN
      CALL release_children_apply();
    END IF;
    CALL release_children_record(in_now_ms);
    CALL record_job_changes();
    SELECT COUNT(*) INTO v_n_finished FROM tmp_releases WHERE to_child_id IS NULL;
  END IF;
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message, v_n_children AS n_children, v_n_parents AS n_parents,
         v_n_finished AS n_finished;
END $$
DELIMITER ;
