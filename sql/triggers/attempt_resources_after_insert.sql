-- Billing: a resource recorded after the attempt already ran for a while is
-- billed for that time at once.
DROP TRIGGER IF EXISTS attempt_resources_after_insert;
DELIMITER $$
CREATE TRIGGER attempt_resources_after_insert AFTER INSERT ON attempt_resources FOR EACH ROW
BEGIN
  DECLARE v_start BIGINT;
  DECLARE v_rollup BIGINT;
  SELECT start_time_ms, rollup_time_ms INTO v_start, v_rollup
    FROM attempts WHERE batch_id = NEW.batch_id AND job_id = NEW.job_id AND attempt_id = NEW.attempt_id;
  IF v_start IS NOT NULL AND v_rollup IS NOT NULL AND v_rollup > v_start THEN
    CALL add_attempt_usage(NEW.batch_id, NEW.job_id, NEW.attempt_id, NEW.resource_id, v_rollup - v_start, v_rollup);
  END IF;
END $$
DELIMITER ;
