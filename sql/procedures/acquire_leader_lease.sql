-- A driver campaigns: it becomes the leader if the lease has expired by the
-- database's clock (or was released, or never held), with the next epoch
-- and a lease of in_lease_ms from now. Otherwise nothing changes, and the
-- answer names the holder and how long its lease still runs. The epoch row
-- is updated after the lease row is locked (lock order: leader_lease,
-- leader_epoch), and its exclusive lock waits for the driver transactions
-- that share-locked it under the old epoch: once this commits, every one of
-- the deposed leader's later calls is refused (check_epoch).
-- Even its own name takes over only an expired lease: a driver that steps
-- down and campaigns again waits, like any other.
-- One exception: a lease whose holder's database connection has closed
-- since it last renewed (on this run of the server) is taken over before it
-- expires. A dead driver's connection closes with it; a paused or cut-off
-- one keeps its connection, and its lease runs out as usual (migration
-- 0012). The answer's message says which: 'elected' or 'holder gone'.
-- Status: rc 0 with elected (1: this call took the lease), epoch (the
-- current one), leader_name (the holder, NULL if nobody leads),
-- lease_ms_left (of the holder's lease); rc 3 for a bad argument.
DROP PROCEDURE IF EXISTS acquire_leader_lease;
DELIMITER $$
CREATE PROCEDURE acquire_leader_lease(IN in_name VARCHAR(255), IN in_lease_ms INT, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_epoch BIGINT;
  DECLARE v_holder VARCHAR(255);
  DECLARE v_holder_connection BIGINT UNSIGNED;
  DECLARE v_renewed DATETIME(6);
  DECLARE v_expires DATETIME(6);
  DECLARE v_now DATETIME(6);
  DECLARE v_server_started DATETIME(6);
  DECLARE v_message VARCHAR(32) DEFAULT 'elected';
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  IF in_name IS NULL OR in_name = '' THEN
    SELECT 3 AS rc, 'a leader needs a name' AS message;
    LEAVE proc;
  END IF;
  IF in_lease_ms IS NULL OR in_lease_ms <= 0 OR in_lease_ms > 3600000 THEN
    SELECT 3 AS rc, 'lease_ms must be between 1 and 3600000' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  SELECT epoch, holder_name, holder_connection, renewed_at, expires_at
    INTO v_epoch, v_holder, v_holder_connection, v_renewed, v_expires
    FROM leader_lease WHERE singleton = 1 FOR UPDATE;
  -- Read after the row lock is granted: a wait for it counts.
  SET v_now = UTC_TIMESTAMP(6);
  IF v_expires IS NOT NULL AND v_expires > v_now AND v_holder_connection IS NOT NULL THEN
    -- Whole seconds of uptime: one more second of margin, so that a renewal
    -- from just before a restart is never taken for one after it.
    SELECT v_now - INTERVAL (VARIABLE_VALUE - 1) SECOND INTO v_server_started
      FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME';
    IF v_renewed > v_server_started
       AND NOT EXISTS (SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = v_holder_connection) THEN
      SET v_message = 'holder gone';
    END IF;
  END IF;
  IF v_expires IS NOT NULL AND v_expires > v_now AND v_message = 'elected' THEN
    COMMIT;
    SELECT 0 AS rc, 'held' AS message, 0 AS elected, v_epoch AS epoch, v_holder AS leader_name,
           TIMESTAMPDIFF(MICROSECOND, v_now, v_expires) DIV 1000 AS lease_ms_left;
    LEAVE proc;
  END IF;
  UPDATE leader_epoch SET epoch = epoch + 1, leader_name = in_name, elected_at_ms = in_now_ms WHERE singleton = 1;
  SELECT epoch INTO v_epoch FROM leader_epoch WHERE singleton = 1;
  SET v_now = UTC_TIMESTAMP(6);
  UPDATE leader_lease
    SET epoch = v_epoch, holder_name = in_name, holder_connection = CONNECTION_ID(),
        acquired_at = v_now, renewed_at = v_now,
        expires_at = v_now + INTERVAL in_lease_ms * 1000 MICROSECOND
    WHERE singleton = 1;
  COMMIT;
  SELECT 0 AS rc, v_message AS message, 1 AS elected, v_epoch AS epoch, in_name AS leader_name,
         in_lease_ms AS lease_ms_left;
END $$
DELIMITER ;
