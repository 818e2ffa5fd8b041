-- The canceller's bulk drain of Pending jobs: up to in_limit Pending jobs of
-- one batch whose group (or an ancestor) is cancelled, not always_run and
-- of a committed update, become Cancelled in one transaction, without
-- waiting for their parents. Such a job could never run: once its parents
-- ended it would be Ready in a cancelled group, which schedule_jobs refuses
-- and cancel_ready_jobs cancels. Taking it now drains a million Pending
-- children of a running parent set-based, many per statement, instead of
-- level by level behind their parents.
--
-- The cancelled jobs keep their n_pending_parents: their parents' releases
-- still count them down, changing nothing else (see release_children_apply).
-- Their own children are released as any completed job's (complete_jobs_core:
-- up to in_max_children here, the rest queued); children in the cancelled
-- groups are Pending jobs this drain takes too, on this call or the next.
-- always_run jobs wait for their parents and run, as before.
--
-- The jobs are found through jobs_group_state, one range per group under a
-- cancelled one; which come first does not matter, complete_jobs_core locks
-- them in key order. A job's update is read without a lock: a committed
-- update stays committed.
-- Returns the status row with n_cancelled.
DROP PROCEDURE IF EXISTS cancel_pending_jobs;
DELIMITER $$
CREATE PROCEDURE cancel_pending_jobs(IN in_epoch BIGINT, IN in_batch_id BIGINT, IN in_limit INT,
                                     IN in_now_ms BIGINT, IN in_max_children INT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_n INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    -- complete_jobs_core sets these around its bulk statements; a pooled
    -- connection must not carry them into its next call.
    SET @corral_bulk_job_changes = NULL, @corral_bulk_usage = NULL;
    ROLLBACK;
    RESIGNAL;
  END;

  IF in_limit IS NULL OR in_limit < 0 OR in_max_children IS NULL OR in_max_children < 0 THEN
    SELECT 3 AS rc, 'limit and max_children must not be negative' AS message;
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
  INSERT INTO tmp_job_completions (batch_id, job_id, new_state, reason, may_cancel_pending)
    SELECT j.batch_id, j.job_id, 'Cancelled', 'cancelled', TRUE
    FROM jobs j FORCE INDEX (jobs_group_state)
    JOIN batch_updates u ON u.batch_id = j.batch_id AND u.update_id = j.update_id AND u.committed
    WHERE j.batch_id = in_batch_id AND j.state = 'Pending' AND NOT j.always_run
      AND j.job_group_id IN (SELECT x.job_group_id FROM job_groups_cancelled_self_or_ancestor x
                             WHERE x.batch_id = in_batch_id)
    LIMIT in_limit;
  CALL complete_jobs_core(in_now_ms, in_max_children);
  SELECT COUNT(*) INTO v_n FROM tmp_job_completions WHERE outcome = 'completed';
  COMMIT;
  CALL check_completions(in_now_ms);
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_cancelled;
END $$
DELIMITER ;
