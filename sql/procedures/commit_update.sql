-- Makes an update's jobs and groups visible and runnable: every reserved
-- job and group must have been inserted. Counts go to each group and its
-- ancestors, jobs with no pending parents become Ready (one set-based
-- statement over the update's id range; parents are never re-read here,
-- insert_jobs already counted them), and a batch whose jobs are all final
-- completes. Committing twice is a no-op. Refused for a cancelled batch.
--
-- Events: one update_committed event stands for "these jobs joined the
-- batch; those without unfinished parents are Ready". The Pending -> Ready
-- flips of this commit write no job events, so a commit of a million jobs
-- writes one event. Their live resource counters are added here, one grouped
-- upsert over the update's jobs, instead of one trigger upsert per job:
-- @corral_bulk_job_changes tells the jobs trigger to skip the flips. It is
-- cleared on every way out, an error included: a pooled connection must not
-- carry it into its next call.
DROP PROCEDURE IF EXISTS commit_update;
DELIMITER $$
CREATE PROCEDURE commit_update(IN in_batch_id BIGINT, IN in_update_id INT, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_start INT;
  DECLARE v_n INT;
  DECLARE v_start_group INT;
  DECLARE v_n_groups INT;
  DECLARE v_committed BOOLEAN;
  DECLARE v_deleted BOOLEAN;
  DECLARE v_have INT;
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    SET @corral_bulk_job_changes = NULL;
    ROLLBACK;
    RESIGNAL;
  END;

  CALL create_completion_tables();
  START TRANSACTION;
  SELECT deleted INTO v_deleted FROM batches WHERE batch_id = in_batch_id FOR UPDATE;
  IF v_missing OR v_deleted THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no batch ', in_batch_id) AS message;
    LEAVE proc;
  END IF;
  SELECT start_job_id, n_jobs, start_job_group_id, n_job_groups, committed
    INTO v_start, v_n, v_start_group, v_n_groups, v_committed
    FROM batch_updates WHERE batch_id = in_batch_id AND update_id = in_update_id FOR UPDATE;
  IF v_missing THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no update ', in_update_id, ' of batch ', in_batch_id) AS message;
    LEAVE proc;
  END IF;
  IF v_committed THEN
    COMMIT;
    -- A retry after the first call's completion check failed: check again.
    CALL queue_update_groups_for_check(in_batch_id, in_update_id);
    CALL check_completions(in_now_ms);
    SELECT 0 AS rc, 'already committed' AS message;
    LEAVE proc;
  END IF;
  IF EXISTS (SELECT 1 FROM job_groups_cancelled WHERE batch_id = in_batch_id AND job_group_id = 0) THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('batch ', in_batch_id, ' is cancelled') AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*) INTO v_have FROM jobs WHERE batch_id = in_batch_id AND update_id = in_update_id;
  IF v_have <> v_n THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('the update has ', v_have, ' of its ', v_n, ' jobs; add the missing bunches first') AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*) INTO v_have FROM job_groups WHERE batch_id = in_batch_id AND update_id = in_update_id;
  IF v_have <> v_n_groups THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('the update has ', v_have, ' of its ', v_n_groups, ' job groups') AS message;
    LEAVE proc;
  END IF;

  UPDATE batch_updates SET committed = TRUE, time_committed_ms = in_now_ms
    WHERE batch_id = in_batch_id AND update_id = in_update_id;
  INSERT INTO batch_event_outbox (batch_id, kind, update_id, start_job_id, n_jobs, time_ms)
    VALUES (in_batch_id, 'update_committed', in_update_id, v_start, v_n, in_now_ms);
  UPDATE job_groups g
    JOIN (SELECT a.ancestor_id, COUNT(*) AS n
          FROM jobs j
          JOIN job_group_self_and_ancestors a ON a.batch_id = j.batch_id AND a.job_group_id = j.job_group_id
          WHERE j.batch_id = in_batch_id AND j.update_id = in_update_id
          GROUP BY a.ancestor_id) x ON g.batch_id = in_batch_id AND g.job_group_id = x.ancestor_id
    SET g.n_jobs = g.n_jobs + x.n, g.state = 'running', g.time_completed_ms = NULL;
  UPDATE batches
    SET n_jobs = n_jobs + v_n,
        state = IF(v_n > 0 OR state = 'open', 'running', state),
        time_completed_ms = IF(v_n > 0, NULL, time_completed_ms)
    WHERE batch_id = in_batch_id;
  SET @corral_bulk_job_changes = TRUE;
  UPDATE jobs SET state = 'Ready'
    WHERE batch_id = in_batch_id AND update_id = in_update_id AND state = 'Pending' AND n_pending_parents = 0
    ORDER BY job_id;
  SET @corral_bulk_job_changes = NULL;
  -- Every Ready job of the update was made Ready just now: none is before the
  -- commit (complete_jobs_core readies only children of committed updates).
  INSERT INTO user_inst_coll_resources_by_job_group
      (user, inst_coll, batch_id, job_group_id, token,
       n_ready_cancellable_jobs, ready_cancellable_cores_mcpu,
       n_ready_always_run_jobs, ready_always_run_cores_mcpu, n_ready_dependency_failed_jobs)
    SELECT b.user, j.inst_coll, j.batch_id, j.job_group_id, CONNECTION_ID() MOD 64,
           SUM(NOT j.always_run AND NOT j.dependency_failed),
           SUM(IF(NOT j.always_run AND NOT j.dependency_failed, j.cores_mcpu, 0)),
           SUM(j.always_run), SUM(IF(j.always_run, j.cores_mcpu, 0)),
           SUM(NOT j.always_run AND j.dependency_failed)
    FROM jobs j
    JOIN batches b ON b.batch_id = j.batch_id
    WHERE j.batch_id = in_batch_id AND j.update_id = in_update_id AND j.state = 'Ready'
    GROUP BY b.user, j.inst_coll, j.batch_id, j.job_group_id
    ORDER BY b.user, j.inst_coll, j.batch_id, j.job_group_id
  ON DUPLICATE KEY UPDATE
    n_ready_cancellable_jobs = n_ready_cancellable_jobs + VALUES(n_ready_cancellable_jobs),
    ready_cancellable_cores_mcpu = ready_cancellable_cores_mcpu + VALUES(ready_cancellable_cores_mcpu),
    n_ready_always_run_jobs = n_ready_always_run_jobs + VALUES(n_ready_always_run_jobs),
    ready_always_run_cores_mcpu = ready_always_run_cores_mcpu + VALUES(ready_always_run_cores_mcpu),
    n_ready_dependency_failed_jobs = n_ready_dependency_failed_jobs + VALUES(n_ready_dependency_failed_jobs);
  COMMIT;

  CALL queue_update_groups_for_check(in_batch_id, in_update_id);
  CALL check_completions(in_now_ms);
  SELECT 0 AS rc, 'committed' AS message, v_n AS n_jobs;
END $$
DELIMITER ;
