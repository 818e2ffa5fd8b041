-- Internal, called by the attempts and attempt_resources triggers: bills
-- delta_ms more milliseconds of an attempt's resources (all of them, or
-- only in_resource_id) to the job, every ancestor job group (group 0 is
-- the batch), the billing project, and the billing project/user/UTC day of
-- in_rollup_time_ms. Aggregates other than the job's are tokenized.
DROP PROCEDURE IF EXISTS add_attempt_usage;
DELIMITER $$
CREATE PROCEDURE add_attempt_usage(IN in_batch_id BIGINT, IN in_job_id INT, IN in_attempt_id VARCHAR(40),
                                   IN in_resource_id INT, IN in_delta_ms BIGINT, IN in_rollup_time_ms BIGINT)
BEGIN
  DECLARE v_user VARCHAR(100);
  DECLARE v_billing_project VARCHAR(100);
  DECLARE v_job_group_id INT;
  DECLARE v_token INT DEFAULT CONNECTION_ID() MOD 64;
  DECLARE v_date DATE DEFAULT DATE('1970-01-01') + INTERVAL FLOOR(in_rollup_time_ms / 86400000) DAY;

  SELECT user, billing_project INTO v_user, v_billing_project FROM batches WHERE batch_id = in_batch_id;
  SELECT job_group_id INTO v_job_group_id FROM jobs WHERE batch_id = in_batch_id AND job_id = in_job_id;

  INSERT INTO aggregated_job_resources (batch_id, job_id, resource_id, `usage`)
    SELECT in_batch_id, in_job_id, r.resource_id, r.quantity * in_delta_ms
    FROM attempt_resources r
    WHERE r.batch_id = in_batch_id AND r.job_id = in_job_id AND r.attempt_id = in_attempt_id
      AND (in_resource_id IS NULL OR r.resource_id = in_resource_id)
    ORDER BY r.resource_id
  ON DUPLICATE KEY UPDATE `usage` = `usage` + VALUES(`usage`);

  INSERT INTO aggregated_job_group_resources (batch_id, job_group_id, resource_id, token, `usage`)
    SELECT in_batch_id, a.ancestor_id, r.resource_id, v_token, r.quantity * in_delta_ms
    FROM attempt_resources r
    JOIN job_group_self_and_ancestors a ON a.batch_id = in_batch_id AND a.job_group_id = v_job_group_id
    WHERE r.batch_id = in_batch_id AND r.job_id = in_job_id AND r.attempt_id = in_attempt_id
      AND (in_resource_id IS NULL OR r.resource_id = in_resource_id)
    ORDER BY a.ancestor_id, r.resource_id
  ON DUPLICATE KEY UPDATE `usage` = `usage` + VALUES(`usage`);

  INSERT INTO aggregated_billing_project_resources (billing_project, resource_id, token, `usage`)
    SELECT v_billing_project, r.resource_id, v_token, r.quantity * in_delta_ms
    FROM attempt_resources r
    WHERE r.batch_id = in_batch_id AND r.job_id = in_job_id AND r.attempt_id = in_attempt_id
      AND (in_resource_id IS NULL OR r.resource_id = in_resource_id)
    ORDER BY r.resource_id
  ON DUPLICATE KEY UPDATE `usage` = `usage` + VALUES(`usage`);

  INSERT INTO aggregated_billing_project_user_resources_by_date
      (billing_date, billing_project, user, resource_id, token, `usage`)
    SELECT v_date, v_billing_project, v_user, r.resource_id, v_token, r.quantity * in_delta_ms
    FROM attempt_resources r
    WHERE r.batch_id = in_batch_id AND r.job_id = in_job_id AND r.attempt_id = in_attempt_id
      AND (in_resource_id IS NULL OR r.resource_id = in_resource_id)
    ORDER BY r.resource_id
  ON DUPLICATE KEY UPDATE `usage` = `usage` + VALUES(`usage`);
END $$
DELIMITER ;
