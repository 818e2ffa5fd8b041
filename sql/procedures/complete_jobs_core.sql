-- The set-based heart of every final transition (worker completions, the
-- canceller's drain, cancelling running jobs). Internal: the caller opened a
-- transaction, checked the epoch and filled tmp_job_completions with the
-- requested (batch_id, job_id, attempt_id, instance_name, new_state, ...).
-- Writes one `outcome` per row:
--   completed         the job moved to new_state now
--   already_complete  it was final before (first completion wins); the
--                     reporting attempt's times are still recorded
--   not_found         no such job
--   invalid_state     new_state is not a final state
--   not_runnable      a Pending job, or a Ready job reported without an
--                     attempt as anything but Cancelled
-- Lock order: target jobs ascending, children ascending, attempts,
-- instances, then token rows (the jobs trigger).
DROP PROCEDURE IF EXISTS complete_jobs_core;
DELIMITER $$
CREATE PROCEDURE complete_jobs_core(IN in_now_ms BIGINT)
BEGIN
  DECLARE v_locked INT;

  -- Lock the targets in key order before reading them.
  SELECT COUNT(*) INTO v_locked
    FROM tmp_job_completions t
    JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    FOR UPDATE;

  UPDATE tmp_job_completions t
    JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    SET t.found = TRUE, t.old_state = j.state, t.old_attempt_id = j.attempt_id,
        t.job_group_id = j.job_group_id, t.cores_mcpu = j.cores_mcpu;

  UPDATE tmp_job_completions SET outcome = CASE
      WHEN NOT found THEN 'not_found'
      WHEN new_state NOT IN ('Success', 'Failed', 'Error', 'Cancelled') THEN 'invalid_state'
      WHEN old_state IN ('Success', 'Failed', 'Error', 'Cancelled') THEN 'already_complete'
      WHEN old_state = 'Pending' THEN 'not_runnable'
      WHEN old_state = 'Ready' AND attempt_id IS NULL AND new_state <> 'Cancelled' THEN 'not_runnable'
      ELSE 'completed' END;

  -- Lock the children too, before any other row (lock order: targets,
  -- children, attempts, instances, token rows); they are updated below.
  DROP TEMPORARY TABLE IF EXISTS tmp_children;
  CREATE TEMPORARY TABLE tmp_children (
    batch_id BIGINT NOT NULL,
    job_id INT NOT NULL,
    n_done INT NOT NULL,
    n_unaccepted INT NOT NULL,
    PRIMARY KEY (batch_id, job_id)
  );
  INSERT INTO tmp_children (batch_id, job_id, n_done, n_unaccepted)
    SELECT e.batch_id, e.job_id, COUNT(*),
           SUM((e.accepted_states & CASE t.new_state WHEN 'Success' THEN 1 WHEN 'Failed' THEN 2
                                                    WHEN 'Error' THEN 4 ELSE 8 END) = 0)
    FROM tmp_job_completions t
    JOIN job_parents e ON e.batch_id = t.batch_id AND e.parent_id = t.job_id
    WHERE t.outcome = 'completed'
    GROUP BY e.batch_id, e.job_id;
  SELECT COUNT(*) INTO v_locked
    FROM tmp_children c
    JOIN jobs j ON j.batch_id = c.batch_id AND j.job_id = c.job_id
    FOR UPDATE;

  -- Record the reporting attempt's start, end and outcome, once (MJC may
  -- come before MJS, twice, or for an attempt the job no longer points at).
  INSERT INTO attempts (batch_id, job_id, attempt_id, instance_name, start_time_ms, end_time_ms, rollup_time_ms, reason,
                        exit_code, error_message, cpu_time_ms, peak_memory_bytes)
    SELECT batch_id, job_id, attempt_id, instance_name, start_time_ms, end_time_ms, end_time_ms,
           COALESCE(reason, 'completed'), exit_code, error_message, cpu_time_ms, peak_memory_bytes
    FROM tmp_job_completions
    WHERE attempt_id IS NOT NULL AND instance_name IS NOT NULL
      AND outcome IN ('completed', 'already_complete')
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
    rollup_time_ms = IF(attempts.end_time_ms IS NULL,
                        GREATEST(COALESCE(attempts.rollup_time_ms, 0), COALESCE(VALUES(rollup_time_ms), 0),
                                 COALESCE(attempts.start_time_ms, 0)),
                        attempts.rollup_time_ms),
    reason = IF(attempts.end_time_ms IS NULL, VALUES(reason), attempts.reason),
    end_time_ms = COALESCE(attempts.end_time_ms,
                           GREATEST(COALESCE(VALUES(end_time_ms), 0), COALESCE(attempts.start_time_ms, 0)));

  -- Give back the cores of the attempt the job was running under.
  UPDATE instances i
    JOIN (SELECT a.instance_name, SUM(t.cores_mcpu) AS cores_mcpu
          FROM tmp_job_completions t
          JOIN attempts a ON a.batch_id = t.batch_id AND a.job_id = t.job_id AND a.attempt_id = t.old_attempt_id
          WHERE t.outcome = 'completed' AND t.old_state IN ('Running', 'Creating')
          GROUP BY a.instance_name) x ON x.instance_name = i.name
    SET i.free_cores_mcpu = i.free_cores_mcpu + x.cores_mcpu;

  UPDATE jobs j
    JOIN tmp_job_completions t ON t.batch_id = j.batch_id AND t.job_id = j.job_id
    SET j.state = t.new_state, j.exit_code = t.exit_code, j.attempt_id = COALESCE(t.attempt_id, j.attempt_id)
    WHERE t.outcome = 'completed';

  -- Tokenized completion counters of the job's group and every ancestor.
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

  -- Children: one fewer pending parent per completed parent; remember an
  -- unaccepted parent state; Ready when nothing is pending and the child's
  -- update is committed (jobs of an uncommitted update stay invisible).
  UPDATE jobs j
    JOIN tmp_children c ON c.batch_id = j.batch_id AND c.job_id = j.job_id
    SET j.n_pending_parents = j.n_pending_parents - c.n_done,
        j.dependency_failed = (j.dependency_failed OR c.n_unaccepted > 0);
  UPDATE jobs j
    JOIN tmp_children c ON c.batch_id = j.batch_id AND c.job_id = j.job_id
    JOIN batch_updates u ON u.batch_id = j.batch_id AND u.update_id = j.update_id
    SET j.state = 'Ready'
    WHERE j.state = 'Pending' AND j.n_pending_parents = 0 AND u.committed;
  DROP TEMPORARY TABLE IF EXISTS tmp_children;

  -- cancel_after_n_failures: cancel the group (one row) once its failures
  -- reach the threshold. A concurrent failure may be missed here; the
  -- driver's loop re-checks running groups with a threshold.
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
