-- Internal: the set-based twin of add_attempt_usage, for the procedures that
-- move many rollups at once (heartbeat_rollup, complete_jobs_core). Each row
-- of tmp_attempt_usage (create_change_tables) bills delta_ms more
-- milliseconds of all of an attempt's resources to the job, every ancestor
-- job group (group 0 is the batch), the billing project, and the billing
-- project/user/UTC day of the row's rollup_time_ms: four grouped upserts per
-- call, where the attempts trigger ran four per attempt. Aggregates other
-- than the job's are tokenized (CONNECTION_ID() MOD 64).
-- The caller holds the attempts' row locks. An add_attempt_resources of the
-- same attempt (its insert share-locks the attempt through the foreign key)
-- either committed first, and its resources are billed here, or waits and
-- bills the time rolled up by then itself (attempt_resources_after_insert).
DROP PROCEDURE IF EXISTS bill_attempt_usage;
DELIMITER $$
CREATE PROCEDURE bill_attempt_usage()
BEGIN
  IF EXISTS (SELECT 1 FROM tmp_attempt_usage WHERE delta_ms <> 0) THEN
    INSERT INTO aggregated_job_resources (batch_id, job_id, resource_id, `usage`)
      SELECT u.batch_id, u.job_id, r.resource_id, SUM(r.quantity * u.delta_ms)
      FROM tmp_attempt_usage u
      JOIN attempt_resources r ON r.batch_id = u.batch_id AND r.job_id = u.job_id AND r.attempt_id = u.attempt_id
      WHERE u.delta_ms <> 0
      GROUP BY u.batch_id, u.job_id, r.resource_id
      ORDER BY u.batch_id, u.job_id, r.resource_id
    ON DUPLICATE KEY UPDATE `usage` = `usage` + VALUES(`usage`);

    INSERT INTO aggregated_job_group_resources (batch_id, job_group_id, resource_id, token, `usage`)
      SELECT u.batch_id, a.ancestor_id, r.resource_id, CONNECTION_ID() MOD 64, SUM(r.quantity * u.delta_ms)
      FROM tmp_attempt_usage u
      JOIN attempt_resources r ON r.batch_id = u.batch_id AND r.job_id = u.job_id AND r.attempt_id = u.attempt_id
      JOIN jobs j ON j.batch_id = u.batch_id AND j.job_id = u.job_id
      JOIN job_group_self_and_ancestors a ON a.batch_id = j.batch_id AND a.job_group_id = j.job_group_id
      WHERE u.delta_ms <> 0
      GROUP BY u.batch_id, a.ancestor_id, r.resource_id
      ORDER BY u.batch_id, a.ancestor_id, r.resource_id
    ON DUPLICATE KEY UPDATE `usage` = `usage` + VALUES(`usage`);

    INSERT INTO aggregated_billing_project_resources (billing_project, resource_id, token, `usage`)
      SELECT b.billing_project, r.resource_id, CONNECTION_ID() MOD 64, SUM(r.quantity * u.delta_ms)
      FROM tmp_attempt_usage u
      JOIN attempt_resources r ON r.batch_id = u.batch_id AND r.job_id = u.job_id AND r.attempt_id = u.attempt_id
      JOIN batches b ON b.batch_id = u.batch_id
      WHERE u.delta_ms <> 0
      GROUP BY b.billing_project, r.resource_id
      ORDER BY b.billing_project, r.resource_id
    ON DUPLICATE KEY UPDATE `usage` = `usage` + VALUES(`usage`);

    INSERT INTO aggregated_billing_project_user_resources_by_date
        (billing_date, billing_project, user, resource_id, token, `usage`)
      SELECT DATE('1970-01-01') + INTERVAL FLOOR(u.rollup_time_ms / 86400000) DAY AS billing_date,
             b.billing_project, b.user, r.resource_id, CONNECTION_ID() MOD 64, SUM(r.quantity * u.delta_ms)
      FROM tmp_attempt_usage u
      JOIN attempt_resources r ON r.batch_id = u.batch_id AND r.job_id = u.job_id AND r.attempt_id = u.attempt_id
      JOIN batches b ON b.batch_id = u.batch_id
      WHERE u.delta_ms <> 0
      GROUP BY billing_date, b.billing_project, b.user, r.resource_id
      ORDER BY billing_date, b.billing_project, b.user, r.resource_id
    ON DUPLICATE KEY UPDATE `usage` = `usage` + VALUES(`usage`);
  END IF;
END $$
DELIMITER ;
