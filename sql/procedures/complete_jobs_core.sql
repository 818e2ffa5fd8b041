-- The set-based heart of every final transition (worker completions, the
-- cancellers' drains, cancelling running jobs). Internal: the caller opened a
-- transaction, checked the epoch, called create_completion_tables and filled
-- tmp_job_completions with the requested (batch_id, job_id, attempt_id,
-- instance_name, new_state, ...). Writes one `outcome` per row:
--   completed         the job moved to new_state now
--   already_complete  it was final before (first completion wins); the
--                     reporting attempt's times are still recorded
--   not_found         no such job
--   invalid_state     new_state is not a final state
--   not_runnable      a Pending job (unless the row says may_cancel_pending:
--                     cancel_pending_jobs), or a Ready job reported without
--                     an attempt as anything but Cancelled
--   retried           (rows that say may_retry) the attempt ended but the job
--                     runs again: it is Ready, with what decide_retries chose
--                     for its next attempt (migration 0014)
-- A report of an attempt whose end already made a new attempt (a worker
-- sending its completion again) is 'already_complete': it must not end the
-- job its retry is running. An attempt declared lost, though, may still
-- report: the first completion wins.
-- Children of the jobs completed now are released (release_children_*) up
-- to in_max_children in all, shared evenly between the completed jobs that
-- have children; a job with more gets a row in job_child_releases and the
-- driver's releaser goes on from there, in bounded chunks. So completing a
-- parent of a million children is one small transaction, not one that
-- touches a million rows.
-- Lock order: target jobs ascending, children ascending, attempts,
-- instances (by name), then token rows. The counters and events of the jobs'
-- changes (record_job_changes) and the billing of the attempts' last rollup
-- (bill_attempt_usage) are written here, set-based, with the triggers told
-- to skip those statements (@corral_bulk_job_changes, @corral_bulk_usage):
-- the caller's handler clears both on an error.
DROP PROCEDURE IF EXISTS complete_jobs_core;
DELIMITER $$
CREATE PROCEDURE complete_jobs_core(IN in_now_ms BIGINT, IN in_max_children INT)
BEGIN
  DECLARE v_locked INT;
  DECLARE v_n_attempts INT;
  DECLARE v_n_freeing INT;
  DECLARE v_n_failed INT;
  DECLARE v_n_parents INT;
  DECLARE v_n_children INT DEFAULT 0;
  DECLARE v_n_retried INT DEFAULT 0;

  -- Lock the targets in key order before reading them.
  SELECT COUNT(*) INTO v_locked
    FROM tmp_job_completions t
    JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    FOR UPDATE;

  -- A row without its job keeps the outcome's default, 'not_found'.
  UPDATE tmp_job_completions t
    JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    SET t.found = TRUE, t.old_state = j.state, t.old_attempt_id = j.attempt_id,
        t.job_group_id = j.job_group_id, t.inst_coll = j.inst_coll, t.cores_mcpu = j.cores_mcpu,
        t.memory_bytes = COALESCE(j.memory_bytes, 0), t.storage_bytes = j.storage_bytes,
        t.always_run = j.always_run, t.dependency_failed = j.dependency_failed,
        t.outcome = CASE
          WHEN t.new_state NOT IN ('Success', 'Failed', 'Error', 'Cancelled') THEN 'invalid_state'
          WHEN j.state IN ('Success', 'Failed', 'Error', 'Cancelled') THEN 'already_complete'
          WHEN j.state = 'Pending' AND NOT (t.may_cancel_pending AND t.new_state = 'Cancelled'
                                            AND t.attempt_id IS NULL) THEN 'not_runnable'
          WHEN j.state = 'Ready' AND t.attempt_id IS NULL AND t.new_state <> 'Cancelled' THEN 'not_runnable'
          -- Only a job that moved on from the attempt pays for the look at it.
          WHEN (j.state = 'Ready' OR j.attempt_id <> t.attempt_id) AND t.attempt_id IS NOT NULL
               AND (SELECT a.retry_reason IS NOT NULL AND a.reason NOT IN ('worker_lost', 'preempted')
                    FROM attempts a WHERE a.batch_id = t.batch_id AND a.job_id = t.job_id
                    AND a.attempt_id = t.attempt_id) THEN 'already_complete'
          ELSE 'completed' END;
  IF EXISTS (SELECT 1 FROM tmp_job_completions WHERE may_retry AND outcome = 'completed'
             AND new_state IN ('Failed', 'Error')) THEN
    CALL decide_retries(in_now_ms);
    SELECT COUNT(*) INTO v_n_retried FROM tmp_job_completions WHERE outcome = 'retried';
  END IF;
  -- What the steps below have to do: the canceller's drain, for one, closes
  -- no attempt and frees no cores.
  SELECT COALESCE(SUM(attempt_id IS NOT NULL AND instance_name IS NOT NULL
                      AND outcome IN ('completed', 'already_complete', 'retried')), 0),
         COALESCE(SUM(outcome IN ('completed', 'retried') AND old_state IN ('Running', 'Creating')), 0),
         COALESCE(SUM(outcome = 'completed' AND new_state IN ('Failed', 'Error')), 0)
    INTO v_n_attempts, v_n_freeing, v_n_failed
    FROM tmp_job_completions;

  -- Lock the children to release now too, before any other row (lock
  -- order: targets, children, attempts, instances, token rows); they are
  -- updated below.
  INSERT INTO tmp_releases (batch_id, parent_id, parent_state, from_child_id)
    SELECT t.batch_id, t.job_id, t.new_state, 0
    FROM tmp_job_completions t
    WHERE t.outcome = 'completed'
      -- a scalar subquery, read per row: as EXISTS, MariaDB materializes
      -- the whole of job_parents for the semi-join
      AND (SELECT e.job_id FROM job_parents e FORCE INDEX (job_parents_parent)
           WHERE e.batch_id = t.batch_id AND e.parent_id = t.job_id LIMIT 1) IS NOT NULL;
  SET v_n_parents = ROW_COUNT();
  IF v_n_parents > 0 THEN
    CALL release_children_lock(GREATEST(0, COALESCE(in_max_children, 0)) DIV v_n_parents, v_n_children);
  END IF;

  IF v_n_attempts > 0 THEN
    -- Lock the reporting attempts that exist and note what each has billed so
    -- far (a negative delta: the rollup below adds what it bills after).
    INSERT INTO tmp_attempt_usage (batch_id, job_id, attempt_id, delta_ms)
      SELECT a.batch_id, a.job_id, a.attempt_id,
             -IF(a.start_time_ms IS NULL OR a.rollup_time_ms IS NULL, 0, a.rollup_time_ms - a.start_time_ms)
      FROM tmp_job_completions t
      STRAIGHT_JOIN attempts a FORCE INDEX (PRIMARY)
        ON a.batch_id = t.batch_id AND a.job_id = t.job_id AND a.attempt_id = t.attempt_id
      WHERE t.attempt_id IS NOT NULL AND t.instance_name IS NOT NULL
        AND t.outcome IN ('completed', 'already_complete', 'retried')
      ORDER BY a.batch_id, a.job_id, a.attempt_id
      FOR UPDATE;

    -- Record the reporting attempt's start, end and outcome, once (MJC may
    -- come before MJS, twice, or for an attempt the job no longer points at).
    SET @corral_bulk_usage = TRUE;
    INSERT INTO attempts (batch_id, job_id, attempt_id, instance_name, start_time_ms, end_time_ms, rollup_time_ms,
                          reason, exit_code, error_message, cpu_time_ms, peak_memory_bytes, retry_reason,
                          retry_delay_ms)
      SELECT batch_id, job_id, attempt_id, instance_name, start_time_ms, end_time_ms,
             IF(bill_to_end, end_time_ms, NULL), COALESCE(reason, 'completed'), exit_code, error_message,
             cpu_time_ms, peak_memory_bytes, retry_reason, retry_delay_ms
      FROM tmp_job_completions
      WHERE attempt_id IS NOT NULL AND instance_name IS NOT NULL
        AND outcome IN ('completed', 'already_complete', 'retried')
      ORDER BY batch_id, job_id
    ON DUPLICATE KEY UPDATE
      -- Assignments run left to right: later ones see the new start time, and
      -- end_time_ms goes last so the others still see the attempt open. A
      -- closed attempt keeps its times and outcome: a late report changes nothing.
      exit_code = IF(attempts.end_time_ms IS NULL, VALUES(exit_code), attempts.exit_code),
      error_message = IF(attempts.end_time_ms IS NULL, VALUES(error_message), attempts.error_message),
      cpu_time_ms = IF(attempts.end_time_ms IS NULL, VALUES(cpu_time_ms), attempts.cpu_time_ms),
      peak_memory_bytes = IF(attempts.end_time_ms IS NULL, VALUES(peak_memory_bytes), attempts.peak_memory_bytes),
      start_time_ms = IF(attempts.end_time_ms IS NULL, COALESCE(attempts.start_time_ms, VALUES(start_time_ms)),
                         attempts.start_time_ms),
      retry_reason = IF(attempts.end_time_ms IS NULL, VALUES(retry_reason), attempts.retry_reason),
      retry_delay_ms = IF(attempts.end_time_ms IS NULL, VALUES(retry_delay_ms), attempts.retry_delay_ms),
      -- Never past what the attempt reserved (a budget's attempts: migration 0013). No rollup given
      -- (deactivate_instance): billed to the last one a worker reported.
      rollup_time_ms = IF(attempts.end_time_ms IS NULL AND VALUES(rollup_time_ms) IS NOT NULL,
                          LEAST(GREATEST(COALESCE(attempts.rollup_time_ms, 0), COALESCE(VALUES(rollup_time_ms), 0),
                                         COALESCE(attempts.start_time_ms, 0)),
                                COALESCE(attempts.start_time_ms + attempts.reserved_ms, 9223372036854775807)),
                          attempts.rollup_time_ms),
      reason = IF(attempts.end_time_ms IS NULL, VALUES(reason), attempts.reason),
      end_time_ms = COALESCE(attempts.end_time_ms,
                             GREATEST(COALESCE(VALUES(end_time_ms), 0), COALESCE(attempts.start_time_ms, 0)));
    SET @corral_bulk_usage = NULL;
    -- What the rollup to the end billed: new milliseconds minus the old. An
    -- attempt created just now has no resources yet and bills nothing.
    UPDATE tmp_attempt_usage u
      STRAIGHT_JOIN attempts a ON a.batch_id = u.batch_id AND a.job_id = u.job_id AND a.attempt_id = u.attempt_id
      SET u.delta_ms = u.delta_ms
                       + IF(a.start_time_ms IS NULL OR a.rollup_time_ms IS NULL, 0, a.rollup_time_ms - a.start_time_ms),
          u.rollup_time_ms = a.rollup_time_ms;
  END IF;

  -- Give back the cores (and memory and storage) of the attempt the job was running under. The
  -- instances come from the attempts' primary key into a table of their
  -- own first: updating instances joined with attempts share-locked
  -- attempts (through attempts_instance) while holding instance rows, and
  -- two MJCs on one instance deadlocked. Instances are then updated in name
  -- order (the table's key, which leads the join).
  IF v_n_freeing > 0 THEN
    -- (t.memory_bytes is what the attempt reserved, read before a retry's
    -- new memory is written below.)
    INSERT INTO tmp_instance_cores (instance_name, cores_mcpu, memory_bytes, storage_bytes)
      SELECT a.instance_name, SUM(t.cores_mcpu), SUM(t.memory_bytes), SUM(t.storage_bytes)
      FROM tmp_job_completions t
      JOIN attempts a ON a.batch_id = t.batch_id AND a.job_id = t.job_id AND a.attempt_id = t.old_attempt_id
      WHERE t.outcome IN ('completed', 'retried') AND t.old_state IN ('Running', 'Creating')
      GROUP BY a.instance_name;
    UPDATE tmp_instance_cores x STRAIGHT_JOIN instances i ON i.name = x.instance_name
      SET i.free_cores_mcpu = i.free_cores_mcpu + x.cores_mcpu,
          i.used_memory_bytes = i.used_memory_bytes - x.memory_bytes,
          i.used_storage_bytes = i.used_storage_bytes - x.storage_bytes;
  END IF;

  SET @corral_bulk_job_changes = TRUE;
  UPDATE jobs j
    JOIN tmp_job_completions t ON t.batch_id = j.batch_id AND t.job_id = j.job_id
    SET j.state = t.new_state, j.exit_code = t.exit_code, j.attempt_id = COALESCE(t.attempt_id, j.attempt_id)
    WHERE t.outcome = 'completed';
  IF v_n_retried > 0 THEN
    UPDATE jobs j
      JOIN tmp_job_completions t ON t.batch_id = j.batch_id AND t.job_id = j.job_id
      SET j.state = 'Ready', j.exit_code = t.exit_code,
          j.memory_bytes = COALESCE(t.next_memory_bytes, j.memory_bytes),
          j.n_preemptions = j.n_preemptions + (t.reason = 'preempted'),
          j.n_failed_retries = j.n_failed_retries + (t.retry_delay_ms IS NOT NULL),
          j.on_demand = j.on_demand OR t.to_on_demand,
          j.not_before_ms = t.not_before_ms,
          j.avoid_instance = t.avoid_instance
      WHERE t.outcome = 'retried';
    INSERT INTO on_demand_jobs (batch_id, job_id, inst_coll)
      SELECT batch_id, job_id, inst_coll FROM tmp_job_completions WHERE outcome = 'retried' AND to_on_demand
      ORDER BY batch_id, job_id
    ON DUPLICATE KEY UPDATE inst_coll = VALUES(inst_coll);
  END IF;
  SET @corral_bulk_job_changes = NULL;

  IF v_n_children > 0 THEN
    CALL release_children_apply();
  END IF;

  -- Token rows last: completion counters of each job's group and every
  -- ancestor, live resource counters and events of the targets and then of
  -- the children, and the billing of the closed attempts.
  INSERT INTO job_groups_n_jobs_in_complete_states
      (batch_id, job_group_id, token, n_completed, n_succeeded, n_failed, n_errored, n_cancelled)
    SELECT t.batch_id, a.ancestor_id, CONNECTION_ID() MOD 64, COUNT(*),
           SUM(t.new_state = 'Success'), SUM(t.new_state = 'Failed'),
           SUM(t.new_state = 'Error'), SUM(t.new_state = 'Cancelled')
    FROM tmp_job_completions t
    JOIN job_group_self_and_ancestors a ON a.batch_id = t.batch_id AND a.job_group_id = t.job_group_id
    WHERE t.outcome = 'completed'
    GROUP BY t.batch_id, a.ancestor_id
    ORDER BY t.batch_id, a.ancestor_id
  ON DUPLICATE KEY UPDATE
    n_completed = n_completed + VALUES(n_completed),
    n_succeeded = n_succeeded + VALUES(n_succeeded),
    n_failed = n_failed + VALUES(n_failed),
    n_errored = n_errored + VALUES(n_errored),
    n_cancelled = n_cancelled + VALUES(n_cancelled);

  INSERT INTO tmp_job_changes (batch_id, job_id, job_group_id, inst_coll, cores_mcpu, always_run,
                               old_state, new_state, old_dependency_failed, new_dependency_failed,
                               attempt_id, exit_code)
    SELECT batch_id, job_id, job_group_id, inst_coll, cores_mcpu, always_run,
           old_state, new_state, dependency_failed, dependency_failed,
           COALESCE(attempt_id, old_attempt_id), exit_code
    FROM tmp_job_completions
    WHERE outcome IN ('completed', 'retried')
    ORDER BY batch_id, job_id;
  -- The children's changes after their parents' (release_children_record),
  -- and the parents with children left go to the releaser's queue.
  IF v_n_parents > 0 THEN
    CALL release_children_record(in_now_ms);
  END IF;
  CALL record_job_changes();
  IF v_n_attempts > 0 THEN
    CALL bill_attempt_usage();
  END IF;

  -- cancel_after_n_failures: cancel the group (one row) once its failures
  -- reach the threshold. A concurrent failure may be missed here; the
  -- driver's loop re-checks running groups with a threshold.
  IF v_n_failed > 0 THEN
    INSERT INTO job_groups_cancelled (batch_id, job_group_id, cancelled_by, reason, time_cancelled_ms)
      SELECT g.batch_id, g.job_group_id, 'corral',
             CONCAT('cancel_after_n_failures: ', g.cancel_after_n_failures, ' jobs failed'), in_now_ms
      FROM job_groups g
      WHERE g.cancel_after_n_failures IS NOT NULL
        AND (g.batch_id, g.job_group_id) IN (
          SELECT t.batch_id, a.ancestor_id
          FROM tmp_job_completions t
          JOIN job_group_self_and_ancestors a ON a.batch_id = t.batch_id AND a.job_group_id = t.job_group_id
          WHERE t.outcome = 'completed' AND t.new_state IN ('Failed', 'Error'))
        AND (SELECT COALESCE(SUM(s.n_failed + s.n_errored), 0)
             FROM job_groups_n_jobs_in_complete_states s
             WHERE s.batch_id = g.batch_id AND s.job_group_id = g.job_group_id) >= g.cancel_after_n_failures
    ON DUPLICATE KEY UPDATE batch_id = job_groups_cancelled.batch_id;
  END IF;

  -- The groups whose completion the caller checks after COMMIT. Repeats
  -- ('already_complete') are checked too: a call retried after its check
  -- failed must not leave a finished group running.
  INSERT INTO tmp_groups_to_check (batch_id, job_group_id)
    SELECT DISTINCT t.batch_id, a.ancestor_id
    FROM tmp_job_completions t
    JOIN job_group_self_and_ancestors a ON a.batch_id = t.batch_id AND a.job_group_id = t.job_group_id
    WHERE t.outcome IN ('completed', 'already_complete')
  ON DUPLICATE KEY UPDATE batch_id = tmp_groups_to_check.batch_id;
END $$
DELIMITER ;
