-- The leader renews its lease: in_lease_ms more from now, by the database's
-- clock. Refused, changing nothing, when another driver has taken over
-- since (rc 4, stale epoch) or when the lease has already expired, even if
-- nobody took it (rc 2): a lease that lapsed is gone, and its holder
-- campaigns again like anyone else (a new epoch, so nothing it started
-- under the old one can still write). Either way the caller steps down.
DROP PROCEDURE IF EXISTS renew_leader_lease;
DELIMITER $$
CREATE PROCEDURE renew_leader_lease(IN in_epoch BIGINT, IN in_lease_ms INT)
proc: BEGIN
  DECLARE v_epoch BIGINT;
  DECLARE v_expires DATETIME(6);
  DECLARE v_now DATETIME(6);
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  IF in_lease_ms IS NULL OR in_lease_ms <= 0 OR in_lease_ms > 3600000 THEN
    SELECT 3 AS rc, 'lease_ms must be between 1 and 3600000' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  SELECT epoch, expires_at INTO v_epoch, v_expires FROM leader_lease WHERE singleton = 1 FOR UPDATE;
  SET v_now = UTC_TIMESTAMP(6);
  IF in_epoch IS NULL OR v_epoch <> in_epoch THEN
    ROLLBACK;
    SELECT 4 AS rc, CONCAT('stale leader epoch: epoch ', v_epoch, ' leads now') AS message;
    LEAVE proc;
  END IF;
  IF v_expires IS NULL OR v_expires <= v_now THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('the leader lease of epoch ', v_epoch, ' has expired') AS message;
    LEAVE proc;
  END IF;
  UPDATE leader_lease
    SET holder_connection = CONNECTION_ID(), renewed_at = v_now,
        expires_at = v_now + INTERVAL in_lease_ms * 1000 MICROSECOND
    WHERE singleton = 1;
  COMMIT;
  SELECT 0 AS rc, 'renewed' AS message, in_lease_ms AS lease_ms_left;
END $$
DELIMITER ;
