-- Billing limits: every running batch of a billing project whose cost
-- (aggregated_billing_project_resources x resources.rate_usd) reached its
-- limit_usd (billing_limit_reached: at it, as above it) is cancelled, one
-- job_groups_cancelled row for group 0 each, cancelled_by 'corral', reason
-- 'billing limit reached'; up to in_limit batches per call, the oldest
-- first. A limit of 0 allows no spending. The cost is a scan of (resources
-- x 64 tokens) rows per limited project.
-- Idempotent: a cancelled batch is not taken again and keeps the first who
-- and why. Returns the status row with n_cancelled.
DROP PROCEDURE IF EXISTS cancel_batches_over_limit;
DELIMITER $$
CREATE PROCEDURE cancel_batches_over_limit(IN in_epoch BIGINT, IN in_limit INT, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_n INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_limit IS NULL OR in_limit < 1 THEN
    SELECT 3 AS rc, 'limit must be at least 1' AS message;
    LEAVE proc;
  END IF;
  DROP TEMPORARY TABLE IF EXISTS tmp_over_limit;
  CREATE TEMPORARY TABLE tmp_over_limit (batch_id BIGINT NOT NULL PRIMARY KEY);
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  INSERT INTO tmp_over_limit (batch_id)
    SELECT b.batch_id
    FROM (SELECT p.name
          FROM billing_projects p
          LEFT JOIN aggregated_billing_project_resources a ON a.billing_project = p.name
          LEFT JOIN resources r ON r.resource_id = a.resource_id
          WHERE p.limit_usd IS NOT NULL
          GROUP BY p.name, p.limit_usd
          HAVING billing_limit_reached(COALESCE(SUM(a.`usage` * r.rate_usd), 0), p.limit_usd)) over_limit
    JOIN batches b ON b.billing_project = over_limit.name AND b.state = 'running'
    WHERE NOT EXISTS (SELECT 1 FROM job_groups_cancelled c WHERE c.batch_id = b.batch_id AND c.job_group_id = 0)
    ORDER BY b.batch_id
    LIMIT in_limit;
  INSERT INTO job_groups_cancelled (batch_id, job_group_id, cancelled_by, reason, time_cancelled_ms)
    SELECT batch_id, 0, 'corral', 'billing limit reached', in_now_ms
    FROM tmp_over_limit
    ORDER BY batch_id
  ON DUPLICATE KEY UPDATE batch_id = job_groups_cancelled.batch_id;
  SELECT COUNT(*) INTO v_n FROM tmp_over_limit;
  COMMIT;
  DROP TEMPORARY TABLE IF EXISTS tmp_over_limit;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_cancelled;
END $$
DELIMITER ;
