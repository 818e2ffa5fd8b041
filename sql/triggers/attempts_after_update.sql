-- Billing: when an attempt's rollup (or start) moves, bill the difference
-- in elapsed milliseconds for each of its resources.
DROP TRIGGER IF EXISTS attempts_after_update;
DELIMITER $$
CREATE TRIGGER attempts_after_update AFTER UPDATE ON attempts FOR EACH ROW
BEGIN
  DECLARE v_old_ms BIGINT DEFAULT IF(OLD.start_time_ms IS NULL OR OLD.rollup_time_ms IS NULL, 0,
                                     OLD.rollup_time_ms - OLD.start_time_ms);
  DECLARE v_new_ms BIGINT DEFAULT IF(NEW.start_time_ms IS NULL OR NEW.rollup_time_ms IS NULL, 0,
                                     NEW.rollup_time_ms - NEW.start_time_ms);
  IF v_new_ms <> v_old_ms THEN
    CALL add_attempt_usage(NEW.batch_id, NEW.job_id, NEW.attempt_id, NULL, v_new_ms - v_old_ms, NEW.rollup_time_ms);
  END IF;
END $$
DELIMITER ;
