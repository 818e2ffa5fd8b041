-- Live resource counters: when a job's state (or its dependency_failed flag)
-- changes, move its contribution between the columns of the writer's token
-- row for (user, pool, batch, group). Cancelling never fires this: the
-- fair-share reader masks the cancellable columns of cancelled groups.
--
-- Events: every state change appends a job_state_changed row to the batch
-- event outbox (one single-row INSERT: a new key at the end of the
-- AUTO_INCREMENT index, which takes no lock another writer holds). The
-- event's time is the database's clock: a trigger has no caller's clock to
-- read.
--
-- The hot procedures do this work themselves, set-based, for the statements
-- that change many jobs at once: schedule_jobs and complete_jobs_core hand
-- their changes to record_job_changes (one grouped counter upsert and one
-- INSERT ... SELECT of events per call), and commit_update counts its
-- Pending -> Ready flips in one grouped upsert and writes one
-- update_committed event instead of one event per job. They set
-- @corral_bulk_job_changes around those statements so that this trigger
-- skips its row-at-a-time work: at 50 jobs per call it was ten times the
-- procedures' own statements. Every other update of jobs (deactivate_instance,
-- an operator's UPDATE) is counted and logged here, row by row.
DROP TRIGGER IF EXISTS jobs_after_update;
DELIMITER $$
CREATE TRIGGER jobs_after_update AFTER UPDATE ON jobs FOR EACH ROW
BEGIN
  -- The variables are declared inside the IF: declaring them costs about a
  -- microsecond per row, which commit_update's million flips would pay too.
  IF @corral_bulk_job_changes IS NULL THEN
    BEGIN
      DECLARE v_user VARCHAR(100);
      DECLARE d_ready_cancellable INT;
      DECLARE d_ready_always_run INT;
      DECLARE d_ready_dependency_failed INT;
      DECLARE d_creating INT;
      DECLARE d_creating_cancellable INT;
      DECLARE d_running INT;
      DECLARE d_running_cancellable INT;

      IF OLD.state <> NEW.state THEN
        INSERT INTO batch_event_outbox
            (batch_id, kind, job_id, job_group_id, attempt_id, old_state, new_state, exit_code, reason, time_ms)
          VALUES (NEW.batch_id, 'job_state_changed', NEW.job_id, NEW.job_group_id,
                  -- the attempt the change starts or ends; none for Pending -> Ready
                  -- or for cancelling a Ready job
                  IF(OLD.state IN ('Creating', 'Running') OR NEW.state IN ('Creating', 'Running'),
                     NEW.attempt_id, NULL),
                  OLD.state, NEW.state,
                  IF(NEW.state IN ('Success', 'Failed', 'Error', 'Cancelled'), NEW.exit_code, NULL),
                  IF(NEW.state = 'Cancelled', NEW.end_reason, NULL),
                  ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000));
      END IF;

      IF OLD.state <> NEW.state OR OLD.dependency_failed <> NEW.dependency_failed THEN
        SET d_ready_cancellable =
              (NEW.state = 'Ready' AND NOT NEW.always_run AND NOT NEW.dependency_failed)
            - (OLD.state = 'Ready' AND NOT OLD.always_run AND NOT OLD.dependency_failed);
        SET d_ready_always_run = (NEW.state = 'Ready' AND NEW.always_run) - (OLD.state = 'Ready' AND OLD.always_run);
        SET d_ready_dependency_failed =
              (NEW.state = 'Ready' AND NOT NEW.always_run AND NEW.dependency_failed)
            - (OLD.state = 'Ready' AND NOT OLD.always_run AND OLD.dependency_failed);
        SET d_creating = (NEW.state = 'Creating') - (OLD.state = 'Creating');
        SET d_creating_cancellable = (NEW.state = 'Creating' AND NOT NEW.always_run)
                                   - (OLD.state = 'Creating' AND NOT OLD.always_run);
        SET d_running = (NEW.state = 'Running') - (OLD.state = 'Running');
        SET d_running_cancellable = (NEW.state = 'Running' AND NOT NEW.always_run)
                                  - (OLD.state = 'Running' AND NOT OLD.always_run);
        IF d_ready_cancellable <> 0 OR d_ready_always_run <> 0 OR d_ready_dependency_failed <> 0
           OR d_creating <> 0 OR d_running <> 0 THEN
          SELECT user INTO v_user FROM batches WHERE batch_id = NEW.batch_id;
          INSERT INTO user_inst_coll_resources_by_job_group
              (user, inst_coll, batch_id, job_group_id, token,
               n_ready_cancellable_jobs, ready_cancellable_cores_mcpu,
               n_ready_always_run_jobs, ready_always_run_cores_mcpu,
               n_ready_dependency_failed_jobs, n_creating_jobs, n_creating_cancellable_jobs,
               n_running_jobs, running_cores_mcpu, n_running_cancellable_jobs)
            VALUES (v_user, NEW.inst_coll, NEW.batch_id, NEW.job_group_id, CONNECTION_ID() MOD 64,
                    d_ready_cancellable, d_ready_cancellable * NEW.cores_mcpu,
                    d_ready_always_run, d_ready_always_run * NEW.cores_mcpu,
                    d_ready_dependency_failed, d_creating, d_creating_cancellable,
                    d_running, d_running * NEW.cores_mcpu, d_running_cancellable)
          ON DUPLICATE KEY UPDATE
            n_ready_cancellable_jobs = n_ready_cancellable_jobs + d_ready_cancellable,
            ready_cancellable_cores_mcpu = ready_cancellable_cores_mcpu + d_ready_cancellable * NEW.cores_mcpu,
            n_ready_always_run_jobs = n_ready_always_run_jobs + d_ready_always_run,
            ready_always_run_cores_mcpu = ready_always_run_cores_mcpu + d_ready_always_run * NEW.cores_mcpu,
            n_ready_dependency_failed_jobs = n_ready_dependency_failed_jobs + d_ready_dependency_failed,
            n_creating_jobs = n_creating_jobs + d_creating,
            n_creating_cancellable_jobs = n_creating_cancellable_jobs + d_creating_cancellable,
            n_running_jobs = n_running_jobs + d_running,
            running_cores_mcpu = running_cores_mcpu + d_running * NEW.cores_mcpu,
            n_running_cancellable_jobs = n_running_cancellable_jobs + d_running_cancellable;
        END IF;
      END IF;

      -- Held locks: a job holds its locks while Creating or Running.
      IF (NEW.state IN ('Creating', 'Running')) <> (OLD.state IN ('Creating', 'Running')) THEN
        INSERT INTO held_locks (billing_project, level, mode, lock_name, token, n_holders)
          SELECT b.billing_project, l.level, l.mode, l.lock_name, CONNECTION_ID() MOD 16,
                 IF(NEW.state IN ('Creating', 'Running'), 1, -1)
          FROM job_locks l JOIN batches b ON b.batch_id = l.batch_id
          WHERE l.batch_id = NEW.batch_id AND l.job_id = NEW.job_id
        ON DUPLICATE KEY UPDATE n_holders = n_holders + VALUES(n_holders);
      END IF;
    END;
  END IF;
END $$
DELIMITER ;
