-- Billing: when an attempt's rollup (or start) moves, bill the difference
-- in elapsed milliseconds for each of its resources.
--
-- heartbeat_rollup and complete_jobs_core (MJC) bill their rollup advances
-- themselves, set-based (bill_attempt_usage: four grouped upserts per call
-- instead of four per attempt), and set @corral_bulk_usage around those
-- statements so that this trigger skips them. It still bills every other
-- change: mark_jobs_started (which moves nothing: start and rollup are set
-- together); deactivate_instance's end of the attempts moves no rollup
-- either (time no worker reported is not billed).
--
-- Reservations (migration 0013): whatever path ends an attempt (MJC,
-- deactivate_instance), the end gives its reservation back to its billing
-- project's counter, here, whatever @corral_bulk_usage says.
DROP TRIGGER IF EXISTS attempts_after_update;
DELIMITER $$
CREATE TRIGGER attempts_after_update AFTER UPDATE ON attempts FOR EACH ROW
BEGIN
  IF @corral_bulk_usage IS NULL THEN
    BEGIN
      DECLARE v_old_ms BIGINT DEFAULT IF(OLD.start_time_ms IS NULL OR OLD.rollup_time_ms IS NULL, 0,
                                         OLD.rollup_time_ms - OLD.start_time_ms);
      DECLARE v_new_ms BIGINT DEFAULT IF(NEW.start_time_ms IS NULL OR NEW.rollup_time_ms IS NULL, 0,
                                         NEW.rollup_time_ms - NEW.start_time_ms);
      IF v_new_ms <> v_old_ms THEN
        CALL add_attempt_usage(NEW.batch_id, NEW.job_id, NEW.attempt_id, NULL, v_new_ms - v_old_ms,
                               NEW.rollup_time_ms);
      END IF;
    END;
  END IF;
  IF OLD.end_time_ms IS NULL AND NEW.end_time_ms IS NOT NULL AND OLD.reserved_micro_usd > 0 THEN
    INSERT INTO aggregated_billing_project_reservations (billing_project, token, reserved_micro_usd)
      SELECT b.billing_project, FLOOR(RAND() * 64), -OLD.reserved_micro_usd FROM batches b
      WHERE b.batch_id = NEW.batch_id
    ON DUPLICATE KEY UPDATE reserved_micro_usd = reserved_micro_usd + VALUES(reserved_micro_usd);
  END IF;
END $$
DELIMITER ;
