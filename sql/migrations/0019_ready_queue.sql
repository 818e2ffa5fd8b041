-- Each user's Ready jobs in queue order, per pool, kept by InnoDB as an
-- index (issue 11, acceptance 6). The scheduler and ExplainJob read only
-- the head of each user's queue, as deep as the planner looks
-- (read_ready_heads), walking this index and stopping there; before, they
-- ranked every Ready job of the user's running batches each cycle, so one
-- user with 300,000 Ready jobs made every cycle 1.3 s.
--
-- jobs.user is the batch owner's name, copied when the job is inserted
-- (insert_jobs, rerun_failed_jobs); a batch's owner never changes, and
-- services/db/invariants.py checks the copy. always_run, dependency_failed
-- and job_group_id close the index so that whether a job may run is
-- decided from the index alone, before its row is read.
ALTER TABLE jobs ADD COLUMN user VARCHAR(100) NOT NULL DEFAULT '' AFTER job_group_id;

-- The copy changes no state, so jobs_after_update has nothing to count.
SET @corral_bulk_job_changes = 1;
UPDATE jobs j JOIN batches b ON b.batch_id = j.batch_id SET j.user = b.user;
SET @corral_bulk_job_changes = NULL;

ALTER TABLE jobs ADD INDEX jobs_ready_queue
  (state, inst_coll, user, priority DESC, batch_id, job_id, always_run, dependency_failed, job_group_id);
