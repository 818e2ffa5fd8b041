-- Events: a cancelled event when a batch (group 0) or a job group is
-- cancelled, in the cancelling transaction. A trigger rather than code in
-- cancel_job_group so that every way of cancelling writes it: a user's
-- CancelBatch/CancelJobGroup, cancel_after_n_failures inside MJC, and the
-- billing-limit loop. It fires only for a new row: the repeat of a
-- cancellation (INSERT ... ON DUPLICATE KEY UPDATE on an existing row) runs
-- the UPDATE triggers instead, so a repeat writes no event.
DROP TRIGGER IF EXISTS job_groups_cancelled_after_insert;
DELIMITER $$
CREATE TRIGGER job_groups_cancelled_after_insert AFTER INSERT ON job_groups_cancelled FOR EACH ROW
BEGIN
  INSERT INTO batch_event_outbox (batch_id, kind, job_group_id, cancelled_by, reason, time_ms)
    VALUES (NEW.batch_id, 'cancelled', NEW.job_group_id, NEW.cancelled_by, NEW.reason, NEW.time_cancelled_ms);
END $$
DELIMITER ;
