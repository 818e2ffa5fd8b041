-- A driver that has just won the leader lock (a named MySQL lock held on its
-- own connection) calls this to start a new epoch. Every state-changing
-- driver procedure takes the epoch and refuses a stale one.
DROP PROCEDURE IF EXISTS elect_leader;
DELIMITER $$
CREATE PROCEDURE elect_leader(IN in_leader_name VARCHAR(255), IN in_now_ms BIGINT)
BEGIN
  DECLARE v_epoch BIGINT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  START TRANSACTION;
  UPDATE leader_epoch SET epoch = epoch + 1, leader_name = in_leader_name, elected_at_ms = in_now_ms
    WHERE singleton = 1;
  SELECT epoch INTO v_epoch FROM leader_epoch WHERE singleton = 1;
  COMMIT;
  SELECT 0 AS rc, 'elected' AS message, v_epoch AS epoch;
END $$
DELIMITER ;
