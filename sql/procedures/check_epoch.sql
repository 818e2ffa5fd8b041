-- Fencing: called inside a driver transaction. Takes a shared lock on the
-- epoch row, so an election (which updates it) waits for in-flight driver
-- transactions and every later one sees the new epoch.
DROP PROCEDURE IF EXISTS check_epoch;
DELIMITER $$
CREATE PROCEDURE check_epoch(IN in_epoch BIGINT, OUT out_ok BOOLEAN)
BEGIN
  DECLARE v_epoch BIGINT;
  SELECT epoch INTO v_epoch FROM leader_epoch WHERE singleton = 1 LOCK IN SHARE MODE;
  SET out_ok = (in_epoch IS NOT NULL AND in_epoch = v_epoch);
END $$
DELIMITER ;
