-- Billing: a resource recorded after the attempt already ran for a while is
-- billed for that time at once. mark_jobs_started records the resources of
-- attempts that start in the same call (nothing rolled up to bill) with
-- @corral_bulk_usage set, and this trigger skips those rows.
DROP TRIGGER IF EXISTS attempt_resources_after_insert;
DELIMITER $$
CREATE TRIGGER attempt_resources_after_insert AFTER INSERT ON attempt_resources FOR EACH ROW
BEGIN
  IF @corral_bulk_usage IS NULL THEN
    BEGIN
      DECLARE v_start BIGINT;
      DECLARE v_rollup BIGINT;
      SELECT start_time_ms, rollup_time_ms INTO v_start, v_rollup
        FROM attempts WHERE batch_id = NEW.batch_id AND job_id = NEW.job_id AND attempt_id = NEW.attempt_id;
      IF v_start IS NOT NULL AND v_rollup IS NOT NULL AND v_rollup > v_start THEN
        CALL add_attempt_usage(NEW.batch_id, NEW.job_id, NEW.attempt_id, NEW.resource_id, v_rollup - v_start,
                               v_rollup);
      END IF;
    END;
  END IF;
END $$
DELIMITER ;
