-- Internal: the set-based twin of the jobs_after_update trigger, for the
-- hot procedures (schedule_jobs, complete_jobs_core). The caller changed
-- jobs with @corral_bulk_job_changes set, so the trigger skipped them, and
-- described each change in tmp_job_changes (create_change_tables). Here the
-- counter deltas become one grouped upsert into the writer's token rows
-- (token = CONNECTION_ID() MOD 64, as the trigger), and the state changes
-- become job_state_changed events in one INSERT ... SELECT, in seq order;
-- the jobs that start or stop holding their locks (enter or leave
-- Creating/Running) move their job_locks rows in held_locks, grouped.
-- The rules are the trigger's: keep the two in step.
DROP PROCEDURE IF EXISTS record_job_changes;
DELIMITER $$
CREATE PROCEDURE record_job_changes()
BEGIN
  INSERT INTO user_inst_coll_resources_by_job_group
      (user, inst_coll, batch_id, job_group_id, token,
       n_ready_cancellable_jobs, ready_cancellable_cores_mcpu,
       n_ready_always_run_jobs, ready_always_run_cores_mcpu,
       n_ready_dependency_failed_jobs, n_creating_jobs, n_creating_cancellable_jobs,
       n_running_jobs, running_cores_mcpu, n_running_cancellable_jobs)
    SELECT b.user, c.inst_coll, c.batch_id, c.job_group_id, CONNECTION_ID() MOD 64,
           SUM((c.new_state = 'Ready' AND NOT c.always_run AND NOT c.new_dependency_failed)
               - (c.old_state = 'Ready' AND NOT c.always_run AND NOT c.old_dependency_failed))
             AS delta_ready_cancellable,
           SUM(((c.new_state = 'Ready' AND NOT c.always_run AND NOT c.new_dependency_failed)
                - (c.old_state = 'Ready' AND NOT c.always_run AND NOT c.old_dependency_failed)) * c.cores_mcpu),
           SUM((c.new_state = 'Ready' AND c.always_run) - (c.old_state = 'Ready' AND c.always_run))
             AS delta_ready_always_run,
           SUM(((c.new_state = 'Ready' AND c.always_run) - (c.old_state = 'Ready' AND c.always_run)) * c.cores_mcpu),
           SUM((c.new_state = 'Ready' AND NOT c.always_run AND c.new_dependency_failed)
               - (c.old_state = 'Ready' AND NOT c.always_run AND c.old_dependency_failed))
             AS delta_ready_dependency_failed,
           SUM((c.new_state = 'Creating') - (c.old_state = 'Creating')) AS delta_creating,
           SUM((c.new_state = 'Creating' AND NOT c.always_run) - (c.old_state = 'Creating' AND NOT c.always_run)),
           SUM((c.new_state = 'Running') - (c.old_state = 'Running')) AS delta_running,
           SUM(((c.new_state = 'Running') - (c.old_state = 'Running')) * c.cores_mcpu),
           SUM((c.new_state = 'Running' AND NOT c.always_run) - (c.old_state = 'Running' AND NOT c.always_run))
    FROM tmp_job_changes c
    JOIN batches b ON b.batch_id = c.batch_id
    GROUP BY b.user, c.inst_coll, c.batch_id, c.job_group_id
    -- as the trigger, which upserts only when a count changes (the
    -- cancellable counts change only with the others)
    HAVING delta_ready_cancellable <> 0 OR delta_ready_always_run <> 0 OR delta_ready_dependency_failed <> 0
        OR delta_creating <> 0 OR delta_running <> 0
    ORDER BY b.user, c.inst_coll, c.batch_id, c.job_group_id
  ON DUPLICATE KEY UPDATE
    n_ready_cancellable_jobs = n_ready_cancellable_jobs + VALUES(n_ready_cancellable_jobs),
    ready_cancellable_cores_mcpu = ready_cancellable_cores_mcpu + VALUES(ready_cancellable_cores_mcpu),
    n_ready_always_run_jobs = n_ready_always_run_jobs + VALUES(n_ready_always_run_jobs),
    ready_always_run_cores_mcpu = ready_always_run_cores_mcpu + VALUES(ready_always_run_cores_mcpu),
    n_ready_dependency_failed_jobs = n_ready_dependency_failed_jobs + VALUES(n_ready_dependency_failed_jobs),
    n_creating_jobs = n_creating_jobs + VALUES(n_creating_jobs),
    n_creating_cancellable_jobs = n_creating_cancellable_jobs + VALUES(n_creating_cancellable_jobs),
    n_running_jobs = n_running_jobs + VALUES(n_running_jobs),
    running_cores_mcpu = running_cores_mcpu + VALUES(running_cores_mcpu),
    n_running_cancellable_jobs = n_running_cancellable_jobs + VALUES(n_running_cancellable_jobs);

  INSERT INTO held_locks (billing_project, level, mode, lock_name, token, n_holders)
    SELECT b.billing_project, l.level, l.mode, l.lock_name, CONNECTION_ID() MOD 16,
           SUM((c.new_state IN ('Creating', 'Running')) - (c.old_state IN ('Creating', 'Running'))) AS delta
    FROM tmp_job_changes c
    JOIN job_locks l ON l.batch_id = c.batch_id AND l.job_id = c.job_id
    JOIN batches b ON b.batch_id = c.batch_id
    WHERE (c.new_state IN ('Creating', 'Running')) <> (c.old_state IN ('Creating', 'Running'))
    GROUP BY b.billing_project, l.level, l.mode, l.lock_name
    HAVING delta <> 0
    ORDER BY b.billing_project, l.level, l.lock_name, l.mode
  ON DUPLICATE KEY UPDATE n_holders = n_holders + VALUES(n_holders);

  INSERT INTO batch_event_outbox
      (batch_id, kind, job_id, job_group_id, attempt_id, old_state, new_state, exit_code, reason, time_ms)
    SELECT t.batch_id, 'job_state_changed', t.job_id, t.job_group_id,
           -- the attempt the change starts or ends, as the trigger writes it
           IF(t.old_state IN ('Creating', 'Running') OR t.new_state IN ('Creating', 'Running'), t.attempt_id, NULL),
           t.old_state, t.new_state,
           IF(t.new_state IN ('Success', 'Failed', 'Error', 'Cancelled'), t.exit_code, NULL),
           -- why a job was cancelled, when it says (a parent that failed it): read only for those
           IF(t.new_state = 'Cancelled',
              (SELECT j.end_reason FROM jobs j WHERE j.batch_id = t.batch_id AND j.job_id = t.job_id), NULL),
           ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000)
    FROM tmp_job_changes t
    WHERE t.old_state <> t.new_state
    ORDER BY t.seq;
END $$
DELIMITER ;
