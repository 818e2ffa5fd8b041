-- A worker that booted presents its activation token: pending -> active.
-- Activating an active instance again with the right token is a no-op; a
-- wrong token or an inactive/deleted instance is refused.
-- in_storage_bytes: the scratch storage the worker reports (migration 0017);
-- it replaces what the instance was created with, the worker knowing its
-- own disk. 0 or NULL: the worker did not say, the instance's stays.
DROP PROCEDURE IF EXISTS activate_instance;
DELIMITER $$
CREATE PROCEDURE activate_instance(IN in_epoch BIGINT, IN in_name VARCHAR(100), IN in_activation_token VARCHAR(100),
                                   IN in_ip_address VARCHAR(64), IN in_now_ms BIGINT, IN in_storage_bytes BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_state VARCHAR(20);
  DECLARE v_token VARCHAR(100);
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  SELECT state, activation_token INTO v_state, v_token FROM instances WHERE name = in_name FOR UPDATE;
  IF v_missing THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no instance ', in_name) AS message;
    LEAVE proc;
  END IF;
  IF v_token <> in_activation_token THEN
    ROLLBACK;
    SELECT 6 AS rc, 'wrong activation token' AS message;
    LEAVE proc;
  END IF;
  IF v_state NOT IN ('pending', 'active') THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('instance ', in_name, ' is ', v_state) AS message;
    LEAVE proc;
  END IF;
  UPDATE instances
    SET state = 'active', ip_address = in_ip_address,
        storage_bytes = IF(in_storage_bytes > 0, in_storage_bytes, storage_bytes),
        time_activated_ms = COALESCE(time_activated_ms, in_now_ms),
        last_heartbeat_ms = GREATEST(COALESCE(last_heartbeat_ms, 0), in_now_ms)
    WHERE name = in_name;
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message;
END $$
DELIMITER ;
