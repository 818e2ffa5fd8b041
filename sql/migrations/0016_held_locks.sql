-- The locks running jobs hold, counted per distinct lock (issue 11,
-- acceptance 6): the scheduler's cycle reads these few rows instead of
-- joining every running job's job_locks rows, once per pool. A thousand
-- jobs holding one of twenty names are twenty rows (times the writers'
-- tokens).
--
-- A job holds its locks from the start of an attempt until it is final:
-- while its state is Creating or Running. The jobs_after_update trigger
-- (row at a time) and record_job_changes (the hot procedures' set-based
-- twin) add the job's job_locks rows when it enters those states and take
-- them away when it leaves them, in the same statement as the counters;
-- services/db/invariants.py checks the rows against job_locks.
--
-- Rows are per writer token (CONNECTION_ID() MOD 16), as the resource
-- counters are per token: many jobs holding one shared lock end on several
-- connections at once without waiting on one row. A row that falls to 0 is
-- kept (an upsert cannot delete); readers skip it.
CREATE TABLE held_locks (
  billing_project VARCHAR(100) NOT NULL,
  level VARCHAR(64) NOT NULL,
  mode ENUM('shared', 'unknown_shared', 'all_shared', 'exclusive', 'unknown_exclusive', 'all_exclusive') NOT NULL,
  lock_name VARCHAR(255) NOT NULL DEFAULT '',
  token TINYINT NOT NULL,
  n_holders INT NOT NULL DEFAULT 0,
  PRIMARY KEY (billing_project, level, lock_name, mode, token)
) ENGINE=InnoDB;

INSERT INTO held_locks (billing_project, level, mode, lock_name, token, n_holders)
  SELECT b.billing_project, l.level, l.mode, l.lock_name, 0, COUNT(*)
  FROM job_locks l
  JOIN jobs j ON j.batch_id = l.batch_id AND j.job_id = l.job_id AND j.state IN ('Creating', 'Running')
  JOIN batches b ON b.batch_id = l.batch_id
  GROUP BY b.billing_project, l.level, l.mode, l.lock_name;
