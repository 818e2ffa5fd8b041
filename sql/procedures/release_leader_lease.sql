-- A leader shutting down cleanly gives its lease up: it expires now, so a
-- standby takes over at its next look instead of after the lease length.
-- The epoch does not change (the standby's takeover increments it).
-- Releasing a lease that already expired is a no-op; a stale epoch is
-- refused (rc 4) and changes nothing: another driver leads.
DROP PROCEDURE IF EXISTS release_leader_lease;
DELIMITER $$
CREATE PROCEDURE release_leader_lease(IN in_epoch BIGINT)
proc: BEGIN
  DECLARE v_epoch BIGINT;
  DECLARE v_now DATETIME(6);
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  START TRANSACTION;
  SELECT epoch INTO v_epoch FROM leader_lease WHERE singleton = 1 FOR UPDATE;
  IF in_epoch IS NULL OR v_epoch <> in_epoch THEN
    ROLLBACK;
    SELECT 4 AS rc, CONCAT('stale leader epoch: epoch ', v_epoch, ' leads now') AS message;
    LEAVE proc;
  END IF;
  SET v_now = UTC_TIMESTAMP(6);
  UPDATE leader_lease SET expires_at = LEAST(COALESCE(expires_at, v_now), v_now) WHERE singleton = 1;
  COMMIT;
  SELECT 0 AS rc, 'released' AS message;
END $$
DELIMITER ;
