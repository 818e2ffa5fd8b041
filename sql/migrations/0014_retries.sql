-- Retries that know why an attempt ended (issue 11, design §9, RetryPolicy
-- in the protos). complete_jobs_core decides, for each attempt a worker
-- reported or a deactivation ended, whether the job runs again
-- (decide_retries) instead of becoming final.
--
-- jobs.retry_policy / job_groups.retry_policy: the policy a spec or group
-- sets, as JSON (NULL: none; a job without one takes its nearest group's):
--   {"max_preemptions_before_on_demand", "oom_memory_factor",
--    "max_memory_bytes", "max_failed_retries", "exit_codes": [...],
--    "delay_ms", "max_delay_ms"}
-- jobs.n_preemptions / n_failed_retries: attempts ended by preemption, and
--   retries made after a non-zero exit.
-- jobs.on_demand: runs only on instances that are not preemptible (asked
--   for, or after max_preemptions_before_on_demand preemptions).
-- jobs.not_before_ms: the next attempt waits until then (exit-code back-off).
-- jobs.avoid_instance: the next attempt does not run there (where a system
--   error happened) while another worker of the pool can take it.
-- attempts.retry_reason / retry_delay_ms: why the next attempt was made after
--   this one, and how long it was held back.
-- instances.preemptible: a spot machine (the cloud may reclaim it).
-- on_demand_jobs: the jobs with on_demand set, so that the autoscaler finds
--   their demand without scanning jobs (few jobs ever have it).
ALTER TABLE jobs
  ADD COLUMN retry_policy JSON NULL,
  ADD COLUMN n_preemptions INT NOT NULL DEFAULT 0,
  ADD COLUMN n_failed_retries INT NOT NULL DEFAULT 0,
  ADD COLUMN on_demand BOOLEAN NOT NULL DEFAULT FALSE,
  ADD COLUMN not_before_ms BIGINT NULL,
  ADD COLUMN avoid_instance VARCHAR(100) NULL;
ALTER TABLE job_groups ADD COLUMN retry_policy JSON NULL;
ALTER TABLE attempts
  ADD COLUMN retry_reason VARCHAR(255) NULL,
  ADD COLUMN retry_delay_ms BIGINT NULL;
ALTER TABLE instances ADD COLUMN preemptible BOOLEAN NOT NULL DEFAULT FALSE;
CREATE TABLE on_demand_jobs (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  inst_coll VARCHAR(100) NOT NULL,
  PRIMARY KEY (batch_id, job_id),
  INDEX on_demand_jobs_inst_coll (inst_coll),
  CONSTRAINT on_demand_jobs_job FOREIGN KEY (batch_id, job_id) REFERENCES jobs (batch_id, job_id) ON DELETE CASCADE
) ENGINE=InnoDB;
