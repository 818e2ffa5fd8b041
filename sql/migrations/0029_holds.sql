-- Holds (issue 41): a held batch, job group or job stays Ready but is not
-- scheduled until it is released. A batch is held as its group 0, and a
-- group's hold reaches its whole subtree, as a cancellation does: one row
-- whatever the number of jobs, seen by the scheduler's walk
-- (read_ready_heads), by schedule_jobs and by the demand the fair share
-- and the autoscaler read, at once. A job is held by a row of its own.
-- Releasing deletes the row. Who held it and when are kept for ExplainJob.
CREATE TABLE job_groups_held (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  held_by VARCHAR(100) NOT NULL,
  time_held_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id, job_group_id),
  CONSTRAINT job_groups_held_group FOREIGN KEY (batch_id, job_group_id)
    REFERENCES job_groups (batch_id, job_group_id) ON DELETE CASCADE
) ENGINE=InnoDB;

CREATE TABLE jobs_held (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  held_by VARCHAR(100) NOT NULL,
  time_held_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id, job_id),
  CONSTRAINT jobs_held_job FOREIGN KEY (batch_id, job_id) REFERENCES jobs (batch_id, job_id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- Every job group that is held, itself or through an ancestor, with the
-- group whose hold reaches it (as job_groups_cancelled_self_or_ancestor).
CREATE ALGORITHM=MERGE VIEW job_groups_held_self_or_ancestor AS
  SELECT a.batch_id, a.job_group_id, h.job_group_id AS held_group_id
  FROM job_groups_held h
  JOIN job_group_self_and_ancestors a ON a.batch_id = h.batch_id AND a.ancestor_id = h.job_group_id;

-- The fair share's demand (migration 0003) without what is held: a held
-- group's ready demand, always-run jobs' too, and each held job that would
-- otherwise count (Ready, may run, its group not held, its batch among its
-- user's first 50 running ones).
CREATE OR REPLACE VIEW user_inst_coll_fair_share AS
  SELECT d.user, d.inst_coll,
         d.n_ready_jobs - COALESCE(h.n_ready_jobs, 0) AS n_ready_jobs,
         d.ready_cores_mcpu - COALESCE(h.ready_cores_mcpu, 0) AS ready_cores_mcpu,
         d.n_running_jobs, d.running_cores_mcpu, d.n_creating_jobs
  FROM (
    SELECT r.user, r.inst_coll,
           SUM(IF(rb.batch_rank <= 50 AND gh.batch_id IS NULL, r.n_ready_always_run_jobs
                  + IF(gc.batch_id IS NULL, r.n_ready_cancellable_jobs, 0), 0)) AS n_ready_jobs,
           SUM(IF(rb.batch_rank <= 50 AND gh.batch_id IS NULL, r.ready_always_run_cores_mcpu
                  + IF(gc.batch_id IS NULL, r.ready_cancellable_cores_mcpu, 0), 0)) AS ready_cores_mcpu,
           SUM(r.n_running_jobs) AS n_running_jobs,
           SUM(r.running_cores_mcpu) AS running_cores_mcpu,
           SUM(r.n_creating_jobs) AS n_creating_jobs
    FROM user_inst_coll_resources_by_job_group r
    JOIN (SELECT b.batch_id, ROW_NUMBER() OVER (PARTITION BY b.user ORDER BY b.batch_id) AS batch_rank
          FROM batches b WHERE b.state = 'running') rb ON rb.batch_id = r.batch_id
    LEFT JOIN (SELECT DISTINCT a.batch_id, a.job_group_id
               FROM job_group_self_and_ancestors a
               JOIN job_groups_cancelled c ON c.batch_id = a.batch_id AND c.job_group_id = a.ancestor_id) gc
      ON gc.batch_id = r.batch_id AND gc.job_group_id = r.job_group_id
    LEFT JOIN (SELECT DISTINCT batch_id, job_group_id FROM job_groups_held_self_or_ancestor) gh
      ON gh.batch_id = r.batch_id AND gh.job_group_id = r.job_group_id
    GROUP BY r.user, r.inst_coll) d
  LEFT JOIN (
    SELECT j.user, j.inst_coll, COUNT(*) AS n_ready_jobs, SUM(j.cores_mcpu) AS ready_cores_mcpu
    FROM jobs_held hj
    JOIN jobs j ON j.batch_id = hj.batch_id AND j.job_id = hj.job_id
    JOIN (SELECT b.batch_id, ROW_NUMBER() OVER (PARTITION BY b.user ORDER BY b.batch_id) AS batch_rank
          FROM batches b WHERE b.state = 'running') rb ON rb.batch_id = j.batch_id AND rb.batch_rank <= 50
    WHERE j.state = 'Ready'
      AND (j.always_run OR (NOT j.dependency_failed AND NOT EXISTS (
         SELECT 1 FROM job_groups_cancelled_self_or_ancestor x
         WHERE x.batch_id = j.batch_id AND x.job_group_id = j.job_group_id)))
      AND NOT EXISTS (SELECT 1 FROM job_groups_held_self_or_ancestor y
                      WHERE y.batch_id = j.batch_id AND y.job_group_id = j.job_group_id)
    GROUP BY j.user, j.inst_coll) h
  ON h.user = d.user AND h.inst_coll = d.inst_coll;
