-- Internal: whether a billing project still takes new work (migration 0013).
-- out_message is NULL if it does, else why not: its spend reached its limit
-- (billing_limit_reached: at the limit is refused, as above it; a limit of
-- 0 takes none). Used by create_batch, create_update and
-- rerun_failed_jobs, which refuse with rc 2 and this message.
DROP PROCEDURE IF EXISTS billing_limit_check;
DELIMITER $$
CREATE PROCEDURE billing_limit_check(IN in_billing_project VARCHAR(100), OUT out_message VARCHAR(512))
BEGIN
  DECLARE v_limit_usd DOUBLE;
  DECLARE v_spend_usd DOUBLE;
  SET out_message = NULL;
  SELECT p.limit_usd,
         (SELECT COALESCE(SUM(x.`usage` * r.rate_usd), 0) FROM aggregated_billing_project_resources x
          JOIN resources r ON r.resource_id = x.resource_id WHERE x.billing_project = p.name)
    INTO v_limit_usd, v_spend_usd FROM billing_projects p WHERE p.name = in_billing_project;
  IF billing_limit_reached(v_spend_usd, v_limit_usd) THEN
    SET out_message = CONCAT('billing project ', in_billing_project, ' has spent $', FORMAT(v_spend_usd, 6),
                             ' of its $', FORMAT(v_limit_usd, 6), ' limit');
  END IF;
END $$
DELIMITER ;
