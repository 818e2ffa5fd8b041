-- What fair share sees per user and instance collection: ready demand and
-- running cores, summed over the tokenized per-group counters.
--   * cancellable ready demand of a cancelled group (or of a group under a
--     cancelled ancestor, or of a cancelled batch = group 0) is ignored at
--     once; always-run ready demand still counts;
--   * ready demand comes from at most the first 50 running batches of each
--     user (the cancellation RFC's safety bound for users with 100,000s of
--     batches); running cores count for every batch.
-- The driver caches the result for a few seconds.
CREATE VIEW user_inst_coll_fair_share AS
  SELECT r.user, r.inst_coll,
         SUM(IF(rb.batch_rank <= 50, r.n_ready_always_run_jobs
                + IF(gc.batch_id IS NULL, r.n_ready_cancellable_jobs, 0), 0)) AS n_ready_jobs,
         SUM(IF(rb.batch_rank <= 50, r.ready_always_run_cores_mcpu
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
  GROUP BY r.user, r.inst_coll;
