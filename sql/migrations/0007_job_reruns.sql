-- RerunFailedJobs (design §9) re-runs failed jobs as copies in a new
-- update. Each copy records the job it re-runs: Job.rerun_of_job_id, and
-- "has this job been re-run already?" (a job is re-run at most once: a
-- later RerunFailedJobs re-runs the copy if it fails in turn). A table of
-- its own rather than a column of `jobs`, so the hot jobs table and its
-- inserts stay as they are.
CREATE TABLE job_reruns (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  rerun_of_job_id INT NOT NULL,
  PRIMARY KEY (batch_id, job_id),
  UNIQUE INDEX job_reruns_original (batch_id, rerun_of_job_id),
  CONSTRAINT job_reruns_job FOREIGN KEY (batch_id, job_id) REFERENCES jobs (batch_id, job_id) ON DELETE CASCADE,
  CONSTRAINT job_reruns_order CHECK (rerun_of_job_id < job_id)
) ENGINE=InnoDB;
