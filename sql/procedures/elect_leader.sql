-- A new epoch by force, whatever the lease says: the current leader is
-- fenced off at once (its next renewal and every later call are refused).
-- For tools that run driver procedures without a driver (benchmarks, tests)
-- and an operator's forced failover; it runs under the administrator's
-- account only. Drivers campaign with acquire_leader_lease. The forced
-- epoch holds no lease: the first driver to campaign takes over from it.
-- Lock order as acquire_leader_lease: leader_lease, then leader_epoch.
DROP PROCEDURE IF EXISTS elect_leader;
DELIMITER $$
CREATE PROCEDURE elect_leader(IN in_leader_name VARCHAR(255), IN in_now_ms BIGINT)
BEGIN
  DECLARE v_epoch BIGINT;
  DECLARE v_now DATETIME(6);
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  START TRANSACTION;
  SELECT epoch INTO v_epoch FROM leader_lease WHERE singleton = 1 FOR UPDATE;
  UPDATE leader_epoch SET epoch = epoch + 1, leader_name = in_leader_name, elected_at_ms = in_now_ms
    WHERE singleton = 1;
  SELECT epoch INTO v_epoch FROM leader_epoch WHERE singleton = 1;
  SET v_now = UTC_TIMESTAMP(6);
  UPDATE leader_lease SET epoch = v_epoch, holder_name = in_leader_name, acquired_at = v_now, renewed_at = NULL,
                          expires_at = v_now
    WHERE singleton = 1;
  COMMIT;
  SELECT 0 AS rc, 'elected' AS message, v_epoch AS epoch;
END $$
DELIMITER ;
